//! Deterministic "model" output: prompt rendering, reasoning as the chat template would shape
//! it, answers and tool calls, in the words of the simulator's vocabulary. Same input, same output, every time.

use serde_json::{Map, Value};

pub(crate) use super::tools::ToolCall;
use super::vocab::{split_tokens, WORDS};

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A small deterministic generator (xorshift) so runs repeat exactly.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Which chat template the simulated model has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Template {
    /// `low`=50, `high`=75 (default), `max`=100 or an integer 1..=100.
    DeepSeek,
    /// `low` or `high`; anything else (or nothing) renders Max.
    Glm,
}

/// What the chat template received, after vLLM's kwargs merge.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rendering {
    pub(crate) thinking: bool,
    /// The effort line the template renders (`75`, `High`, …).
    pub(crate) effort_label: String,
    /// How many reasoning lines the model thinks for (grows with effort).
    pub(crate) reasoning_lines: usize,
    /// Whether the reasoning parser separates the reasoning: vLLM's glm45 parser stops when
    /// `thinking` is false, while GLM's template (reading `enable_thinking`) still thinks — the
    /// reasoning and `</think>` then land in `content`.
    pub(crate) parsed: bool,
}

/// Jinja truthiness, which is what a template's `{% if enable_thinking %}` applies.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// The deepseek_v41 encoder's refusal of an effort it cannot render (vLLM answers it with 400).
pub(crate) const DEEPSEEK_EFFORT_ERROR: &str =
    "DeepSeek V4.1 reasoning_effort must be low, high, xhigh, max, or an integer within [1, 100] in chat_template_kwargs";

impl Template {
    /// The encoder's checks before rendering: DeepSeek accepts `low|high|xhigh|max`, `none`
    /// (thinking off) or a JSON integer 1..=100; GLM's jinja template takes any value.
    pub(crate) fn check(self, kwargs: &Map<String, Value>) -> Result<(), &'static str> {
        if self == Template::Glm {
            return Ok(());
        }
        match kwargs.get("reasoning_effort") {
            None | Some(Value::Null) => Ok(()),
            Some(Value::String(s)) if ["none", "low", "high", "xhigh", "max"].contains(&s.as_str()) => Ok(()),
            Some(Value::Number(n)) if n.as_i64().is_some_and(|v| (1..=100).contains(&v)) => Ok(()),
            Some(_) => Err(DEEPSEEK_EFFORT_ERROR),
        }
    }

    /// Renders the effort and thinking switch from the final template kwargs.
    pub(crate) fn render(self, kwargs: &Map<String, Value>) -> Rendering {
        let effort = kwargs.get("reasoning_effort");
        match self {
            Template::DeepSeek => {
                // The encoder thinks when either flag is truthy, or when neither is given.
                let flags: Vec<&Value> = ["thinking", "enable_thinking"]
                    .iter()
                    .filter_map(|k| kwargs.get(*k))
                    .collect();
                let thinking =
                    (flags.is_empty() || flags.iter().any(|v| truthy(v))) && effort != Some(&Value::from("none"));
                let value = match effort {
                    Some(Value::String(s)) if s == "low" => 50,
                    Some(Value::String(s)) if s == "max" => 100,
                    Some(Value::Number(n)) => n.as_u64().filter(|v| (1..=100).contains(v)).unwrap_or(75),
                    // "high", "xhigh", absent: 75.
                    _ => 75,
                };
                Rendering {
                    thinking,
                    parsed: true,
                    effort_label: value.to_string(),
                    reasoning_lines: (value as usize).div_ceil(10),
                }
            }
            Template::Glm => {
                let thinking = kwargs.get("enable_thinking").is_none_or(truthy);
                let (label, lines) = match effort.and_then(Value::as_str) {
                    Some("low") => ("Low", 3),
                    Some("high") => ("High", 6),
                    _ => ("Max", 28),
                };
                Rendering {
                    thinking,
                    parsed: kwargs.get("thinking").is_none_or(truthy),
                    effort_label: label.to_owned(),
                    reasoning_lines: lines,
                }
            }
        }
    }
}

/// Flattens chat messages into the prompt the template would render.
pub(crate) fn render_prompt(messages: &[Value], rendering: &Rendering) -> String {
    let mut out = String::new();
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        out.push_str(match role {
            "system" | "developer" => "<|system|>",
            "assistant" => "<|assistant|>",
            "tool" => "<|tool|>",
            _ => "<|user|>",
        });
        out.push_str(&content_text(m.get("content")));
    }
    out.push_str("<|assistant|>");
    if rendering.thinking {
        out.push_str("<think>");
    } else {
        out.push_str("</think>");
    }
    out
}

/// The text of a message's `content`: a string, or the text parts of a list.
pub(crate) fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str).or_else(|| p.as_str()))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The output plan of one sequence: reasoning tokens first, then content tokens.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Output {
    pub(crate) reasoning: Vec<String>,
    pub(crate) content: Vec<String>,
    pub(crate) tool_call: Option<ToolCall>,
}

fn reasoning_tokens(rendering: &Rendering, seed: u64) -> Vec<String> {
    let mut text = format!("Reasoning Effort: {}\n", rendering.effort_label);
    let openers = ["Considering", "Looking", "Checking", "Weighing", "Noting", "Recalling"];
    let mut rng = Rng::new(seed ^ 0x5eed);
    for i in 0..rendering.reasoning_lines {
        text.push_str(openers[i % openers.len()]);
        for _ in 0..5 {
            text.push(' ');
            text.push_str(WORDS[rng.below(60) as usize]);
        }
        text.push_str(".\n");
    }
    split_tokens(&text).into_iter().map(str::to_owned).collect()
}

/// The prose answer to `prompt`: deterministic, 64..=255 tokens, ending in a full stop.
fn prose(seed: u64) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let target = 64 + rng.below(192) as usize;
    let mut tokens = vec!["The".to_owned()];
    let mut since_stop = 1;
    while tokens.len() < target - 1 {
        if since_stop > 8 && rng.below(6) == 0 {
            tokens.push(".".into());
            tokens.push(format!(
                " {}",
                ["In", "Each", "When", "This", "We", "A"][rng.below(6) as usize]
            ));
            since_stop = 1;
        } else {
            tokens.push(format!(" {}", WORDS[rng.below(100) as usize]));
            since_stop += 1;
        }
    }
    tokens.push(".".into());
    tokens
}

impl Output {
    /// The answer a structured-output request forces (after the reasoning, as vLLM's grammar
    /// starts when reasoning ends).
    pub(crate) fn constrain(&mut self, c: &super::structured::Constraint) {
        self.content = split_tokens(&c.output()).into_iter().map(str::to_owned).collect();
        self.tool_call = None;
    }
}

/// Plans the output for a chat turn: reasoning (when thinking), then the answer or a tool call.
pub(crate) fn plan_chat(
    messages: &[Value],
    tools: Option<&[Value]>,
    tool_choice: Option<&Value>,
    rendering: &Rendering,
) -> Output {
    let prompt = render_prompt(messages, rendering);
    let seed = fnv(&prompt);
    let mut reasoning = if rendering.thinking {
        reasoning_tokens(rendering, seed)
    } else {
        Vec::new()
    };
    let mut leaked = Vec::new();
    if !rendering.parsed && !reasoning.is_empty() {
        leaked = std::mem::take(&mut reasoning);
        leaked.push("</think>".to_owned());
    }
    let last = messages.last();
    let last_role = last
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        .unwrap_or("user");
    // What the model answers: the last message, or after the assistant's own turn, the user's
    // before it (the fixture's model reads the text after the last user header).
    let asked = match last_role {
        "assistant" => messages
            .iter()
            .rev()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            .or(last),
        _ => last,
    };
    let last_text = content_text(asked.and_then(|m| m.get("content")));
    let mut out = if last_role == "tool" {
        let text = format!("The tool returned: {}", last_text.trim());
        Output {
            reasoning,
            content: split_tokens(&text).into_iter().map(str::to_owned).collect(),
            tool_call: None,
        }
    } else if let Some(call) = tools.and_then(|t| super::tools::choose(t, tool_choice, &last_text)) {
        Output {
            reasoning,
            content: Vec::new(),
            tool_call: Some(call),
        }
    } else {
        Output {
            reasoning,
            content: answer_tokens(&last_text, seed),
            tool_call: None,
        }
    };
    if !leaked.is_empty() {
        leaked.append(&mut out.content);
        out.content = leaked;
    }
    out
}

/// The answer tokens for a plain prompt.
pub(crate) fn answer_tokens(prompt: &str, seed: u64) -> Vec<String> {
    if prompt.replace(' ', "").contains("17*19") {
        return vec!["323".to_owned()];
    }
    if let Some(answer) = super::counting::answer(prompt) {
        return answer;
    }
    prose(seed)
}

pub(crate) fn plan_completion(prompt: &str) -> Vec<String> {
    prose(fnv(prompt))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_smoke_question_answers_323() {
        let r = Template::DeepSeek.render(&Map::from_iter([("enable_thinking".into(), json!(false))]));
        let msgs = [json!({"role":"user","content":"What is 17*19? Reply with the integer only."})];
        let out = plan_chat(&msgs, None, None, &r);
        assert!(out.reasoning.is_empty());
        assert_eq!(out.content, vec!["323"]);
    }

    #[test]
    fn templates_render_effort_like_the_guides() {
        let kw = |v: Value| Map::from_iter([("reasoning_effort".into(), v)]);
        assert_eq!(Template::DeepSeek.render(&Map::new()).effort_label, "75");
        assert_eq!(Template::DeepSeek.render(&kw(json!("low"))).effort_label, "50");
        assert_eq!(Template::DeepSeek.render(&kw(json!("max"))).effort_label, "100");
        assert_eq!(Template::DeepSeek.render(&kw(json!(33))).effort_label, "33");
        assert_eq!(Template::Glm.render(&Map::new()).effort_label, "Max");
        assert_eq!(Template::Glm.render(&kw(json!("medium"))).effort_label, "Max");
        assert_eq!(Template::Glm.render(&kw(json!("high"))).effort_label, "High");
        let high = Template::Glm.render(&kw(json!("high")));
        let max = Template::Glm.render(&Map::new());
        assert!(max.reasoning_lines > 4 * high.reasoning_lines);
        assert!(
            Template::Glm
                .render(&Map::from_iter([("thinking".into(), json!(false))]))
                .thinking,
            "GLM's template reads enable_thinking only"
        );
        assert!(
            Template::DeepSeek
                .render(&Map::from_iter([
                    ("thinking".into(), json!(true)),
                    ("enable_thinking".into(), json!(false))
                ]))
                .thinking,
            "the deepseek_v41 encoder thinks when either flag is set"
        );
        assert_eq!(
            Template::DeepSeek.check(&Map::from_iter([("reasoning_effort".into(), json!("medium"))])),
            Err(DEEPSEEK_EFFORT_ERROR)
        );
        assert_eq!(
            Template::DeepSeek.check(&Map::from_iter([("reasoning_effort".into(), json!("50"))])),
            Err(DEEPSEEK_EFFORT_ERROR)
        );
        assert_eq!(
            Template::DeepSeek.check(&Map::from_iter([("reasoning_effort".into(), json!(50))])),
            Ok(())
        );
        assert!(
            Template::Glm
                .render(&Map::from_iter([("enable_thinking".into(), json!("false"))]))
                .thinking,
            "Jinja truthiness"
        );
    }

    #[test]
    fn reasoning_first_line_names_the_effort() {
        let r = Template::Glm.render(&Map::from_iter([("reasoning_effort".into(), json!("low"))]));
        let out = plan_chat(&[json!({"role":"user","content":"hi"})], None, None, &r);
        assert!(out.reasoning.concat().starts_with("Reasoning Effort: Low\n"));
    }

    #[test]
    fn prose_is_deterministic_and_bounded() {
        let a = plan_completion("hello");
        assert_eq!(a, plan_completion("hello"));
        assert!((64..=255).contains(&a.len()), "{}", a.len());
        assert_eq!(a.concat().chars().last(), Some('.'));
    }
}
