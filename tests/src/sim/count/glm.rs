//! GLM's prompt as the fixture's chat template (`tests/realvllm/model_dir.py`, `GLM_TEMPLATE`)
//! renders it through transformers' jinja environment (`trim_blocks`, `lstrip_blocks`): the
//! text below is that template's output, written out.

use serde_json::Value;

use super::{py_json, Conversation};

const TOOLS_HEADER: &str =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n<tools>\n";

/// The rendered prompt of `c`.
pub(super) fn render(c: &Conversation) -> String {
    let mut out = String::from("[gMASK]<sop>");
    if !c.tools.is_empty() {
        out.push_str(TOOLS_HEADER);
        for t in &c.tools {
            out.push_str(&py_json(t));
            out.push('\n');
        }
        out.push_str("</tools>");
    }
    for m in &c.messages {
        message(m, &mut out);
    }
    if c.add_generation_prompt {
        if let Some(label) = &c.effort {
            out.push_str("<|system|>\nReasoning Effort: ");
            out.push_str(label);
        }
        out.push_str("<|assistant|>");
        out.push_str(if c.effort.is_some() { "<think>" } else { "</think>" });
    }
    if c.continue_final {
        continued(&mut out, c.messages.last());
    }
    out
}

/// transformers' `continue_final_message`: the render cut right after the final message's
/// text (its leading whitespace kept where the render kept it, its trailing cut).
fn continued(out: &mut String, last: Option<&Value>) {
    let text = match last.and_then(|m| m.get("content")) {
        Some(Value::Array(parts)) => parts.iter().rev().find_map(|p| p["text"].as_str()).unwrap_or_default(),
        Some(Value::String(s)) => s.as_str(),
        _ => "",
    };
    let Some(at) = out.rfind(text.trim()) else { return };
    let kept = text.trim_start();
    let end = if out[at..].starts_with(kept) {
        at + kept.len()
    } else {
        at + text.trim().len()
    };
    out.truncate(end);
}

/// One message of vLLM's conversation (content a string: the template's format is "string").
fn message(m: &Value, out: &mut String) {
    let content = super::flat_text(m.get("content"), "\n");
    match m.get("role").and_then(Value::as_str).unwrap_or("user") {
        "system" | "developer" => out.push_str(&format!("<|system|>\n{content}")),
        "user" => out.push_str(&format!("<|user|>\n{content}")),
        "assistant" => {
            out.push_str("<|assistant|>");
            match m.get("reasoning").and_then(Value::as_str) {
                Some(r) if !r.is_empty() => out.push_str(&format!("<think>{r}</think>")),
                _ => out.push_str("</think>"),
            }
            out.push_str(&content);
            for call in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                tool_call(call, out);
            }
        }
        "tool" => out.push_str(&format!("<|observation|>\n<tool_response>{content}</tool_response>")),
        other => out.push_str(&format!("<|{other}|>\n{content}")),
    }
}

/// A call as the template writes it: its arguments parsed to an object by vLLM
/// (`_postprocess_messages`), each as a key and a value (JSON unless a string).
fn tool_call(call: &Value, out: &mut String) {
    let f = &call["function"];
    out.push_str("<tool_call>");
    out.push_str(f["name"].as_str().unwrap_or_default());
    match super::arguments(&f["arguments"]) {
        Value::Object(args) => {
            for (k, v) in args {
                let v = v.as_str().map_or_else(|| py_json(&v), str::to_owned);
                out.push_str(&format!("<arg_key>{k}</arg_key><arg_value>{v}</arg_value>"));
            }
        }
        Value::String(s) => out.push_str(&s),
        other => out.push_str(&py_json(&other)),
    }
    out.push_str("</tool_call>");
}
