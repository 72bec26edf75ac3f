//! A generation in flight: each choice's planned token ids, their submission to the engine,
//! and the deltas the engine's steps release, read by the request's parser.

use axum::http::StatusCode;
use tokio::sync::mpsc;

use super::{error, ApiError, App};
use crate::sim::engine::{Event, Refused, Submission, ENGINE_DEAD};
use crate::sim::metrics::Finished;
use crate::sim::parser::{self, Parsed, Parser, ParserConfig, ToolDelta};
use crate::sim::text::{self, Planned, ToolCall};
use crate::sim::vocab;

/// One choice's output plan and how much of it has been released.
#[derive(Debug)]
pub(crate) struct ChoicePlan {
    ids: Vec<u32>,
    /// Each id's text (a stop string cuts the last one).
    texts: Vec<String>,
    cfg: ParserConfig,
    /// Reads the tokens as they are released.
    parser: Parser,
    /// The whole plan parsed (for whole bodies and the reasoning count).
    view: Parsed,
    pub(crate) tool_call: Option<ToolCall>,
    pub(crate) finish: &'static str,
    /// The stop string that ended the output.
    pub(crate) stop_reason: Option<String>,
    /// The end-of-sequence token after the plan, when it ends by itself (sent with the finish,
    /// not counted as output).
    pub(crate) eos: Option<u32>,
    produced: usize,
}

/// What one engine step released for a choice.
#[derive(Debug, Default)]
pub(crate) struct Delta {
    pub(crate) reasoning: String,
    pub(crate) content: String,
    /// Tool calls' parts the step completed.
    pub(crate) tools: Vec<ToolDelta>,
    /// The choice's last token was released with this step.
    pub(crate) last: bool,
    /// The released tokens' ids.
    pub(crate) ids: Vec<u32>,
    /// The released tokens' texts (for logprobs).
    pub(crate) tokens: Vec<String>,
}

impl ChoicePlan {
    /// Fits `planned` into `budget` output tokens; `ignore_eos` keeps generating up to the
    /// budget. `cfg` says how the output is parsed.
    pub(crate) fn new(planned: Planned, budget: usize, ignore_eos: bool, min_tokens: usize, cfg: ParserConfig) -> Self {
        let Planned { mut ids, call } = planned;
        let floor = if ignore_eos { budget } else { min_tokens.min(budget) };
        if call.is_none() && ids.len() < floor {
            let filler = text::completion_ids(&vocab::text_of(&ids));
            let mut i = 0;
            while ids.len() < floor && !filler.is_empty() {
                ids.push(filler[i % filler.len()]);
                i += 1;
            }
        }
        let (tool_call, finish, eos) = if ids.len() > budget || (ignore_eos && call.is_none()) {
            // ignore_eos runs to the budget: vLLM reports that as a length stop.
            ids.truncate(budget);
            (None, "length", None)
        } else if call.is_some() {
            (call, "tool_calls", Some(vocab::eos_id()))
        } else {
            (None, "stop", Some(vocab::eos_id()))
        };
        let texts = vocab::piece_texts(&ids).0;
        let view = parser::parse_all(&cfg, &ids, &texts);
        Self {
            ids,
            texts,
            parser: Parser::new(cfg.clone()),
            cfg,
            view,
            tool_call,
            finish,
            stop_reason: None,
            eos,
            produced: 0,
        }
    }

    /// Stop strings (vLLM's detokenizer): the output ends at the token that completes the first
    /// one to appear, its text cut before the string; finish `stop`, the string as `stop_reason`.
    pub(crate) fn apply_stop(&mut self, stops: &[String]) {
        if stops.is_empty() {
            return;
        }
        let mut text = String::new();
        for i in 0..self.texts.len() {
            let before = text.len();
            text.push_str(&self.texts[i]);
            let hit = stops
                .iter()
                .filter_map(|s| text.find(s.as_str()).map(|at| (at, s)))
                .min_by_key(|(at, _)| *at);
            if let Some((at, stop)) = hit {
                self.texts[i] = text[before.min(at)..at].to_owned();
                self.texts.truncate(i + 1);
                self.ids.truncate(i + 1);
                self.tool_call = None;
                self.finish = "stop";
                self.eos = None;
                self.stop_reason = Some(stop.clone());
                self.view = parser::parse_all(&self.cfg, &self.ids, &self.texts);
                return;
            }
        }
    }

    pub(crate) fn total(&self) -> usize {
        self.ids.len()
    }

    /// The planned output's ids.
    pub(crate) fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub(crate) fn reasoning_text(&self) -> Option<String> {
        (self.view.reasoning_ids > 0).then(|| self.view.reasoning.clone())
    }

    /// The texts of the tokens released so far.
    pub(crate) fn released(&self) -> &[String] {
        &self.texts[..self.produced.min(self.texts.len())]
    }

    pub(crate) fn content_text(&self) -> String {
        self.view.content.clone()
    }

    fn release(&mut self, n: usize) -> Delta {
        let start = self.produced;
        self.produced = (self.produced + n).min(self.total());
        let (ids, texts) = (&self.ids[start..self.produced], &self.texts[start..self.produced]);
        let Parsed {
            reasoning,
            content,
            tools,
            ..
        } = self.parser.step(ids, texts);
        Delta {
            reasoning,
            content,
            tools,
            last: self.produced == self.total(),
            ids: ids.to_vec(),
            tokens: texts.to_vec(),
        }
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
    /// Submits every choice of the prompts given as token ids (`texts` their text, for the
    /// poison check), each prefilled but for what the prefix cache holds: the ids' number is
    /// the prompt's token count, their blocks the cache's key. Refusals become vLLM's
    /// responses: 500 when the engine is dead, 503 when `--max-num-queued-reqs` is reached.
    pub(crate) fn start_tokens(
        app: &App,
        tokens: &[Vec<u32>],
        texts: &[&str],
        choices: Vec<ChoicePlan>,
    ) -> Result<Job, ApiError> {
        let prompt_tokens: usize = tokens.iter().map(Vec::len).sum();
        let lookups: Vec<_> = tokens.iter().map(|t| app.prefix.lookup(t)).collect();
        let cached_tokens: usize = lookups.iter().map(|l| l.cached).sum();
        let (tx, rx) = mpsc::unbounded_channel();
        let poison = app.engine.is_poison(texts);
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
        self.choices.iter().map(|c| c.produced.min(c.view.reasoning_ids)).sum()
    }
}
