//! DeepSeek V4.1's prompt as vLLM's `deepseek_v41` tokenizer mode encodes it
//! (`vllm/tokenizers/deepseek_v41.py` normalises the request's messages, then
//! `deepseek_v41_encoding.encode_messages`): ported for text messages, tools, tool calls and
//! results, and the effort line.

use serde_json::{json, Map, Value};

use super::{py_json, Conversation};
use crate::sim::changes::{since, Change};

const BOS: &str = "<｜begin▁of▁sentence｜>";
const EOS: &str = "<｜end▁of▁sentence｜>";
const USER: &str = "<｜User｜>";
const ASSISTANT: &str = "<｜Assistant｜>";
const SYSTEM: &str = "<｜System｜>";
const DSML: &str = "｜DSML｜";

/// `TOOLS_TEMPLATE` with its names filled in; `{tool_schemas}` is the one slot left.
const TOOLS_TEMPLATE: &str = include_str!("deepseek_tools.txt");

type Msg = Map<String, Value>;

/// How the encoder ends a prompt: 0.33's knows neither switch (a generation header follows
/// a final user turn); 0.34's takes `add_generation_prompt` and `continue_final_message`.
#[derive(Clone, Copy)]
struct Ending {
    generation_prompt: bool,
    continue_final: bool,
    /// 0.34's rules (a final assistant message also gets a header, unless continued).
    v034: bool,
}

/// The encoded prompt of `c` (`drop_thinking` on, as vLLM's default).
pub(super) fn render(c: &Conversation) -> String {
    let v034 = since(Change::DeepSeekContinueFinalMessage);
    let continue_final = v034 && c.continue_final;
    let ending = Ending {
        generation_prompt: !v034 || (c.add_generation_prompt && !continue_final),
        continue_final,
        v034,
    };
    let mut messages: Vec<Msg> = c.messages.iter().map(normalize).collect();
    if !c.tools.is_empty() {
        let at = match messages.iter().position(|m| role(m) == "system") {
            Some(at) => at,
            None => {
                messages.insert(
                    0,
                    Map::from_iter([("role".into(), json!("system")), ("content".into(), json!(""))]),
                );
                0
            }
        };
        messages[at].insert("tools".into(), Value::Array(c.tools.clone()));
    }
    let mut messages = merge_tool_messages(messages);
    let thinking = c.effort.is_some();
    let drop = !messages.iter().any(|m| m.get("tools").is_some_and(truthy));
    if thinking && drop {
        messages = drop_thinking_messages(messages);
    }
    let mut out = String::from(BOS);
    for i in 0..messages.len() {
        out.push_str(&render_message(i, &messages, c.effort.as_deref(), drop, ending));
    }
    out
}

fn role(m: &Msg) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or_default()
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Number(n) => n.as_f64() != Some(0.0),
    }
}

fn text<'a>(m: &'a Msg, key: &str) -> &'a str {
    m.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// `_normalize_messages`: `reasoning` as `reasoning_content`, content parts as their texts
/// joined by blank lines.
fn normalize(m: &Value) -> Msg {
    let mut m = m.as_object().cloned().unwrap_or_default();
    if let Some(r) = m.get("reasoning").cloned() {
        m.insert("reasoning_content".into(), r);
    }
    if let Some(Value::Array(_)) = m.get("content") {
        let joined = super::flat_text(m.get("content"), "\n\n");
        m.insert("content".into(), Value::String(joined));
    }
    m
}

/// `merge_tool_messages`: tool results become `tool_result` blocks of a user turn, and user
/// turns carry their text as blocks (consecutive ones merged).
fn merge_tool_messages(messages: Vec<Msg>) -> Vec<Msg> {
    let mut merged: Vec<Msg> = Vec::new();
    for mut m in messages {
        let blocks = match role(&m) {
            "tool" => vec![json!({"type": "tool_result", "content": m.get("content").cloned().unwrap_or(json!(""))})],
            "user" => vec![json!({"type": "text", "text": text(&m, "content")})],
            _ => {
                merged.push(m);
                continue;
            }
        };
        let is_tool = role(&m) == "tool";
        match merged.last_mut() {
            Some(last) if role(last) == "user" && (is_tool || last.get("task").is_none()) => {
                if let Some(Value::Array(b)) = last.get_mut("content_blocks") {
                    b.extend(blocks);
                }
            }
            _ if is_tool => merged.push(Map::from_iter([
                ("role".into(), json!("user")),
                ("content_blocks".into(), Value::Array(blocks)),
            ])),
            _ => {
                m.insert("content_blocks".into(), Value::Array(blocks));
                merged.push(m);
            }
        }
    }
    merged
}

/// `find_last_user_index`: the last user or developer turn (or later system message) with
/// text, not only tool results.
fn last_user_index(messages: &[Msg]) -> Option<usize> {
    messages.iter().enumerate().rev().find_map(|(i, m)| {
        let r = role(m);
        if !(r == "user" || r == "developer" || (r == "system" && i > 0)) {
            return None;
        }
        let only_results = m.get("content_blocks").and_then(Value::as_array).is_some_and(|b| {
            !b.is_empty()
                && !b
                    .iter()
                    .any(|b| matches!(b["type"].as_str(), Some("text" | "image" | "image_url")))
        });
        (!only_results).then_some(i)
    })
}

/// `_drop_thinking_messages`: before the last user turn only user, system and tool turns
/// stay, and assistant turns without their reasoning.
fn drop_thinking_messages(messages: Vec<Msg>) -> Vec<Msg> {
    let last = last_user_index(&messages).map_or(-1, |i| i as i64);
    let mut out = Vec::new();
    for (i, mut m) in messages.into_iter().enumerate() {
        let keep = matches!(
            role(&m),
            "user" | "system" | "tool" | "latest_reminder" | "direct_search_results"
        );
        if keep || i as i64 >= last {
            out.push(m);
        } else if role(&m) == "assistant" {
            m.remove("reasoning_content");
            out.push(m);
        }
    }
    out
}

/// `render_message` for message `index`.
fn render_message(index: usize, messages: &[Msg], effort: Option<&str>, drop: bool, ending: Ending) -> String {
    let m = &messages[index];
    let is_last = index + 1 == messages.len();
    let open_end = is_last && ending.continue_final;
    let last_user = last_user_index(messages).map_or(-1, |i| i as i64);
    let effort_line = match effort {
        Some(budget) if index == 0 => format!(
            "Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
        ),
        _ => String::new(),
    };
    let mut out = String::new();
    if index == 0 && (!effort_line.is_empty() || role(m) == "system") {
        out.push_str(SYSTEM);
    }
    out.push_str(&effort_line);
    let tools: Vec<Value> = m
        .get("tools")
        .and_then(Value::as_array)
        .map_or_else(Vec::new, |t| t.iter().map(|t| t["function"].clone()).collect());
    match role(m) {
        "system" => {
            if index > 0 {
                out.push_str(SYSTEM);
            }
            out.push_str(text(m, "content"));
            if !tools.is_empty() {
                out.push_str("\n\n");
                out.push_str(&render_tools(&tools));
            }
        }
        "developer" => {
            out.push_str(USER);
            out.push_str(text(m, "content"));
            if !tools.is_empty() {
                out.push_str("\n\n");
                out.push_str(&render_tools(&tools));
            }
        }
        "user" => {
            out.push_str(USER);
            out.push_str(&user_blocks(m));
        }
        "assistant" => {
            let thinking = effort.is_some() && (!drop || index as i64 > last_user);
            let (reasoning, content, calls) = (text(m, "reasoning_content"), text(m, "content"), tool_calls(m));
            if thinking {
                out.push_str(reasoning);
                // A continued turn that has only reasoning so far stays inside it.
                if !(open_end && !reasoning.is_empty() && content.is_empty() && calls.is_empty()) {
                    out.push_str("</think>");
                }
            }
            out.push_str(content);
            out.push_str(&calls);
            if !open_end {
                out.push_str(EOS);
            }
        }
        _ => {}
    }
    if is_last && !ending.generation_prompt {
        return out;
    }
    let next_role = messages.get(index + 1).map(role);
    if next_role.is_some_and(|r| r != "assistant" && r != "latest_reminder") {
        return out;
    }
    let final_answer = ending.v034 && is_last && role(m) == "assistant" && !open_end;
    if matches!(role(m), "user" | "developer") || (role(m) == "system" && index > 0) || final_answer {
        out.push_str(ASSISTANT);
        let open = effort.is_some() && (!drop || index as i64 >= last_user);
        out.push_str(if open { "<think>" } else { "</think>" });
    }
    out
}

/// A user turn's blocks joined by blank lines (tool results in `<tool_result>` tags).
fn user_blocks(m: &Msg) -> String {
    let blocks = m
        .get("content_blocks")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let parts: Vec<String> = blocks
        .iter()
        .map(|b| match b["type"].as_str() {
            Some("text") => b["text"].as_str().unwrap_or_default().to_owned(),
            Some("tool_result") => {
                let content = match &b["content"] {
                    Value::String(s) => s.clone(),
                    Value::Array(parts) => parts
                        .iter()
                        .map(|p| match p["type"].as_str() {
                            Some("text") => p["text"].as_str().unwrap_or_default().to_owned(),
                            other => format!("[Unsupported {}]", other.unwrap_or("None")),
                        })
                        .collect::<Vec<_>>()
                        .join("\n\n"),
                    _ => String::new(),
                };
                format!("<tool_result>{content}</tool_result>")
            }
            other => format!("[Unsupported {}]", other.unwrap_or("None")),
        })
        .collect();
    parts.join("\n\n")
}

/// `render_tools`: the instructions and each function's schema as a JSON line.
fn render_tools(functions: &[Value]) -> String {
    let schemas: Vec<String> = functions.iter().map(py_json).collect();
    TOOLS_TEMPLATE.replace("{tool_schemas}", &schemas.join("\n"))
}

/// An assistant turn's calls in DSML, after a blank line.
fn tool_calls(m: &Msg) -> String {
    let calls = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if calls.is_empty() {
        return String::new();
    }
    let invokes: Vec<String> = calls
        .iter()
        .map(|c| {
            let f = &c["function"];
            let args = match super::arguments(&f["arguments"]) {
                Value::Object(a) => a,
                _ => Map::from_iter([("arguments".into(), f["arguments"].clone())]),
            };
            let params: Vec<String> = args
                .iter()
                .map(|(k, v)| {
                    let (is_str, value) = match v {
                        Value::String(s) => ("true", s.clone()),
                        other => ("false", py_json(other)),
                    };
                    format!("<{DSML} parameter name=\"{k}\" string=\"{is_str}\">{value}</{DSML} parameter>")
                })
                .collect();
            let name = f["name"].as_str().unwrap_or_default();
            format!(
                "<{DSML} invoke name=\"{name}\">\n{}\n</{DSML} invoke>",
                params.join("\n")
            )
        })
        .collect();
    format!("\n\n<{DSML} calls>\n{}\n</{DSML} calls>", invokes.join("\n"))
}
