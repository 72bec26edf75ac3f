//! A TCP proxy that cuts a streamed answer, as a rank's death cuts it: placed between a gateway
//! and its upstream, it passes bytes both ways and, once armed, closes the next answer that
//! carried N server-sent `data:` events — the upstream itself lives on, so what follows the cut
//! is judged against the same process (the reference fixture's engine remembers its plans).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A running proxy.
#[derive(Debug)]
pub struct CutProxy {
    pub addr: SocketAddr,
    /// Events after which the next answer is cut; 0 = none armed.
    armed: Arc<AtomicUsize>,
    /// Answers cut so far.
    cuts: Arc<AtomicUsize>,
    /// What the gateway sent upstream (its first MiB), to read its request heads.
    sent: Arc<std::sync::Mutex<Vec<u8>>>,
}

impl CutProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("its address");
        let (armed, cuts) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (a, c, s) = (armed.clone(), cuts.clone(), sent.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (a, c, s) = (a.clone(), c.clone(), s.clone());
                std::thread::spawn(move || pipe(client, upstream, &a, &c, s));
            }
        });
        CutProxy {
            addr,
            armed,
            cuts,
            sent,
        }
    }

    /// What the gateway sent upstream so far, as text (its first MiB).
    pub fn sent(&self) -> String {
        String::from_utf8_lossy(&self.sent.lock().expect("sent")).into_owned()
    }

    /// The next answer that carries `events` `data:` events is closed right after them.
    pub fn cut_next_stream_after(&self, events: usize) {
        self.armed.store(events, Ordering::SeqCst);
    }

    /// How many answers were cut.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

/// One connection: requests pass as they are; the answers are counted and, when armed, cut.
fn pipe(
    client: TcpStream,
    upstream: SocketAddr,
    armed: &AtomicUsize,
    cuts: &AtomicUsize,
    sent: Arc<std::sync::Mutex<Vec<u8>>>,
) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let (Ok(mut from_client), Ok(mut to_server)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = from_client.read(&mut buf) {
            {
                let mut log = sent.lock().expect("sent");
                let room = (1usize << 20).saturating_sub(log.len()).min(n);
                log.extend_from_slice(&buf[..room]);
            }
            if to_server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to_server.shutdown(Shutdown::Write);
    });
    let (mut from_server, mut to_client) = (server, client);
    let mut seen = 0usize;
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from_server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        seen += chunk.windows(6).filter(|w| w == b"data: ").count();
        if to_client.write_all(chunk).is_err() {
            break;
        }
        let limit = armed.load(Ordering::SeqCst);
        if limit > 0
            && seen >= limit
            && armed
                .compare_exchange(limit, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            cuts.fetch_add(1, Ordering::SeqCst);
            // The connection ends with the events already sent and no end of the chunked body,
            // as when the process that answered died (a FIN, so what was sent arrives first).
            let _ = to_client.shutdown(Shutdown::Write);
            let _ = from_server.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = to_client.shutdown(Shutdown::Write);
}
