//! Docker and SSH access for sparkgate's nodes: the only crate that talks to a Docker daemon or
//! opens an SSH session. Filled in by the supervisor issue (bollard over the head's socket and
//! the worker's socket forwarded through openssh).
