//! The Responses API's stored state as OpenAI clients see it (docs/store.md): who owns a stored
//! response (`Caller::owner`: its key's digest), how a `previous_response_id` chain becomes the full input vLLM is sent, the
//! response object as it is stored and returned, and the `input_items` list with OpenAI's
//! pagination.

use serde_json::{json, Map, Value};

/// A Responses `input` as a list of items: a string is one user message.
pub(crate) fn input_items(input: &Value) -> Vec<Value> {
    match input {
        Value::String(text) => vec![json!({"type": "message", "role": "user", "content": text})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

/// The input a follow-up is generated from: the previous response's own full input, its
/// output (messages and tool calls; reasoning items are not sent back, as vLLM does), then the
/// follow-up's input. The previous turn's `instructions` do not carry over (OpenAI's rule):
/// they were never part of the stored input.
pub(crate) fn chained_input(prev_input: &Value, prev_response: &Value, input: &Value) -> Value {
    let mut items = input_items(prev_input);
    for item in prev_response["output"].as_array().into_iter().flatten() {
        if item["type"] != "reasoning" {
            items.push(item.clone());
        }
    }
    items.extend(input_items(input));
    Value::Array(items)
}

/// The response as stored and returned: what the client was sent, with the request's own
/// `previous_response_id` (the gateway removed it before vLLM). vLLM's response object has no
/// `store` field, and none is added.
pub(crate) fn as_stored(response: &mut Value, previous: Option<&str>) {
    if let Some(r) = response.as_object_mut() {
        r.insert(
            "previous_response_id".into(),
            previous.map_or(Value::Null, |p| json!(p)),
        );
    }
}

/// `DELETE /v1/responses/{id}`'s answer.
pub(crate) fn deleted(id: &str) -> Value {
    json!({"id": id, "object": "response", "deleted": true})
}

/// The item's id, or one made from its place (items sent without ids keep a stable one).
fn item_id(response_id: &str, at: usize, item: &Value) -> String {
    match item["id"].as_str() {
        Some(id) => id.to_owned(),
        None => format!("{}_item_{at}", response_id.trim_start_matches("resp_")),
    }
}

/// `GET /v1/responses/{id}/input_items`'s query, as OpenAI reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    pub(crate) limit: usize,
    pub(crate) ascending: bool,
    pub(crate) after: Option<String>,
}

impl Page {
    /// Reads `limit` (1..=100, default 20), `order` (`asc` or `desc`, default `desc`) and
    /// `after` from a query string; a bad value is named.
    pub(crate) fn parse(query: Option<&str>) -> Result<Page, (String, &'static str)> {
        let mut page = Page {
            limit: 20,
            ascending: false,
            after: None,
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_encoding::percent_decode_str(value)
                .decode_utf8_lossy()
                .into_owned();
            match key {
                "limit" => match value.parse::<usize>() {
                    Ok(n @ 1..=100) => page.limit = n,
                    _ => {
                        return Err((
                            format!("limit must be an integer from 1 to 100, not {value:?}"),
                            "limit",
                        ))
                    }
                },
                "order" => match value.as_str() {
                    "asc" => page.ascending = true,
                    "desc" => page.ascending = false,
                    _ => return Err((format!("order must be asc or desc, not {value:?}"), "order")),
                },
                "after" => page.after = Some(value),
                _ => {}
            }
        }
        Ok(page)
    }
}

/// One page of a stored response's input items, as OpenAI's list object.
pub(crate) fn input_items_page(response_id: &str, input: &Value, page: &Page) -> Value {
    let mut items: Vec<Value> = input_items(input)
        .into_iter()
        .enumerate()
        .map(|(at, mut item)| {
            let id = item_id(response_id, at, &item);
            if let Some(o) = item.as_object_mut() {
                o.insert("id".into(), json!(id));
            }
            item
        })
        .collect();
    if !page.ascending {
        items.reverse();
    }
    if let Some(after) = &page.after {
        match items.iter().position(|i| i["id"] == after.as_str()) {
            Some(at) => {
                items.drain(..=at);
            }
            None => items.clear(),
        }
    }
    let has_more = items.len() > page.limit;
    items.truncate(page.limit);
    let first = items.first().map_or(Value::Null, |i| i["id"].clone());
    let last = items.last().map_or(Value::Null, |i| i["id"].clone());
    json!({"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": has_more})
}

/// The request's fields with its chain resolved: `input` the full input, no
/// `previous_response_id`.
pub(crate) fn resolved_body(mut body: Map<String, Value>, input: Value) -> Map<String, Value> {
    body.remove("previous_response_id");
    body.insert("input".into(), input);
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_is_the_previous_input_its_output_then_the_new_input() {
        let prev_input = json!("Remember 7.");
        let prev = json!({"output": [
            {"type": "reasoning", "id": "rs_1", "content": []},
            {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "OK"}]},
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}
        ]});
        let next = json!([{"type": "function_call_output", "call_id": "c1", "output": "42"}]);
        let all = chained_input(&prev_input, &prev, &next);
        let types: Vec<&str> = all
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["message", "message", "function_call", "function_call_output"]);
        assert_eq!(all[0]["content"], "Remember 7.");
    }

    #[test]
    fn input_items_are_paged_as_openai_pages_them() {
        let input = json!([{"type": "message", "role": "user", "content": "a"},
                           {"type": "message", "role": "user", "content": "b", "id": "msg_b"},
                           {"type": "message", "role": "user", "content": "c"}]);
        let all = input_items_page("resp_x", &input, &Page::parse(None).unwrap());
        assert_eq!(all["data"][0]["content"], "c", "newest first by default");
        assert_eq!(all["has_more"], false);
        let asc = Page::parse(Some("order=asc&limit=1")).unwrap();
        let first = input_items_page("resp_x", &input, &asc);
        assert_eq!(first["data"].as_array().unwrap().len(), 1);
        assert_eq!(first["has_more"], true);
        assert_eq!(first["first_id"], "x_item_0");
        let after = Page::parse(Some("order=asc&after=x_item_0")).unwrap();
        let rest = input_items_page("resp_x", &input, &after);
        assert_eq!(rest["first_id"], "msg_b");
        assert_eq!(rest["last_id"], "x_item_2");
        assert!(Page::parse(Some("limit=0")).is_err());
        assert!(Page::parse(Some("order=up")).is_err());
    }
}
