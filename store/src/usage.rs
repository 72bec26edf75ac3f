//! Usage per API key (docs/keys.md): one row per minute, key name, model and route, whose counts
//! each finished request adds to in one upsert — so totals for any window from a minute up are
//! sums, several gateways on one PostgreSQL store add to the same rows, and nothing is lost
//! across a restart. Queue waits are kept as a histogram (`WAIT_BOUNDS_MS`) for percentiles.

use std::sync::LazyLock;

use crate::{int, text, Param, Store, StoreError};

/// Upper bounds (ms) of the queue-wait histogram's buckets; one more bucket holds the rest.
pub const WAIT_BOUNDS_MS: [u64; 11] = [10, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000];
const BUCKETS: usize = WAIT_BOUNDS_MS.len() + 1;

/// The counted columns, in the order `Usage::counts` gives them: the fields, then the buckets.
const FIELDS: [&str; 9] = [
    "requests",
    "errors",
    "disconnects",
    "refusals",
    "prompt",
    "cached",
    "completion",
    "reasoning",
    "wait_ms",
];
const COUNTS: usize = FIELDS.len() + BUCKETS;

/// What a key used: requests and how they ended, tokens, and the time it waited for a slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub requests: u64,
    /// Answered with an error (the gateway's or vLLM's).
    pub errors: u64,
    /// Streams whose client left before the end (counted with what was generated until then).
    pub disconnects: u64,
    /// Refused, or (QUOTA_MODE=shadow) would have been, for the key's quota.
    pub refusals: u64,
    pub prompt: u64,
    /// Prompt tokens read from vLLM's prefix cache.
    pub cached: u64,
    pub completion: u64,
    /// Completion tokens that were reasoning.
    pub reasoning: u64,
    /// Queue wait, summed (ms).
    pub wait_ms: u64,
    /// Queue waits by `WAIT_BOUNDS_MS` bucket.
    #[serde(skip)]
    pub waits: [u64; BUCKETS],
}

impl Usage {
    /// Counts one queue wait.
    pub fn waited(&mut self, ms: u64) {
        let bucket = WAIT_BOUNDS_MS.iter().position(|b| ms <= *b).unwrap_or(BUCKETS - 1);
        self.waits[bucket] += 1;
        self.wait_ms += ms;
    }

    /// The queue wait `p` (0–1) of the waits fall under: a bucket's upper bound in ms (`None`
    /// when nothing waited, or past the last bound).
    pub fn wait_percentile(&self, p: f64) -> Option<u64> {
        let total: u64 = self.waits.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((p * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, n) in self.waits.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return WAIT_BOUNDS_MS.get(i).copied();
            }
        }
        None
    }

    pub fn add(&mut self, other: &Usage) {
        let (mut mine, theirs) = (self.counts(), other.counts());
        for (m, t) in mine.iter_mut().zip(theirs) {
            *m += t;
        }
        *self = Usage::from_counts(&mine);
    }

    fn counts(&self) -> [u64; COUNTS] {
        let mut c = [0; COUNTS];
        let fields = [
            self.requests,
            self.errors,
            self.disconnects,
            self.refusals,
            self.prompt,
            self.cached,
            self.completion,
            self.reasoning,
            self.wait_ms,
        ];
        c[..FIELDS.len()].copy_from_slice(&fields);
        c[FIELDS.len()..].copy_from_slice(&self.waits);
        c
    }

    fn from_counts(c: &[u64]) -> Usage {
        let mut waits = [0; BUCKETS];
        waits.copy_from_slice(&c[FIELDS.len()..COUNTS]);
        Usage {
            requests: c[0],
            errors: c[1],
            disconnects: c[2],
            refusals: c[3],
            prompt: c[4],
            cached: c[5],
            completion: c[6],
            reasoning: c[7],
            wait_ms: c[8],
            waits,
        }
    }
}

/// Whose usage a row is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct UsageKey {
    /// The API key's name (`anonymous` without keys).
    pub key: String,
    pub model: String,
    pub route: String,
}

fn columns() -> Vec<String> {
    let buckets = (0..BUCKETS).map(|i| format!("w{i}"));
    FIELDS.iter().map(|f| (*f).to_owned()).chain(buckets).collect()
}

pub(crate) static SCHEMA: LazyLock<String> = LazyLock::new(|| {
    let counts: Vec<String> = columns().iter().map(|c| format!("{c} BIGINT NOT NULL")).collect();
    format!(
        "CREATE TABLE IF NOT EXISTS sparkgate_usage (
        minute BIGINT NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, route TEXT NOT NULL, {},
        PRIMARY KEY (minute, key, model, route))",
        counts.join(", ")
    )
});

/// Adds a request's counts to its minute's row: `$1` minute, `$2` key, `$3` model, `$4` route,
/// then the counts.
static ADD: LazyLock<String> = LazyLock::new(|| {
    let cols = columns();
    let params: Vec<String> = (5..5 + cols.len()).map(|i| format!("${i}")).collect();
    let sums: Vec<String> = cols
        .iter()
        .map(|c| format!("{c} = sparkgate_usage.{c} + excluded.{c}"))
        .collect();
    format!(
        "INSERT INTO sparkgate_usage (minute, key, model, route, {}) VALUES ($1, $2, $3, $4, {})
        ON CONFLICT (minute, key, model, route) DO UPDATE SET {}",
        cols.join(", "),
        params.join(", "),
        sums.join(", ")
    )
});

/// Sums since `$1` (a minute, in seconds), by key, model and route; `$2` a key name or ''.
static SINCE: LazyLock<String> = LazyLock::new(|| {
    let sums: Vec<String> = columns().iter().map(|c| format!("CAST(SUM({c}) AS BIGINT)")).collect();
    format!(
        "SELECT key, model, route, {} FROM sparkgate_usage WHERE minute >= $1 AND ($2 = '' OR key = $2)
        GROUP BY key, model, route ORDER BY key, model, route",
        sums.join(", ")
    )
});

/// Tokens by key and minute since `$1`.
const BY_MINUTE: &str = "SELECT key, minute, CAST(SUM(prompt + completion) AS BIGINT) FROM sparkgate_usage
    WHERE minute >= $1 GROUP BY key, minute ORDER BY key, minute";

/// Prompt and completion tokens and requests by key and bucket: minutes since `$1`, bucketed by
/// `$2` seconds from `$1`; `$3` a key name or ''.
const SERIES: &str = "SELECT key, $1 + ((minute - $1) / $2) * $2 AS bucket, CAST(SUM(prompt) AS BIGINT),
    CAST(SUM(completion) AS BIGINT), CAST(SUM(requests) AS BIGINT) FROM sparkgate_usage
    WHERE minute >= $1 AND ($3 = '' OR key = $3) GROUP BY key, bucket ORDER BY key, bucket";

/// One key's use in one bucket of a series (`Store::usage_series`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesPoint {
    pub key: String,
    /// The bucket's start (seconds).
    pub at: i64,
    pub prompt: u64,
    pub completion: u64,
    pub requests: u64,
}

/// `ADD`'s parameters for a request's counts at `at` (seconds).
fn add_params(at: i64, who: &UsageKey, usage: &Usage) -> Vec<Param> {
    let mut params = vec![
        Param::Int(at - at.rem_euclid(60)),
        Param::Text(who.key.clone()),
        Param::Text(who.model.clone()),
        Param::Text(who.route.clone()),
    ];
    params.extend(usage.counts().iter().map(|c| Param::Int(*c as i64)));
    params
}

/// The rows' integer columns (every one after key, model, route).
static INTS: LazyLock<Vec<usize>> = LazyLock::new(|| (3..3 + COUNTS).collect());

impl Store {
    /// Adds `usage` to `who`'s row for the minute holding `at` (seconds).
    pub async fn add_usage(&self, at: i64, who: &UsageKey, usage: &Usage) -> Result<(), StoreError> {
        self.0
            .backend
            .execute(ADD.as_str(), add_params(at, who, usage))
            .await
            .map(drop)
    }

    /// Adds each row's counts to its minute's row (`at` in seconds), all in one transaction: a
    /// batch is durable whole when this returns, or not at all.
    pub async fn add_usage_all(&self, rows: &[(i64, UsageKey, Usage)]) -> Result<(), StoreError> {
        let params = rows
            .iter()
            .map(|(at, who, usage)| add_params(*at, who, usage))
            .collect();
        self.0.backend.execute_all(ADD.as_str(), params).await
    }

    /// Tokens (prompt + completion) each key used, by minute, since `since` (seconds; rounded
    /// down to its minute): what the quotas' sliding windows are rebuilt from at a start.
    pub async fn tokens_by_minute(&self, since: i64) -> Result<Vec<(String, i64, u64)>, StoreError> {
        let params = vec![Param::Int(since - since.rem_euclid(60))];
        let rows = self.0.backend.query(BY_MINUTE, params, &[1, 2]).await?;
        Ok(rows
            .iter()
            .map(|row| (text(&row[0]), int(&row[1]), int(&row[2]).max(0) as u64))
            .collect())
    }

    /// Usage since `since` (seconds; rounded down to its minute), by key, model and route, of
    /// one key or (`None`) all.
    pub async fn usage_since(&self, since: i64, key: Option<&str>) -> Result<Vec<(UsageKey, Usage)>, StoreError> {
        let params = vec![
            Param::Int(since - since.rem_euclid(60)),
            Param::Text(key.unwrap_or_default().to_owned()),
        ];
        let rows = self.0.backend.query(SINCE.as_str(), params, INTS.as_slice()).await?;
        Ok(rows
            .iter()
            .map(|row| {
                let who = UsageKey {
                    key: text(&row[0]),
                    model: text(&row[1]),
                    route: text(&row[2]),
                };
                let counts: Vec<u64> = row[3..].iter().map(|v| int(v).max(0) as u64).collect();
                (who, Usage::from_counts(&counts))
            })
            .collect())
    }

    /// Each key's prompt and completion tokens and requests in buckets of `step` seconds (a
    /// multiple of 60) from `since` (rounded down to its minute), of one key or (`None`) all:
    /// the console's charts. Buckets nobody used are left out.
    pub async fn usage_series(&self, since: i64, step: i64, key: Option<&str>) -> Result<Vec<SeriesPoint>, StoreError> {
        let since = since - since.rem_euclid(60);
        let params = vec![
            Param::Int(since),
            Param::Int(step.max(60)),
            Param::Text(key.unwrap_or_default().to_owned()),
        ];
        let rows = self.0.backend.query(SERIES, params, &[1, 2, 3, 4]).await?;
        Ok(rows
            .iter()
            .map(|row| SeriesPoint {
                key: text(&row[0]),
                at: int(&row[1]),
                prompt: int(&row[2]).max(0) as u64,
                completion: int(&row[3]).max(0) as u64,
                requests: int(&row[4]).max(0) as u64,
            })
            .collect())
    }

    /// The store's clock (seconds since the epoch).
    pub fn now(&self) -> i64 {
        (self.0.clock)()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_fall_in_buckets_and_percentiles_are_their_bounds() {
        let mut u = Usage::default();
        assert_eq!(u.wait_percentile(0.5), None);
        for ms in [0, 5, 40, 90, 900, 120_000] {
            u.waited(ms);
        }
        assert_eq!(u.wait_ms, 121_035);
        assert_eq!(u.wait_percentile(0.5), Some(50));
        assert_eq!(u.wait_percentile(0.6), Some(100));
        assert_eq!(u.wait_percentile(0.8), Some(1_000));
        assert_eq!(u.wait_percentile(1.0), None, "past the last bound");
        let mut sum = u;
        sum.add(&u);
        assert_eq!((sum.wait_ms, sum.waits[0]), (242_070, 4));
        assert_eq!(Usage::from_counts(&u.counts()), u);
    }
}
