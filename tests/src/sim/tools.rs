//! Tool calling of the simulated model: which tool a turn calls and with what arguments —
//! enough for agent frameworks' happy path.

use serde_json::{json, Map, Value};

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCall {
    pub(crate) name: String,
    pub(crate) arguments: String,
}

/// The function name of an OpenAI tool entry (chat: `{type, function: {name, parameters}}`,
/// responses: `{type, name, parameters}`).
pub(crate) fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function")
        .and_then(|f| f.get("name"))
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
}

fn tool_parameters(tool: &Value) -> Option<&Value> {
    tool.get("function")
        .and_then(|f| f.get("parameters"))
        .or_else(|| tool.get("parameters"))
}

/// Picks the tool to call: a forced choice, `required`, or one whose name the prompt mentions.
pub(crate) fn choose(tools: &[Value], tool_choice: Option<&Value>, prompt: &str) -> Option<ToolCall> {
    let forced = tool_choice
        .and_then(|c| c.get("function").and_then(|f| f.get("name")).or_else(|| c.get("name")))
        .and_then(Value::as_str);
    let mode = tool_choice.and_then(Value::as_str).unwrap_or("auto");
    if mode == "none" {
        return None;
    }
    let lower = prompt.to_lowercase();
    let tool = match forced {
        Some(name) => tools.iter().find(|t| tool_name(t) == Some(name)),
        None => tools
            .iter()
            .find(|t| tool_name(t).is_some_and(|n| lower.contains(&n.to_lowercase())))
            .or_else(|| (mode == "required").then(|| tools.first()).flatten()),
    }?;
    Some(ToolCall {
        name: tool_name(tool)?.to_owned(),
        arguments: arguments_for(tool_parameters(tool), prompt).to_string(),
    })
}

/// Arguments that satisfy the schema's properties, filled from the prompt where possible.
fn arguments_for(schema: Option<&Value>, prompt: &str) -> Value {
    let mut args = Map::new();
    let Some(props) = schema.and_then(|s| s.get("properties")).and_then(Value::as_object) else {
        return Value::Object(args);
    };
    let capitalised = prompt
        .split(|c: char| !c.is_alphanumeric())
        .skip(1)
        .filter(|w| w.chars().next().is_some_and(char::is_uppercase))
        .last()
        .unwrap_or("example");
    let number = prompt
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .and_then(|n| n.parse::<i64>().ok())
        .unwrap_or(1);
    for (name, prop) in props {
        let value = match prop.get("type").and_then(Value::as_str) {
            Some("integer") => json!(number),
            Some("number") => json!(number as f64),
            Some("boolean") => json!(true),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => match prop.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
                Some(first) => first.clone(),
                None => json!(capitalised),
            },
        };
        args.insert(name.clone(), value);
    }
    Value::Object(args)
}

#[cfg(test)]
mod tests {
    use super::super::prompt::plan_messages;
    use super::super::text::Template;
    use serde_json::{json, Map, Value};

    #[test]
    fn tools_are_called_when_named_and_results_are_answered() {
        let tools = [
            json!({"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}),
        ];
        let r = Template::DeepSeek.render(&Map::from_iter([("enable_thinking".into(), json!(false))]));
        let out = plan_messages(
            &[json!({"role":"user","content":"Use get_weather for Paris please"})],
            Some(&tools),
            None,
            &r,
            Template::DeepSeek,
        );
        let call = out.tool_call.expect("tool call");
        assert_eq!(call.name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&call.arguments).unwrap(),
            json!({"city":"Paris"})
        );
        let after = plan_messages(
            &[json!({"role":"tool","content":"sunny, 21 degrees"})],
            Some(&tools),
            None,
            &r,
            Template::DeepSeek,
        );
        assert!(after.tool_call.is_none());
        assert!(after.content.concat().contains("sunny"));
    }
}
