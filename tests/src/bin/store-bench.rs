//! Response store benchmark: the time one write (a stored response with its full input, as the
//! gateway writes it before an answer's first byte) and one read (a `previous_response_id`
//! lookup) take, on SQLite (WAL, synchronous=FULL, on this disk) and on a local PostgreSQL
//! server (Unix socket, fsync off as the test cluster runs), with a conversation of `--kib` KiB.
//!
//! usage: cargo run --release -p sparkgate-tests --bin store-bench [-- --n 500 --kib 64]

use std::time::{Duration, Instant};

use sparkgate_store::{Location, Retention, Store, Stored};
use sparkgate_tests::postgres::Postgres;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn run(name: &str, at: Location, n: usize, kib: usize) {
    let store = Store::open(&at, Retention::default()).await.expect("the store opens");
    let input = format!("[{{\"role\":\"user\",\"content\":\"{}\"}}]", "x".repeat(kib * 1024));
    let (mut writes, mut reads) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let record = Stored {
            id: format!("resp_{i}"),
            owner: "owner".into(),
            created_at: 0,
            response: format!("{{\"id\":\"resp_{i}\",\"output\":[]}}"),
            input: input.clone(),
        };
        let t = Instant::now();
        store.put(record).await.expect("a write");
        writes.push(t.elapsed());
        let t = Instant::now();
        store
            .get(&format!("resp_{i}"), "owner")
            .await
            .expect("a read")
            .expect("found");
        reads.push(t.elapsed());
    }
    println!(
        "| {name} | {n} | {kib} | {:.3} ms | {:.3} ms |",
        median(writes).as_secs_f64() * 1e3,
        median(reads).as_secs_f64() * 1e3
    );
}

fn main() {
    let (n, kib) = (arg("--n", 500), arg("--kib", 64));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = tempfile::tempdir().expect("a directory");
    let pg = Postgres::start();
    let url = pg.database("bench");
    println!("| backend | records | KiB each | write (median) | read (median) |");
    println!("|---|---|---|---|---|");
    rt.block_on(run("SQLite", Location::Sqlite(dir.path().join("s.sqlite")), n, kib));
    rt.block_on(run("PostgreSQL", Location::parse(&url).expect("a URL"), n, kib));
}
