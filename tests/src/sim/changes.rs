//! What vLLM changed between the releases the simulator plays that the captured schemas
//! (`api::schema`) do not show: one row per behaviour with the release it arrived in. A
//! handler asks [`since`]; each row names the vLLM code it follows.

use serde_json::Value;
use sparkgate_config::VllmRelease;

/// A behaviour that arrived in a later release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// `ChatMessage.annotations` is `exclude_if=None`: omitted when there are none (0.33: null).
    AnnotationsOmittedWhenNone,
    /// `UsageInfo.prompt_tokens_details` is `exclude_if=None`: omitted when there are none.
    PromptDetailsOmittedWhenNone,
    /// Chat's `check_tool_usage`: `tools: []` with no named tool reads as no tools, `auto` and
    /// `required` fall back to `none` (0.33 refused the empty list); a named tool missing from
    /// `tools` is named in the refusal.
    EmptyToolsAreNoTools,
    /// The first chunk of a stream with continuous usage carries `prompt_tokens_details`.
    FirstChunkPromptDetails,
    /// `/v1/chat/completions/batch`'s usage sums reasoning tokens and prompt token details.
    BatchUsageDetails,
    /// Anthropic streams' `message_start` usage has the cache token counts.
    MessageStartCacheTokens,
    /// `AnthropicTool.reject_anthropic_defined_tools`: a tool `type` other than `custom` is
    /// refused by name before its fields are checked.
    AnthropicDefinedToolsRefused,
    /// Anthropic `thinking: {"type": "between_tools"}` reads as disabled thinking.
    ThinkingBetweenTools,
    /// Anthropic `min_tokens` reaches the chat request (0.33 dropped it).
    AnthropicMinTokens,
    /// `count_tokens` counts a prompt over the context limit instead of refusing it.
    CountTokensOverContext,
    /// DeepSeek V4.1's encoder honours `continue_final_message` (refused without a final
    /// assistant message) and `add_generation_prompt`.
    DeepSeekContinueFinalMessage,
    /// Responses input items follow the OpenResponses schema: `type` defaults to `message`,
    /// a missing or empty id and status are filled, a reasoning item's summary too.
    OpenResponsesInputItems,
    /// `ResponsesRequest.thinking_token_budget` exists, with the sampling parameter's check.
    ResponsesThinkingTokenBudget,
    /// `DerenderStreamState` carries its detokenizer window as ids (`prev_token_ids`; 0.33:
    /// `prev_tokens`, the window's token strings).
    DerenderWindowIds,
    /// `GenerateRequest`'s serializer writes a `max_tokens` equal to `SamplingParams`' default
    /// (16), which the struct omits (0.33's render left it out).
    RenderKeepsDefaultMaxTokens,
}

/// Each change and the release it arrived in.
const ARRIVED: &[(Change, VllmRelease)] = &[
    (Change::AnnotationsOmittedWhenNone, VllmRelease::V0_34),
    (Change::PromptDetailsOmittedWhenNone, VllmRelease::V0_34),
    (Change::EmptyToolsAreNoTools, VllmRelease::V0_34),
    (Change::FirstChunkPromptDetails, VllmRelease::V0_34),
    (Change::BatchUsageDetails, VllmRelease::V0_34),
    (Change::MessageStartCacheTokens, VllmRelease::V0_34),
    (Change::AnthropicDefinedToolsRefused, VllmRelease::V0_34),
    (Change::ThinkingBetweenTools, VllmRelease::V0_34),
    (Change::AnthropicMinTokens, VllmRelease::V0_34),
    (Change::CountTokensOverContext, VllmRelease::V0_34),
    (Change::DeepSeekContinueFinalMessage, VllmRelease::V0_34),
    (Change::OpenResponsesInputItems, VllmRelease::V0_34),
    (Change::ResponsesThinkingTokenBudget, VllmRelease::V0_34),
    (Change::DerenderWindowIds, VllmRelease::V0_34),
    (Change::RenderKeepsDefaultMaxTokens, VllmRelease::V0_34),
];

/// Whether `change` holds in the release the simulator plays.
pub(crate) fn since(change: Change) -> bool {
    holds_in(change, super::release())
}

fn holds_in(change: Change, release: VllmRelease) -> bool {
    let (_, arrived) = ARRIVED
        .iter()
        .find(|(c, _)| *c == change)
        .expect("every change has its row");
    release >= *arrived
}

/// Removes `object[key]` when it is null and `change` (an `exclude_if=None` field) holds.
pub(crate) fn exclude_null(object: &mut Value, key: &str, change: Change) {
    if since(change) && object.get(key).is_some_and(Value::is_null) {
        if let Some(o) = object.as_object_mut() {
            o.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_holds_from_its_release_on() {
        for (change, arrived) in ARRIVED {
            for release in VllmRelease::ALL {
                assert_eq!(holds_in(*change, release), release >= *arrived, "{change:?} {release}");
            }
        }
        assert!(!holds_in(Change::EmptyToolsAreNoTools, VllmRelease::V0_33));
    }
}
