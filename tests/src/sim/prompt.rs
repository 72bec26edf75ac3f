//! The chat prompt as the simulated template renders it, and the same prompt read back from
//! its text. The model plans from what it reads back (never from the request), so a prompt
//! that reaches the model as token ids only (`/inference/v1/generate`) is answered exactly as
//! the chat route answers the request that rendered it.
//!
//! The render: `<|tools|>{"tools": […], "tool_choice": …}` when the request offers tools, each
//! message as its role's marker and its text, `<|effort|>LABEL` when thinking at an effort
//! other than the template's default, then the generation prompt `<|assistant|><think>`
//! (thinking) or `<|assistant|></think>`.

use serde_json::{json, Value};

use super::text::{content_text, ChatPrompt, Rendering, Template, Turn};
use super::vocab::{EFFORT, TOOLS};

const ROLES: &[(&str, &str)] = &[
    ("<|system|>", "system"),
    ("<|user|>", "user"),
    ("<|assistant|>", "assistant"),
    ("<|tool|>", "tool"),
];
const THINKING_PROMPT: &str = "<|assistant|><think>";
const ANSWER_PROMPT: &str = "<|assistant|></think>";

/// The marker a role renders as (developer is a system message; an unknown role a user's).
fn marker(role: &str) -> &'static str {
    match role {
        "system" | "developer" => "<|system|>",
        "assistant" => "<|assistant|>",
        "tool" => "<|tool|>",
        _ => "<|user|>",
    }
}

/// The prompt text of `messages` with `tools` offered, as the template renders it.
pub(crate) fn render(
    messages: &[Value],
    tools: Option<&[Value]>,
    tool_choice: Option<&Value>,
    rendering: &Rendering,
    template: Template,
) -> String {
    let mut out = String::new();
    if let Some(tools) = tools.filter(|t| !t.is_empty()) {
        out.push_str(TOOLS);
        out.push_str(&json!({"tools": tools, "tool_choice": tool_choice.cloned().unwrap_or(Value::Null)}).to_string());
    }
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        out.push_str(marker(role));
        out.push_str(&content_text(m.get("content")));
    }
    if rendering.thinking && rendering.effort_label != template.default_label() {
        out.push_str(EFFORT);
        out.push_str(&rendering.effort_label);
    }
    out.push_str(if rendering.thinking {
        THINKING_PROMPT
    } else {
        ANSWER_PROMPT
    });
    out
}

/// Reads a rendered prompt back; `None` when `text` does not end in a generation prompt.
pub(crate) fn parse(text: &str, template: Template) -> Option<ChatPrompt> {
    let (body, thinking) = match text.strip_suffix(THINKING_PROMPT) {
        Some(body) => (body, true),
        None => (text.strip_suffix(ANSWER_PROMPT)?, false),
    };
    let (body, tools, tool_choice) = tools_section(body);
    let (body, effort_label) = match body.rfind(EFFORT) {
        Some(at) => (&body[..at], body[at + EFFORT.len()..].to_owned()),
        None => (body, template.default_label().to_owned()),
    };
    Some(ChatPrompt {
        text: text.to_owned(),
        messages: turns(body),
        tools,
        tool_choice,
        thinking,
        reasoning_lines: template.lines_for(&effort_label),
        effort_label,
    })
}

/// The tools section at the start of `body`, and what follows it.
fn tools_section(body: &str) -> (&str, Option<Vec<Value>>, Option<Value>) {
    let Some(rest) = body.strip_prefix(TOOLS) else {
        return (body, None, None);
    };
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
    match values.next() {
        Some(Ok(section)) => {
            let after = &rest[values.byte_offset()..];
            let tools = section.get("tools").and_then(Value::as_array).cloned();
            let choice = section.get("tool_choice").filter(|c| !c.is_null()).cloned();
            (after, tools, choice)
        }
        _ => (rest, None, None),
    }
}

/// The messages of `body`: each role marker and the text up to the next one.
fn turns(body: &str) -> Vec<Turn> {
    let next_marker = |s: &str| {
        ROLES
            .iter()
            .filter_map(|(m, role)| s.find(m).map(|at| (at, m.len(), *role)))
            .min_by_key(|(at, _, _)| *at)
    };
    let mut out = Vec::new();
    let mut rest = body;
    let Some((at, len, mut role)) = next_marker(rest) else {
        return out;
    };
    rest = &rest[at + len..];
    loop {
        match next_marker(rest) {
            Some((at, len, next)) => {
                out.push(Turn {
                    role: role.to_owned(),
                    content: rest[..at].to_owned(),
                });
                rest = &rest[at + len..];
                role = next;
            }
            None => {
                out.push(Turn {
                    role: role.to_owned(),
                    content: rest.to_owned(),
                });
                return out;
            }
        }
    }
}

/// Plans a chat turn as the chat route does: the messages rendered, the render read back.
#[cfg(test)]
pub(crate) fn plan_messages(
    messages: &[Value],
    tools: Option<&[Value]>,
    tool_choice: Option<&Value>,
    rendering: &Rendering,
    template: Template,
) -> super::text::Output {
    let text = render(messages, tools, tool_choice, rendering, template);
    super::text::plan_chat(&parse(&text, template).expect("a rendered prompt reads back"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    #[test]
    fn a_render_reads_back_to_what_the_model_needs() {
        let tools =
            [json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})];
        let messages = [
            json!({"role": "developer", "content": "Be brief."}),
            json!({"role": "user", "content": [{"type": "text", "text": "call get_weather"}]}),
        ];
        let kwargs = Map::from_iter([("reasoning_effort".into(), json!("low"))]);
        let rendering = Template::DeepSeek.render(&kwargs);
        let text = render(
            &messages,
            Some(&tools),
            Some(&json!("required")),
            &rendering,
            Template::DeepSeek,
        );
        let p = parse(&text, Template::DeepSeek).expect("a chat prompt");
        assert_eq!(p.text, text);
        assert_eq!(
            p.messages,
            vec![
                Turn {
                    role: "system".into(),
                    content: "Be brief.".into()
                },
                Turn {
                    role: "user".into(),
                    content: "call get_weather".into()
                }
            ]
        );
        assert_eq!(p.tools.as_deref(), Some(&tools[..]));
        assert_eq!(p.tool_choice, Some(json!("required")));
        assert!(p.thinking);
        assert_eq!((p.effort_label.as_str(), p.reasoning_lines), ("50", 5));
    }

    #[test]
    fn a_default_render_is_the_plain_one() {
        let rendering = Template::Glm.render(&Map::new());
        let text = render(
            &[json!({"role": "user", "content": "hi"})],
            None,
            None,
            &rendering,
            Template::Glm,
        );
        assert_eq!(text, "<|user|>hi<|assistant|><think>");
        let p = parse(&text, Template::Glm).unwrap();
        assert_eq!((p.effort_label.as_str(), p.reasoning_lines), ("Max", 28));
        assert!(parse("<|user|>hi", Template::Glm).is_none());
    }
}
