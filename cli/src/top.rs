//! `sparkgate top`: a live terminal view of a running gateway — the group's state, epoch, mode
//! and policy, admission, tokens/s over the last minutes, TTFT and inter-token percentiles, the
//! ranks and their nodes' memory, restarts — refreshed from `/admin/status`, `/admin/spec` and
//! `/metrics`. `q` (or Esc, Ctrl-C) quits; a gateway that does not answer is said so, and the
//! view keeps trying.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::Line;
use ratatui::widgets::{Block, Gauge, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;
use serde_json::Value;

use super::admin::Endpoint;

/// Tokens/s samples kept for the sparkline (one per refresh).
const HISTORY: usize = 300;

/// What the view shows, updated from each refresh.
#[derive(Debug, Default)]
pub(super) struct View {
    url: String,
    status: Option<Value>,
    spec: Option<Value>,
    /// Why the last refresh failed (the gateway is down, a refusal).
    error: Option<String>,
    /// Tokens per second, newest last.
    rate: VecDeque<u64>,
    last_tokens: Option<(f64, Instant)>,
    ttft: [Option<f64>; 2],
    itl: [Option<f64>; 2],
}

/// The sum of every series of `name` in a Prometheus text exposition.
pub(super) fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Quantile `q` of histogram `name` from its cumulative buckets (all series summed): the upper
/// bound of the first bucket that holds it.
pub(super) fn histogram_quantile(text: &str, name: &str, q: f64) -> Option<f64> {
    let bucket = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(&bucket)) {
        let le = line.split("le=\"").nth(1)?.split('"').next()?;
        let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
        let count: f64 = line.rsplit(' ').next()?.parse().ok()?;
        match buckets.iter_mut().find(|(b, _)| *b == bound) {
            Some((_, c)) => *c += count,
            None => buckets.push((bound, count)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets.iter().find(|(_, c)| *c >= q * total).map(|(b, _)| *b)
}

impl View {
    pub(super) fn new(url: &str) -> View {
        View {
            url: url.to_owned(),
            ..View::default()
        }
    }

    /// Takes one refresh: the status (or why there is none), the spec and the metrics text.
    pub(super) fn update(
        &mut self,
        status: anyhow::Result<Value>,
        spec: Option<Value>,
        metrics: Option<String>,
        now: Instant,
    ) {
        match status {
            Ok(s) => {
                self.status = Some(s);
                self.error = None;
            }
            Err(e) => self.error = Some(format!("{e:#}")),
        }
        self.spec = spec.or(self.spec.take());
        let Some(text) = metrics else { return };
        if let Some(total) = metric_sum(&text, "sparkgate_generated_tokens_total") {
            if let Some((before, at)) = self.last_tokens {
                let dt = now.duration_since(at).as_secs_f64();
                if dt > 0.0 {
                    self.rate.push_back(((total - before).max(0.0) / dt).round() as u64);
                }
                if self.rate.len() > HISTORY {
                    self.rate.pop_front();
                }
            }
            self.last_tokens = Some((total, now));
        }
        let q = |name: &str| [0.5, 0.95].map(|q| histogram_quantile(&text, name, q));
        self.ttft = q("sparkgate_time_to_first_token_seconds");
        self.itl = q("sparkgate_inter_token_latency_seconds");
    }
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

fn ms(v: Option<f64>) -> String {
    match v {
        Some(s) if s.is_finite() => format!("≤ {:.1} ms", s * 1e3),
        Some(_) => "> the largest bucket".to_owned(),
        None => "—".to_owned(),
    }
}

/// Draws the view.
pub(super) fn render(frame: &mut Frame<'_>, view: &View) {
    let area = frame.area();
    let outer = Block::bordered().title(format!(" sparkgate top · {} · q quits ", view.url));
    let inner = outer.inner(area);
    frame.render_widget(outer, area);
    let Some(status) = view.status.as_ref().filter(|_| view.error.is_none()) else {
        let why = view
            .error
            .clone()
            .unwrap_or_else(|| "waiting for the first answer".into());
        let lines = vec![Line::from(why.red()), Line::from("retrying every second")];
        frame.render_widget(Paragraph::new(lines), inner);
        return;
    };
    let [head, admission, rate, latency, ranks] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Length(3),
        Constraint::Length(6),
        Constraint::Length(4),
        Constraint::Min(3),
    ])
    .areas(inner);
    frame.render_widget(Paragraph::new(head_lines(status, view.spec.as_ref())), head);
    let a = &status["admission"];
    let (used, cap) = (
        a["in_flight"].as_u64().unwrap_or(0),
        a["capacity"].as_u64().unwrap_or(0),
    );
    let ratio = if cap > 0 {
        (used as f64 / cap as f64).min(1.0)
    } else {
        0.0
    };
    let open = if a["open"] == true { "open" } else { "held" };
    let label = format!("{used} in flight of {cap} · {} queued · {open}", a["queued"]);
    let gauge = Gauge::default()
        .block(Block::bordered().title(" admission "))
        .gauge_style(Style::default().fg(Color::Cyan))
        .ratio(ratio)
        .label(label);
    frame.render_widget(gauge, admission);
    let now = view.rate.back().copied().unwrap_or(0);
    let data: Vec<u64> = view.rate.iter().copied().collect();
    let spark = Sparkline::default()
        .block(Block::bordered().title(format!(" tokens/s: {now} now, last {} s ", data.len())))
        .data(&data)
        .style(Style::default().fg(Color::Green));
    frame.render_widget(spark, rate);
    let lat = vec![
        Line::from(format!(
            "TTFT            p50 {}   p95 {}",
            ms(view.ttft[0]),
            ms(view.ttft[1])
        )),
        Line::from(format!(
            "inter-token     p50 {}   p95 {}",
            ms(view.itl[0]),
            ms(view.itl[1])
        )),
    ];
    frame.render_widget(Paragraph::new(lat).block(Block::bordered().title(" latency ")), latency);
    frame.render_widget(rank_table(status), ranks);
}

fn head_lines(status: &Value, spec: Option<&Value>) -> Vec<Line<'static>> {
    let s = &status["supervisor"];
    let phase = if s.is_null() {
        "gateway-only (not supervised)".to_owned()
    } else {
        super::wait::phase_of(status).to_string()
    };
    let policy = spec.map_or_else(|| "?".to_owned(), |v| text(&v["policy"]));
    let mut lines = vec![
        Line::from(model_line(status).bold()),
        Line::from(format!("group  {}", groups_phase(status).unwrap_or(phase))),
        Line::from(format!(
            "mode   {} · policy {policy} · restarts {}",
            text(&status["mode"]),
            s["restarts"].as_u64().unwrap_or(0)
        )),
    ];
    if let Some(r) = s.get("last_restart").filter(|r| !r.is_null()) {
        lines.push(Line::from(format!("last   {}", text(&r["reason"]))));
    }
    lines
}

/// The model, and rank 0's vLLM with the rules applied when they are not its own release's.
fn model_line(status: &Value) -> String {
    let mut line = format!("{} ({})", text(&status["model"]), text(&status["profile"]));
    let vllm = &status["vllm"];
    if let Some(version) = vllm["version"].as_str() {
        line += &format!(" · vLLM {version}");
        if vllm["warning"].is_string() {
            line += &format!(" (untested: rules {})", text(&vllm["rules"]));
        }
    }
    line
}

/// With several groups: each group's name, state and load on the one line.
fn groups_phase(status: &Value) -> Option<String> {
    let groups = status["groups"].as_array().filter(|g| g.len() > 1)?;
    let parts: Vec<String> = groups
        .iter()
        .map(|g| {
            format!(
                "{} {} {}/{}",
                text(&g["name"]),
                g["upstream"]["state"].as_str().unwrap_or("?"),
                g["in_flight"],
                g["capacity"]
            )
        })
        .collect();
    Some(parts.join(" · "))
}

fn rank_table(status: &Value) -> Table<'static> {
    let s = &status["supervisor"];
    // A node's memory is named `head`, `worker`, or `worker <rank>` when there are several.
    let memory = |node: &str, rank: &str| {
        let numbered = format!("{node} {rank}");
        s["memory"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["node"] == node || m["node"] == numbered.as_str())
            .and_then(|m| m["mem_available_gib"].as_f64())
            .map_or_else(|| "—".to_owned(), |g| format!("{g:.1} GiB free"))
    };
    // Its GPUs (the wedge watch): utilisation and power of each.
    let gpus = |node: &str, rank: &str| {
        let numbered = format!("{node} {rank}");
        let found: Vec<String> = s["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["node"] == node || n["node"] == numbered.as_str())
            .flat_map(|n| n["gpus"].as_array().into_iter().flatten())
            .map(|g| {
                let n = |v: &Value| v.as_f64().map_or("?".to_owned(), |x| format!("{x:.0}"));
                format!("{} % {} W", n(&g["utilization_pct"]), n(&g["power_w"]))
            })
            .collect();
        if found.is_empty() {
            "—".to_owned()
        } else {
            found.join(", ")
        }
    };
    let mut ranks: Vec<&Value> = s["ranks"].as_array().into_iter().flatten().collect();
    ranks.sort_by_key(|r| r["rank"].as_u64());
    let rows = ranks.into_iter().map(|r| {
        let node = text(&r["node"]);
        Row::new(vec![
            text(&r["rank"]),
            node.clone(),
            if r["running"] == true {
                "running".into()
            } else {
                "exited".into()
            },
            format!("{:.0} s", r["uptime_s"].as_f64().unwrap_or(0.0)),
            memory(&node, &text(&r["rank"])),
            gpus(&node, &text(&r["rank"])),
        ])
    });
    let widths = [
        Constraint::Length(5),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Length(15),
        Constraint::Min(12),
    ];
    Table::new(rows, widths)
        .header(Row::new(vec!["rank", "node", "state", "uptime", "memory", "gpu"]).bold())
        .block(Block::bordered().title(" ranks "))
}

/// Runs the view until `q`.
pub(super) fn run(ep: &Endpoint, every: Duration) -> anyhow::Result<ExitCode> {
    let mut view = View::new(ep.base());
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        loop {
            let status = ep.get("/admin/status");
            let spec = ep.get("/admin/spec").ok();
            let metrics = ep.text("/metrics").ok();
            view.update(status, spec, metrics, Instant::now());
            terminal.draw(|f| render(f, &view))?;
            let deadline = Instant::now() + every;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                if !event::poll(left)? {
                    break;
                }
                if let Event::Key(k) = event::read()? {
                    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if k.kind == KeyEventKind::Press && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c)
                    {
                        return Ok(());
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result.map(|()| ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use serde_json::json;

    const METRICS: &str = "# TYPE sparkgate_generated_tokens_total counter\n\
sparkgate_generated_tokens_total{mode=\"dspark\"} 100\n\
sparkgate_generated_tokens_total{mode=\"none\"} 20\n\
sparkgate_time_to_first_token_seconds_bucket{le=\"0.05\"} 2\n\
sparkgate_time_to_first_token_seconds_bucket{le=\"0.1\"} 9\n\
sparkgate_time_to_first_token_seconds_bucket{le=\"+Inf\"} 10\n";

    #[test]
    fn counters_sum_their_series_and_quantiles_come_from_buckets() {
        assert_eq!(metric_sum(METRICS, "sparkgate_generated_tokens_total"), Some(120.0));
        assert_eq!(metric_sum(METRICS, "sparkgate_generated"), None, "a whole name only");
        let q = |p| histogram_quantile(METRICS, "sparkgate_time_to_first_token_seconds", p);
        assert_eq!(q(0.2), Some(0.05));
        assert_eq!(q(0.5), Some(0.1));
        assert_eq!(q(0.99), Some(f64::INFINITY));
        assert_eq!(histogram_quantile(METRICS, "absent", 0.5), None);
    }

    fn screen(view: &View) -> String {
        let mut terminal = ratatui::Terminal::new(TestBackend::new(100, 30)).unwrap();
        terminal.draw(|f| render(f, view)).unwrap();
        let buffer = terminal.backend().buffer().clone();
        (0..buffer.area.height)
            .map(|y| {
                (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
                    + "\n"
            })
            .collect()
    }

    #[test]
    fn the_view_shows_state_admission_rate_and_ranks_and_says_when_the_gateway_is_down() {
        let mut view = View::new("http://127.0.0.1:8888");
        let status = json!({
            "model": "DS", "profile": "deepseek-v4.1-flash", "mode": "dspark",
            "vllm": {"version": "0.35.1", "rules": "0.34.0", "fit": "newer", "warning": "newer"},
            "admission": {"open": true, "capacity": 2, "in_flight": 1, "queued": 3},
            "supervisor": {"state": "ready", "epoch": 2, "mode": "dspark", "restarts": 1,
                "last_restart": {"reason": "operator restart"},
                "memory": [{"node": "head", "mem_available_gib": 20.0}],
                "ranks": [{"rank": 1, "node": "worker", "running": true, "uptime_s": 5.0},
                          {"rank": 0, "node": "head", "running": true, "uptime_s": 5.0}]}
        });
        let t0 = Instant::now();
        view.update(
            Ok(status.clone()),
            Some(json!({"policy": "fixed"})),
            Some(METRICS.into()),
            t0,
        );
        let later = METRICS.replace("} 100", "} 160");
        view.update(Ok(status), None, Some(later), t0 + Duration::from_secs(2));
        let s = screen(&view);
        assert!(s.contains("ready: epoch 2, mode dspark"), "{s}");
        assert!(s.contains("policy fixed · restarts 1"), "{s}");
        assert!(
            s.contains("DS (deepseek-v4.1-flash) · vLLM 0.35.1 (untested: rules 0.34.0)"),
            "{s}"
        );
        assert!(s.contains("1 in flight of 2 · 3 queued · open"), "{s}");
        assert!(s.contains("tokens/s: 30 now"), "{s}");
        assert!(s.contains("TTFT            p50 ≤ 100.0 ms"), "{s}");
        assert!(
            s.find("head").unwrap() < s.find("worker").unwrap(),
            "ranks in order:\n{s}"
        );
        assert!(s.contains("20.0 GiB free"), "{s}");
        view.update(
            Err(anyhow::anyhow!("no sparkgate answers at http://127.0.0.1:8888")),
            None,
            None,
            t0,
        );
        let s = screen(&view);
        assert!(s.contains("no sparkgate answers") && s.contains("retrying"), "{s}");
    }

    #[test]
    fn several_groups_share_the_group_line() {
        let mut view = View::new("http://127.0.0.1:8888");
        let status = json!({
            "model": "DS", "profile": "deepseek-v4.1-flash", "mode": "dspark",
            "admission": {"open": true, "capacity": 2, "in_flight": 1, "queued": 0},
            "groups": [
                {"name": "a", "upstream": {"state": "ready"}, "in_flight": 1, "capacity": 2},
                {"name": "b", "upstream": {"state": "restarting", "detail": "rank 1 exited"}, "in_flight": 0, "capacity": 2}
            ],
            "supervisor": {"state": "ready", "epoch": 1, "mode": "dspark", "restarts": 0,
                "memory": [{"node": "head", "mem_available_gib": 20.0}, {"node": "worker 1", "mem_available_gib": 11.0},
                           {"node": "worker 2", "mem_available_gib": 12.0}],
                "gpus": [{"node": "worker 2", "gpus": [{"index": 0, "utilization_pct": 98.0, "power_w": 31.2}]}],
                "ranks": [{"rank": 2, "node": "worker", "running": true, "uptime_s": 5.0}]}
        });
        view.update(Ok(status), None, None, Instant::now());
        let s = screen(&view);
        assert!(s.contains("group  a ready 1/2 · b restarting 0/2"), "{s}");
        assert!(
            s.contains("12.0 GiB free") && !s.contains("11.0 GiB free"),
            "worker 2's own memory: {s}"
        );
        assert!(s.contains("98 % 31 W"), "worker 2's GPU: {s}");
    }
}
