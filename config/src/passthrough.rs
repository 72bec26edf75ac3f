//! The rank containers' pass-through environment, and warnings about variables sparkgate does
//! not use (unknown, another profile's, or overridden by a per-rank pin).

use std::collections::BTreeMap;

use crate::config::RankEnvValue;
use crate::knobs::{self, PASSTHROUGH_PREFIXES, PER_RANK_ENV};
use crate::resolve::Resolver;
use crate::secret::Secret;
use crate::source::Source;

/// The rank containers' pass-through environment, and warnings about variables that are
/// unknown, unused by this profile or overridden by per-rank pins.
pub(crate) fn rank_env_and_warnings(r: &Resolver<'_>) -> (Vec<(String, RankEnvValue)>, Vec<String>) {
    let mut env: Vec<(String, RankEnvValue)> = knobs::KNOBS
        .iter()
        .filter(|k| k.rank_env && r.applies(k))
        .filter_map(|k| {
            let v = r.value(k.name);
            match (k.secret, v.is_empty()) {
                (true, true) => None,
                (true, false) => Some((k.name.to_owned(), RankEnvValue::Secret(Secret::new(v)))),
                (false, _) => Some((k.name.to_owned(), RankEnvValue::Plain(v))),
            }
        })
        .collect();
    let mut warnings = Vec::new();
    let mut extra: BTreeMap<String, (String, Source)> = BTreeMap::new();
    let process = r
        .layers
        .process
        .iter()
        .map(|(k, v)| (k.clone(), v.clone(), Source::Process));
    let file = r.layers.dotenv.into_iter().flat_map(|d| {
        d.assignments.iter().map(move |a| {
            (
                a.key.clone(),
                a.value.clone(),
                Source::EnvFile {
                    path: d.path.clone(),
                    line: a.line,
                },
            )
        })
    });
    // File first so the process environment overwrites it.
    for (key, value, source) in file.chain(process) {
        let from_file = matches!(source, Source::EnvFile { .. });
        if let Some(knob) = knobs::knob_by_any_name(&key) {
            if !r.applies(knob) && from_file {
                warnings.push(format!(
                    "{key} ({source}) is not used by the {} profile; ignored",
                    r.profile
                ));
            }
            continue;
        }
        if PER_RANK_ENV.contains(&key.as_str()) {
            warnings.push(format!(
                "{key} ({source}) is ignored: each rank's value comes from HEAD_/WORKER_CX7_IF, _CX7_IB, _GID and the node IPs"
            ));
            continue;
        }
        if PASSTHROUGH_PREFIXES.iter().any(|p| key.starts_with(p)) {
            extra.insert(key, (value, source));
        } else if from_file {
            warnings.push(format!("{key} ({source}) is not a sparkgate variable; ignored"));
        }
    }
    env.extend(extra.into_iter().map(|(k, (v, _))| (k, RankEnvValue::Plain(v))));
    for pair in r.value("RANK_ENV").split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((k, v)) = pair.split_once('=') {
            env.retain(|(name, _)| name != k.trim());
            env.push((k.trim().to_owned(), RankEnvValue::Plain(v.trim().to_owned())));
        }
    }
    (env, warnings)
}
