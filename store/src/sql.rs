//! The store's statements, the same text on SQLite and PostgreSQL: parameters are `$1`, `$2`, …
//! in the order of their first use (SQLite numbers `$n` parameters by first appearance), sums
//! are cast to BIGINT (PostgreSQL's SUM of BIGINT is NUMERIC), and an upsert names `excluded`.

/// The table and its index; each statement runs on its own (PostgreSQL's prepared statements
/// take one).
pub(crate) const SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS sparkgate_responses (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        stored_at BIGINT NOT NULL,
        bytes BIGINT NOT NULL,
        response TEXT NOT NULL,
        input TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS sparkgate_responses_stored_at ON sparkgate_responses (stored_at)",
];

/// Every statement of the schema: the responses' table and index, the usage table, then the
/// quarantine's.
pub(crate) fn schema() -> impl Iterator<Item = &'static str> {
    SCHEMA
        .into_iter()
        .chain([crate::usage::SCHEMA.as_str(), crate::quarantine::SCHEMA])
}

/// A record written, or rewritten by its owner; another owner's id is left alone (no row).
pub(crate) const PUT: &str =
    "INSERT INTO sparkgate_responses (id, owner, created_at, stored_at, bytes, response, input)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT (id) DO UPDATE SET created_at = excluded.created_at, stored_at = excluded.stored_at,
        bytes = excluded.bytes, response = excluded.response, input = excluded.input
    WHERE sparkgate_responses.owner = excluded.owner";

/// Columns: id, owner, created_at, response, input.
pub(crate) const GET: &str = "SELECT id, owner, created_at, response, input FROM sparkgate_responses
    WHERE id = $1 AND owner = $2 AND stored_at >= $3";

pub(crate) const DELETE: &str = "DELETE FROM sparkgate_responses WHERE id = $1 AND owner = $2";

/// Records stored before `$1`.
pub(crate) const EXPIRE: &str = "DELETE FROM sparkgate_responses WHERE stored_at < $1";

/// The oldest records past `$1` bytes in all (the newest are kept).
pub(crate) const OVER_CAP: &str = "DELETE FROM sparkgate_responses WHERE id IN (
    SELECT id FROM (
        SELECT id, CAST(SUM(bytes) OVER (ORDER BY stored_at DESC, id DESC) AS BIGINT) AS kept
        FROM sparkgate_responses) AS newest_first
    WHERE kept > $1)";

/// Columns: records, bytes.
pub(crate) const STATS: &str =
    "SELECT CAST(COUNT(*) AS BIGINT), CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM sparkgate_responses";
