//! The sections of the configuration reference, in the order it lists them; every knob and
//! every setting `sparkgate config` shows belongs to one.

/// Sections of the configuration reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Group {
    General,
    Nodes,
    Nccl,
    Serving,
    Speculation,
    Runtime,
    Containers,
    Storage,
    Preparation,
    Supervision,
    Gateway,
    Secrets,
}

impl Group {
    pub(crate) fn title(self) -> &'static str {
        match self {
            Group::General => "General",
            Group::Nodes => "Nodes and network pins",
            Group::Nccl => "NCCL (passed into both rank containers)",
            Group::Serving => "Serving (`vllm serve` arguments)",
            Group::Speculation => "Speculative decoding",
            Group::Runtime => "Rank runtime environment (passed into both rank containers)",
            Group::Containers => "Rank containers",
            Group::Storage => "Weights and caches (host paths)",
            Group::Preparation => "Node preparation (image, shipping, weights at start, Engram pack)",
            Group::Supervision => "Supervision",
            Group::Gateway => "Gateway (the OpenAI front door)",
            Group::Secrets => "Secrets (never printed)",
        }
    }
}
