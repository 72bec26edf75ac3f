//! Quarantined request bodies (docs/operations.md, "Poison requests"): one row per body's
//! fingerprint with how many requests under it were quarantined, why the last one was, the key
//! that sent it, when, and when the row expires — so a body refused at arrival stays refused
//! across a restart and on every gateway sharing a PostgreSQL store, until it expires or an
//! operator releases it.

use crate::{int, text, Param, Store, StoreError};

pub(crate) const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS sparkgate_quarantine (
    id TEXT PRIMARY KEY,
    quarantines BIGINT NOT NULL,
    reason TEXT NOT NULL,
    key TEXT NOT NULL,
    request_id TEXT NOT NULL,
    first_at BIGINT NOT NULL,
    last_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL)";

/// `$1` id, `$2` reason, `$3` key, `$4` request id, `$5` now, `$6` expiry. A row past its expiry
/// starts again from one.
const RECORD: &str = "INSERT INTO sparkgate_quarantine
    (id, quarantines, reason, key, request_id, first_at, last_at, expires_at)
    VALUES ($1, 1, $2, $3, $4, $5, $5, $6)
    ON CONFLICT (id) DO UPDATE SET
        quarantines = CASE WHEN sparkgate_quarantine.expires_at <= excluded.last_at THEN 1
            ELSE sparkgate_quarantine.quarantines + 1 END,
        first_at = CASE WHEN sparkgate_quarantine.expires_at <= excluded.last_at THEN excluded.first_at
            ELSE sparkgate_quarantine.first_at END,
        reason = excluded.reason, key = excluded.key, request_id = excluded.request_id,
        last_at = excluded.last_at, expires_at = excluded.expires_at";

/// Columns: id, reason, key, request_id, quarantines, first_at, last_at, expires_at.
const LIST: &str = "SELECT id, reason, key, request_id, quarantines, first_at, last_at, expires_at
    FROM sparkgate_quarantine WHERE expires_at > $1 ORDER BY last_at DESC, id";

const RELEASE: &str = "DELETE FROM sparkgate_quarantine WHERE id = $1";

const EXPIRE: &str = "DELETE FROM sparkgate_quarantine WHERE expires_at <= $1";

/// One quarantined body.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Quarantined {
    /// The body's fingerprint (hex): what an operator releases.
    pub id: String,
    /// Requests quarantined under it (two or more: refused at arrival).
    pub quarantines: u64,
    /// Why the last one was.
    pub reason: String,
    /// The name of the key that sent the last one (`anonymous` without keys).
    pub key: String,
    pub request_id: String,
    /// Seconds since the epoch.
    pub first_at: i64,
    pub last_at: i64,
    pub expires_at: i64,
}

/// A quarantine verdict to record.
#[derive(Debug, Clone, Copy)]
pub struct Verdict<'a> {
    pub id: &'a str,
    pub reason: &'a str,
    pub key: &'a str,
    pub request_id: &'a str,
    /// How long the row lives past this verdict (seconds).
    pub ttl: i64,
}

impl Store {
    /// Records a quarantine verdict under a body (durable when this returns).
    pub async fn quarantine(&self, v: Verdict<'_>) -> Result<(), StoreError> {
        let now = self.now();
        let params = vec![
            Param::Text(v.id.to_owned()),
            Param::Text(v.reason.to_owned()),
            Param::Text(v.key.to_owned()),
            Param::Text(v.request_id.to_owned()),
            Param::Int(now),
            Param::Int(now + v.ttl),
        ];
        self.0.backend.execute(RECORD, params).await.map(drop)
    }

    /// The bodies quarantined and not expired, the latest first.
    pub async fn quarantined(&self) -> Result<Vec<Quarantined>, StoreError> {
        let rows = self
            .0
            .backend
            .query(LIST, vec![Param::Int(self.now())], &[4, 5, 6, 7])
            .await?;
        Ok(rows
            .iter()
            .map(|r| Quarantined {
                id: text(&r[0]),
                reason: text(&r[1]),
                key: text(&r[2]),
                request_id: text(&r[3]),
                quarantines: int(&r[4]).max(0) as u64,
                first_at: int(&r[5]),
                last_at: int(&r[6]),
                expires_at: int(&r[7]),
            })
            .collect())
    }

    /// Releases a body; whether it was on record.
    pub async fn release(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .0
            .backend
            .execute(RELEASE, vec![Param::Text(id.to_owned())])
            .await?
            > 0)
    }

    /// Removes the expired rows; how many went.
    pub async fn expire_quarantine(&self) -> Result<u64, StoreError> {
        self.0.backend.execute(EXPIRE, vec![Param::Int(self.now())]).await
    }
}
