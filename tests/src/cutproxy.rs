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
}

impl CutProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("its address");
        let (armed, cuts) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (a, c) = (armed.clone(), cuts.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (a, c) = (a.clone(), c.clone());
                std::thread::spawn(move || pipe(client, upstream, &a, &c));
            }
        });
        CutProxy { addr, armed, cuts }
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
fn pipe(client: TcpStream, upstream: SocketAddr, armed: &AtomicUsize, cuts: &AtomicUsize) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let (Ok(mut from_client), Ok(mut to_server)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut to_server);
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
