//! The gateway's persistent state (docs/store.md): stored Responses, each owned by the API key
//! that made it, usage per key (`usage`, docs/keys.md), quarantined request bodies
//! (`quarantine`), kept in one SQLite file (embedded, the default) or in PostgreSQL (several
//! gateways sharing conversations), with a TTL and a size cap that evict the oldest first. The
//! same statements run on both backends (`sql`); each backend only runs them (`sqlite`,
//! `postgres`).

mod postgres;
mod quarantine;
mod sql;
mod sqlite;
mod usage;

pub use quarantine::{Quarantined, Verdict};
pub use usage::{SeriesPoint, Usage, UsageKey, WAIT_BOUNDS_MS};

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where the store lives, as `STORE_URL` names it.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// A SQLite file (`sqlite:PATH`, or a bare path).
    Sqlite(PathBuf),
    /// A PostgreSQL connection string (`postgres://…` or `postgresql://…`).
    Postgres(String),
}

impl Location {
    pub fn parse(text: &str) -> Result<Location, StoreError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(StoreError::Location("the store's location is empty".into()));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Location::Postgres(text.to_owned()));
        }
        if let Some((scheme, _)) = text.split_once("://") {
            return Err(StoreError::Location(format!(
                "unknown scheme {scheme}:// (postgres://, postgresql://, sqlite: or a file path)"
            )));
        }
        let path = text.strip_prefix("sqlite:").unwrap_or(text);
        Ok(Location::Sqlite(PathBuf::from(path)))
    }
}

/// A location as logs and status show it: a PostgreSQL password is never written.
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Location::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Location({self})")
    }
}

/// `scheme://user:password@rest` as `scheme://user:***@rest`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// How long records live and how much the store may hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Records older than this are gone (none: kept until evicted by size or deleted).
    pub ttl: Option<Duration>,
    /// The records' bytes past this are evicted, oldest first.
    pub max_bytes: Option<u64>,
}

/// One stored response: the response object and the full input it was generated from, both as
/// JSON text, owned by `owner` (a digest of the API key that made it; empty without keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub id: String,
    pub owner: String,
    /// The response's own `created_at` (seconds).
    pub created_at: i64,
    pub response: String,
    pub input: String,
}

impl Stored {
    fn bytes(&self) -> i64 {
        (self.id.len() + self.owner.len() + self.response.len() + self.input.len()) as i64
    }
}

/// What the store holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub records: u64,
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("STORE_URL: {0}")]
    Location(String),
    #[error("the store at {at} could not be opened: {reason}")]
    Open { at: String, reason: String },
    #[error("the store failed: {0}")]
    Backend(String),
}

/// Seconds since the epoch, as the store's clock reads them (a test sets its own).
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    })
}

enum Backend {
    Sqlite(sqlite::Sqlite),
    Postgres(Box<postgres::Postgres>),
}

/// A value bound to a statement's `$n`.
#[derive(Debug, Clone)]
pub(crate) enum Param {
    Text(String),
    Int(i64),
}

impl Backend {
    async fn execute(&self, statement: &'static str, params: Vec<Param>) -> Result<u64, StoreError> {
        match self {
            Backend::Sqlite(b) => b.execute(statement, params).await,
            Backend::Postgres(b) => b.execute(statement, params).await,
        }
    }

    /// Runs `statement` once for each parameter list, all in one transaction: every row is
    /// committed, or none is (SQLite: in the WAL, safe from the gateway's crash; PostgreSQL: its
    /// commit).
    async fn execute_all(&self, statement: &'static str, params: Vec<Vec<Param>>) -> Result<(), StoreError> {
        match self {
            Backend::Sqlite(b) => b.execute_all(statement, params).await,
            Backend::Postgres(b) => b.execute_all(statement, params).await,
        }
    }

    /// The rows of a query whose columns are all text but the `ints` ones (by index).
    async fn query(
        &self,
        statement: &'static str,
        params: Vec<Param>,
        ints: &'static [usize],
    ) -> Result<Vec<Vec<Param>>, StoreError> {
        match self {
            Backend::Sqlite(b) => b.query(statement, params, ints).await,
            Backend::Postgres(b) => b.query(statement, params, ints).await,
        }
    }
}

struct Inner {
    backend: Backend,
    retention: Retention,
    clock: Clock,
    evicted: AtomicU64,
    /// Bytes written since the last size sweep: the cap is enforced once they could pass it.
    written: AtomicU64,
}

/// The store, shared by every request.
#[derive(Clone)]
pub struct Store(Arc<Inner>);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("retention", &self.0.retention)
            .finish_non_exhaustive()
    }
}

fn text(v: &Param) -> String {
    match v {
        Param::Text(t) => t.clone(),
        Param::Int(i) => i.to_string(),
    }
}

fn int(v: &Param) -> i64 {
    match v {
        Param::Int(i) => *i,
        Param::Text(t) => t.parse().unwrap_or(0),
    }
}

impl Store {
    /// Opens (creating it and its schema if needed) the store at `at`.
    pub async fn open(at: &Location, retention: Retention) -> Result<Store, StoreError> {
        Store::open_with_clock(at, retention, system_clock()).await
    }

    pub async fn open_with_clock(at: &Location, retention: Retention, clock: Clock) -> Result<Store, StoreError> {
        let backend = match at {
            Location::Sqlite(path) => Backend::Sqlite(sqlite::Sqlite::open(path).await?),
            Location::Postgres(url) => Backend::Postgres(Box::new(postgres::Postgres::open(url).await?)),
        };
        Ok(Store(Arc::new(Inner {
            backend,
            retention,
            clock,
            evicted: AtomicU64::new(0),
            written: AtomicU64::new(0),
        })))
    }

    /// Keeps `record`; false when its id is another owner's (nothing is written then).
    pub async fn put(&self, record: Stored) -> Result<bool, StoreError> {
        let bytes = record.bytes();
        let params = vec![
            Param::Text(record.id),
            Param::Text(record.owner),
            Param::Int(record.created_at),
            Param::Int((self.0.clock)()),
            Param::Int(bytes),
            Param::Text(record.response),
            Param::Text(record.input),
        ];
        let written = self.0.backend.execute(sql::PUT, params).await? > 0;
        if let Some(cap) = self.0.retention.max_bytes {
            let since = self.0.written.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
            // A sweep reads the whole table's sizes: only once the writes could have passed
            // the cap's slack (an eighth of it).
            if since > cap / 8 {
                self.0.written.store(0, Ordering::Relaxed);
                self.over_cap(cap).await?;
            }
        }
        Ok(written)
    }

    /// `owner`'s record `id`, unless it expired.
    pub async fn get(&self, id: &str, owner: &str) -> Result<Option<Stored>, StoreError> {
        let params = vec![
            Param::Text(id.to_owned()),
            Param::Text(owner.to_owned()),
            Param::Int(self.oldest_kept()),
        ];
        let rows = self.0.backend.query(sql::GET, params, &[2]).await?;
        Ok(rows.into_iter().next().map(|row| Stored {
            id: text(&row[0]),
            owner: text(&row[1]),
            created_at: int(&row[2]),
            response: text(&row[3]),
            input: text(&row[4]),
        }))
    }

    /// Deletes `owner`'s record `id`; whether there was one.
    pub async fn delete(&self, id: &str, owner: &str) -> Result<bool, StoreError> {
        let params = vec![Param::Text(id.to_owned()), Param::Text(owner.to_owned())];
        Ok(self.0.backend.execute(sql::DELETE, params).await? > 0)
    }

    /// Removes what the TTL and the size cap no longer keep; how many records went.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        let mut gone = 0;
        if self.0.retention.ttl.is_some() {
            let params = vec![Param::Int(self.oldest_kept())];
            gone += self.0.backend.execute(sql::EXPIRE, params).await?;
        }
        if let Some(cap) = self.0.retention.max_bytes {
            gone += self.over_cap(cap).await?;
        }
        self.0.evicted.fetch_add(gone, Ordering::Relaxed);
        Ok(gone)
    }

    async fn over_cap(&self, cap: u64) -> Result<u64, StoreError> {
        let params = vec![Param::Int(i64::try_from(cap).unwrap_or(i64::MAX))];
        let gone = self.0.backend.execute(sql::OVER_CAP, params).await?;
        self.0.evicted.fetch_add(gone, Ordering::Relaxed);
        Ok(gone)
    }

    /// The oldest `stored_at` the TTL keeps.
    fn oldest_kept(&self) -> i64 {
        match self.0.retention.ttl {
            Some(ttl) => (self.0.clock)() - ttl.as_secs() as i64,
            None => i64::MIN,
        }
    }

    pub async fn stats(&self) -> Result<Stats, StoreError> {
        let rows = self.0.backend.query(sql::STATS, Vec::new(), &[0, 1]).await?;
        let row = rows.first();
        Ok(Stats {
            records: row.map_or(0, |r| int(&r[0]) as u64),
            bytes: row.map_or(0, |r| int(&r[1]) as u64),
        })
    }

    /// Records evicted by the TTL or the size cap since the store was opened.
    pub fn evicted(&self) -> u64 {
        self.0.evicted.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_are_read_and_a_password_is_never_shown() {
        assert_eq!(
            Location::parse("/var/lib/sg/store.sqlite").unwrap(),
            Location::Sqlite("/var/lib/sg/store.sqlite".into())
        );
        assert_eq!(Location::parse("sqlite:x.db").unwrap(), Location::Sqlite("x.db".into()));
        let pg = Location::parse("postgres://sg:s3cret@db:5432/sg").unwrap();
        assert!(matches!(pg, Location::Postgres(_)));
        assert_eq!(pg.to_string(), "postgres://sg:***@db:5432/sg");
        assert!(!format!("{pg:?}").contains("s3cret"));
        assert!(Location::parse("mysql://x").is_err());
        assert!(Location::parse(" ").is_err());
    }
}
