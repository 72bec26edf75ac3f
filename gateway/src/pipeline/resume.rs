//! Continuing a cut stream (docs/resume.md): once the stream's group is lost, a task waits for
//! a group at the head of the queue (within RESUME_TIMEOUT), has vLLM render the request again
//! (its prompt must be the stream's, token for token), generates from the prompt plus every
//! token already sent, and has each new chunk derendered — vLLM's own reasoning and tool parsers
//! replaying the sent tokens first — into the client's chunks, which it hands to the relay. A
//! temperature-0 Messages or Responses stream is sent again instead, and its events spliced past
//! what the client got (`splice`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method};
use bytes::Bytes;
use eventsource_stream::Eventsource as _;
use futures_util::{FutureExt as _, StreamExt as _};
use http_body_util::BodyExt as _;
use metrics::{counter, histogram};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::hold::Held;
use super::splice::{Event, Sent, Splice};
use super::trace::Trace;
use crate::api::error::GatewayError;
use crate::api::resume::{client_chunk, usage_chunk, ReplayApi, Resumable, TokenApi, GENERATE_PATH};
use crate::app::App;
use crate::groups::{Group, Lost};
use crate::observe::{self, ResumeFailure};
use crate::quarantine::{Dispatched, Suspect, Verdict};

/// What the relay hands on: the client's next event, or why the stream ends.
pub(crate) type Feed = mpsc::Receiver<Result<Bytes, GatewayError>>;

/// A continuation's latest dispatch, shared with its relay.
pub(crate) type Dispatch = Arc<std::sync::Mutex<Option<Suspect>>>;

/// One continuation of a cut stream.
pub(crate) struct Continuation {
    pub(crate) app: Arc<App>,
    pub(crate) request_id: String,
    pub(crate) headers: HeaderMap,
    /// The request as it was forwarded (with `return_token_ids`).
    pub(crate) forward: Bytes,
    /// Its upstream route (where a replay is sent).
    pub(crate) path: &'static str,
    pub(crate) prefix: Option<u64>,
    /// Its model: the continuation waits for it (a stream cut by a swap's drain resumes once its
    /// model is loaded again).
    pub(crate) model: crate::api::models::ModelId,
    pub(crate) trace: Trace,
    /// The request as the poison guard judges it (absent when its group was not lost).
    pub(crate) suspect: Option<Suspect>,
    /// The continuation's own dispatch, as the poison guard would judge it: the relay takes it
    /// when the continuation is cut in turn.
    pub(crate) dispatch: Dispatch,
    pub(crate) cut_at: Instant,
}

/// Why a continuation failed, counted and told to the client.
fn failed(reason: ResumeFailure, detail: impl Into<String>) -> GatewayError {
    counter!(observe::RESUME_FAILURES, "reason" => reason.label()).increment(1);
    GatewayError::NotContinued(detail.into())
}

/// How one try at the continuation ended short of its end.
enum Short {
    /// Rank 0 could not be reached before anything of it went out (a rank that just died may
    /// still be the serving one for a moment): tried again on the group that comes up.
    NotReached(String),
    /// Cut after some of it went out: the relay continues again from what it recorded.
    Cut,
    /// A refusal: the stream ends with it.
    Failed(GatewayError),
}

impl From<GatewayError> for Short {
    fn from(e: GatewayError) -> Short {
        Short::Failed(e)
    }
}

/// Starts `c`; its events come on the feed.
pub(crate) fn start(c: Continuation) -> Feed {
    let (tx, rx) = mpsc::channel(64);
    sparkgate_task::spawn("stream-resume", async move {
        let mut c = c;
        let deadline = c.cut_at + c.app.resume_timeout;
        let outcome = match tokio::time::timeout_at(deadline.into(), c.run(&tx)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(failed(
                ResumeFailure::Timeout,
                format!(
                    "no rank group was ready within RESUME_TIMEOUT={}s",
                    c.app.resume_timeout.as_secs()
                ),
            )),
        };
        if let Err(e) = outcome {
            let _ = tx.send(Err(e)).await;
        }
    });
    rx
}

impl Continuation {
    async fn run(&mut self, tx: &mpsc::Sender<Result<Bytes, GatewayError>>) -> Result<(), GatewayError> {
        let judged = self.verdict().await?;
        loop {
            let held = self.slot().await?;
            let (group, epoch) = (held.shared_group(), held.group().epoch());
            if let Some((template, strikes)) = &judged {
                let dispatched = Dispatched::now(group.clone(), 1, true);
                *self.dispatch.lock().expect("dispatch") = Some(template.again(*strikes, dispatched));
            }
            match self.attempt(&group, tx).await {
                Ok(()) => {
                    // vLLM finished the continuation: its slots go back now.
                    drop(held.into_parts());
                    return Ok(());
                }
                Err(Short::NotReached(why)) => {
                    sparkgate_events::Event::ContinuationWaits {
                        request_id: self.request_id.clone(),
                        why: format!("rank 0 not reached: {why}"),
                    }
                    .emit();
                    drop(held);
                    group.lost_since(epoch).await;
                }
                Err(Short::Cut) => return Err(GatewayError::UpstreamBroke),
                Err(Short::Failed(e)) => return Err(e),
            }
        }
    }

    /// One try on `group`: from the token ids, or by replay.
    async fn attempt(&self, group: &Group, tx: &mpsc::Sender<Result<Bytes, GatewayError>>) -> Result<(), Short> {
        match self.trace.spec.kind {
            Resumable::Tokens(api) => self.by_tokens(api, group, tx).await,
            Resumable::Replay(api) => self.replay(api, group, tx).await,
        }
    }

    /// Render, generate, derender.
    async fn by_tokens(
        &self,
        api: TokenApi,
        group: &Group,
        tx: &mpsc::Sender<Result<Bytes, GatewayError>>,
    ) -> Result<(), Short> {
        let (generate, prompt) = self.generate_request(api, group).await?;
        let resp = group
            .upstream
            .send(Method::POST, GENERATE_PATH, &self.headers, &self.request_id, generate)
            .await
            .map_err(|e| Short::NotReached(format!("generate: {e}")))?;
        if !resp.status().is_success() {
            let body = read_whole(resp.into_body()).await;
            let detail = format!("generate answered {}", String::from_utf8_lossy(&body));
            return Err(failed(ResumeFailure::Upstream, detail).into());
        }
        counter!(observe::RESUMES).increment(1);
        histogram!(observe::RESUME_WAIT_SECONDS).record(self.cut_at.elapsed().as_secs_f64());
        self.relay(api, group, resp.into_body(), &prompt, tx).await
    }

    /// The request sent again as it was, its events spliced past what the client got.
    async fn replay(
        &self,
        api: ReplayApi,
        group: &Group,
        tx: &mpsc::Sender<Result<Bytes, GatewayError>>,
    ) -> Result<(), Short> {
        let resp = group
            .upstream
            .send(
                Method::POST,
                self.path,
                &self.headers,
                &self.request_id,
                self.forward.clone(),
            )
            .await
            .map_err(|e| Short::NotReached(format!("replay: {e}")))?;
        if !resp.status().is_success() {
            let body = read_whole(resp.into_body()).await;
            let detail = format!("the replay was answered {}", String::from_utf8_lossy(&body));
            return Err(failed(ResumeFailure::Upstream, detail).into());
        }
        counter!(observe::RESUMES).increment(1);
        histogram!(observe::RESUME_WAIT_SECONDS).record(self.cut_at.elapsed().as_secs_f64());
        let sent = self.trace.sent.clone().unwrap_or_else(|| Sent::new(api));
        let mut splice = Splice::new(sent);
        let mut events = http_body_util::BodyDataStream::new(resp.into_body()).eventsource();
        let mut out = false;
        let broke = |out: bool, why: String| if out { Short::Cut } else { Short::NotReached(why) };
        let mut wait = self.app.first_token_timeout;
        loop {
            let next = tokio::time::timeout(wait, events.next()).await;
            wait = self.app.idle_timeout;
            let Ok(next) = next else {
                return Err(broke(out, format!("no event within {}s", wait.as_secs())));
            };
            let Some(event) = next else { break };
            let event = event.map_err(|e| broke(out, format!("the replay's stream: {e}")))?;
            let name = (!event.event.is_empty() && event.event != "message").then(|| event.event.clone());
            let Ok(data) = serde_json::from_str(&event.data) else {
                continue;
            };
            let spliced = splice
                .next(Event::from_parts(name, data))
                .map_err(|m| Short::Failed(failed(ResumeFailure::SpliceMismatch, m.0)))?;
            if let Some(e) = spliced {
                if tx.send(Ok(e.to_bytes())).await.is_err() {
                    return Ok(());
                }
                out = true;
            }
        }
        splice
            .end()
            .map_err(|m| Short::Failed(failed(ResumeFailure::SpliceMismatch, m.0)))?;
        if !splice.finished() {
            return Err(broke(out, "the replay's stream ended before its finish".into()));
        }
        Ok(())
    }

    /// The poison guard: a request that crashed the engine is not sent into the next epoch.
    /// When its loss was judged, the request (to judge the continuation's own loss by) and its
    /// strikes so far.
    async fn verdict(&mut self) -> Result<Option<(Suspect, u32)>, GatewayError> {
        let Some(suspect) = self.suspect.take() else {
            return Ok(None);
        };
        let group = suspect.dispatched.group.clone();
        let Some(Lost::Failed(cause)) = group.lost_since(suspect.dispatched.epoch).await else {
            return Ok(None);
        };
        let template = suspect.again(suspect.strikes, suspect.dispatched.clone());
        let (verdict, strikes) = suspect.judge(cause).await;
        if matches!(verdict, Verdict::Quarantined(_)) {
            counter!(observe::RESUME_FAILURES, "reason" => ResumeFailure::Quarantined.label()).increment(1);
            return Err(GatewayError::RequestCrashedEngine {
                request_id: self.request_id.clone(),
                refused: None,
            });
        }
        Ok(Some((template, strikes)))
    }

    /// A slot on a group that serves, first in the queue; past QUEUE_TIMEOUT it queues again
    /// (RESUME_TIMEOUT bounds the whole wait).
    async fn slot(&self) -> Result<Held, GatewayError> {
        let admission = self.app.control.admission();
        loop {
            let mut permit = match admission.requeue_for(1, self.forward.len(), self.model).await {
                Ok(p) => p,
                Err(GatewayError::QueueTimeout { .. }) => continue,
                Err(e) => return Err(e),
            };
            if let Some(lease) = self
                .app
                .groups
                .lease(self.prefix, permit.take_reservation(), 1, self.model)
            {
                return Ok(Held::new(lease, permit));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Render the request again, check its prompt, and ask for the rest: the prompt plus the
    /// tokens sent, within what is left of `max_tokens`.
    async fn generate_request(&self, api: TokenApi, group: &Group) -> Result<(Bytes, Vec<u32>), Short> {
        let path = api.render_path();
        let rendered = call_json(group, path, &self.headers, &self.request_id, self.forward.clone()).await?;
        let mut generate = match rendered {
            Value::Array(mut list) if !list.is_empty() => list.swap_remove(0),
            other => other,
        };
        let prompt: Vec<u32> = ids(&generate["token_ids"]);
        if let Some(streamed) = &self.trace.prompt {
            if *streamed != prompt {
                return Err(Short::Failed(failed(
                    ResumeFailure::PromptMismatch,
                    format!(
                        "vLLM rendered {} prompt tokens where the stream had {}",
                        prompt.len(),
                        streamed.len()
                    ),
                )));
            }
        }
        let sent = self.trace.output.len() as u64;
        let mut tokens = prompt.clone();
        tokens.extend(&self.trace.output);
        generate["token_ids"] = json!(tokens);
        let max = generate["sampling_params"]["max_tokens"]
            .as_u64()
            .unwrap_or(api.default_max_tokens());
        generate["sampling_params"]["max_tokens"] = json!(max.saturating_sub(sent).max(1));
        generate["stream"] = json!(true);
        generate["return_token_ids"] = json!(true);
        Ok((Bytes::from(generate.to_string()), prompt))
    }

    /// Each generated chunk (those that arrived together, as one) derendered into the client's
    /// chunk; then the usage chunk and `[DONE]`.
    async fn relay(
        &self,
        kind: TokenApi,
        group: &Group,
        body: crate::upstream::UpstreamBody,
        prompt: &[u32],
        tx: &mpsc::Sender<Result<Bytes, GatewayError>>,
    ) -> Result<(), Short> {
        let mut template = self.trace.template_json();
        let mut state = self.trace.stream_state();
        let mut made = 0usize;
        let mut events = http_body_util::BodyDataStream::new(body).eventsource();
        let (mut finished, mut sent) = (false, false);
        // A break once something went out is a cut the relay continues from what it recorded.
        let broke = |sent: bool, why: String| if sent { Short::Cut } else { Short::NotReached(why) };
        // The continuation's own stream is held to STREAM_IDLE_TIMEOUT (FIRST_TOKEN_TIMEOUT for
        // its first event) like the stream it continues.
        let mut wait = self.app.first_token_timeout;
        while !finished {
            let next = tokio::time::timeout(wait, events.next()).await;
            wait = self.app.idle_timeout;
            let Ok(next) = next else {
                return Err(broke(sent, format!("no event within {}s", wait.as_secs())));
            };
            let Some(first) = next else { break };
            let Some(mut chunk) = event_json(first).map_err(|why| broke(sent, why))? else {
                break;
            };
            // Whatever else already arrived goes in the same derender call.
            while let Some(Some(more)) = events.next().now_or_never() {
                match event_json(more).map_err(|why| broke(sent, why))? {
                    Some(more) => merge(&mut chunk, more),
                    None => break,
                }
            }
            let chunk_ids = ids(&chunk["choices"][0]["token_ids"]);
            made += chunk_ids.len();
            finished = !chunk["choices"][0]["finish_reason"].is_null();
            let mut body = json!({"stream": true, "generate_chunk": chunk, "stream_state": state,
                "prompt_token_ids": prompt, "prompt_tokens": prompt.len()});
            body[kind.request_field()] = self.original();
            let out = call_json(
                group,
                kind.derender_path(),
                &self.headers,
                &self.request_id,
                Bytes::from(body.to_string()),
            )
            .await
            .map_err(|e| match e {
                Short::NotReached(why) => broke(sent, why),
                other => other,
            })?;
            state = out["stream_state"].clone();
            // Cut before any chunk reached the client: the derendered chunks are the stream's own.
            let template = template.get_or_insert_with(|| first_chunk(&out["chunk"]));
            if let Some(c) = client_chunk(template, &out["chunk"], &chunk_ids) {
                if tx.send(Ok(data_event(&c))).await.is_err() {
                    return Ok(());
                }
                sent = true;
            }
        }
        if !finished {
            return Err(broke(sent, "the continuation's stream ended before its finish".into()));
        }
        // Every stream upstream has its usage chunk (asked by the client, or by the gateway for
        // its accounting, then the relay drops it).
        let completion = self.trace.output.len() + made;
        if let Some(template) = &template {
            let _ = tx
                .send(Ok(data_event(&usage_chunk(template, prompt.len(), completion))))
                .await;
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
        Ok(())
    }

    /// The client's request as vLLM's derender reads it.
    fn original(&self) -> Value {
        serde_json::from_slice(&self.forward).unwrap_or(Value::Null)
    }
}

/// A chunk from generate, as JSON; `None` at its `[DONE]`; why not, when the stream broke.
fn event_json<E: std::fmt::Display>(event: Result<eventsource_stream::Event, E>) -> Result<Option<Value>, String> {
    let event = event.map_err(|e| format!("the continuation's stream: {e}"))?;
    if event.data == "[DONE]" {
        return Ok(None);
    }
    serde_json::from_str(&event.data)
        .map(Some)
        .map_err(|_| format!("generate sent {}", event.data))
}

/// `more`'s tokens and finish added to `chunk`.
fn merge(chunk: &mut Value, more: Value) {
    let mut tokens = ids(&chunk["choices"][0]["token_ids"]);
    tokens.extend(ids(&more["choices"][0]["token_ids"]));
    chunk["choices"][0]["token_ids"] = json!(tokens);
    for key in ["finish_reason", "stop_reason"] {
        if !more["choices"][0][key].is_null() {
            chunk["choices"][0][key] = more["choices"][0][key].clone();
        }
    }
}

/// A derendered chunk as the template of a stream nothing of which reached the client: its
/// prompt ids and text are vLLM's first chunk's only, and `null` unless asked.
fn first_chunk(chunk: &Value) -> Value {
    let mut c = chunk.clone();
    for key in ["prompt_token_ids", "prompt_text"] {
        if c.get(key).is_some() {
            c[key] = Value::Null;
        }
    }
    c
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| a.iter().filter_map(|x| x.as_u64().map(|n| n as u32)).collect())
        .unwrap_or_default()
}

fn data_event(chunk: &Value) -> Bytes {
    Bytes::from(format!("data: {chunk}\n\n"))
}

/// POSTs `body` to rank 0's `path` and reads the JSON answer: not reached when the request or
/// its answer broke, a refusal (a status, or not JSON) fails the continuation.
async fn call_json(
    group: &Group,
    path: &str,
    headers: &HeaderMap,
    request_id: &str,
    body: Bytes,
) -> Result<Value, Short> {
    let resp = group
        .upstream
        .send(Method::POST, path, headers, request_id, body)
        .await
        .map_err(|e| Short::NotReached(format!("{path}: {e}")))?;
    let ok = resp.status().is_success();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| Short::NotReached(format!("{path}: {e}")))?
        .to_bytes();
    if !ok {
        let detail = format!("{path} answered {}", String::from_utf8_lossy(&bytes));
        return Err(failed(ResumeFailure::Upstream, detail).into());
    }
    serde_json::from_slice(&bytes).map_err(|e| failed(ResumeFailure::Upstream, format!("{path}: {e}")).into())
}

async fn read_whole(body: crate::upstream::UpstreamBody) -> Bytes {
    body.collect().await.map(|c| c.to_bytes()).unwrap_or_default()
}
