//! Prometheus `/metrics` with vLLM 0.33's names, labels and buckets (reference §6.2).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];
const ITERATION_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

#[derive(Debug)]
struct Histogram {
    buckets: &'static [f64],
    inner: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    fn new(buckets: &'static [f64]) -> Self {
        Self {
            buckets,
            inner: Mutex::new((vec![0; buckets.len()], 0.0, 0)),
        }
    }

    fn observe(&self, v: f64) {
        let mut g = self.inner.lock().expect("histogram lock");
        for (i, b) in self.buckets.iter().enumerate() {
            if v <= *b {
                g.0[i] += 1;
            }
        }
        g.1 += v;
        g.2 += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let g = self.inner.lock().expect("histogram lock");
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in self.buckets.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {:?}", g.0[i] as f64);
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {:?}", g.2 as f64);
        let _ = writeln!(out, "{name}_count{{{labels}}} {:?}", g.2 as f64);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", g.1);
    }
}

/// Why a request finished, as `vllm:request_success_total{finished_reason}` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finished {
    Stop,
    Length,
    Abort,
    Error,
}

impl Finished {
    const ALL: [Finished; 4] = [Finished::Stop, Finished::Length, Finished::Abort, Finished::Error];
    fn label(self) -> &'static str {
        match self {
            Finished::Stop => "stop",
            Finished::Length => "length",
            Finished::Abort => "abort",
            Finished::Error => "error",
        }
    }
}

#[derive(Debug)]
pub(crate) struct Metrics {
    labels: String,
    max_num_seqs: u64,
    spec_k: Option<u32>,
    pub(crate) running: AtomicU64,
    pub(crate) waiting: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    finished: [AtomicU64; 4],
    drafts: AtomicU64,
    draft_tokens: AtomicU64,
    accepted: AtomicU64,
    accepted_per_pos: Vec<AtomicU64>,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue_time: Histogram,
    iteration_tokens: Histogram,
}

impl Metrics {
    pub(crate) fn new(model_name: &str, max_num_seqs: u32, spec_k: Option<u32>) -> Self {
        Self {
            labels: format!("model_name=\"{model_name}\",engine=\"0\""),
            max_num_seqs: u64::from(max_num_seqs),
            spec_k,
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            finished: Default::default(),
            drafts: AtomicU64::new(0),
            draft_tokens: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            accepted_per_pos: (0..spec_k.unwrap_or(0)).map(|_| AtomicU64::new(0)).collect(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(LATENCY_BUCKETS),
            queue_time: Histogram::new(LATENCY_BUCKETS),
            iteration_tokens: Histogram::new(ITERATION_BUCKETS),
        }
    }

    pub(crate) fn finished(&self, why: Finished, e2e_s: f64) {
        self.finished[why as usize].fetch_add(1, Relaxed);
        if why != Finished::Abort {
            self.e2e.observe(e2e_s);
        }
    }

    pub(crate) fn aborted(&self) -> u64 {
        self.finished[Finished::Abort as usize].load(Relaxed)
    }

    pub(crate) fn prompt(&self, tokens: u64, queue_s: f64) {
        self.prompt_tokens.fetch_add(tokens, Relaxed);
        self.queue_time.observe(queue_s);
    }

    pub(crate) fn first_token(&self, ttft_s: f64) {
        self.ttft.observe(ttft_s);
    }

    pub(crate) fn tokens(&self, n: u64, gap_s: Option<f64>) {
        self.generation_tokens.fetch_add(n, Relaxed);
        if let Some(g) = gap_s {
            self.itl.observe(g);
        }
    }

    pub(crate) fn iteration(&self, tokens: u64) {
        self.iteration_tokens.observe(tokens as f64);
    }

    /// One verification of `k` drafted tokens of which the first `accepted` were accepted.
    pub(crate) fn draft(&self, k: u32, accepted: u32) {
        self.drafts.fetch_add(1, Relaxed);
        self.draft_tokens.fetch_add(u64::from(k), Relaxed);
        self.accepted.fetch_add(u64::from(accepted), Relaxed);
        for pos in self.accepted_per_pos.iter().take(accepted as usize) {
            pos.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn generation_tokens_total(&self) -> u64 {
        self.generation_tokens.load(Relaxed)
    }

    pub(crate) fn render(&self) -> String {
        let l = &self.labels;
        let mut out = String::with_capacity(16 * 1024);
        let mut gauge = |name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{l}}} {v:?}");
        };
        let running = self.running.load(Relaxed);
        gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            running as f64,
        );
        gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            self.waiting.load(Relaxed) as f64,
        );
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            running as f64 / self.max_num_seqs.max(1) as f64 * 0.5,
        );
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{l}}} {:?}",
                v as f64
            );
        };
        counter(
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            self.prompt_tokens.load(Relaxed),
        );
        counter(
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            self.generation_tokens.load(Relaxed),
        );
        counter(
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine.",
            0,
        );
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter"
        );
        for why in Finished::ALL {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{l},finished_reason=\"{}\"}} {:?}",
                why.label(),
                self.finished[why as usize].load(Relaxed) as f64
            );
        }
        if self.spec_k.is_some() {
            let mut spec = |name: &str, help: &str, v: u64| {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{l}}} {:?}",
                    v as f64
                );
            };
            spec(
                "vllm:spec_decode_num_drafts_total",
                "Number of spec decoding drafts.",
                self.drafts.load(Relaxed),
            );
            spec(
                "vllm:spec_decode_num_draft_tokens_total",
                "Number of draft tokens.",
                self.draft_tokens.load(Relaxed),
            );
            spec(
                "vllm:spec_decode_num_accepted_tokens_total",
                "Number of accepted tokens.",
                self.accepted.load(Relaxed),
            );
            let name = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
            let _ = writeln!(
                out,
                "# HELP {name} Accepted tokens per draft position.\n# TYPE {name} counter"
            );
            for (pos, v) in self.accepted_per_pos.iter().enumerate() {
                let _ = writeln!(out, "{name}{{{l},position=\"{pos}\"}} {:?}", v.load(Relaxed) as f64);
            }
        }
        self.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            l,
        );
        self.itl.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            l,
        );
        self.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            l,
        );
        self.queue_time.render(
            &mut out,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            l,
        );
        self.iteration_tokens.render(
            &mut out,
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            l,
        );
        out
    }
}
