//! A generation in flight: each choice's planned tokens, their submission to the engine, and
//! the deltas the engine's steps release.

use axum::http::StatusCode;
use tokio::sync::mpsc;

use super::{error, ApiError, App};
use crate::sim::engine::{Event, Refused, Submission, ENGINE_DEAD};
use crate::sim::metrics::Finished;
use crate::sim::text::{self, Output, ToolCall};
use crate::sim::vocab;

/// One choice's output plan and how much of it has been released.
#[derive(Debug)]
pub(crate) struct ChoicePlan {
    tokens: Vec<String>,
    reasoning_len: usize,
    /// Tokens of the trailing tool call (released as one tool-call delta at the end).
    tool_tokens: usize,
    pub(crate) tool_call: Option<ToolCall>,
    pub(crate) finish: &'static str,
    /// The stop string that ended the output.
    pub(crate) stop_reason: Option<String>,
    produced: usize,
}

/// What one engine step released for a choice.
#[derive(Debug, Default)]
pub(crate) struct Delta {
    pub(crate) reasoning: String,
    pub(crate) content: String,
    /// The choice's last token was released with this step.
    pub(crate) last: bool,
    /// The text tokens released (for logprobs).
    pub(crate) tokens: Vec<String>,
}

impl ChoicePlan {
    /// Fits `out` into `budget` output tokens; `ignore_eos` keeps generating up to the budget.
    pub(crate) fn new(out: Output, budget: usize, ignore_eos: bool, min_tokens: usize) -> Self {
        let reasoning_len = out.reasoning.len();
        let mut tokens = out.reasoning;
        tokens.extend(out.content);
        let tool_tokens = out
            .tool_call
            .as_ref()
            .map_or(0, |c| vocab::count_tokens(&c.arguments) + 1);
        let floor = if ignore_eos { budget } else { min_tokens.min(budget) };
        if out.tool_call.is_none() && tokens.len() < floor {
            let filler = text::plan_completion(&tokens.concat());
            let mut i = 0;
            while tokens.len() < floor {
                tokens.push(filler[i % filler.len()].clone());
                i += 1;
            }
        }
        let natural = tokens.len() + tool_tokens;
        let (tool_call, finish) = if natural > budget || (ignore_eos && out.tool_call.is_none()) {
            // ignore_eos runs to the budget: vLLM reports that as a length stop.
            tokens.truncate(budget);
            (None, "length")
        } else if out.tool_call.is_some() {
            (out.tool_call, "tool_calls")
        } else {
            (None, "stop")
        };
        let tool_tokens = if tool_call.is_some() { tool_tokens } else { 0 };
        Self {
            tokens,
            reasoning_len,
            tool_tokens,
            tool_call,
            finish,
            stop_reason: None,
            produced: 0,
        }
    }

    /// Stop strings (vLLM's detokenizer): the output ends before the first one that appears,
    /// with finish `stop` and the string as `stop_reason`.
    pub(crate) fn apply_stop(&mut self, stops: &[String]) {
        if stops.is_empty() {
            return;
        }
        let mut text = String::new();
        for i in 0..self.tokens.len() {
            let before = text.len();
            text.push_str(&self.tokens[i]);
            let hit = stops
                .iter()
                .filter_map(|s| text.find(s.as_str()).map(|at| (at, s)))
                .min_by_key(|(at, _)| *at);
            if let Some((at, stop)) = hit {
                self.tokens[i] = text[before.min(at)..at].to_owned();
                self.tokens.truncate(i + 1);
                self.tool_call = None;
                self.tool_tokens = 0;
                self.finish = "stop";
                self.stop_reason = Some(stop.clone());
                return;
            }
        }
    }

    pub(crate) fn total(&self) -> usize {
        self.tokens.len() + self.tool_tokens
    }

    pub(crate) fn reasoning_text(&self) -> Option<String> {
        (self.reasoning_len > 0).then(|| self.tokens[..self.reasoning_len.min(self.tokens.len())].concat())
    }

    /// The text tokens released so far.
    pub(crate) fn released(&self) -> &[String] {
        &self.tokens[..self.produced.min(self.tokens.len())]
    }

    pub(crate) fn content_text(&self) -> String {
        self.tokens[self.reasoning_len.min(self.tokens.len())..].concat()
    }

    fn release(&mut self, n: usize) -> Delta {
        let start = self.produced;
        self.produced = (self.produced + n).min(self.total());
        let text_end = self.produced.min(self.tokens.len());
        let mut d = Delta {
            last: self.produced == self.total(),
            ..Delta::default()
        };
        for i in start.min(text_end)..text_end {
            d.tokens.push(self.tokens[i].clone());
            if i < self.reasoning_len {
                d.reasoning.push_str(&self.tokens[i]);
            } else {
                d.content.push_str(&self.tokens[i]);
            }
        }
        d
    }

    fn metric_finish(&self) -> Finished {
        if self.finish == "length" {
            Finished::Length
        } else {
            Finished::Stop
        }
    }
}

/// A request's choices, submitted to the engine.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) choices: Vec<ChoicePlan>,
    pub(crate) prompt_tokens: usize,
    /// Prompt tokens the prefix cache held (not prefilled again).
    pub(crate) cached_tokens: usize,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    open: usize,
}

/// What the stream of a job yields.
#[derive(Debug)]
pub(crate) enum Step {
    Delta(usize, Delta),
    Failed(String),
}

impl Job {
    /// Submits every choice of the rendered `prompts`, each prefilled but for what the prefix
    /// cache holds. Refusals become vLLM's responses: 500 when the engine is dead, 503 when
    /// `--max-num-queued-reqs` is reached.
    pub(crate) fn start(app: &App, prompts: &[&str], choices: Vec<ChoicePlan>) -> Result<Job, ApiError> {
        // Tokenised once: its length is the prompt's token count, its blocks the cache's key.
        let tokens: Vec<Vec<u32>> = prompts.iter().map(|p| crate::sim::vocab::tokenize(p)).collect();
        let prompt_tokens: usize = tokens.iter().map(Vec::len).sum();
        let lookups: Vec<_> = tokens.iter().map(|t| app.prefix.lookup(t)).collect();
        let cached_tokens: usize = lookups.iter().map(|l| l.cached).sum();
        let (tx, rx) = mpsc::unbounded_channel();
        let poison = app.engine.is_poison(prompts);
        for (index, c) in choices.iter().enumerate() {
            let sub = Submission {
                prompt_tokens,
                cached_tokens,
                total: c.total(),
                finish: c.metric_finish(),
                index,
                poison,
            };
            match app.engine.submit(sub, &tx) {
                Ok(()) => {}
                Err(Refused::Dead) => return Err(error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError", ENGINE_DEAD, None)),
                Err(Refused::QueueFull) => {
                    return Err(error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Service Unavailable",
                        "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.",
                        None,
                    ))
                }
            }
        }
        // Taken: its blocks are cached from now on, and each choice queried the cache (vLLM
        // counts per sequence; nothing when prefix caching is off).
        for l in &lookups {
            app.prefix.keep(l);
        }
        if app.prefix.enabled() {
            let n = choices.len() as u64;
            app.metrics.prefix(prompt_tokens as u64 * n, cached_tokens as u64 * n);
        }
        let open = choices.len();
        Ok(Job {
            choices,
            prompt_tokens,
            cached_tokens,
            rx,
            open,
        })
    }

    /// The next released delta, a failure, or `None` when every choice is done.
    pub(crate) async fn next(&mut self) -> Option<Step> {
        while self.open > 0 {
            match self.rx.recv().await? {
                (i, Event::Tokens(n)) => return Some(Step::Delta(i, self.choices[i].release(n))),
                (_, Event::Done) => self.open -= 1,
                (_, Event::Failed(msg)) => {
                    self.open = 0;
                    return Some(Step::Failed(msg));
                }
            }
        }
        None
    }

    /// Waits for every choice (non-streaming).
    pub(crate) async fn complete(&mut self) -> Result<(), String> {
        while let Some(step) = self.next().await {
            if let Step::Failed(msg) = step {
                return Err(msg);
            }
        }
        Ok(())
    }

    pub(crate) fn completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.produced).sum()
    }

    /// Tokens released so far that were reasoning (vLLM's `reasoning_tokens`).
    pub(crate) fn reasoning_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.produced.min(c.reasoning_len)).sum()
    }
}
