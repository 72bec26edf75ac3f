//! The tool-call markup the simulated models write, in each profile's own syntax (as the
//! reference fixture's fake model writes it): DeepSeek's DSML block and GLM's `<tool_call>`
//! tags. The model writes a call as markup tokens; the parser reads the markup back into the
//! name and the arguments string the chat stream sends, so a continued stream parses the same
//! call from the same tokens.

use serde_json::{Map, Value};

use super::tools::ToolCall;

const DSML_OPEN: &str = "<\u{ff5c}DSML\u{ff5c}";
const DSML_CLOSE: &str = "</\u{ff5c}DSML\u{ff5c}";
const INVOKE: &str = "invoke name=\"";

/// Which markup a profile's tool parser reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syntax {
    /// `<｜DSML｜ calls>` … `<｜DSML｜ invoke name="N">` … `</｜DSML｜ calls>`.
    DeepSeek,
    /// `<tool_call>N<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`.
    Glm,
}

/// A value as the markup writes it: strings bare, everything else as JSON.
fn bare(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Syntax {
    /// The text that opens a call: the parser's cue that markup begins.
    pub(crate) fn opener(self) -> &'static str {
        match self {
            Syntax::DeepSeek => "<\u{ff5c}DSML\u{ff5c} calls>",
            Syntax::Glm => "<tool_call>",
        }
    }

    /// The markup of `call` (its arguments a JSON object, in their order).
    pub(crate) fn render(self, call: &ToolCall) -> String {
        let args: Map<String, Value> = serde_json::from_str(&call.arguments).unwrap_or_default();
        match self {
            Syntax::DeepSeek => {
                let params: Vec<String> = args
                    .iter()
                    .map(|(k, v)| {
                        format!(
                            "{DSML_OPEN} parameter name=\"{k}\" string=\"{}\">{}{DSML_CLOSE} parameter>",
                            v.is_string(),
                            bare(v)
                        )
                    })
                    .collect();
                format!(
                    "{DSML_OPEN} calls>\n{DSML_OPEN} {INVOKE}{}\">\n{}\n{DSML_CLOSE} invoke>\n{DSML_CLOSE} calls>",
                    call.name,
                    params.join("\n")
                )
            }
            Syntax::Glm => {
                let kv: String = args
                    .iter()
                    .map(|(k, v)| format!("<arg_key>{k}</arg_key><arg_value>{}</arg_value>", bare(v)))
                    .collect();
                format!("<tool_call>{}{kv}</tool_call>", call.name)
            }
        }
    }

    /// What `markup` (a call's text so far, from its opener) says: the name once it is
    /// complete, and the whole call once the markup is closed. `tools` types GLM's bare values
    /// (a property of type string stays a string).
    pub(crate) fn scan(self, markup: &str, tools: &[Value]) -> Scan {
        match self {
            Syntax::DeepSeek => scan_dsml(markup),
            Syntax::Glm => scan_glm(markup, tools),
        }
    }
}

/// A call's markup as far as it goes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Scan {
    /// The function name, once its text is complete.
    pub(crate) name: Option<String>,
    /// The arguments (a JSON object's text), once the markup is closed.
    pub(crate) arguments: Option<String>,
}

fn scan_dsml(markup: &str) -> Scan {
    let name = markup
        .split_once(INVOKE)
        .and_then(|(_, rest)| rest.split_once("\">"))
        .map(|(n, _)| n.to_owned());
    let closed = markup.ends_with(&format!("{DSML_CLOSE} calls>"));
    let arguments = closed.then(|| {
        let mut args = Map::new();
        let open = format!("{DSML_OPEN} parameter name=\"");
        for part in markup.split(&open).skip(1) {
            let Some((key, rest)) = part.split_once("\" string=\"") else {
                continue;
            };
            let Some((is_string, rest)) = rest.split_once("\">") else {
                continue;
            };
            let Some((raw, _)) = rest.split_once(&format!("{DSML_CLOSE} parameter>")) else {
                continue;
            };
            let value = match is_string {
                "true" => Value::String(raw.to_owned()),
                _ => serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned())),
            };
            args.insert(key.to_owned(), value);
        }
        Value::Object(args).to_string()
    });
    Scan { name, arguments }
}

/// Whether `tools` declares `key` of `function` a string.
fn is_string_property(tools: &[Value], function: &str, key: &str) -> bool {
    tools
        .iter()
        .find(|t| super::tools::tool_name(t) == Some(function))
        .and_then(|t| {
            t.get("function")
                .and_then(|f| f.get("parameters"))
                .or_else(|| t.get("parameters"))
        })
        .and_then(|p| {
            p.pointer(&format!(
                "/properties/{}/type",
                key.replace('~', "~0").replace('/', "~1")
            ))
        })
        .is_some_and(|ty| ty == "string")
}

fn scan_glm(markup: &str, tools: &[Value]) -> Scan {
    let body = markup.strip_prefix("<tool_call>").unwrap_or(markup);
    let name_end = [body.find("<arg_key>"), body.find("</tool_call>")]
        .into_iter()
        .flatten()
        .min();
    let name = name_end.map(|end| body[..end].to_owned());
    let closed = markup.ends_with("</tool_call>");
    let arguments = match (&name, closed) {
        (Some(function), true) => {
            let mut args = Map::new();
            for part in body.split("<arg_key>").skip(1) {
                let Some((key, rest)) = part.split_once("</arg_key><arg_value>") else {
                    continue;
                };
                let Some((raw, _)) = rest.split_once("</arg_value>") else {
                    continue;
                };
                let value = if is_string_property(tools, function, key) {
                    Value::String(raw.to_owned())
                } else {
                    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
                };
                args.insert(key.to_owned(), value);
            }
            Some(Value::Object(args).to_string())
        }
        _ => None,
    };
    Scan { name, arguments }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn markup_reads_back_to_the_same_call() {
        let tools = [
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "code": {"type": "string"}}}}}),
        ];
        let call = ToolCall {
            name: "get_weather".into(),
            arguments: json!({"city": "Paris", "days": 3, "code": "75"}).to_string(),
        };
        for syntax in [Syntax::DeepSeek, Syntax::Glm] {
            let text = syntax.render(&call);
            assert!(text.starts_with(syntax.opener()));
            let scan = syntax.scan(&text, &tools);
            assert_eq!(scan.name.as_deref(), Some("get_weather"), "{syntax:?}");
            assert_eq!(
                scan.arguments.as_deref(),
                Some(call.arguments.as_str()),
                "{syntax:?}: {text}"
            );
            let open = syntax.scan(&text[..text.len() - 3], &tools);
            assert_eq!(open.name.as_deref(), Some("get_weather"));
            assert_eq!(open.arguments, None, "not closed yet");
        }
        let glm = Syntax::Glm.render(&ToolCall {
            name: "calc".into(),
            arguments: "{}".into(),
        });
        assert_eq!(glm, "<tool_call>calc</tool_call>");
        assert_eq!(Syntax::Glm.scan(&glm, &[]).arguments.as_deref(), Some("{}"));
    }
}
