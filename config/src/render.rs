//! Renders a rank plan as commands an operator can paste: `docker run …` and `vllm serve …`.

use crate::config::{Gpus, RankEnvValue};
use crate::plan::RankPlan;

fn quote(word: &str) -> String {
    shlex::try_quote(word)
        .map(|q| q.into_owned())
        .unwrap_or_else(|_| format!("'{}'", word.replace('\0', "")))
}

fn join(words: impl IntoIterator<Item = String>) -> String {
    words.into_iter().collect::<Vec<_>>().join(" ")
}

impl RankPlan {
    /// `vllm serve …`, shell-quoted.
    pub fn vllm_command(&self) -> String {
        join(std::iter::once("vllm".to_owned()).chain(self.vllm_argv().iter().map(|w| quote(w))))
    }

    /// The equivalent `docker run`, shell-quoted. A secret appears as `-e NAME` without a
    /// value, so Docker takes it from the pasting shell's environment and it is never printed.
    pub fn docker_run_command(&self) -> String {
        let c = &self.container;
        let mut w: Vec<String> = vec![
            "docker".into(),
            "run".into(),
            "-d".into(),
            "--name".into(),
            quote(&c.name),
        ];
        for (k, v) in &c.labels {
            w.push("--label".into());
            w.push(quote(&format!("{k}={v}")));
        }
        w.push(format!("--network={}", c.network_mode));
        w.push(format!("--ipc={}", c.ipc_mode));
        if c.gpus == Gpus::All {
            w.push("--gpus".into());
            w.push("all".into());
        }
        w.push(format!("--shm-size={}g", c.shm_size_bytes >> 30));
        w.push(format!("--stop-timeout={}", c.stop_timeout_s));
        w.push(format!("--restart={}", c.restart_policy));
        if let Some(adj) = c.oom_score_adj {
            w.push(format!("--oom-score-adj={adj}"));
        }
        for cap in &c.cap_add {
            w.push(format!("--cap-add={cap}"));
        }
        for d in &c.devices {
            w.push("--device".into());
            w.push(quote(d));
        }
        for u in &c.ulimits {
            let v = if u.soft == u.hard {
                u.soft.to_string()
            } else {
                format!("{}:{}", u.soft, u.hard)
            };
            w.push(format!("--ulimit={}={v}", u.name));
        }
        for m in &c.mounts {
            w.push("-v".into());
            w.push(quote(&m.bind_spec()));
        }
        for (k, v) in &c.env {
            w.push("-e".into());
            match v {
                RankEnvValue::Plain(p) => w.push(quote(&format!("{k}={p}"))),
                RankEnvValue::Secret(_) => w.push(quote(k)),
            }
        }
        w.push("--entrypoint".into());
        w.push(quote(&c.entrypoint.join(" ")));
        w.push(quote(&c.image));
        w.extend(c.cmd.iter().map(|a| quote(a)));
        join(w)
    }
}
