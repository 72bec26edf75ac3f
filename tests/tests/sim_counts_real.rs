//! vllm-sim counts a prompt's tokens as the real frontend does: the same requests — tools, system
//! prompts, multi-turn conversations with tool calls and results, efforts — sent to the reference
//! fixture (vLLM's own frontend, both releases and profiles) and to vllm-sim give equal
//! `usage.prompt_tokens` (chat), `usage.input_tokens` (Messages, Responses), `count_tokens`,
//! `/tokenize`'s count and as many `prompt_token_ids`; completions count their prompt text alike.
//! The tokenizer the simulator counts with is the fixture's, checked here against the one the
//! fixture trains at start.

use serde_json::{json, Value};
use sparkgate_config::{ProfileId, VllmRelease};
use sparkgate_tests::conformance::start_sim;
use sparkgate_tests::http::request;
use sparkgate_tests::realvllm::{fixture_profile, plan_argv, test_config, RealVllm};

const SIM: &str = env!("CARGO_BIN_EXE_vllm-sim");

/// Text in and out of the fixture tokenizer's corpus, with a character of several bytes.
const PROSE: &str = "The scheduler admits requests in arrival order; zyxwv qqq — unseen words, 日本.";

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}})
}

fn anthropic_tool() -> Value {
    json!({"name": "get_weather", "description": "Current weather of a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

/// A conversation that called the tool and got its result.
fn with_tool_round() -> Value {
    json!([
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"},
        {"role": "user", "content": [{"type": "text", "text": "And should I take a coat?"}, {"type": "text", "text": "Be brief."}]}
    ])
}

/// `(name, path, body, where the count is)` for every case.
fn cases(model: &str) -> Vec<(&'static str, &'static str, Value, &'static str)> {
    let multi_turn = json!([
        {"role": "system", "content": "You answer questions about inference servers."},
        {"role": "user", "content": "What does the scheduler do?"},
        {"role": "assistant", "content": "It admits requests in arrival order."},
        {"role": "user", "content": "And the key value cache?"}
    ]);
    let chat = |messages: Value, extra: Value| {
        let mut b = json!({"model": model, "messages": messages, "max_tokens": 4});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    let anthropic_messages = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 degrees"},
            {"type": "text", "text": "Thanks. Anything else?"}]}
    ]);
    let anthropic = json!({"model": model, "max_tokens": 4, "system": [{"type": "text", "text": "You are terse. "},
        {"type": "text", "text": "Answer in English."}], "tools": [anthropic_tool()], "messages": anthropic_messages});
    let continued = json!([{"role": "user", "content": "What does the scheduler do?"},
        {"role": "assistant", "content": "The scheduler"}]);
    let thought = json!({"model": model, "max_tokens": 4, "system": "Be brief.", "messages": [
        {"role": "user", "content": "What is a hash map?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "The user asks about hash maps.", "signature": "s"},
            {"type": "text", "text": "A map from keys to values."}]},
        {"role": "user", "content": "And collisions?"}]});
    let mut thought_tools = thought.clone();
    thought_tools["tools"] = json!([anthropic_tool()]);
    let one_tool =
        json!({"model": model, "messages": [{"role": "user", "content": "Hello"}], "tools": [anthropic_tool()]});
    vec![
        (
            "chat plain",
            "/v1/chat/completions",
            chat(json!([{"role": "user", "content": "Hello there"}]), json!({})),
            "prompt_tokens",
        ),
        (
            "chat system multi-turn",
            "/v1/chat/completions",
            chat(multi_turn.clone(), json!({})),
            "prompt_tokens",
        ),
        (
            "chat tools multi-turn",
            "/v1/chat/completions",
            chat(multi_turn.clone(), json!({"tools": [weather_tool()]})),
            "prompt_tokens",
        ),
        (
            "chat tool round",
            "/v1/chat/completions",
            chat(with_tool_round(), json!({"tools": [weather_tool()]})),
            "prompt_tokens",
        ),
        (
            "chat effort low",
            "/v1/chat/completions",
            chat(
                with_tool_round(),
                json!({"tools": [weather_tool()], "reasoning_effort": "low"}),
            ),
            "prompt_tokens",
        ),
        (
            "chat no thinking",
            "/v1/chat/completions",
            chat(
                json!([{"role": "user", "content": "Hi"}]),
                json!({"chat_template_kwargs": {"enable_thinking": false, "thinking": false}}),
            ),
            "prompt_tokens",
        ),
        (
            "chat prompt_token_ids",
            "/v1/chat/completions",
            chat(
                with_tool_round(),
                json!({"tools": [weather_tool()], "return_token_ids": true}),
            ),
            "prompt_token_ids",
        ),
        (
            "tokenize messages",
            "/tokenize",
            // (not the tool round: vLLM's DeepSeek /tokenize fails to copy a message's
            // `tool_calls` or content parts, a 400 the simulator does not model)
            json!({"model": model, "messages": multi_turn.clone(), "tools": [weather_tool()]}),
            "count",
        ),
        (
            "completions",
            "/v1/completions",
            json!({"model": model, "prompt": PROSE, "max_tokens": 4}),
            "prompt_tokens",
        ),
        (
            "tokenize prompt",
            "/tokenize",
            json!({"model": model, "prompt": PROSE}),
            "count",
        ),
        (
            "chat continued",
            "/v1/chat/completions",
            chat(
                continued,
                json!({"continue_final_message": true, "add_generation_prompt": false}),
            ),
            "prompt_tokens",
        ),
        (
            "chat no generation prompt",
            "/v1/chat/completions",
            chat(
                json!([{"role": "user", "content": "Hi"}]),
                json!({"add_generation_prompt": false}),
            ),
            "prompt_tokens",
        ),
        (
            "messages thinking history",
            "/v1/messages",
            thought.clone(),
            "input_tokens",
        ),
        (
            "count_tokens thinking history with tools",
            "/v1/messages/count_tokens",
            thought_tools,
            "input_tokens",
        ),
        (
            "messages tools multi-turn",
            "/v1/messages",
            anthropic.clone(),
            "input_tokens",
        ),
        (
            "count_tokens tools multi-turn",
            "/v1/messages/count_tokens",
            anthropic,
            "input_tokens",
        ),
        (
            "count_tokens one tool",
            "/v1/messages/count_tokens",
            one_tool,
            "input_tokens",
        ),
        (
            "responses instructions",
            "/v1/responses",
            json!({"model": model, "instructions": "Be brief.", "input": "What is a key value cache?", "max_output_tokens": 16}),
            "input_tokens",
        ),
    ]
}

/// The prompt count an answer reports.
fn counted(addr: std::net::SocketAddr, path: &str, body: &Value, field: &str) -> Result<u64, String> {
    let r = request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    let v = r.json();
    let n = match field {
        "prompt_token_ids" => v[field].as_array().map(|ids| ids.len() as u64),
        _ if path.ends_with("count_tokens") || path == "/tokenize" => v[field].as_u64(),
        _ => v["usage"][field].as_u64(),
    };
    n.ok_or_else(|| format!("{} {}", r.status, r.text()))
}

#[test]
fn prompt_token_counts_equal_the_real_frontends() {
    let mut rows = Vec::new();
    for release in VllmRelease::ALL {
        let reals: Vec<(ProfileId, std::thread::JoinHandle<RealVllm>)> = ProfileId::ALL
            .into_iter()
            .map(|p| (p, std::thread::spawn(move || RealVllm::start(release, p))))
            .collect();
        for (profile, handle) in reals {
            let real = handle.join().expect("reference frontend starts");
            let trained = std::fs::read_to_string(real.model_dir().join("tokenizer.json")).unwrap();
            let committed = std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join(format!("realvllm/tokenizers/{}.json", fixture_profile(profile))),
            )
            .unwrap();
            assert!(
                trained == committed,
                "the committed {profile} tokenizer is the one the fixture trains"
            );
            let (_procs, sim) = start_sim(SIM, release, &plan_argv(profile, None));
            let model = test_config(profile, &[]).serving.served_model_name.clone();
            for (name, path, body, field) in cases(&model) {
                let want = counted(real.addr, path, &body, field);
                let got = counted(sim, path, &body, field);
                rows.push((format!("{release} {profile} {name}"), want, got));
            }
        }
    }
    let table: Vec<String> = rows
        .iter()
        .map(|(n, w, g)| format!("{n}: real {w:?}, sim {g:?}"))
        .collect();
    println!("{}", table.join("\n"));
    let wrong: Vec<&String> = rows
        .iter()
        .zip(&table)
        .filter(|((_, w, g), _)| w.is_err() || w != g)
        .map(|(_, line)| line)
        .collect();
    assert!(
        wrong.is_empty(),
        "counts differ:\n{}",
        wrong.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
    );
}
