//! The label values of the gateway's labelled metrics, each set an enum declared once with its
//! spellings (`labels!`): the code names a variant, `label()` spells it, and `ALL` is the list
//! every family is registered with at zero — so the list and the `match` cannot drift apart.

/// Declares an enum whose variants each have one label spelling, with `ALL` and `label()`.
macro_rules! labels {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum $name {
            $($(#[$vm])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub(crate) const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The label value as metrics and logs spell it.
            pub(crate) const fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }
    };
}

labels! {
    /// Why admission refused a generation (`sparkgate_admission_rejections_total{reason}`).
    Rejection {
        RateLimit => "rate_limit",
        QueueFull => "queue_full",
        QueueBytes => "queue_bytes",
        QueueTimeout => "queue_timeout",
        Restarting => "restarting",
        NotRunning => "not_running",
        ShuttingDown => "shutting_down",
        TooManySequences => "too_many_sequences",
        Quota => "quota",
        /// Its prefill's memory did not come back within QUEUE_TIMEOUT (the memory guard).
        Memory => "memory",
        /// MODELS: its model is not loaded (SWAP_POLICY=manual) or its swap failed.
        ModelNotLoaded => "model_not_loaded",
        /// MODELS: its key may not use the model it named.
        ModelForbidden => "model_forbidden",
    }
}

labels! {
    /// Which of an API key's quotas a request is over (`sparkgate_key_quota_refusals_total{limit}`).
    QuotaLimit {
        TokensPerMinute => "tokens_per_minute",
        TokensPerDay => "tokens_per_day",
        Sequences => "max_sequences",
    }
}

labels! {
    /// A listed repair of a body a widely used client sends and vLLM refuses or misreads
    /// (`sparkgate_request_repairs_total{rule}`; docs/gateway.md lists each with its client).
    Repair {
        /// A literal `extra_body` object flattened, as the OpenAI SDK does on the client.
        ExtraBody => "extra_body",
        /// An empty `tools` list dropped on chat completions (LiteLLM's Responses bridge).
        EmptyTools => "empty_tools",
    }
}

labels! {
    /// Why a stream ended with an error (`sparkgate_stream_errors_total{reason}`): the gateway
    /// cut it, or rank 0 sent its own error event.
    StreamEnd {
        FirstTokenTimeout => "first_token_timeout",
        IdleTimeout => "idle_timeout",
        UpstreamBroken => "upstream_broken",
        UpstreamTruncated => "upstream_truncated",
        DrainTimeout => "drain_timeout",
        GatewayError => "gateway_error",
        UpstreamErrorEvent => "upstream_error_event",
    }
}

labels! {
    /// Why a cut stream could not be continued (`sparkgate_stream_resume_failures_total{reason}`;
    /// docs/resume.md): the stream then ends with its error event, as before resuming existed.
    ResumeFailure {
        /// No group was Ready again within RESUME_TIMEOUT.
        Timeout => "timeout",
        /// Cut a third time.
        TooMany => "too_many",
        /// The request crashed the engine (the poison guard): not sent into the next epoch.
        Quarantined => "quarantined",
        /// vLLM rendered another prompt than the stream's: the continuation would not be exact.
        PromptMismatch => "prompt_mismatch",
        /// Rank 0 refused or broke a render, generate or derender call, or a replay.
        Upstream => "upstream",
        /// A replay's text did not run through what the client got (not the same generation).
        SpliceMismatch => "splice_mismatch",
    }
}

labels! {
    /// Where a request was waiting when its client left (`sparkgate_client_gone_total{stage}`).
    Waiting {
        /// Its body was being read or prepared.
        Request => "request",
        /// In the admission queue.
        Queue => "queue",
        /// Sent, before rank 0's answer began.
        Upstream => "upstream",
    }
}

labels! {
    /// Where a request was quarantined (`sparkgate_quarantined_requests_total{stage}`).
    QuarantineStage {
        /// After its group was lost under it.
        Dispatch => "dispatch",
        /// At arrival: two requests with the same body were quarantined before.
        Arrival => "arrival",
    }
}

labels! {
    /// What failed on the way to rank 0 (`sparkgate_upstream_errors_total{kind}`).
    UpstreamErrorKind {
        Connect => "connect",
        Request => "request",
    }
}

impl UpstreamErrorKind {
    pub(crate) fn of(connect: bool) -> UpstreamErrorKind {
        if connect {
            UpstreamErrorKind::Connect
        } else {
            UpstreamErrorKind::Request
        }
    }
}

labels! {
    /// How an affinity wait ended (`sparkgate_affinity_waits_total{outcome}`): admitted with a
    /// slot of its group free, or elsewhere when the wait ran out or the group closed.
    Affinity {
        Home => "home",
        Elsewhere => "elsewhere",
    }
}

labels! {
    /// A generation's stages as its trace names their spans (docs/observability.md).
    TraceStage {
        /// The body read, parsed and normalised, and the checks that need no slot.
        Normalize => "normalize",
        /// The key's quota reserved.
        Admission => "admission",
        /// Waiting for a slot in the admission queue.
        QueueWait => "queue_wait",
        /// A group's slot leased.
        Lease => "lease",
        /// Rank 0 until its first token (or, answered whole, its answer): vLLM's spans are its children.
        Upstream => "upstream",
        /// The first token to the last.
        Streaming => "streaming",
        /// A stream cut by its group's loss, until its continuation went on.
        Resume => "resume",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_is_spelled_once_in_snake_case() {
        let sets: [Vec<&str>; 8] = [
            QuotaLimit::ALL.iter().map(|v| v.label()).collect(),
            TraceStage::ALL.iter().map(|v| v.label()).collect(),
            Rejection::ALL.iter().map(|v| v.label()).collect(),
            StreamEnd::ALL.iter().map(|v| v.label()).collect(),
            Waiting::ALL.iter().map(|v| v.label()).collect(),
            QuarantineStage::ALL.iter().map(|v| v.label()).collect(),
            UpstreamErrorKind::ALL.iter().map(|v| v.label()).collect(),
            Affinity::ALL.iter().map(|v| v.label()).collect(),
        ];
        for set in sets {
            let mut unique = set.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), set.len(), "{set:?}");
            assert!(set
                .iter()
                .all(|l| l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
        }
        assert_eq!(Rejection::ALL.len(), 12);
        assert_eq!(Waiting::ALL[1].label(), "queue");
    }
}
