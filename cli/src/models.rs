//! `sparkgate model` (MODELS): every model, the loaded one and the swap under way — the whole
//! view, and its one line in `sparkgate status`.

use std::process::ExitCode;

use serde_json::Value;

/// `sparkgate model` without a name, from `GET /admin/model`'s answer `v`.
pub(super) fn show(v: &Value) -> anyhow::Result<ExitCode> {
    for m in v["models"].as_array().into_iter().flatten() {
        println!(
            "{} {:<26} {}",
            if m["loaded"] == true { "*" } else { " " },
            m["name"].as_str().unwrap_or("?"),
            m["profile"].as_str().unwrap_or("?")
        );
    }
    let swap = &v["swap"];
    println!(
        "phase     {} (SWAP_POLICY={})",
        swap["phase"].as_str().unwrap_or("?"),
        swap["policy"].as_str().unwrap_or("?")
    );
    if let Some(under_way) = under_way(swap) {
        println!("swap      {under_way}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The swap under way in words: `A → B (trigger, N s so far)`.
fn under_way(swap: &Value) -> Option<String> {
    let s = swap["swap"].as_object()?;
    let name = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
    Some(format!(
        "{} → {} ({}, {} s so far)",
        name("from"),
        name("to"),
        name("trigger"),
        s.get("elapsed_s").cloned().unwrap_or_default()
    ))
}

/// `sparkgate status`'s models line with MODELS (nothing with one model): each model, the
/// loaded one starred, and the swap's phase.
pub(super) fn line(status: &Value) -> String {
    let models: Vec<&Value> = status["models"].as_array().into_iter().flatten().collect();
    if models.len() < 2 {
        return String::new();
    }
    let names: Vec<String> = models
        .iter()
        .map(|m| {
            let star = if m["loaded"] == true { "*" } else { "" };
            format!("{star}{}", m["name"].as_str().unwrap_or("?"))
        })
        .collect();
    let swap = &status["swap"];
    let phase = swap["phase"].as_str().unwrap_or("?");
    let detail = under_way(swap).map_or_else(String::new, |u| format!(": {u}"));
    format!("models     {} · {phase}{detail}\n", names.join(" · "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_status_line_stars_the_loaded_model_and_says_the_swap() {
        let one = json!({"models": [{"name": "DS", "loaded": true}], "swap": null});
        assert_eq!(line(&one), "");
        let swapping = json!({
            "models": [{"name": "DS", "loaded": false}, {"name": "GLM", "loaded": false}],
            "swap": {"phase": "draining", "swap": {"from": "DS", "to": "GLM", "trigger": "demand", "elapsed_s": 1.5}}
        });
        assert_eq!(
            line(&swapping),
            "models     DS · GLM · draining: DS → GLM (demand, 1.5 s so far)\n"
        );
        let serving = json!({"models": [{"name": "DS", "loaded": false}, {"name": "GLM", "loaded": true}], "swap": {"phase": "serving", "swap": null}});
        assert_eq!(line(&serving), "models     DS · *GLM · serving\n");
    }
}
