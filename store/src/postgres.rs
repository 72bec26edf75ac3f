//! The shared backend: PostgreSQL through tokio-postgres (no TLS: a database on the operators'
//! own network or socket), one client, connected again when its connection closed.

use tokio::sync::Mutex;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls};

use crate::{redact, sql, Param, StoreError};

pub(crate) struct Postgres {
    url: String,
    client: Mutex<Option<Client>>,
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    sparkgate_task::spawn("store-postgres", async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "the store's PostgreSQL connection ended");
        }
    });
    Ok(client)
}

impl Postgres {
    pub(crate) async fn open(url: &str) -> Result<Postgres, StoreError> {
        let failed = |e: tokio_postgres::Error| StoreError::Open {
            at: redact(url),
            reason: e.to_string(),
        };
        let client = connect(url).await.map_err(failed)?;
        for statement in sql::schema() {
            // Gateways starting together race to create the table: the loser tries once more.
            if client.batch_execute(statement).await.is_err() {
                client.batch_execute(statement).await.map_err(failed)?;
            }
        }
        Ok(Postgres {
            url: url.to_owned(),
            client: Mutex::new(Some(client)),
        })
    }

    /// The client, connected again if its connection closed.
    async fn client(&self) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, StoreError> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(Client::is_closed) {
            *guard = Some(connect(&self.url).await.map_err(backend)?);
        }
        Ok(guard)
    }

    pub(crate) async fn execute(&self, statement: &'static str, params: Vec<Param>) -> Result<u64, StoreError> {
        let guard = self.client().await?;
        let client = guard.as_ref().expect("connected");
        let refs = refs(&params);
        client.execute(statement, &refs).await.map_err(backend)
    }

    pub(crate) async fn execute_all(&self, statement: &'static str, params: Vec<Vec<Param>>) -> Result<(), StoreError> {
        let mut guard = self.client().await?;
        let client = guard.as_mut().expect("connected");
        let tx = client.transaction().await.map_err(backend)?;
        let prepared = tx.prepare(statement).await.map_err(backend)?;
        for p in &params {
            tx.execute(&prepared, &refs(p)).await.map_err(backend)?;
        }
        tx.commit().await.map_err(backend)
    }

    pub(crate) async fn query(
        &self,
        statement: &'static str,
        params: Vec<Param>,
        ints: &'static [usize],
    ) -> Result<Vec<Vec<Param>>, StoreError> {
        let guard = self.client().await?;
        let client = guard.as_ref().expect("connected");
        let refs = refs(&params);
        let rows = client.query(statement, &refs).await.map_err(backend)?;
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| {
                        if ints.contains(&i) {
                            row.try_get::<_, i64>(i).map(Param::Int)
                        } else {
                            row.try_get::<_, String>(i).map(Param::Text)
                        }
                    })
                    .collect::<Result<Vec<Param>, _>>()
                    .map_err(backend)
            })
            .collect()
    }
}

fn refs(params: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| match p {
            Param::Text(t) => t as &(dyn ToSql + Sync),
            Param::Int(i) => i as &(dyn ToSql + Sync),
        })
        .collect()
}
