//! Deterministic "model" output: prompt rendering, reasoning as the chat template would shape
//! it, answers and tool calls, in the words of the simulator's vocabulary. Same input, same output, every time.

use serde_json::{Map, Value};

use super::markup::Syntax;
pub(crate) use super::tools::ToolCall;
use super::vocab::{split_tokens, tokenize, WORDS};

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

    /// The effort label the template renders when nothing else is asked.
    pub(crate) fn default_label(self) -> &'static str {
        match self {
            Template::DeepSeek => "75",
            Template::Glm => "Max",
        }
    }

    /// How many reasoning lines the model thinks for at effort `label` (more for higher
    /// efforts; GLM's Max is 4.7 times its High).
    pub(crate) fn lines_for(self, label: &str) -> usize {
        match self {
            Template::DeepSeek => label.trim().parse::<usize>().unwrap_or(75).min(100).div_ceil(10),
            Template::Glm => match label {
                "Low" => 3,
                "High" => 6,
                _ => 28,
            },
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
                    reasoning_lines: self.lines_for(&value.to_string()),
                }
            }
            Template::Glm => {
                let thinking = kwargs.get("enable_thinking").is_none_or(truthy);
                let label = match effort.and_then(Value::as_str) {
                    Some("low") => "Low",
                    Some("high") => "High",
                    _ => "Max",
                };
                Rendering {
                    thinking,
                    parsed: kwargs.get("thinking").is_none_or(truthy),
                    effort_label: label.to_owned(),
                    reasoning_lines: self.lines_for(label),
                }
            }
        }
    }
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

/// One message as the prompt holds it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Turn {
    pub(crate) role: String,
    pub(crate) content: String,
}

/// What the model reads off a rendered chat prompt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChatPrompt {
    /// The prompt's text (its hash seeds the model's prose).
    pub(crate) text: String,
    pub(crate) messages: Vec<Turn>,
    pub(crate) tools: Option<Vec<Value>>,
    pub(crate) tool_choice: Option<Value>,
    pub(crate) thinking: bool,
    /// The effort the template rendered (`75`, `High`, …).
    pub(crate) effort_label: String,
    /// How many reasoning lines that effort thinks for.
    pub(crate) reasoning_lines: usize,
}

/// The output plan of one sequence: reasoning tokens first, then content tokens.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Output {
    pub(crate) reasoning: Vec<String>,
    pub(crate) content: Vec<String>,
    pub(crate) tool_call: Option<ToolCall>,
}

fn reasoning_tokens(prompt: &ChatPrompt, seed: u64) -> Vec<String> {
    let mut text = format!("Reasoning Effort: {}\n", prompt.effort_label);
    let openers = ["Considering", "Looking", "Checking", "Weighing", "Noting", "Recalling"];
    let mut rng = Rng::new(seed ^ 0x5eed);
    for i in 0..prompt.reasoning_lines {
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

/// Plans the output for a chat turn from its prompt: reasoning (when the prompt opens it),
/// then the answer or a tool call.
pub(crate) fn plan_chat(prompt: &ChatPrompt) -> Output {
    let seed = fnv(&prompt.text);
    let reasoning = if prompt.thinking {
        reasoning_tokens(prompt, seed)
    } else {
        Vec::new()
    };
    let last = prompt.messages.last();
    let last_role = last.map_or("user", |m| m.role.as_str());
    // What the model answers: the last message, or after the assistant's own turn, the user's
    // before it (the fixture's model reads the text after the last user header).
    let asked = match last_role {
        "assistant" => prompt.messages.iter().rev().find(|m| m.role == "user").or(last),
        _ => last,
    };
    let last_text = asked.map_or("", |m| m.content.as_str());
    if last_role == "tool" {
        let text = format!("The tool returned: {}", last_text.trim());
        return Output {
            reasoning,
            content: split_tokens(&text).into_iter().map(str::to_owned).collect(),
            tool_call: None,
        };
    }
    let tools = prompt.tools.as_deref();
    if let Some(call) = tools.and_then(|t| super::tools::choose(t, prompt.tool_choice.as_ref(), last_text)) {
        return Output {
            reasoning,
            content: Vec::new(),
            tool_call: Some(call),
        };
    }
    let content = match recall(&prompt.messages, last_text) {
        Some(text) => split_tokens(&text).into_iter().map(str::to_owned).collect(),
        None => answer_tokens(last_text, seed),
    };
    Output {
        reasoning,
        content,
        tool_call: None,
    }
}

/// "Which numbers did I say?" answered from the whole conversation the prompt holds: every
/// "remember the number N" of its user turns, in order — the test of a conversation sent whole
/// (the reference fixture's model answers it the same way).
fn recall(messages: &[Turn], asked: &str) -> Option<String> {
    if !asked.contains("Which numbers did I say?") {
        return None;
    }
    let numbers: Vec<String> = messages
        .iter()
        .filter(|m| m.role == "user")
        .filter_map(|m| {
            let (_, rest) = m.content.split_once("remember the number ")?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            (!digits.is_empty()).then_some(digits)
        })
        .collect();
    Some(format!("You said: {}.", numbers.join(", ")))
}

/// A sequence's planned output as token ids: everything the model generates after its
/// prompt, the end-of-sequence token aside.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Planned {
    pub(crate) ids: Vec<u32>,
    /// The call the ids end with, written as the profile's markup.
    pub(crate) call: Option<ToolCall>,
}

impl Output {
    /// The tokens the model writes: the reasoning and `</think>` when it thought, the answer,
    /// then the call in `syntax`'s markup.
    pub(crate) fn into_planned(self, thinking: bool, syntax: Syntax) -> Planned {
        let mut ids: Vec<u32> = self.reasoning.iter().flat_map(|t| tokenize(t)).collect();
        if thinking {
            ids.push(super::vocab::think_end_id());
        }
        ids.extend(self.content.iter().flat_map(|t| tokenize(t)));
        if let Some(call) = &self.tool_call {
            ids.extend(tokenize(&syntax.render(call)));
        }
        Planned {
            ids,
            call: self.tool_call,
        }
    }
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

/// The completion of `prompt` as token ids.
pub(crate) fn completion_ids(prompt: &str) -> Vec<u32> {
    plan_completion(prompt).iter().flat_map(|t| tokenize(t)).collect()
}

#[cfg(test)]
mod tests {
    use super::super::prompt::plan_messages;
    use super::*;
    use serde_json::json;

    #[test]
    fn the_smoke_question_answers_323() {
        let r = Template::DeepSeek.render(&Map::from_iter([("enable_thinking".into(), json!(false))]));
        let msgs = [json!({"role":"user","content":"What is 17*19? Reply with the integer only."})];
        let out = plan_messages(&msgs, None, None, &r, Template::DeepSeek);
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
        let out = plan_messages(&[json!({"role":"user","content":"hi"})], None, None, &r, Template::Glm);
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
