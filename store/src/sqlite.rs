//! The embedded backend: one SQLite file in WAL mode, each statement run on the blocking pool.
//! Responses go through a connection with `synchronous=FULL` (a write is on disk when it
//! returns, power loss included). Usage batches (`execute_all`) go through a second connection
//! with `synchronous=NORMAL`: a commit is in the WAL file, in the kernel's hands, when it
//! returns — it survives a SIGKILL of the gateway, which is what a usage row must outlive before
//! its answer ends — without an fsync per batch, which cost every request a disk flush (about
//! 0.4 ms; BENCHMARKS.md). At a power loss the usage of the last seconds, not yet written out by
//! the kernel or a checkpoint, can be lost.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{params_from_iter, Connection};

use crate::{sql, Param, StoreError};

pub(crate) struct Sqlite {
    conn: Arc<Mutex<Connection>>,
    /// Usage batches' connection (`synchronous=NORMAL`).
    usage: Arc<Mutex<Connection>>,
}

impl rusqlite::ToSql for Param {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        match self {
            Param::Text(t) => t.to_sql(),
            Param::Int(i) => i.to_sql(),
        }
    }
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// A connection to `path` in WAL mode at `synchronous` (FULL or NORMAL).
fn connect(path: &Path, synchronous: &str) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", synchronous)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

/// Runs `f` on `conn` on the blocking pool.
async fn on<T: Send + 'static>(
    conn: Arc<Mutex<Connection>>,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(move || {
        let conn = conn
            .lock()
            .map_err(|_| backend("the store's connection lock was poisoned"))?;
        f(&conn).map_err(backend)
    })
    .await
    .map_err(backend)?
}

impl Sqlite {
    pub(crate) async fn open(path: &Path) -> Result<Sqlite, StoreError> {
        let path = path.to_owned();
        let failed = |reason: String| StoreError::Open {
            at: format!("sqlite:{}", path.display()),
            reason,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| failed(format!("{}: {e}", dir.display())))?;
        }
        let opened = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || -> rusqlite::Result<(Connection, Connection)> {
                let conn = connect(&path, "FULL")?;
                for statement in sql::schema() {
                    conn.execute(statement, [])?;
                }
                Ok((conn, connect(&path, "NORMAL")?))
            })
            .await
            .map_err(|e| failed(e.to_string()))?
        };
        let (conn, usage) = opened.map_err(|e| failed(e.to_string()))?;
        Ok(Sqlite {
            conn: Arc::new(Mutex::new(conn)),
            usage: Arc::new(Mutex::new(usage)),
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        on(self.conn.clone(), f).await
    }

    pub(crate) async fn execute(&self, statement: &'static str, params: Vec<Param>) -> Result<u64, StoreError> {
        self.blocking(move |c| {
            c.prepare_cached(statement)?
                .execute(params_from_iter(params.iter()))
                .map(|n| n as u64)
        })
        .await
    }

    pub(crate) async fn execute_all(&self, statement: &'static str, params: Vec<Vec<Param>>) -> Result<(), StoreError> {
        on(self.usage.clone(), move |c| {
            // One transaction: one WAL commit for the whole batch.
            let tx = c.unchecked_transaction()?;
            {
                let mut stmt = tx.prepare_cached(statement)?;
                for p in &params {
                    stmt.execute(params_from_iter(p.iter()))?;
                }
            }
            tx.commit()
        })
        .await
    }

    pub(crate) async fn query(
        &self,
        statement: &'static str,
        params: Vec<Param>,
        ints: &'static [usize],
    ) -> Result<Vec<Vec<Param>>, StoreError> {
        self.blocking(move |c| {
            let mut stmt = c.prepare_cached(statement)?;
            let columns = stmt.column_count();
            let rows = stmt.query_map(params_from_iter(params.iter()), |row| {
                (0..columns)
                    .map(|i| {
                        if ints.contains(&i) {
                            row.get::<_, i64>(i).map(Param::Int)
                        } else {
                            row.get::<_, String>(i).map(Param::Text)
                        }
                    })
                    .collect::<rusqlite::Result<Vec<Param>>>()
            })?;
            rows.collect()
        })
        .await
    }
}
