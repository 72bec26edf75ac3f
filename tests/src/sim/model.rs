//! The simulated model as a function of its prompt's tokens, as a model is at temperature 0:
//! a chat prompt (the template's render, read back) is answered with its plan; a prompt that is
//! a chat prompt followed by the start of that prompt's plan continues the plan token for
//! token; any other prompt is a completion prompt, continued alike. Nothing is remembered
//! between requests, so a generation cut and sent again as prompt plus emitted tokens — even
//! to a restarted rank — goes on exactly where it stopped.

use super::markup::Syntax;
use super::prompt;
use super::structured::Constraint;
use super::text::{self, Planned, Template};
use super::vocab;

/// The tool markup of a template's model.
pub(crate) fn syntax(template: Template) -> Syntax {
    match template {
        Template::DeepSeek => Syntax::DeepSeek,
        Template::Glm => Syntax::Glm,
    }
}

/// The plan of the rendered chat prompt `text`, structured output forced by `constraint`
/// after the reasoning (as vLLM's grammar starts when reasoning ends).
pub(crate) fn chat(template: Template, text: &str, constraint: Option<&Constraint>) -> Planned {
    match prompt::parse(text, template) {
        Some(p) => {
            let mut out = text::plan_chat(&p);
            if let Some(c) = constraint {
                out.constrain(c);
            }
            out.into_planned(p.thinking, syntax(template))
        }
        None => Planned {
            ids: text::completion_ids(text),
            call: None,
        },
    }
}

/// What the model generates after the prompt `ids`: the rest of the plan it continues, or a
/// new one.
pub(crate) fn continuation(template: Template, ids: &[u32], constraint: Option<&Constraint>) -> Planned {
    continue_chat(template, ids, constraint).unwrap_or_else(|| continue_completion(ids))
}

/// The rest of a chat plan: the prompt ends where a generation prompt (`<|assistant|>` and a
/// thinking marker) does, and everything after it is the start of that prompt's plan.
fn continue_chat(template: Template, ids: &[u32], constraint: Option<&Constraint>) -> Option<Planned> {
    let (assistant, think, think_end) = (vocab::assistant_id(), vocab::think_id(), vocab::think_end_id());
    let ends = (1..ids.len())
        .rev()
        .filter(|&i| ids[i - 1] == assistant && (ids[i] == think || ids[i] == think_end))
        .map(|i| i + 1);
    for end in ends {
        let text = vocab::text_of(&ids[..end]);
        if prompt::parse(&text, template).is_none() {
            continue;
        }
        let planned = chat(template, &text, constraint);
        if planned.ids.starts_with(&ids[end..]) {
            return Some(Planned {
                ids: planned.ids[ids.len() - end..].to_vec(),
                call: planned.call,
            });
        }
    }
    None
}

/// The rest of a completion: the prompt ends where the prose it is continued with begins (its
/// first token is always `The`), else the whole of `ids` is the prompt.
fn continue_completion(ids: &[u32]) -> Planned {
    let first = vocab::id_of("The");
    for j in (1..ids.len()).filter(|&j| Some(ids[j]) == first) {
        let plan = text::completion_ids(&vocab::text_of(&ids[..j]));
        if plan.starts_with(&ids[j..]) {
            return Planned {
                ids: plan[ids.len() - j..].to_vec(),
                call: None,
            };
        }
    }
    Planned {
        ids: text::completion_ids(&vocab::text_of(ids)),
        call: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::text::ToolCall;
    use serde_json::{json, Map};

    #[test]
    fn a_cut_plan_goes_on_where_it_stopped() {
        let tools = [
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}}}}),
        ];
        for template in [Template::DeepSeek, Template::Glm] {
            let rendering = template.render(&Map::new());
            for (messages, tools) in [
                (vec![json!({"role": "user", "content": "Explain decode"})], None),
                (
                    vec![json!({"role": "user", "content": "call get_weather for Paris"})],
                    Some(&tools[..]),
                ),
            ] {
                let text = prompt::render(&messages, tools, None, &rendering, template);
                let whole = chat(template, &text, None);
                let prompt_ids = vocab::tokenize(&text);
                assert_eq!(continuation(template, &prompt_ids, None), whole, "a fresh prompt");
                for k in [1, 5, whole.ids.len() - 1, whole.ids.len()] {
                    let mut ids = prompt_ids.clone();
                    ids.extend(&whole.ids[..k]);
                    let rest = continuation(template, &ids, None);
                    assert_eq!(rest.ids, whole.ids[k..], "{template:?} cut after {k}");
                }
                let called: Option<ToolCall> = whole.call.clone();
                assert_eq!(called.is_some(), tools.is_some());
            }
        }
    }

    #[test]
    fn a_cut_completion_goes_on_too() {
        let prompt_ids = vocab::tokenize("The gateway");
        let whole = continuation(Template::Glm, &prompt_ids, None);
        assert_eq!(whole.ids, text::completion_ids("The gateway"));
        let mut ids = prompt_ids.clone();
        ids.extend(&whole.ids[..7]);
        assert_eq!(continuation(Template::Glm, &ids, None).ids, whole.ids[7..]);
    }
}
