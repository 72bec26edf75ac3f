//! sparkgate's front door and command line: the only crate that knows OpenAI JSON.

pub mod cli;
