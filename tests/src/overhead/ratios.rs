//! Same-run ratios of the overhead figures: each of sparkgate's figures over the same figure of
//! nginx, SMG and LiteLLM from the same run (machine drift cancels out), a committed baseline of
//! them (`tests/overhead/baseline.json`), and a check that fails when a ratio regresses by more
//! than a margin against it.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// Which way a figure improves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// One figure of a front's result; `direct` is the no-front run, for the "added" figures.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    pub name: &'static str,
    pub better: Better,
    value: fn(front: &Value, direct: Option<&Value>) -> Option<f64>,
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

fn added(front: &Value, direct: Option<&Value>, path: &[&str]) -> Option<f64> {
    let at = |v: &Value| path.iter().fold(v, |v, k| &v[*k]).clone();
    Some(num(&at(front))? - num(&at(direct?))?)
}

/// The figures the acceptance names (and what explains one), in report order.
pub const FIGURES: &[Figure] = &[
    Figure {
        name: "c64_req_per_s",
        better: Better::Higher,
        value: |f, _| num(&f["non_streaming"]["64"]["rps"]),
    },
    // Not an acceptance figure: the front's CPU per request at c=64, which on cores shared
    // with the backend and the load decides the throughput above.
    Figure {
        name: "c64_cpu_us_per_req",
        better: Better::Lower,
        value: |f, _| num(&f["non_streaming"]["64"]["cpu_us_per_req"]),
    },
    Figure {
        name: "c1_added_p50_ms",
        better: Better::Lower,
        value: |f, d| added(f, d, &["non_streaming", "1", "p50_ms"]),
    },
    Figure {
        name: "stream_ttft_p99_ms",
        better: Better::Lower,
        value: |f, _| num(&f["streaming"]["ttft_p99_ms"]),
    },
    Figure {
        name: "stream_added_ttft_p50_ms",
        better: Better::Lower,
        value: |f, d| added(f, d, &["streaming", "ttft_p50_ms"]),
    },
    Figure {
        name: "stream_added_gap_p99_us",
        better: Better::Lower,
        value: |f, d| added(f, d, &["streaming", "gap_p99_us"]),
    },
    Figure {
        name: "stream_cpu_s_per_1000",
        better: Better::Lower,
        value: |f, _| num(&f["streaming"]["cpu_s_per_1000"]),
    },
    Figure {
        name: "idle_kib_per_stream",
        better: Better::Lower,
        value: |f, _| num(&f["idle"]["kib_per_stream"]),
    },
];

/// The fronts sparkgate is compared with.
pub const PEERS: [&str; 3] = ["nginx", "smg", "litellm"];

/// `{peer: {figure: sparkgate / peer}}` for every figure both fronts have.
pub fn ratios(results: &[Value]) -> BTreeMap<String, BTreeMap<String, f64>> {
    let find = |name: &str| results.iter().find(|r| r["front"] == name && r["error"].is_null());
    let direct = find("direct");
    let mut out = BTreeMap::new();
    let Some(sparkgate) = find("sparkgate") else {
        return out;
    };
    for peer in PEERS {
        let Some(p) = find(peer) else { continue };
        let row: BTreeMap<String, f64> = FIGURES
            .iter()
            .filter_map(|f| {
                let (ours, theirs) = ((f.value)(sparkgate, direct)?, (f.value)(p, direct)?);
                (theirs != 0.0).then(|| (f.name.to_owned(), ours / theirs))
            })
            .collect();
        out.insert(peer.to_owned(), row);
    }
    out
}

/// The ratio table, a line per figure: sparkgate's value, then its ratio to each peer.
pub fn table(results: &[Value]) -> String {
    let r = ratios(results);
    let sparkgate = results.iter().find(|r| r["front"] == "sparkgate");
    let direct = results.iter().find(|r| r["front"] == "direct");
    let mut out =
        String::from("| figure | better | sparkgate | ÷ nginx | ÷ SMG | ÷ LiteLLM |\n|---|---|---|---|---|---|\n");
    for f in FIGURES {
        let ours = sparkgate.and_then(|s| (f.value)(s, direct));
        let cell = |peer: &str| {
            r.get(peer)
                .and_then(|row| row.get(f.name))
                .map_or("—".into(), |x| format!("{x:.2}×"))
        };
        out += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            f.name,
            if f.better == Better::Higher { "higher" } else { "lower" },
            ours.map_or("—".into(), |v| format!("{v:.3}")),
            cell("nginx"),
            cell("smg"),
            cell("litellm")
        );
    }
    out
}

/// Every ratio that is worse than `baseline`'s by more than `margin` (0.1 = 10 %), in words.
pub fn regressions(now: &BTreeMap<String, BTreeMap<String, f64>>, baseline: &Value, margin: f64) -> Vec<String> {
    let mut out = Vec::new();
    for f in FIGURES {
        for peer in PEERS {
            let (Some(then), Some(&now)) = (
                baseline[peer][f.name].as_f64(),
                now.get(peer).and_then(|r| r.get(f.name)),
            ) else {
                continue;
            };
            let worse = match f.better {
                Better::Higher => now < then * (1.0 - margin),
                Better::Lower => now > then * (1.0 + margin),
            };
            if worse {
                out.push(format!(
                    "{} ÷ {peer}: {now:.3}× against the baseline's {then:.3}× ({} is better)",
                    f.name,
                    if f.better == Better::Higher { "higher" } else { "lower" }
                ));
            }
        }
    }
    out
}

/// The ratios as the baseline file holds them.
pub fn baseline_json(now: &BTreeMap<String, BTreeMap<String, f64>>) -> Value {
    json!(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn front(name: &str, rps: f64, p50: f64, cpu: f64) -> Value {
        json!({"front": name, "non_streaming": {"64": {"rps": rps}, "1": {"p50_ms": p50}},
               "streaming": {"cpu_s_per_1000": cpu}})
    }

    #[test]
    fn ratios_divide_by_each_peer_and_regressions_follow_the_direction() {
        let results = [
            front("direct", 30000.0, 0.10, 0.0),
            front("sparkgate", 20000.0, 0.18, 3.0),
            front("nginx", 25000.0, 0.15, 2.0),
        ];
        let r = ratios(&results);
        assert_eq!(r["nginx"]["c64_req_per_s"], 0.8);
        assert!(
            (r["nginx"]["c1_added_p50_ms"] - 1.6).abs() < 1e-9,
            "added over added: 0.08 / 0.05"
        );
        assert_eq!(r["nginx"]["stream_cpu_s_per_1000"], 1.5);
        assert!(!r.contains_key("smg"), "a peer that did not run has no ratios");
        let baseline = json!({"nginx": {"c64_req_per_s": 0.9, "stream_cpu_s_per_1000": 1.4, "c1_added_p50_ms": 2.0}});
        let worse = regressions(&r, &baseline, 0.05);
        assert_eq!(worse.len(), 2, "{worse:?}");
        assert!(worse[0].starts_with("c64_req_per_s ÷ nginx: 0.800×"), "{worse:?}");
        assert!(worse[1].starts_with("stream_cpu_s_per_1000 ÷ nginx"), "{worse:?}");
        assert!(regressions(&r, &baseline, 0.2).is_empty(), "inside the margin");
    }
}
