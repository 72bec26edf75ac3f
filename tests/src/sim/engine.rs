//! The simulated engine core: FCFS scheduler capped at `max_num_seqs` with an unbounded waiting
//! queue, chunked prefill (at most `max_num_batched_tokens` prompt tokens a step, so a long
//! prompt is many steps, each counted in `vllm:iteration_tokens_total` as vLLM does), steps
//! paced from the profile's throughput table, speculative acceptance, and engine death after a
//! lost rank — the parts of vLLM's scheduler the gateway can observe.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sparkgate_config::ThroughputTable;
use tokio::sync::{mpsc, Notify};

use super::faults::Faults;
use super::group::Group;
use super::log;
use super::metrics::{Finished, Metrics};
use super::text::Rng;

/// What a sequence reports to its HTTP handler.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    /// `n` more output tokens are ready (one engine step; several with speculation).
    Tokens(usize),
    /// All planned tokens were delivered.
    Done,
    /// The request failed (mid-stream error, engine death); the message is vLLM's.
    Failed(String),
}

/// vLLM's message for requests caught by an engine death.
pub(crate) const ENGINE_DEAD: &str = "The server had an error while processing your request.";

/// Pacing: aggregate tokens/s by batch width, scaled by SIM_SPEED; `None` = instant.
#[derive(Debug, Clone)]
pub(crate) struct Pacing {
    pub(crate) table: ThroughputTable,
    pub(crate) speed: Option<f64>,
    /// Prefill tokens/s at speed 1.
    pub(crate) prefill_tps: f64,
    /// Prompt tokens prefilled per step at most (`--max-num-batched-tokens`).
    pub(crate) prefill_chunk: usize,
    /// One prompt's prefill per step at most while another request runs or waits
    /// (`--long-prefill-token-threshold`; 0: none), as vLLM V1's scheduler caps it.
    pub(crate) prefill_cap: usize,
    /// Per-position acceptance probabilities of the speculation mode (empty: none).
    pub(crate) acceptance: Vec<f64>,
}

impl Pacing {
    fn step_duration(&self, width: usize, tokens: usize, prefill: usize) -> Duration {
        let Some(speed) = self.speed else { return Duration::ZERO };
        let tps = self.table.at(width as u32).max(0.1) * speed;
        let secs = tokens as f64 / tps + prefill as f64 / (self.prefill_tps * speed);
        Duration::from_secs_f64(secs)
    }
}

#[derive(Debug)]
struct Seq {
    prompt_tokens: usize,
    /// Prompt tokens not prefilled yet.
    prefill_left: usize,
    total: usize,
    produced: usize,
    finish: Finished,
    index: usize,
    tx: mpsc::UnboundedSender<(usize, Event)>,
    arrived: Instant,
    last_token: Option<Instant>,
    /// Its prompt carries SIM_FAULT_CRASH_ON's marker: the engine dies when it schedules it.
    poison: bool,
}

/// One sequence to queue (`Engine::submit`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Submission {
    pub(crate) prompt_tokens: usize,
    pub(crate) cached_tokens: usize,
    /// Output tokens it will make.
    pub(crate) total: usize,
    pub(crate) finish: Finished,
    /// Its choice index, which tags its events.
    pub(crate) index: usize,
    pub(crate) poison: bool,
}

#[derive(Debug)]
pub(crate) struct Engine {
    waiting: Mutex<VecDeque<Seq>>,
    wake: Notify,
    dead: AtomicBool,
    max_num_seqs: usize,
    max_queued: Option<u64>,
    pacing: Pacing,
    pub(crate) metrics: Arc<Metrics>,
    faults: Arc<Faults>,
    group: Arc<Group>,
    execute_timeout: Duration,
    watchdog: Duration,
    /// SIM_MEMINFO: the node's memory, taken by running prefills.
    memory: Option<super::memory::NodeMemory>,
}

/// How an engine schedules and paces, from the command line and the environment.
#[derive(Debug)]
pub(crate) struct EngineSettings {
    /// `--max-num-seqs`: sequences running at once.
    pub(crate) max_num_seqs: u32,
    /// `--max-num-queued-reqs`: requests waiting or running at most (none: unbounded).
    pub(crate) max_queued: Option<u64>,
    pub(crate) pacing: Pacing,
    /// VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: how long a step's collective may hang.
    pub(crate) execute_timeout: Duration,
    /// SIM_WATCHDOG_S: how long the API server lives on after the engine died.
    pub(crate) watchdog: Duration,
}

/// Why a submission was refused before it started.
#[derive(Debug, PartialEq)]
pub(crate) enum Refused {
    Dead,
    QueueFull,
}

impl Engine {
    pub(crate) fn new(
        settings: EngineSettings,
        metrics: Arc<Metrics>,
        faults: Arc<Faults>,
        group: Arc<Group>,
    ) -> Arc<Self> {
        Arc::new(Self {
            waiting: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            dead: AtomicBool::new(false),
            max_num_seqs: settings.max_num_seqs as usize,
            max_queued: settings.max_queued,
            pacing: settings.pacing,
            metrics,
            faults,
            group,
            execute_timeout: settings.execute_timeout,
            watchdog: settings.watchdog,
            memory: super::memory::NodeMemory::from_env(),
        })
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(SeqCst)
    }

    /// Whether a request with these prompts is SIM_FAULT_CRASH_ON's marked request.
    pub(crate) fn is_poison(&self, prompts: &[&str]) -> bool {
        self.faults.is_poison(prompts)
    }

    /// Queues choice `index` of a request: `total` output tokens after `prompt_tokens` of
    /// prefill, ending as `finish`. Events arrive on `tx` tagged with `index`; dropping the
    /// receiver aborts the sequence, as a client disconnect does in vLLM.
    pub(crate) fn submit(&self, sub: Submission, tx: &mpsc::UnboundedSender<(usize, Event)>) -> Result<(), Refused> {
        let Submission {
            prompt_tokens,
            cached_tokens,
            total,
            finish,
            index,
            poison,
        } = sub;
        if self.is_dead() {
            return Err(Refused::Dead);
        }
        let tx = tx.clone();
        {
            let mut waiting = self.waiting.lock().expect("queue lock");
            if let Some(limit) = self.max_queued {
                let in_flight = waiting.len() as u64 + self.metrics.running.load(SeqCst);
                if in_flight >= limit {
                    return Err(Refused::QueueFull);
                }
            }
            waiting.push_back(Seq {
                prompt_tokens,
                prefill_left: prompt_tokens.saturating_sub(cached_tokens),
                total,
                produced: 0,
                finish,
                index,
                tx,
                arrived: Instant::now(),
                last_token: None,
                poison,
            });
            self.metrics.waiting.store(waiting.len() as u64, SeqCst);
            let held = waiting.len() as u64 + self.metrics.running.load(SeqCst);
            self.metrics.peak.fetch_max(held, SeqCst);
        }
        self.wake.notify_one();
        Ok(())
    }

    /// The engine loop; runs until the engine dies. Each step: admit, wait for the collective
    /// with the other ranks, prefill, sample (with speculation), pace, deliver.
    pub(crate) async fn run(self: Arc<Self>) {
        let mut running: Vec<Seq> = Vec::new();
        let mut rng = Rng::new(0x5151);
        let mut next_step = Instant::now();
        loop {
            self.faults.wait_while_hung().await;
            self.admit(&mut running);
            if running.is_empty() {
                self.hold_memory(&running);
                let notified = self.wake.notified();
                if self.waiting.lock().expect("queue lock").is_empty() {
                    notified.await;
                }
                next_step = Instant::now();
                continue;
            }
            // The collective with the other ranks; a lost peer hangs it until the execute timeout.
            let step = async {
                if self.group.step().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            if tokio::time::timeout(self.execute_timeout, step).await.is_err() {
                self.die(&mut running).await;
                return;
            }
            let prefill = self.prefill(&mut running);
            self.hold_memory(&running);
            let mut grants = self.sample(&running, &mut rng);
            let step_tokens: usize = grants.iter().sum();
            self.metrics.iteration(step_tokens as u64 + prefill as u64);
            let duration = self.pacing.step_duration(running.len(), step_tokens, prefill);
            if !duration.is_zero() {
                next_step = next_step.max(Instant::now() - Duration::from_millis(50)) + duration;
                tokio::time::sleep_until(next_step.into()).await;
            }
            self.faults.wait_while_hung().await;
            self.deliver(&mut running, &mut grants);
            self.metrics.running.store(running.len() as u64, SeqCst);
        }
    }

    /// Admits FCFS up to max_num_seqs (the rest wait, unbounded, as in vLLM), after dropping
    /// the sequences whose clients went away, waiting or running.
    fn admit(&self, running: &mut Vec<Seq>) {
        {
            let mut waiting = self.waiting.lock().expect("queue lock");
            waiting.retain(|s| {
                !s.tx.is_closed() || {
                    self.metrics.finished(Finished::Abort, 0.0);
                    false
                }
            });
            while running.len() < self.max_num_seqs {
                let Some(seq) = waiting.pop_front() else { break };
                if seq.poison {
                    log::error(
                        "EngineCore_DP0",
                        "core.py:933",
                        "SIM_FAULT_CRASH_ON: the marked request crashes the engine.",
                    );
                    self.faults.crash();
                }
                self.metrics
                    .prompt(seq.prompt_tokens as u64, seq.arrived.elapsed().as_secs_f64());
                running.push(seq);
            }
            self.metrics.waiting.store(waiting.len() as u64, SeqCst);
        }
        running.retain(|s| {
            let gone = s.tx.is_closed();
            if gone {
                self.metrics
                    .finished(Finished::Abort, s.arrived.elapsed().as_secs_f64());
            }
            !gone
        });
        self.metrics.running.store(running.len() as u64, SeqCst);
    }

    /// Chunked prefill, oldest first, up to the step's budget; returns the tokens prefilled. A
    /// sequence samples its first token in the step that finishes its prompt; until then it
    /// takes part without output. With a threshold, each prompt takes at most that much of the
    /// step while another request runs or waits (vLLM V1: a long prefill then leaves room for a
    /// short prompt beside it; alone it takes the whole budget).
    fn prefill(&self, running: &mut [Seq]) -> usize {
        let (mut budget, mut prefill) = (self.pacing.prefill_chunk, 0);
        let others = running.len() > 1 || !self.waiting.lock().expect("queue lock").is_empty();
        let cap = match self.pacing.prefill_cap {
            0 => usize::MAX,
            _ if !others => usize::MAX,
            cap => cap,
        };
        for seq in running.iter_mut().filter(|s| s.prefill_left > 0) {
            let take = seq.prefill_left.min(budget).min(cap);
            seq.prefill_left -= take;
            budget -= take;
            prefill += take;
            if budget == 0 {
                break;
            }
        }
        prefill
    }

    /// The node's memory as the prompts being prefilled hold it (SIM_MEMINFO): each its whole
    /// prompt's worth, from the step that schedules it until its prefill ends.
    fn hold_memory(&self, running: &[Seq]) {
        if let Some(m) = &self.memory {
            let prefilling = running
                .iter()
                .filter(|s| s.prefill_left > 0)
                .map(|s| s.prompt_tokens as u64)
                .sum();
            m.update(prefilling);
        }
    }

    /// The tokens each running sequence gets this step: none while it prefills, else one plus
    /// the drafts accepted, never past its total.
    fn sample(&self, running: &[Seq], rng: &mut Rng) -> Vec<usize> {
        let k = self.pacing.acceptance.len() as u32;
        let mut grants: Vec<usize> = Vec::with_capacity(running.len());
        for seq in running {
            if seq.prefill_left > 0 {
                grants.push(0);
                continue;
            }
            let mut accepted = 0;
            if k > 0 {
                while (accepted as usize) < self.pacing.acceptance.len()
                    && rng.unit() < self.pacing.acceptance[accepted as usize]
                {
                    accepted += 1;
                }
                self.metrics.draft(k, accepted);
            }
            grants.push((1 + accepted as usize).min(seq.total - seq.produced));
        }
        grants
    }

    /// Sends each sequence its granted tokens; a finished one (or one a stream-error fault
    /// fails) leaves `running` with its grant.
    fn deliver(&self, running: &mut Vec<Seq>, grants: &mut Vec<usize>) {
        let now = Instant::now();
        let fail_after = self.faults.stream_error_after();
        let mut i = 0;
        while i < running.len() {
            let seq = &mut running[i];
            let n = grants[i];
            // A sequence with nothing left to plan (a continuation at its very end) still
            // finishes once its prompt is in: the end-of-sequence token is its only output.
            let exhausted = seq.total == 0 && seq.prefill_left == 0;
            if n == 0 && !exhausted {
                i += 1;
                continue;
            }
            seq.produced += n;
            if seq.last_token.is_none() {
                self.metrics.first_token(now.duration_since(seq.arrived).as_secs_f64());
            }
            if n > 0 {
                let gap = seq.last_token.map(|t| now.duration_since(t).as_secs_f64() / n as f64);
                self.metrics.tokens(n as u64, gap);
            }
            seq.last_token = Some(now);
            let _ = seq.tx.send((seq.index, Event::Tokens(n)));
            let failed = fail_after.is_some_and(|f| seq.produced as u64 >= f && seq.produced < seq.total);
            if failed || seq.produced >= seq.total {
                let seq = running.swap_remove(i);
                grants.swap_remove(i);
                // The slot is free before the client hears of the end, as in vLLM.
                self.metrics.running.store(running.len() as u64, SeqCst);
                self.end(seq, failed);
            } else {
                i += 1;
            }
        }
    }

    /// Tells a sequence's client it ended (failed, or done with its finish reason).
    fn end(&self, seq: Seq, failed: bool) {
        let e2e = seq.arrived.elapsed().as_secs_f64();
        if failed {
            let _ = seq.tx.send((seq.index, Event::Failed("Internal server error".into())));
            self.metrics.finished(Finished::Error, e2e);
        } else {
            let _ = seq.tx.send((seq.index, Event::Done));
            self.metrics.finished(seq.finish, e2e);
        }
        self.faults.request_finished();
    }

    /// Engine death: every request in flight or queued fails, `/health` turns 503, and the
    /// API server's watchdog ends the process.
    async fn die(&self, running: &mut Vec<Seq>) {
        self.dead.store(true, SeqCst);
        log::error(
            "EngineCore_DP0",
            "core.py:933",
            &format!(
                "TimeoutError: RPC call to execute_model timed out after {}s.",
                self.execute_timeout.as_secs_f64()
            ),
        );
        log::error("EngineCore_DP0", "core.py:935", "EngineCore encountered a fatal error.");
        let waiting: Vec<Seq> = self.waiting.lock().expect("queue lock").drain(..).collect();
        for seq in running.drain(..).chain(waiting) {
            let _ = seq.tx.send((seq.index, Event::Failed(ENGINE_DEAD.into())));
            self.metrics
                .finished(Finished::Error, seq.arrived.elapsed().as_secs_f64());
        }
        self.metrics.running.store(0, SeqCst);
        self.metrics.waiting.store(0, SeqCst);
        tokio::time::sleep(self.watchdog).await;
        log::error(
            "APIServer",
            "launcher.py:101",
            "Engine is dead; shutting down the API server.",
        );
        std::process::exit(1);
    }
}
