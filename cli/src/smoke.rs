//! `sparkgate smoke`: the guides' smoke request — 17*19 with thinking off — through the gateway,
//! reported as pass or fail with its latency.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use sparkgate_config::Config;

const QUESTION: &str = "What is 17*19? Answer with the number only.";
const ANSWER: &str = "323";

pub(super) fn run(config: &Config, url: Option<&str>, timeout: Duration) -> anyhow::Result<ExitCode> {
    let base = url
        .map(str::to_owned)
        .unwrap_or_else(|| super::https::local_base(config))
        .trim_end_matches('/')
        .to_owned();
    let endpoint = format!("{base}/v1/chat/completions");
    let body = json!({
        "model": config.serving.served_model_name,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 64,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": false},
    });
    let api_key = std::env::var("OPENAI_API_KEY")
        .ok()
        .filter(|k| !k.is_empty())
        .or_else(|| config.secrets.api_keys.first().map(|k| k.key.expose().to_owned()));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let started = Instant::now();
    let outcome = runtime.block_on(async {
        let client = super::https::client_for(&endpoint)?;
        let mut req = hyper::Request::post(&endpoint).header("content-type", "application/json");
        if let Some(k) = &api_key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let req = req.body(Full::new(Bytes::from(body.to_string())))?;
        let call = async {
            let resp = client
                .request(req)
                .await
                .map_err(|e| anyhow::anyhow!("nothing answers at {endpoint} ({e}); is sparkgate serving?"))?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, bytes))
        };
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| anyhow::anyhow!("no answer from {endpoint} within {} s", timeout.as_secs()))?
    });
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    let (status, bytes) = match outcome {
        Ok(r) => r,
        Err(e) => {
            println!("smoke: FAIL after {elapsed_ms:.0} ms: {e:#}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if !status.is_success() {
        let message = v["error"]["message"].as_str().unwrap_or("no detail");
        println!("smoke: FAIL after {elapsed_ms:.0} ms: HTTP {status}: {message}");
        return Ok(ExitCode::FAILURE);
    }
    let content = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
    if content.contains(ANSWER) {
        println!("smoke: pass in {elapsed_ms:.0} ms: 17*19 = {}", content.trim());
        Ok(ExitCode::SUCCESS)
    } else {
        println!("smoke: FAIL after {elapsed_ms:.0} ms: expected {ANSWER}, the model answered {content:?}");
        Ok(ExitCode::FAILURE)
    }
}
