//! Prometheus `/metrics` with vLLM 0.33's names, labels and buckets (reference §6.2).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use super::metric_families::{Kind, FAMILIES};

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

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let g = self.inner.lock().expect("histogram lock");
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
    /// The most requests the engine held at once (running + waiting), for `/state`: what a test
    /// holds the gateway's concurrency limit to.
    pub(crate) peak: AtomicU64,
    prompt_tokens: AtomicU64,
    prefix_queries: AtomicU64,
    prefix_hits: AtomicU64,
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
    /// Unix time of start, the value of every `_created` sample.
    started: f64,
}

impl Metrics {
    pub(crate) fn new(model_name: &str, max_num_seqs: u32, spec_k: Option<u32>) -> Self {
        Self {
            labels: format!("model_name=\"{model_name}\",engine=\"0\""),
            max_num_seqs: u64::from(max_num_seqs),
            spec_k,
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
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
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
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

    /// A request's prompt met the prefix cache: `queried` tokens, `hits` of them cached.
    pub(crate) fn prefix(&self, queried: u64, hits: u64) {
        self.prefix_queries.fetch_add(queried, Relaxed);
        self.prefix_hits.fetch_add(hits, Relaxed);
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

    /// The exposition: every family of the real server (`metric_families`), in its order,
    /// with the `_created` companions prometheus_client adds; the simulator's measured values
    /// where it has them, zero samples elsewhere.
    pub(crate) fn render(&self) -> String {
        let mut out = String::with_capacity(32 * 1024);
        for &(name, kind, help) in FAMILIES {
            if name.starts_with("vllm:spec_decode") && self.spec_k.is_none() {
                continue;
            }
            let type_name = match kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
                Kind::Summary => "summary",
            };
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {type_name}");
            let labels = if name.starts_with("vllm:") {
                self.labels.as_str()
            } else {
                ""
            };
            self.samples(&mut out, name, kind, labels);
            let created = kind != Kind::Gauge && (name.starts_with("vllm:") || name.starts_with("http_"));
            if created {
                let base = if kind == Kind::Counter {
                    name.strip_suffix("_total").unwrap_or(name)
                } else {
                    name
                };
                let _ = writeln!(
                    out,
                    "# HELP {base}_created {help}\n# TYPE {base}_created gauge\n{base}_created{{{labels}}} {:?}",
                    self.started
                );
            }
        }
        out
    }

    fn samples(&self, out: &mut String, name: &str, kind: Kind, l: &str) {
        let value = |v: u64| v as f64;
        let simple = match name {
            "vllm:num_requests_running" => Some(value(self.running.load(Relaxed))),
            "vllm:num_requests_waiting" => Some(value(self.waiting.load(Relaxed))),
            "vllm:kv_cache_usage_perc" => {
                Some(self.running.load(Relaxed) as f64 / self.max_num_seqs.max(1) as f64 * 0.5)
            }
            "vllm:prompt_tokens_total" => Some(value(self.prompt_tokens.load(Relaxed))),
            "vllm:generation_tokens_total" => Some(value(self.generation_tokens.load(Relaxed))),
            "vllm:prefix_cache_queries_total" => Some(value(self.prefix_queries.load(Relaxed))),
            "vllm:prefix_cache_hits_total" => Some(value(self.prefix_hits.load(Relaxed))),
            "vllm:spec_decode_num_drafts_total" => Some(value(self.drafts.load(Relaxed))),
            "vllm:spec_decode_num_draft_tokens_total" => Some(value(self.draft_tokens.load(Relaxed))),
            "vllm:spec_decode_num_accepted_tokens_total" => Some(value(self.accepted.load(Relaxed))),
            _ => None,
        };
        if let Some(v) = simple {
            let _ = writeln!(out, "{name}{{{l}}} {v:?}");
            return;
        }
        match name {
            "vllm:request_success_total" => {
                for why in Finished::ALL {
                    let v = self.finished[why as usize].load(Relaxed) as f64;
                    let _ = writeln!(out, "{name}{{{l},finished_reason=\"{}\"}} {v:?}", why.label());
                }
            }
            "vllm:spec_decode_num_accepted_tokens_per_pos_total" => {
                for (pos, v) in self.accepted_per_pos.iter().enumerate() {
                    let _ = writeln!(out, "{name}{{{l},position=\"{pos}\"}} {:?}", v.load(Relaxed) as f64);
                }
            }
            "vllm:time_to_first_token_seconds" => self.ttft.render(out, name, l),
            "vllm:inter_token_latency_seconds" => self.itl.render(out, name, l),
            "vllm:e2e_request_latency_seconds" => self.e2e.render(out, name, l),
            "vllm:request_queue_time_seconds" => self.queue_time.render(out, name, l),
            "vllm:iteration_tokens_total" => self.iteration_tokens.render(out, name, l),
            _ => zero(out, name, kind, l),
        }
    }
}

/// A family the simulator does not measure: one zero sample of its kind.
fn zero(out: &mut String, name: &str, kind: Kind, l: &str) {
    match kind {
        Kind::Counter | Kind::Gauge => {
            let _ = writeln!(out, "{name}{{{l}}} 0.0");
        }
        Kind::Histogram => {
            let sep = if l.is_empty() { "" } else { "," };
            let _ = writeln!(
                out,
                "{name}_bucket{{{l}{sep}le=\"+Inf\"}} 0.0\n{name}_count{{{l}}} 0.0\n{name}_sum{{{l}}} 0.0"
            );
        }
        Kind::Summary => {
            let _ = writeln!(out, "{name}_count{{{l}}} 0.0\n{name}_sum{{{l}}} 0.0");
        }
    }
}
