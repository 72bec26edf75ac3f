//! Waiting until a front serves before any load goes through it: its health route is probed on
//! a plain connection (no panicking helper thread per attempt while nothing listens yet) until
//! it answers 200, the front's process ends, or the time is up — each with an error that says
//! what the last probe saw.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long one probe may take to connect and to hear a status line.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The pause between probes: a front that is not up yet is asked again this often.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// What one probe of a front's health route saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// No connection: nothing listens there (yet); how the connect failed.
    NotListening(String),
    /// Connected, but no status line came back in time (or the connection closed first).
    NoAnswer,
    /// It answered with this status.
    Status(u16),
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::NotListening(why) => write!(f, "nothing accepts connections ({why})"),
            Probe::NoAnswer => f.write_str("it accepts connections but sends no status line"),
            Probe::Status(status) => write!(f, "it answers {status}"),
        }
    }
}

/// Connects to `addr` (bounded by `timeout`), sends `GET path` and reads the status line.
pub fn probe(addr: SocketAddr, path: &str, timeout: Duration) -> Probe {
    let mut stream = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(s) => s,
        Err(e) => return Probe::NotListening(e.to_string()),
    };
    let sent = stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .and_then(|()| {
            stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        });
    if sent.is_err() {
        return Probe::NoAnswer;
    }
    let mut line = String::new();
    if BufReader::new(stream).read_line(&mut line).is_err() {
        return Probe::NoAnswer;
    }
    // `HTTP/1.1 200 OK`
    match line.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
        Some(status) => Probe::Status(status),
        None => Probe::NoAnswer,
    }
}

/// Why a front never became ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Its process ended first, with this status.
    Exited(String),
    /// It still did not answer `wanted` when `within` was up; `last` is what the final probe
    /// saw.
    TimedOut { within: Duration, wanted: u16, last: Probe },
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Exited(status) => write!(f, "exited ({status}) before answering"),
            NotReady::TimedOut { within, wanted, last } => {
                write!(f, "did not answer {wanted} within {} s: {last}", within.as_secs_f64())
            }
        }
    }
}

/// Probes `GET path` at `addr` until it answers `serving` (200: the front listens and serves;
/// a TLS front answers the plain probe 400 once it listens). `exited`
/// is asked between probes whether the front's process has ended (its exit status), which
/// ends the wait at once.
pub fn wait_ready(
    addr: SocketAddr,
    path: &str,
    serving: u16,
    within: Duration,
    mut exited: impl FnMut() -> Option<String>,
) -> Result<(), NotReady> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let last = probe(addr, path, PROBE_TIMEOUT.min(left).max(Duration::from_millis(10)));
        if last == Probe::Status(serving) {
            return Ok(());
        }
        if let Some(status) = exited() {
            return Err(NotReady::Exited(status));
        }
        if Instant::now() >= deadline {
            return Err(NotReady::TimedOut {
                within,
                wanted: serving,
                last,
            });
        }
        std::thread::sleep(PROBE_EVERY.min(deadline.saturating_duration_since(Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    /// Answers each connection on `listener` with the next of `statuses` (the last one after
    /// that), reading the request first.
    fn serve(listener: TcpListener, statuses: &'static [u16]) {
        std::thread::spawn(move || {
            for (i, conn) in listener.incoming().enumerate() {
                let Ok(mut conn) = conn else { return };
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf);
                let status = statuses[i.min(statuses.len() - 1)];
                let _ = conn.write_all(format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n").as_bytes());
            }
        });
    }

    #[test]
    fn a_front_is_ready_once_its_route_answers_200() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        serve(listener, &[503, 503, 200]);
        assert_eq!(probe(addr, "/v1/models", PROBE_TIMEOUT), Probe::Status(503));
        assert_eq!(
            wait_ready(addr, "/v1/models", 200, Duration::from_secs(10), || None),
            Ok(())
        );
    }

    #[test]
    fn the_wait_lasts_until_the_front_starts_listening() {
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert!(matches!(probe(addr, "/health", PROBE_TIMEOUT), Probe::NotListening(_)));
        // The front binds its port a moment later, as a starting process does.
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            serve(TcpListener::bind(addr).expect("the port again"), &[200]);
        });
        assert_eq!(
            wait_ready(addr, "/health", 200, Duration::from_secs(10), || None),
            Ok(())
        );
        late.join().unwrap();
    }

    #[test]
    fn nothing_listening_times_out_saying_so() {
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let err = wait_ready(addr, "/v1/models", 200, Duration::from_millis(300), || None).unwrap_err();
        assert!(
            matches!(
                &err,
                NotReady::TimedOut {
                    last: Probe::NotListening(_),
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("nothing accepts connections"), "{err}");
    }

    #[test]
    fn a_listener_that_never_answers_is_not_ready() {
        // Connections queue in the listen backlog; nobody reads them.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let err = wait_ready(addr, "/v1/models", 200, Duration::from_millis(500), || None).unwrap_err();
        assert!(
            matches!(
                &err,
                NotReady::TimedOut {
                    last: Probe::NoAnswer,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("sends no status line"), "{err}");
        drop(listener);
    }

    #[test]
    fn a_front_that_exits_ends_the_wait_at_once() {
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let started = Instant::now();
        let err = wait_ready(addr, "/v1/models", 200, Duration::from_secs(30), || {
            Some("exit status: 1".into())
        })
        .unwrap_err();
        assert_eq!(err, NotReady::Exited("exit status: 1".into()));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(err.to_string(), "exited (exit status: 1) before answering");
    }
}
