//! What a knob accepts. Each knob in the table carries one `Rule`; validation (`check`) and the
//! reference's "Accepts" column (`describe`) are both derived from it, so a range is written once.

use crate::dotenv::is_identifier;
use crate::profile::ProfileId;
use crate::spec;

/// What a value must look like. Relations between knobs (ports that must differ, TP a multiple
/// of NNODES, the profiles' hard constraints) are checked by the builder after these.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Rule {
    /// Anything, including empty.
    Text,
    NonEmpty,
    /// Non-empty, no whitespace (a model id).
    Word,
    /// A base-10 integer in `min..=max`; leading zeros are fine, as in the launchers' checks.
    Int(i64, i64),
    /// A decimal number in `(min, max]`.
    Float(f64, f64),
    /// `0` or `1`.
    Flag,
    /// One of these words (`""` is the empty value).
    OneOf(&'static [&'static str]),
    /// This word, or an integer in `min..=max`.
    WordOrInt(&'static str, i64, i64),
    Ip,
    /// `http://host[:port]`, as the gateway builds upstream URIs on it.
    HttpUrl,
    AbsolutePath,
    DockerName,
    /// Shell words with balanced quotes (the `vllm serve` argument tail).
    ShellWords,
    /// A command line split into argv words; quotes must close.
    Command,
    JsonObject,
    /// Comma-separated `NAME=value` pairs.
    EnvPairs,
    /// Comma-separated `from=to` pairs: an OpenAI effort name to one the profile's template takes.
    EffortMap,
    /// Comma-separated `client=weight` pairs, each weight an integer 1..=1000.
    ClientWeights,
    /// Comma-separated workers, each `[user@]address[:ssh-port]` (an IPv6 address in brackets
    /// when a port follows).
    Workers,
    /// One of the profile's speculation modes.
    SpecMode,
    /// Comma-separated profile words (MODELS), each at most once.
    Profiles,
    /// Empty (unset), or the inner rule.
    Optional(&'static Rule),
    /// The inner rule, with a reason appended to its message.
    Because(&'static Rule, &'static str),
}

use Rule::*;

/// The OpenAI reasoning-effort names REASONING_EFFORT_MAP may map from.
const OPENAI_EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

impl Rule {
    /// Every rule `raw` breaks, as "must …" sentences (several for the pair lists).
    pub(crate) fn check(&self, raw: &str, profile: ProfileId) -> Vec<String> {
        match self {
            Optional(_) if raw.is_empty() => Vec::new(),
            Optional(inner) => inner.check(raw, profile),
            Because(inner, why) => inner
                .check(raw, profile)
                .into_iter()
                .map(|m| format!("{m} ({why})"))
                .collect(),
            EnvPairs => pairs(raw)
                .filter(|p| !p.split_once('=').is_some_and(|(k, _)| is_identifier(k.trim())))
                .map(|p| format!("`{p}` must be NAME=value"))
                .collect(),
            EffortMap => pairs(raw).filter_map(|p| effort_pair(p, profile).err()).collect(),
            // By position: a client may be an API key, which an error must not show.
            ClientWeights => pairs(raw)
                .enumerate()
                .filter_map(|(i, p)| weight_pair(p).err().map(|e| format!("pair {} {e}", i + 1)))
                .collect(),
            Workers => pairs(raw).filter_map(|w| worker_entry(w).err()).collect(),
            Profiles => profile_list(raw),
            _ => self.check_one(raw, profile).err().into_iter().collect(),
        }
    }

    fn check_one(&self, raw: &str, profile: ProfileId) -> Result<(), String> {
        let ok = match self {
            Text => true,
            NonEmpty => !raw.trim().is_empty(),
            Word if raw.is_empty() => return Err("must not be empty".into()),
            Word => !raw.chars().any(char::is_whitespace),
            Int(min, max) => int(raw).is_some_and(|v| (*min..=*max).contains(&v)),
            Float(min, max) => decimal(raw).is_some_and(|v| v > *min && v <= *max),
            Flag => raw == "0" || raw == "1",
            OneOf(words) => words.contains(&raw),
            WordOrInt(word, min, max) => raw == *word || int(raw).is_some_and(|v| (*min..=*max).contains(&v)),
            Ip => raw.parse::<std::net::IpAddr>().is_ok(),
            HttpUrl => upstream_ok(raw.trim_end_matches('/')),
            AbsolutePath => raw.starts_with('/'),
            DockerName => {
                raw.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                    && raw.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
            }
            ShellWords => shlex::split(raw).is_some(),
            Command if raw.trim().is_empty() => return Err("must not be empty".into()),
            Command => crate::words::shell_words(raw).is_some(),
            JsonObject => matches!(
                serde_json::from_str::<serde_json::Value>(raw),
                Ok(serde_json::Value::Object(_))
            ),
            SpecMode => spec::mode_defs(profile).iter().any(|d| d.method.as_str() == raw),
            EnvPairs | EffortMap | ClientWeights | Workers | Profiles | Optional(_) | Because(..) => {
                unreachable!("handled by check")
            }
        };
        if ok {
            Ok(())
        } else {
            Err(self.message(profile))
        }
    }

    /// The sentence a breaking value gets.
    fn message(&self, profile: ProfileId) -> String {
        match self {
            NonEmpty => "must not be empty".into(),
            Word => "must not contain whitespace".into(),
            Int(min, max) => format!("must be an integer between {min} and {max}"),
            Float(min, max) => format!("must be a decimal number in ({min}, {max}]"),
            Flag => "must be 0 or 1".into(),
            OneOf(words) => format!("must be one of: {}", shown(words)),
            WordOrInt(word, min, max) => format!("must be `{word}` or an integer between {min} and {max}"),
            Ip => "must be an IPv4 or IPv6 address".into(),
            HttpUrl => "must be an http:// URL such as http://127.0.0.1:18888".into(),
            AbsolutePath => "must be an absolute path".into(),
            DockerName => "must be a Docker container name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)".into(),
            ShellWords => "must be shell words with balanced quotes".into(),
            Command => "has an unterminated quote".into(),
            JsonObject => "must be a JSON object such as {\"image\":4}; in an env file single-quote it \
                           (LIMIT_MM='{\"image\":4}'), as bash drops unquoted double quotes"
                .into(),
            SpecMode => format!("must be one of: {}", mode_words(profile).join(", ")),
            Text | EnvPairs | EffortMap | ClientWeights | Workers | Profiles | Optional(_) | Because(..) => {
                unreachable!("never fails alone")
            }
        }
    }

    /// What the reference's "Accepts" column says, for one profile.
    pub(crate) fn describe(&self, profile: ProfileId) -> String {
        match self {
            Text => "text".into(),
            NonEmpty => "non-empty text".into(),
            Word => "a word (no spaces)".into(),
            Int(min, max) => format!("integer {min}..{max}"),
            Float(min, max) => format!("decimal in ({min}, {max}]"),
            Flag => "0 or 1".into(),
            OneOf(words) => ticked(words),
            WordOrInt(word, min, max) => format!("`{word}` or integer {min}..{max}"),
            Ip => "IP address".into(),
            HttpUrl => "http://host:port".into(),
            AbsolutePath => "absolute path".into(),
            DockerName => "container name".into(),
            ShellWords => "shell words".into(),
            Command => "command line".into(),
            JsonObject => "JSON object".into(),
            EnvPairs => "NAME=value,…".into(),
            EffortMap => "from=to,…".into(),
            ClientWeights => "client=weight,… (weight 1..1000)".into(),
            Workers => "[user@]address[:ssh-port],…".into(),
            Profiles => format!("empty, or profiles from {}, comma-separated", ticked(ProfileId::WORDS)),
            SpecMode => ticked(&mode_words(profile)),
            Optional(inner) => format!("empty, or {}", inner.describe(profile)),
            Because(inner, _) => inner.describe(profile),
        }
    }
}

/// What breaks in a MODELS list: a word that is no profile, or one named twice.
fn profile_list(raw: &str) -> Vec<String> {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for word in pairs(raw) {
        if !ProfileId::WORDS.contains(&word) {
            out.push(format!("`{word}` must be one of: {}", shown(ProfileId::WORDS)));
        } else if seen.contains(&word) {
            out.push(format!("`{word}` must be named once"));
        }
        seen.push(word);
    }
    out
}

fn pairs(raw: &str) -> impl Iterator<Item = &str> {
    raw.split(',').map(str::trim).filter(|p| !p.is_empty())
}

fn shown(words: &[&str]) -> String {
    let shown: Vec<&str> = words.iter().map(|w| if w.is_empty() { "(empty)" } else { w }).collect();
    shown.join(", ")
}

fn ticked(words: &[&str]) -> String {
    let ticked: Vec<String> = words
        .iter()
        .map(|w| {
            if w.is_empty() {
                "(empty)".into()
            } else {
                format!("`{w}`")
            }
        })
        .collect();
    ticked.join(", ")
}

fn mode_words(profile: ProfileId) -> Vec<&'static str> {
    spec::mode_defs(profile).iter().map(|d| d.method.as_str()).collect()
}

/// Base-10 integers only; a sign is allowed, other notations are not.
pub(crate) fn int(raw: &str) -> Option<i64> {
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| raw.parse().ok())
        .flatten()
}

/// Plain decimals (`1`, `0.5`, `.5`); no sign, exponent or `inf`.
pub(crate) fn decimal(raw: &str) -> Option<f64> {
    let plain =
        !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit() || b == b'.') && raw.matches('.').count() <= 1;
    plain.then(|| raw.parse().ok()).flatten()
}

/// The largest weight a client may have (its share against a weight-1 client).
pub(crate) const MAX_WEIGHT: u32 = 1000;

/// One `client=weight` pair of CLIENT_WEIGHTS; the error names neither (the client may be a key).
pub(crate) fn weight_pair(pair: &str) -> Result<(&str, u32), String> {
    let Some((client, weight)) = pair.rsplit_once('=').map(|(c, w)| (c.trim(), w.trim())) else {
        return Err("must be client=weight".into());
    };
    if client.is_empty() {
        return Err("must name a client before `=`".into());
    }
    match weight.parse::<u32>() {
        Ok(w) if (1..=MAX_WEIGHT).contains(&w) => Ok((client, w)),
        _ => Err(format!("must have a weight between 1 and {MAX_WEIGHT}")),
    }
}

/// One entry of WORKERS: `[user@]address[:port]`, `[v6]:port` when an IPv6 address has a port.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WorkerEntry {
    pub user: Option<String>,
    pub ip: std::net::IpAddr,
    pub port: Option<u16>,
}

/// Parses one WORKERS entry, or says why it is refused (naming it: an address is no secret).
pub(crate) fn worker_entry(entry: &str) -> Result<WorkerEntry, String> {
    let refuse = |why: &str| Err(format!("`{entry}` {why}"));
    let (user, host) = match entry.rsplit_once('@') {
        Some((u, h)) if !u.is_empty() && !u.contains(char::is_whitespace) => (Some(u.to_owned()), h),
        Some(_) => return refuse("must name a user before `@`"),
        None => (None, entry),
    };
    let (addr, port) = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((a, "")) => (a, None),
            Some((a, p)) if p.starts_with(':') => (a, Some(&p[1..])),
            _ => return refuse("must close its `[` with `]` (and `:port` after it)"),
        }
    } else if host.matches(':').count() == 1 {
        let (a, p) = host.split_once(':').expect("one colon");
        (a, Some(p))
    } else {
        (host, None)
    };
    let Ok(ip) = addr.parse() else {
        return refuse("must be [user@]address[:ssh-port] with an IP address");
    };
    let port = match port.map(|p| p.parse::<u16>()) {
        None => None,
        Some(Ok(p)) if p > 0 => Some(p),
        Some(_) => return refuse("must have an SSH port between 1 and 65535"),
    };
    Ok(WorkerEntry { user, ip, port })
}

/// One `from=to` pair of REASONING_EFFORT_MAP, or why it is refused.
pub(crate) fn effort_pair(pair: &str, profile: ProfileId) -> Result<(&str, &str), String> {
    let Some((from, to)) = pair.split_once('=').map(|(f, t)| (f.trim(), t.trim())) else {
        return Err(format!("`{pair}` must be from=to"));
    };
    if !OPENAI_EFFORTS.contains(&from) {
        return Err(format!(
            "`{from}` is not an effort name ({})",
            OPENAI_EFFORTS.join(", ")
        ));
    }
    let facts = profile.reasoning();
    let to_ok = to == "none"
        || facts.named.iter().any(|(n, _)| *n == to)
        || (profile == ProfileId::Glm53Flash && to == "max")
        || facts
            .integer_range
            .is_some_and(|(lo, hi)| to.parse::<u8>().is_ok_and(|v| (lo..=hi).contains(&v)));
    if to_ok {
        Ok((from, to))
    } else {
        Err(format!(
            "`{from}={to}`: {profile} accepts {}",
            accepted_efforts(profile)
        ))
    }
}

/// The effort values a profile's template takes, for messages.
fn accepted_efforts(profile: ProfileId) -> String {
    let facts = profile.reasoning();
    let mut names: Vec<String> = facts.named.iter().map(|(n, _)| (*n).to_owned()).collect();
    if profile == ProfileId::Glm53Flash {
        names.push("max".into());
    }
    names.push("none".into());
    if let Some((lo, hi)) = facts.integer_range {
        names.push(format!("an integer {lo}-{hi}"));
    }
    names.join(", ")
}

/// Whether the gateway can build upstream request URIs on `base` (`{base}{path}`), checked
/// with the same parser it builds them with: `http://` and a host, no path, query or fragment.
fn upstream_ok(base: &str) -> bool {
    let Some(rest) = base.strip_prefix("http://") else {
        return false;
    };
    if rest.is_empty() || rest.contains(['/', '?', '#', ' ']) {
        return false;
    }
    format!("{base}/v1/models?x=1").parse::<http::Uri>().is_ok_and(|u| {
        u.scheme_str() == Some("http")
            && u.authority()
                .is_some_and(|a| !a.host().is_empty() && port_ok(a.as_str()))
    })
}

/// An authority's port, when it has one, is a number the connector can dial.
fn port_ok(authority: &str) -> bool {
    // After an IPv6 literal's `]`, or after the host.
    let tail = authority.rsplit_once(']').map_or(authority, |(_, t)| t);
    match tail.rsplit_once(':') {
        Some((_, port)) => port.parse::<u16>().is_ok(),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DS: ProfileId = ProfileId::DeepSeekV41Flash;

    #[test]
    fn each_rule_accepts_its_values_and_names_what_it_wanted() {
        assert!(Int(1, 5).check("0005", DS).is_empty());
        assert_eq!(Int(1, 5).check("6", DS), ["must be an integer between 1 and 5"]);
        assert_eq!(Int(1, 5).check("0x5", DS).len(), 1);
        assert!(Float(0.0, 1.0).check(".5", DS).is_empty());
        assert_eq!(Float(0.0, 1.0).check("1e0", DS), ["must be a decimal number in (0, 1]"]);
        assert!(Optional(&Int(1, 5)).check("", DS).is_empty());
        assert_eq!(
            Because(&Int(1, 8191), "glm guide").check("8192", DS),
            ["must be an integer between 1 and 8191 (glm guide)"]
        );
        assert_eq!(
            EnvPairs.check("A=1, b c=2,=3", DS),
            ["`b c=2` must be NAME=value", "`=3` must be NAME=value"]
        );
        assert_eq!(OneOf(&["", "low"]).check("x", DS), ["must be one of: (empty), low"]);
        assert!(ClientWeights.check("sk-a=4, 10.0.0.7=1,", DS).is_empty());
        assert_eq!(
            ClientWeights.check("sk-secret=0,b,=2,c=x", DS),
            [
                "pair 1 must have a weight between 1 and 1000",
                "pair 2 must be client=weight",
                "pair 3 must name a client before `=`",
                "pair 4 must have a weight between 1 and 1000"
            ]
        );
        assert!(SpecMode.check("dspark", DS).is_empty());
        assert_eq!(SpecMode.check("mtp", DS), ["must be one of: dspark, none"]);
        assert_eq!(Word.check("", DS), ["must not be empty"]);
        assert!(HttpUrl.check("http://[::1]:8000/", DS).is_empty());
        assert_eq!(HttpUrl.check("http://[::1", DS).len(), 1);
    }

    #[test]
    fn descriptions_are_short_and_say_the_bounds() {
        assert_eq!(
            Optional(&Int(-1000, 1000)).describe(DS),
            "empty, or integer -1000..1000"
        );
        assert_eq!(Float(0.0, 1.0).describe(DS), "decimal in (0, 1]");
        assert_eq!(SpecMode.describe(ProfileId::Glm53Flash), "`dflash`, `mtp`, `none`");
        assert_eq!(WordOrInt("stock", 1, 1000).describe(DS), "`stock` or integer 1..1000");
    }

    #[test]
    fn worker_entries_take_a_user_an_address_and_a_port() {
        let e = worker_entry("ops@10.0.0.3:2222").unwrap();
        assert_eq!(
            (e.user.as_deref(), e.ip.to_string(), e.port),
            (Some("ops"), "10.0.0.3".into(), Some(2222))
        );
        let e = worker_entry("10.0.0.4").unwrap();
        assert_eq!((e.user, e.port), (None, None));
        assert_eq!(worker_entry("[fd00::4]:22").unwrap().port, Some(22));
        assert_eq!(worker_entry("fd00::4").unwrap().ip.to_string(), "fd00::4");
        assert!(Workers.check("10.0.0.2, ops@10.0.0.3:22,", DS).is_empty());
        assert_eq!(
            Workers.check("spark-3,@10.0.0.4,10.0.0.5:0,[fd00::1", DS),
            [
                "`spark-3` must be [user@]address[:ssh-port] with an IP address",
                "`@10.0.0.4` must name a user before `@`",
                "`10.0.0.5:0` must have an SSH port between 1 and 65535",
                "`[fd00::1` must close its `[` with `]` (and `:port` after it)",
            ]
        );
    }
}
