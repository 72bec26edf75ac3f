//! The reasoning and tool parser of the simulated models: output token ids (with their text)
//! in, what a chat client sees out — reasoning until `</think>` when the prompt left it open,
//! then content, and a tool call's markup as the call's name (once its text is complete) and
//! arguments (once the markup closes). The chat stream and `/v1/chat/completions/derender`
//! run the same parser over the same tokens, so a stream continued through the derender reads
//! exactly as the uninterrupted one.

use serde_json::Value;

use super::markup::Syntax;
#[cfg(test)]
use super::tools::ToolCall;
use super::vocab;

/// How a request's output is parsed.
#[derive(Debug, Clone, Default)]
pub(crate) struct ParserConfig {
    /// The output starts as reasoning: the prompt opened `<think>` and the reasoning parser
    /// separates it, or the prompt gave the answer no header (then it is all reasoning).
    pub(crate) reasoning_open: bool,
    /// The tool markup the parser reads (none: tools are not parsed).
    pub(crate) markup: Option<Syntax>,
    /// The tools offered, which type the markup's bare values.
    pub(crate) tools: Vec<Value>,
    /// A forced call on GLM: its name and arguments go out as one delta.
    pub(crate) whole_call: bool,
}

/// Whether a prompt leaves reasoning open, as vLLM's reasoning parsers read it
/// (`is_reasoning_end`): its last thinking marker is not `</think>` (no marker: open).
pub(crate) fn reasoning_open_after(prompt_ids: &[u32]) -> bool {
    let (open, close) = (vocab::think_id(), vocab::think_end_id());
    prompt_ids.iter().rev().find(|&&i| i == open || i == close) != Some(&close)
}

/// A tool call's part released by a step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolDelta {
    /// A new call's name (the caller gives it its id).
    Header { index: usize, name: String },
    /// The arguments of the call at `index`, whole.
    Arguments { index: usize, arguments: String },
    /// A new call's name and arguments together.
    Whole {
        index: usize,
        name: String,
        arguments: String,
    },
}

/// What one step of tokens adds.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Parsed {
    pub(crate) reasoning: String,
    pub(crate) content: String,
    pub(crate) tools: Vec<ToolDelta>,
    /// Tokens that were reasoning (`</think>` not counted).
    pub(crate) reasoning_ids: usize,
}

impl Parsed {
    /// The calls completed in this (whole-output) parse.
    #[cfg(test)]
    pub(crate) fn calls(&self) -> Vec<ToolCall> {
        let mut calls: Vec<ToolCall> = Vec::new();
        for t in &self.tools {
            match t {
                ToolDelta::Header { name, .. } => calls.push(ToolCall {
                    name: name.clone(),
                    arguments: String::new(),
                }),
                ToolDelta::Arguments { arguments, .. } => {
                    if let Some(last) = calls.last_mut() {
                        last.arguments.clone_from(arguments);
                    }
                }
                ToolDelta::Whole { name, arguments, .. } => calls.push(ToolCall {
                    name: name.clone(),
                    arguments: arguments.clone(),
                }),
            }
        }
        calls
    }
}

/// The parser's state over one sequence's output.
#[derive(Debug, Clone)]
pub(crate) struct Parser {
    cfg: ParserConfig,
    in_reasoning: bool,
    /// The open call's markup so far.
    markup: Option<String>,
    /// Whether the open call's name went out.
    header_sent: bool,
    /// Calls begun so far (the next call's index).
    calls: usize,
}

impl Parser {
    pub(crate) fn new(cfg: ParserConfig) -> Parser {
        Parser {
            in_reasoning: cfg.reasoning_open,
            cfg,
            markup: None,
            header_sent: false,
            calls: 0,
        }
    }

    /// Parses one step's tokens (`texts[i]` is `ids[i]`'s text).
    pub(crate) fn step(&mut self, ids: &[u32], texts: &[String]) -> Parsed {
        let mut out = Parsed::default();
        let opener = self.cfg.markup.and_then(|s| vocab::id_of(s.opener()));
        for (&id, text) in ids.iter().zip(texts) {
            if let Some(markup) = &mut self.markup {
                markup.push_str(text);
                self.scan(&mut out);
            } else if self.in_reasoning {
                if id == vocab::think_end_id() {
                    self.in_reasoning = false;
                } else {
                    out.reasoning.push_str(text);
                    out.reasoning_ids += 1;
                }
            } else if Some(id) == opener {
                self.markup = Some(text.clone());
                self.header_sent = false;
                self.scan(&mut out);
            } else {
                out.content.push_str(text);
            }
        }
        merge_headers(&mut out.tools);
        out
    }

    /// Reads the open call's markup: its name once complete, the call once closed.
    fn scan(&mut self, out: &mut Parsed) {
        let (Some(markup), Some(syntax)) = (&self.markup, self.cfg.markup) else {
            return;
        };
        let scan = syntax.scan(markup, &self.cfg.tools);
        let index = self.calls;
        if let (Some(name), false, false) = (&scan.name, self.header_sent, self.cfg.whole_call) {
            out.tools.push(ToolDelta::Header {
                index,
                name: name.clone(),
            });
            self.header_sent = true;
        }
        if let Some(arguments) = scan.arguments {
            out.tools.push(if self.header_sent {
                ToolDelta::Arguments { index, arguments }
            } else {
                ToolDelta::Whole {
                    index,
                    name: scan.name.unwrap_or_default(),
                    arguments,
                }
            });
            self.markup = None;
            self.calls += 1;
        }
    }
}

/// A name and its arguments released by the same step go out as one delta.
fn merge_headers(tools: &mut Vec<ToolDelta>) {
    let mut merged: Vec<ToolDelta> = Vec::with_capacity(tools.len());
    for t in tools.drain(..) {
        match (merged.last(), &t) {
            (Some(ToolDelta::Header { index, name }), ToolDelta::Arguments { index: i, arguments }) if index == i => {
                let whole = ToolDelta::Whole {
                    index: *i,
                    name: name.clone(),
                    arguments: arguments.clone(),
                };
                merged.pop();
                merged.push(whole);
            }
            _ => merged.push(t),
        }
    }
    *tools = merged;
}

/// The whole output parsed at once.
pub(crate) fn parse_all(cfg: &ParserConfig, ids: &[u32], texts: &[String]) -> Parsed {
    Parser::new(cfg.clone()).step(ids, texts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn texts(ids: &[u32]) -> Vec<String> {
        vocab::piece_texts(ids).0
    }

    #[test]
    fn reasoning_content_and_a_call_split_alike_at_any_chunking() {
        let call = ToolCall {
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}).to_string(),
        };
        for syntax in [Syntax::DeepSeek, Syntax::Glm] {
            let text = format!("Thinking it over.</think>Sure.{}", syntax.render(&call));
            let ids = vocab::tokenize(&text);
            let cfg = ParserConfig {
                reasoning_open: true,
                markup: Some(syntax),
                tools: Vec::new(),
                whole_call: false,
            };
            let whole = parse_all(&cfg, &ids, &texts(&ids));
            assert_eq!(whole.reasoning, "Thinking it over.");
            assert_eq!(whole.content, "Sure.");
            assert_eq!(whole.calls(), vec![call.clone()]);
            let mut p = Parser::new(cfg.clone());
            let mut one_by_one = Parsed::default();
            for id in &ids {
                let step = p.step(&[*id], &texts(&[*id]));
                one_by_one.reasoning += &step.reasoning;
                one_by_one.content += &step.content;
                one_by_one.tools.extend(step.tools);
            }
            assert!(matches!(one_by_one.tools[0], ToolDelta::Header { .. }), "{syntax:?}");
            assert_eq!(
                (
                    one_by_one.reasoning.clone(),
                    one_by_one.content.clone(),
                    one_by_one.calls()
                ),
                (whole.reasoning.clone(), whole.content.clone(), whole.calls())
            );
        }
    }
}
