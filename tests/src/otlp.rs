//! An OTLP/HTTP trace receiver for tests: it accepts `POST /v1/traces` (protobuf) on a loopback
//! port, answers 200, and keeps every span it decoded (with the opentelemetry-proto messages, as a
//! collector reads them).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

/// One received span with its service's name.
#[derive(Debug, Clone)]
pub struct Received {
    pub service: String,
    pub span: Span,
}

#[derive(Debug, Default)]
struct Spans {
    list: Mutex<Vec<Received>>,
    more: Condvar,
}

/// A running receiver.
#[derive(Debug)]
pub struct Receiver {
    pub addr: SocketAddr,
    spans: Arc<Spans>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let addr = listener.local_addr().expect("its address");
        let spans = Arc::new(Spans::default());
        let kept = spans.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || serve(conn, &kept));
            }
        });
        Receiver { addr, spans }
    }

    /// Waits (up to `within`) until a span satisfies `pred`; every span received by then.
    pub fn wait_for(&self, within: Duration, pred: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + within;
        let mut list = self.spans.list.lock().expect("spans");
        while !pred(&list) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "the spans never arrived: {list:#?}");
            list = self.spans.more.wait_timeout(list, left).expect("spans").0;
        }
        list.clone()
    }
}

/// One connection's requests, kept alive as the exporter's client keeps it.
fn serve(conn: TcpStream, spans: &Spans) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
    let mut writer = conn;
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((name, value)) = l.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        keep(&body, spans);
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

fn keep(body: &[u8], spans: &Spans) {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return;
    };
    let mut list = spans.list.lock().expect("spans");
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| match &v.value {
                Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                list.push(Received {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    spans.more.notify_all();
}

/// A span's attribute as text (strings, integers; arrays joined by commas).
pub fn attribute(span: &Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match value {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::ArrayValue(a) => a
            .values
            .iter()
            .filter_map(|v| match &v.value {
                Some(Value::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(","),
        other => format!("{other:?}"),
    })
}

/// Lower-case hex of an id's bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
