//! The vocabulary every layer speaks about a request's API: which body shape it has (`Api`),
//! which envelope its errors take (`Family`) and how its stream is framed (`Framing`).

/// Which API a request is for; decides which fields are normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    Chat,
    Completions,
    Responses,
    /// `/v1/chat/completions/batch`: `messages` is a list of conversations, one permit each.
    Batch,
    /// Anthropic's `/v1/messages`.
    Messages,
    /// SageMaker's `/invocations`: chat when the body has `messages`, else completions.
    Invocations,
    /// Engine routes whose bodies the gateway does not interpret (`/v1/decisions`, …): the
    /// model is resolved and one permit taken.
    Opaque,
    /// `/tokenize`, `/detokenize`, `count_tokens`: only the model is resolved.
    Utility,
}

impl Api {
    /// The fields a body of this API names its most output tokens by.
    pub(crate) fn output_limits(self) -> &'static [&'static str] {
        match self {
            Api::Chat | Api::Batch | Api::Invocations => &["max_completion_tokens", "max_tokens"],
            Api::Responses => &["max_output_tokens"],
            Api::Completions | Api::Messages | Api::Opaque | Api::Utility => &["max_tokens"],
        }
    }

    /// The API a body is handled as: `/invocations` is chat when the body has `messages`, else
    /// completions (vLLM dispatches by the body's shape); every other API is itself.
    pub(crate) fn for_body(self, has_messages: bool) -> Api {
        match self {
            Api::Invocations if has_messages => Api::Chat,
            Api::Invocations => Api::Completions,
            other => other,
        }
    }
}

/// Which API a route speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    OpenAi,
    Anthropic,
}

/// The event framing of a stream, which decides how it ends and how the gateway's own error
/// event is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// `data: {…}` chunks ending with `data: [DONE]` (chat, completions).
    Chat,
    /// `event: response.*` frames; the stream ends with the connection.
    Responses,
    /// Anthropic's `event: message_*` frames ending with `message_stop`.
    Anthropic,
}

impl Framing {
    pub(crate) fn of(family: Family, api: Api) -> Framing {
        match (family, api) {
            (Family::Anthropic, _) => Framing::Anthropic,
            (_, Api::Responses) => Framing::Responses,
            _ => Framing::Chat,
        }
    }
}
