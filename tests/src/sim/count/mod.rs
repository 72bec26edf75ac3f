//! The prompt's token count as the real frontend with the reference fixture's model has it: the
//! chat prompt rendered as vLLM renders it for the profile (GLM's chat template, DeepSeek V4.1's
//! prompt encoder) and tokenized by the fixture's trained tokenizer. The simulator's own render
//! and ids (`prompt.rs`, `vocab.rs`) still carry what its model reads; these ids are what it
//! counts, prefills and caches.

mod deepseek;
mod glm;

use serde_json::{json, Map, Value};

use super::bpe::{self, Bpe};
use super::text::{Rendering, Template};

/// A chat request as vLLM hands it to the renderer.
pub(crate) struct Conversation {
    /// The request's messages (vLLM's conversation is derived from them per template).
    messages: Vec<Value>,
    /// The tools as `ChatCompletionToolsParam.model_dump()` writes them.
    tools: Vec<Value>,
    /// The effort label rendered when the template thinks (`None`: it does not).
    effort: Option<String>,
    /// `add_generation_prompt` and `continue_final_message` as the request gave them.
    add_generation_prompt: bool,
    continue_final: bool,
}

/// A chat request's prompt, as the renderer receives it.
pub(crate) struct ChatPrompt<'a> {
    pub(crate) messages: &'a [Value],
    pub(crate) tools: Option<&'a [Value]>,
    /// What the template makes of the request's kwargs (thinking and effort), whatever the
    /// prompt's ending.
    pub(crate) rendering: &'a Rendering,
    pub(crate) add_generation_prompt: bool,
    pub(crate) continue_final: bool,
}

impl ChatPrompt<'_> {
    /// The request's `add_generation_prompt` (default on) and `continue_final_message`.
    pub(crate) fn endings(req: &Map<String, Value>) -> (bool, bool) {
        let flag = |k: &str, default: bool| req.get(k).and_then(Value::as_bool).unwrap_or(default);
        (
            flag("add_generation_prompt", true),
            flag("continue_final_message", false),
        )
    }

    /// The prompt's token ids as the real frontend counts them.
    pub(crate) fn ids(&self, template: Template) -> Vec<u32> {
        let c = Conversation {
            messages: self.messages.to_vec(),
            tools: self.tools.unwrap_or_default().iter().map(dumped_tool).collect(),
            effort: self.rendering.thinking.then(|| self.rendering.effort_label.clone()),
            add_generation_prompt: self.add_generation_prompt,
            continue_final: self.continue_final,
        };
        let text = match template {
            Template::Glm => glm::render(&c),
            Template::DeepSeek => deepseek::render(&c),
        };
        tokenizer(template).encode(&text)
    }
}

/// The ids of a completion prompt's `text`, as the real frontend tokenizes it.
pub(crate) fn text_ids(template: Template, text: &str) -> Vec<u32> {
    tokenizer(template).encode(text)
}

/// The fixture's tokenizer of the profile (its `tokenizer.json`, committed beside the fixture).
fn tokenizer(template: Template) -> &'static Bpe {
    match template {
        Template::Glm => bpe::glm(),
        Template::DeepSeek => bpe::deepseek(),
    }
}

/// A tool as vLLM's `ChatCompletionToolsParam` dumps it: `type`, then `function` with `name`,
/// `description` and `parameters` (null when absent), `strict` and `defer_loading` only when set.
fn dumped_tool(t: &Value) -> Value {
    let f = &t["function"];
    let mut function = Map::new();
    function.insert("name".into(), f["name"].clone());
    function.insert("description".into(), f["description"].clone());
    function.insert("parameters".into(), f["parameters"].clone());
    let defer = t["defer_loading"].clone();
    for (key, v) in [
        ("strict", f["strict"].clone()),
        ("defer_loading", f["defer_loading"].clone()),
    ] {
        let v = if key == "defer_loading" && v.is_null() {
            defer.clone()
        } else {
            v
        };
        if !v.is_null() {
            function.insert(key.into(), v);
        }
    }
    let mut out = Map::from_iter([
        ("type".into(), json!("function")),
        ("function".into(), Value::Object(function)),
    ]);
    if !defer.is_null() {
        out.insert("defer_loading".into(), defer);
    }
    Value::Object(out)
}

/// A message's text: a string as it is, text parts joined by `sep`, nothing else.
fn flat_text(content: Option<&Value>, sep: &str) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| matches!(p["type"].as_str(), Some("text" | "input_text" | "output_text")))
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(sep),
        _ => String::new(),
    }
}

/// A call's arguments as the renderers read them: a JSON string parsed (twice at most, for
/// double-encoded ones), anything else as it is.
fn arguments(args: &Value) -> Value {
    let mut v = args.clone();
    for _ in 0..2 {
        match &v {
            Value::String(s) => match serde_json::from_str::<Value>(s) {
                Ok(parsed) => v = parsed,
                Err(_) => break,
            },
            _ => break,
        }
    }
    v
}

/// Python's `json.dumps(v, ensure_ascii=False)`: `", "` and `": "` between items, keys in
/// their order.
pub(crate) fn py_json(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("[{}]", items.iter().map(py_json).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), py_json(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids `tokenizers` (Python) gives for text that exercises every rule: added tokens, the
    /// pattern's whitespace and contractions, non-ASCII bytes.
    #[test]
    fn the_tokenizers_encode_as_hugging_faces() {
        let glm = "[gMASK]<sop><|system|>\n# Tools\n\nYou  may call one's functions  \n\n  {\"type\": \"function\", \"x\": 12.5e3}\n<think>Ünïcode 日本語 tab\there</think>  end  ";
        let ids = tokenizer(Template::Glm).encode(glm);
        assert_eq!(
            ids,
            [
                1, 2, 4, 208, 12, 230, 61, 88, 330, 92, 208, 208, 66, 88, 94, 230, 301, 357, 285, 288, 85, 302, 78, 16,
                92, 317, 375, 463, 633, 230, 230, 208, 208, 230, 543, 716, 280, 278, 79, 375, 463, 312, 307, 278, 97,
                280, 336, 27, 23, 30, 78, 28, 102, 208, 776, 137, 260, 87, 137, 117, 76, 371, 78, 230, 172, 255, 108,
                172, 260, 115, 174, 113, 262, 268, 74, 75, 207, 388, 777, 230, 338, 77, 230, 230
            ]
        );
        let deepseek = "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100)\n\n## Tools\n<｜DSML｜ calls>\n don't  I'll \r\n\t x<｜User｜>Hi 日本<｜Assistant｜><think>";
        assert_eq!(
            tokenizer(Template::DeepSeek).encode(deepseek),
            [
                0, 4, 667, 726, 38, 553, 542, 718, 339, 25, 435, 21, 211, 211, 15, 15, 233, 64, 91, 333, 95, 211, 40,
                781, 288, 291, 88, 95, 42, 211, 302, 277, 19, 96, 233, 383, 19, 88, 88, 233, 214, 211, 210, 233, 100,
                2, 52, 85, 233, 175, 258, 111, 175, 263, 118, 3, 779
            ]
        );
    }

    #[test]
    fn python_json_spaces_its_separators() {
        assert_eq!(
            py_json(&json!({"a": [1, "é"], "b": {}})),
            "{\"a\": [1, \"é\"], \"b\": {}}"
        );
    }
}
