//! The tensor-parallel group over TCP: rank 0 listens on `master-addr:master-port`, each
//! headless rank joins, and every engine step is a round trip to every peer — so a lost or
//! frozen peer makes rank 0's next step hang, as a cross-node collective does in vLLM.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

use super::faults::Faults;
use super::log;

/// One joined peer as seen from rank 0.
#[derive(Debug)]
struct Peer {
    rank: u32,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

/// Rank 0's view of the group.
#[derive(Debug, Default)]
pub(crate) struct Group {
    peers: Mutex<Vec<Peer>>,
    step: std::sync::atomic::AtomicU64,
}

/// The peer is gone or answered nonsense; the collective can never complete.
#[derive(Debug)]
pub(crate) struct Lost;

impl Group {
    /// Listens and waits until ranks 1..nnodes have joined, or `timeout` passes.
    pub(crate) async fn rendezvous(
        addr: &str,
        port: u16,
        nnodes: u32,
        tp: u32,
        timeout: Duration,
    ) -> Result<Arc<Group>, String> {
        let group = Arc::new(Group::default());
        if nnodes <= 1 {
            return Ok(group);
        }
        let listener = TcpListener::bind((addr, port))
            .await
            .map_err(|e| format!("cannot listen on {addr}:{port}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        log::info(
            "EngineCore_DP0",
            "parallel_state.py:1208",
            &format!("torch.distributed rendezvous listening on {local}"),
        );
        log::info(
            "EngineCore_DP0",
            "multiproc_executor.py:125",
            &format!("Waiting for {} remote rank(s) to join at {local}", nnodes - 1),
        );
        let deadline = Instant::now() + timeout;
        let mut joined: Vec<Peer> = Vec::new();
        while (joined.len() as u32) < nnodes - 1 {
            let (stream, from) = tokio::time::timeout_at(deadline.into(), listener.accept())
                .await
                .map_err(|_| {
                    format!(
                        "Timed out after {}s waiting for {} remote rank(s) to join",
                        timeout.as_secs(),
                        nnodes - 1 - joined.len() as u32
                    )
                })?
                .map_err(|e| e.to_string())?;
            let _ = stream.set_nodelay(true);
            let (read, mut writer) = stream.into_split();
            let mut reader = BufReader::new(read);
            let mut hello = String::new();
            if tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut hello))
                .await
                .is_err()
            {
                continue;
            }
            match judge_join(&hello, nnodes, tp, &joined) {
                Ok(rank) => {
                    if writer.write_all(b"OK\n").await.is_ok() {
                        log::info(
                            "EngineCore_DP0",
                            "multiproc_executor.py:140",
                            &format!("Rank {rank} joined from {from}"),
                        );
                        joined.push(Peer { rank, reader, writer });
                    }
                }
                Err(why) => {
                    let _ = writer.write_all(format!("ERR {why}\n").as_bytes()).await;
                    log::warn(
                        "EngineCore_DP0",
                        "multiproc_executor.py:150",
                        &format!("Refused a rank from {from}: {why}"),
                    );
                }
            }
        }
        *group.peers.lock().await = joined;
        Ok(group)
    }

    /// One collective: every peer must acknowledge the step. Hangs (never returns `Ok`) while
    /// a peer is frozen; returns `Lost` when a peer is gone.
    pub(crate) async fn step(&self) -> Result<(), Lost> {
        let n = self.step.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut peers = self.peers.lock().await;
        for peer in peers.iter_mut() {
            peer.writer
                .write_all(format!("STEP {n}\n").as_bytes())
                .await
                .map_err(|_| Lost)?;
        }
        for peer in peers.iter_mut() {
            let mut line = String::new();
            match peer.reader.read_line(&mut line).await {
                Ok(0) | Err(_) => return Err(Lost),
                Ok(_) if line.trim() == format!("ACK {n}") => {}
                Ok(_) => return Err(Lost),
            }
        }
        Ok(())
    }
}

/// The rank a `JOIN rank nnodes tp` line asks for, if the head (of `nnodes` nodes at `tp`,
/// with `joined` peers) can take it; else why not.
fn judge_join(hello: &str, nnodes: u32, tp: u32, joined: &[Peer]) -> Result<u32, String> {
    let fields: Vec<&str> = hello.split_whitespace().collect();
    let parsed = match fields.as_slice() {
        ["JOIN", rank, n, t] => rank
            .parse::<u32>()
            .ok()
            .zip(n.parse::<u32>().ok())
            .zip(t.parse::<u32>().ok()),
        _ => None,
    };
    match parsed {
        None => Err("malformed join".to_owned()),
        Some(((_, n), t)) if n != nnodes || t != tp => Err(format!(
            "group mismatch: nnodes={n} tp={t}, head has nnodes={nnodes} tp={tp}"
        )),
        Some(((r, _), _)) if r == 0 || r >= nnodes || joined.iter().any(|p| p.rank == r) => {
            Err(format!("rank {r} is not free"))
        }
        Some(((r, _), _)) => Ok(r),
    }
}

/// A headless rank: joins rank 0 (retrying until `timeout`), answers every step, and exits the
/// process when rank 0 goes away.
pub(crate) async fn run_headless(
    addr: &str,
    port: u16,
    rank: u32,
    nnodes: u32,
    tp: u32,
    timeout: Duration,
    faults: Arc<Faults>,
) -> i32 {
    let component = "Worker_TP1";
    let deadline = Instant::now() + timeout;
    let stream = loop {
        match TcpStream::connect((addr, port)).await {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                log::error(
                    component,
                    "multiproc_executor.py:98",
                    &format!(
                        "Could not reach head node {addr}:{port} within {}s: {e}",
                        timeout.as_secs()
                    ),
                );
                return 1;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let _ = stream.set_nodelay(true);
    let (read, mut writer) = stream.into_split();
    let mut reader = BufReader::new(read);
    if writer
        .write_all(format!("JOIN {rank} {nnodes} {tp}\n").as_bytes())
        .await
        .is_err()
    {
        return 1;
    }
    let mut reply = String::new();
    let _ = reader.read_line(&mut reply).await;
    if reply.trim() != "OK" {
        log::error(
            component,
            "multiproc_executor.py:104",
            &format!("Head node refused rank {rank}: {}", reply.trim()),
        );
        return 1;
    }
    log::info(
        component,
        "multiproc_executor.py:110",
        &format!("Rank {rank} joined the tensor-parallel group at {addr}:{port}"),
    );
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line).await {
            Ok(0) | Err(_) => {
                log::error(
                    component,
                    "multiproc_executor.py:512",
                    "Head node connection lost; shutting down the headless executor.",
                );
                return 1;
            }
            Ok(_) => {
                faults.wait_while_hung().await;
                let Some(n) = line.trim().strip_prefix("STEP ") else {
                    continue;
                };
                if writer.write_all(format!("ACK {n}\n").as_bytes()).await.is_err() {
                    return 1;
                }
            }
        }
    }
}
