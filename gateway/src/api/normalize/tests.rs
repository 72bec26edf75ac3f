//! Unit tests of the normaliser: extra_body, models, both profiles' effort and kwargs rules.

use super::*;
use serde_json::json;

fn ds() -> Normalizer {
    let map = [("minimal", "low"), ("medium", "high"), ("xhigh", "max")].map(|(a, b)| (a.to_owned(), b.to_owned()));
    Normalizer::new(ProfileId::DeepSeekV41Flash, "DS", &["ds".to_owned()], &map)
}

fn glm() -> Normalizer {
    let map = [("minimal", "low"), ("medium", "high"), ("xhigh", "max")].map(|(a, b)| (a.to_owned(), b.to_owned()));
    Normalizer::new(ProfileId::Glm53Flash, "GLM", &[], &map)
}

fn run(n: &Normalizer, api: Api, body: Value) -> Result<Normalized, GatewayError> {
    n.normalize(api, VllmRelease::V0_33, body.as_object().unwrap().clone(), None)
}

fn ok(n: &Normalizer, api: Api, body: Value) -> Value {
    Value::Object(run(n, api, body).unwrap_or_else(|e| panic!("{e}")).body)
}

#[test]
fn extra_body_is_flattened_like_the_sdk() {
    let out = run(
        &ds(),
        Api::Chat,
        json!({"messages": [], "top_k": 1, "chat_template_kwargs": {"a": 1},
               "extra_body": {"top_k": 5, "chat_template_kwargs": {"enable_thinking": false}, "extra_body": {"seed": 7}}}),
    )
    .unwrap();
    assert_eq!(out.repairs, vec![Repair::ExtraBody]);
    let b = Value::Object(out.body);
    assert_eq!(b["top_k"], 5, "extra_body keys override");
    assert_eq!(
        b["chat_template_kwargs"],
        json!({"a": 1, "enable_thinking": false}),
        "objects deep-merge"
    );
    assert_eq!(b["seed"], 7, "nested extra_body is flattened too");
    assert!(b.get("extra_body").is_none());
    let plain = run(&ds(), Api::Chat, json!({"messages": []})).unwrap();
    assert!(plain.repairs.is_empty());
    for bad in [json!("x"), json!([1]), json!(3)] {
        let e = run(&ds(), Api::Chat, json!({"messages": [], "extra_body": bad})).unwrap_err();
        assert_eq!(e.param(), Some("extra_body"));
    }
    let deep = json!({"extra_body": {"extra_body": {"extra_body": {"extra_body": {"extra_body": {"x": 1}}}}}});
    assert_eq!(run(&ds(), Api::Chat, deep).unwrap_err().param(), Some("extra_body"));
}

#[test]
fn model_aliases_and_defaults() {
    assert_eq!(ok(&ds(), Api::Chat, json!({"model": "ds"}))["model"], "DS");
    assert_eq!(ok(&ds(), Api::Chat, json!({}))["model"], "DS");
    assert_eq!(ok(&ds(), Api::Chat, json!({"model": null}))["model"], "DS");
    assert_eq!(ok(&ds(), Api::Chat, json!({"model": ""}))["model"], "DS");
    let e = run(&ds(), Api::Chat, json!({"model": "gpt-4", "stream": true})).unwrap_err();
    assert_eq!(
        e.to_string(),
        "The model `gpt-4` does not exist. Valid aliases: DS, ds."
    );
    // Not a string: left as sent, for vLLM's validation to refuse in its own words.
    assert_eq!(ok(&ds(), Api::Chat, json!({"model": 3}))["model"], 3);
}

#[test]
fn deepseek_efforts() {
    let n = ds();
    let chat = |extra: Value| {
        let mut b = json!({"messages": []});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        ok(&n, Api::Chat, b)
    };
    assert_eq!(chat(json!({"reasoning_effort": "high"}))["reasoning_effort"], "high");
    assert_eq!(chat(json!({"reasoning_effort": "max"}))["reasoning_effort"], "max");
    let b = chat(json!({"reasoning_effort": 33}));
    assert!(
        b.get("reasoning_effort").is_none(),
        "integers leave vLLM's literal field"
    );
    assert_eq!(b["chat_template_kwargs"]["reasoning_effort"], 33);
    assert_eq!(
        chat(json!({"reasoning_effort": "40"}))["chat_template_kwargs"]["reasoning_effort"],
        40
    );
    assert_eq!(chat(json!({"reasoning_effort": "medium"}))["reasoning_effort"], "high");
    assert_eq!(chat(json!({"reasoning_effort": "minimal"}))["reasoning_effort"], "low");
    assert_eq!(chat(json!({"reasoning_effort": "xhigh"}))["reasoning_effort"], "max");
    let off = chat(json!({"reasoning_effort": "none"}));
    assert_eq!(off["chat_template_kwargs"]["enable_thinking"], false);
    assert!(off.get("reasoning_effort").is_none());
    // Top-level wins over kwargs.
    let both = chat(json!({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": 90}}));
    assert_eq!(both["reasoning_effort"], "low");
    assert!(both["chat_template_kwargs"].get("reasoning_effort").is_none());
    assert_eq!(
        chat(json!({"chat_template_kwargs": {"reasoning_effort": "max"}}))["reasoning_effort"],
        "max"
    );
    for bad in [
        json!("extreme"),
        json!(0),
        json!(101),
        json!("150"),
        json!(true),
        json!(2.5),
    ] {
        let e = run(&n, Api::Chat, json!({"messages": [], "reasoning_effort": bad})).unwrap_err();
        assert_eq!(e.param(), Some("reasoning_effort"));
        assert!(
            e.to_string().contains("use low, high, max, none or an integer 1-100"),
            "{e}"
        );
    }
    let e = run(
        &n,
        Api::Chat,
        json!({"chat_template_kwargs": {"reasoning_effort": "turbo"}}),
    )
    .unwrap_err();
    assert_eq!(e.param(), Some("chat_template_kwargs.reasoning_effort"));
    assert_eq!(
        run(&n, Api::Chat, json!({"reasoning_effort": "medium"}))
            .unwrap()
            .effort_mapping,
        Some(("medium".into(), "high".into()))
    );
    assert_eq!(
        run(&n, Api::Chat, json!({"reasoning_effort": "high"}))
            .unwrap()
            .effort_mapping,
        None
    );
}

#[test]
fn glm_efforts() {
    let n = glm();
    assert_eq!(
        ok(&n, Api::Chat, json!({"reasoning_effort": "low"}))["reasoning_effort"],
        "low"
    );
    assert_eq!(
        ok(&n, Api::Chat, json!({"reasoning_effort": "max"}))["reasoning_effort"],
        "max"
    );
    assert_eq!(
        ok(&n, Api::Chat, json!({"reasoning_effort": "medium"}))["reasoning_effort"],
        "high"
    );
    for bad in [json!(50), json!("50"), json!("ultra")] {
        let e = run(&n, Api::Chat, json!({"reasoning_effort": bad})).unwrap_err();
        assert_eq!(e.param(), Some("reasoning_effort"));
        assert!(e.to_string().contains("use low, high, max or none"), "{e}");
    }
}

#[test]
fn responses_effort_travels_where_vllm_reads_it() {
    let n = ds();
    let b = ok(
        &n,
        Api::Responses,
        json!({"input": "x", "reasoning": {"effort": "high"}}),
    );
    assert_eq!(b["reasoning"]["effort"], "high");
    let b = ok(
        &n,
        Api::Responses,
        json!({"input": "x", "reasoning": {"effort": "max"}}),
    );
    assert!(b["reasoning"].get("effort").is_none());
    assert_eq!(b["chat_template_kwargs"]["reasoning_effort"], "max");
    let b = ok(
        &n,
        Api::Responses,
        json!({"input": "x", "reasoning": {"effort": "none"}}),
    );
    assert_eq!(b["chat_template_kwargs"]["enable_thinking"], false);
    let e = run(
        &n,
        Api::Responses,
        json!({"input": "x", "reasoning": {"effort": "extreme"}}),
    )
    .unwrap_err();
    assert_eq!(e.param(), Some("reasoning.effort"));
}

#[test]
fn chat_template_kwargs_rules() {
    let n = ds();
    // Not an object: left as sent (vLLM refuses it), with no effort translated into it.
    let out = ok(
        &n,
        Api::Chat,
        json!({"chat_template_kwargs": "x", "reasoning_effort": 30}),
    );
    assert_eq!(out["chat_template_kwargs"], "x");
    for (kw, needle) in [
        (
            json!({"enable_thinking": "false"}),
            "enable_thinking must be true or false",
        ),
        (json!({"thinking": 0}), "thinking must be true or false"),
        (json!({"chat_template": "{{x}}"}), "chat_template is not allowed"),
        (json!({"tokenize": true}), "tokenize is not allowed"),
    ] {
        let e = run(&n, Api::Chat, json!({"chat_template_kwargs": kw})).unwrap_err();
        assert_eq!(e.param(), Some("chat_template_kwargs"));
        assert!(e.to_string().contains(needle), "{e}");
    }
    let big: Map<String, Value> = (0..100).map(|i| (format!("k{i}"), json!(i))).collect();
    assert!(run(&n, Api::Chat, json!({"chat_template_kwargs": big})).is_err());
}

#[test]
fn an_empty_tools_list_is_dropped_on_0_33_only_which_refuses_it() {
    let n = ds();
    let body = json!({"messages": [], "tools": [], "tool_choice": "auto"});
    let on = |release| {
        n.normalize(Api::Chat, release, body.as_object().unwrap().clone(), None)
            .unwrap()
    };
    assert_eq!(on(VllmRelease::V0_33).repairs, vec![Repair::EmptyTools]);
    let out = on(VllmRelease::V0_34);
    assert!(out.repairs.is_empty(), "0.34 accepts `tools: []` itself");
    assert_eq!(
        (&out.body["tools"], &out.body["tool_choice"]),
        (&json!([]), &json!("auto"))
    );
}

#[test]
fn an_empty_tools_list_is_dropped_on_chat_with_a_choice_that_means_the_same() {
    let n = ds();
    for choice in [None, Some(json!("auto")), Some(json!("none")), Some(Value::Null)] {
        let mut body = json!({"messages": [], "tools": []});
        if let Some(c) = &choice {
            body["tool_choice"] = c.clone();
        }
        let out = run(&n, Api::Chat, body).unwrap();
        assert_eq!(out.repairs, vec![Repair::EmptyTools], "{choice:?}");
        assert!(out.body.get("tools").is_none(), "{choice:?}");
        assert!(out.body.get("tool_choice").is_none_or(Value::is_null), "{choice:?}");
    }
    // Nothing to choose from: left for vLLM to refuse.
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "f"}}),
    ] {
        let out = run(
            &n,
            Api::Chat,
            json!({"messages": [], "tools": [], "tool_choice": choice}),
        )
        .unwrap();
        assert!(out.repairs.is_empty() && out.body["tools"] == json!([]));
    }
    // Only on chat completions, and only an empty list.
    let out = run(&n, Api::Responses, json!({"input": "x", "tools": []})).unwrap();
    assert!(out.repairs.is_empty());
    let out = run(&n, Api::Chat, json!({"messages": [], "tools": [{"type": "function"}]})).unwrap();
    assert!(out.repairs.is_empty());
}

#[test]
fn streams_get_usage_for_accounting() {
    let n = ds();
    let out = run(&n, Api::Chat, json!({"stream": true})).unwrap();
    assert!(out.usage_injected);
    assert_eq!(out.body["stream_options"]["include_usage"], true);
    let out = run(
        &n,
        Api::Chat,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    )
    .unwrap();
    assert!(!out.usage_injected);
    let out = run(&n, Api::Chat, json!({"stream": false})).unwrap();
    assert!(!out.usage_injected && out.body.get("stream_options").is_none());
    // `stream` as vLLM's model coerces it; what it would refuse is left to it.
    for (stream, streams) in [(json!("yes"), true), (json!(1), true), (json!("off"), false)] {
        let out = run(&n, Api::Chat, json!({"stream": stream})).unwrap();
        assert_eq!(out.stream, streams, "{stream}");
    }
    let out = run(&n, Api::Chat, json!({"stream": "maybe"})).unwrap();
    assert!(!out.stream && out.body.get("stream_options").is_none());
    // Continuous usage counts only with include_usage in vLLM: turned off with the injection.
    let out = run(
        &n,
        Api::Chat,
        json!({"stream": true, "stream_options": {"continuous_usage_stats": true}}),
    )
    .unwrap();
    assert!(out.usage_injected);
    assert_eq!(
        out.body["stream_options"],
        json!({"continuous_usage_stats": false, "include_usage": true})
    );
    // A value vLLM refuses is left for it to refuse.
    for opts in [
        json!({"include_usage": "maybe"}),
        json!("yes"),
        json!({"continuous_usage_stats": 7}),
    ] {
        let out = run(&n, Api::Chat, json!({"stream": true, "stream_options": opts.clone()})).unwrap();
        assert!(!out.usage_injected, "{opts}");
        assert_eq!(out.body["stream_options"], opts);
    }
    let out = run(
        &n,
        Api::Completions,
        json!({"stream": true, "stream_options": {"include_usage": "no"}}),
    )
    .unwrap();
    assert!(out.usage_injected);
    assert_eq!(out.body["stream_options"]["include_usage"], true);
}

#[test]
fn alias_patterns_take_a_family_of_names() {
    assert!(alias_matches("claude-*", "claude-sonnet-4-5"));
    assert!(alias_matches("*-flash", "glm-flash"));
    assert!(alias_matches("gpt-4o", "gpt-4o"));
    assert!(!alias_matches("claude-*", "gpt-4"));
    assert!(!alias_matches("a*a", "a"), "head and tail may not overlap");
    let n = Normalizer::new(ProfileId::DeepSeekV41Flash, "DS", &["claude-*".to_owned()], &[]);
    let body = run(
        &n,
        Api::Messages,
        json!({"model": "claude-opus-4-1", "max_tokens": 5, "messages": []}),
    )
    .unwrap()
    .body;
    assert_eq!(body["model"], "DS");
    assert!(run(&n, Api::Messages, json!({"model": "gpt-4", "max_tokens": 5})).is_err());
}

#[test]
fn anthropic_effort_follows_the_profile() {
    let body =
        |effort: Value| json!({"model": "DS", "max_tokens": 5, "messages": [], "output_config": {"effort": effort}});
    let out = ok(&ds(), Api::Messages, body(json!("medium")));
    assert_eq!(
        out["output_config"]["effort"], "high",
        "DeepSeek cannot render medium: mapped"
    );
    let out = ok(&ds(), Api::Messages, body(json!(30)));
    assert_eq!(out["chat_template_kwargs"]["reasoning_effort"], 30);
    assert!(out["output_config"].get("effort").is_none());
    let out = ok(&ds(), Api::Messages, body(json!("none")));
    assert_eq!(out["thinking"], json!({"type": "disabled"}));
    let bare = Normalizer::new(ProfileId::DeepSeekV41Flash, "DS", &[], &[]);
    let e = run(&bare, Api::Messages, body(json!("medium"))).unwrap_err();
    assert_eq!(e.param(), Some("output_config.effort"));
    assert!(e.to_string().contains("low, high, max"), "{e}");
    let kw = json!({"model": "DS", "max_tokens": 5, "messages": [], "chat_template_kwargs": {"chat_template": "x"}});
    assert_eq!(
        run(&ds(), Api::Messages, kw).unwrap_err().param(),
        Some("chat_template_kwargs")
    );
}

#[test]
fn anthropic_effort_takes_chats_forms_in_output_config_and_in_the_kwargs() {
    let with = |extra: Value| {
        let mut b = json!({"model": "DS", "max_tokens": 5, "messages": []});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    // Integers and integer strings for DeepSeek, in either place, reach the kwargs as integers.
    for extra in [
        json!({"output_config": {"effort": 1}}),
        json!({"output_config": {"effort": "1"}}),
        json!({"chat_template_kwargs": {"reasoning_effort": 1}}),
        json!({"chat_template_kwargs": {"reasoning_effort": " 1 "}}),
    ] {
        let out = ok(&ds(), Api::Messages, with(extra.clone()));
        assert_eq!(out["chat_template_kwargs"]["reasoning_effort"], 1, "{extra}: {out}");
        assert!(
            out.get("output_config").is_none_or(|c| c.get("effort").is_none()),
            "{extra}: {out}"
        );
    }
    // A name in the kwargs moves to output_config, mapped as on chat.
    let out = ok(
        &ds(),
        Api::Messages,
        with(json!({"chat_template_kwargs": {"reasoning_effort": "medium"}})),
    );
    assert_eq!(out["output_config"]["effort"], "high", "{out}");
    assert!(out["chat_template_kwargs"].get("reasoning_effort").is_none(), "{out}");
    // output_config.effort wins over the kwargs, as vLLM merges them.
    let both = with(json!({"output_config": {"effort": "low"}, "chat_template_kwargs": {"reasoning_effort": 30}}));
    let out = ok(&ds(), Api::Messages, both);
    assert_eq!(out["output_config"]["effort"], "low", "{out}");
    assert!(out["chat_template_kwargs"].get("reasoning_effort").is_none(), "{out}");
    for bad in [
        json!({"output_config": {"effort": 101}}),
        json!({"chat_template_kwargs": {"reasoning_effort": 0}}),
    ] {
        let e = run(&ds(), Api::Messages, with(bad.clone())).unwrap_err();
        assert!(e.to_string().contains("an integer 1-100"), "{bad}: {e}");
    }
    // GLM takes no integers: refused with the accepted values.
    for bad in [
        json!({"output_config": {"effort": 30}}),
        json!({"chat_template_kwargs": {"reasoning_effort": "30"}}),
    ] {
        let mut body = with(bad.clone());
        body["model"] = json!(null);
        let e = run(&glm(), Api::Messages, body).unwrap_err();
        assert!(
            e.to_string().contains("not accepted by") && e.to_string().contains("none"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn sequences_count_every_sequence_a_request_runs() {
    let n = ds();
    let seqs = |api, body: Value, prompts| {
        n.normalize(api, VllmRelease::V0_33, body.as_object().unwrap().clone(), prompts)
            .unwrap()
            .sequences
    };
    assert_eq!(seqs(Api::Chat, json!({"n": 3}), None).total(), 3);
    // vLLM's lax integers count; what it refuses counts as one (vLLM answers it).
    for lax in [json!(2.0), json!("2"), json!(" 2 ")] {
        assert_eq!(seqs(Api::Chat, json!({"n": lax}), None).total(), 2, "{lax}");
    }
    for refused in [json!(0), json!(-1), json!("x"), json!(1.5), json!(null), json!([2])] {
        assert_eq!(seqs(Api::Chat, json!({"n": refused}), None).total(), 1, "{refused}");
    }
    assert_eq!(seqs(Api::Completions, json!({"n": 3}), Some(8)).total(), 24);
    assert_eq!(seqs(Api::Completions, json!({}), None).total(), 1);
    // A completions-shaped `/invocations` is a completion.
    assert_eq!(seqs(Api::Invocations, json!({"n": 2}), Some(4)).total(), 8);
    // A batch runs one sequence per conversation; vLLM refuses its `n` but 1 itself.
    let batch = json!({"messages": [[], [], []], "n": 2});
    assert_eq!(seqs(Api::Batch, batch, None).total(), 3);
    assert_eq!(seqs(Api::Messages, json!({"n": 5}), Some(9)).total(), 1);
    assert_eq!(seqs(Api::Responses, json!({"n": 5}), None).total(), 1);
    // Huge products saturate instead of wrapping under the capacity.
    let huge = json!({"n": 1_000_000_000_000u64});
    assert_eq!(seqs(Api::Completions, huge, Some(4)).total(), u32::MAX);
    let e = seqs(Api::Completions, json!({"n": 1}), Some(8)).refusal(2);
    assert_eq!(e.param(), Some("prompt"));
    assert!(e.to_string().contains("8 prompt(s) × n=1 needs 8 sequences"), "{e}");
    assert_eq!(
        seqs(Api::Batch, json!({"messages": [[], [], []]}), None)
            .refusal(2)
            .param(),
        Some("messages")
    );
}
