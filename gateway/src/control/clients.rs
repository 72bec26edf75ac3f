//! Who a generation request is for the admission queue (QUEUE_POLICY, CLIENT_WEIGHTS): its
//! validated API key, else the `x-sparkgate-client` header, else the body's `user`, else the
//! address it came from; under `fifo` everyone is one client. The weights are looked up by that
//! same name; unlisted clients weigh 1. Without API_KEYS the header and `user` are the client's
//! own word: a client may name itself as it likes (and so claim a listed weight, or split its
//! burst over many names); with API_KEYS the key decides. Names are kept only as keyed hashes
//! (`fairq::name_hash`), never as text. Under SCHEDULING_POLICY=priority a request also carries
//! its priority, read as vLLM reads it: the `X-Vllm-Priority` header when it is an integer, else
//! the body's `priority`, else 0.

use std::collections::HashMap;
use std::net::IpAddr;

use axum::http::HeaderMap;
use sparkgate_config::{QueuePolicy, SchedulingPolicy, Secret};

use crate::control::fairq::{name_hash, Client};
use crate::control::keys::KeyInfo;

/// The header a client may name itself by (when no API key names it).
const CLIENT_HEADER: &str = "x-sparkgate-client";
/// vLLM's priority header; it wins over the body's `priority`.
const PRIORITY_HEADER: &str = "x-vllm-priority";

/// What the edge knows of a request's sender.
#[derive(Clone)]
pub(crate) struct Caller {
    /// The API key the request was checked by (when API_KEYS is set).
    pub(crate) key: Option<KeyInfo>,
    pub(crate) addr: IpAddr,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("key", &self.key.as_ref().map(|k| &k.name))
            .field("addr", &self.addr)
            .finish()
    }
}

impl Caller {
    /// Who sent a request, for a log line: its key's name (never the key), else its address.
    pub(crate) fn label(&self) -> String {
        match &self.key {
            Some(key) => format!("key:{}", key.name),
            None => self.addr.to_string(),
        }
    }

    /// Who owns what its requests store (docs/store.md): its key's digest; empty without keys.
    pub(crate) fn owner(&self) -> String {
        self.key.as_ref().map(KeyInfo::owner).unwrap_or_default()
    }
}

#[derive(Debug)]
pub(crate) struct Clients {
    policy: QueuePolicy,
    scheduling: SchedulingPolicy,
    /// By `name_hash` of the client's name.
    weights: HashMap<u64, u32>,
    /// The one client of `fifo`.
    everyone: Client,
}

impl Clients {
    pub(crate) fn new(policy: QueuePolicy, scheduling: SchedulingPolicy, weights: &[(Secret, u32)]) -> Clients {
        Clients {
            policy,
            scheduling,
            weights: weights.iter().map(|(c, w)| (name_hash(c.expose()), *w)).collect(),
            everyone: Client::new("", 1),
        }
    }

    /// The queue's client for a request from `caller` with `headers` and the body's `user`
    /// and `priority`.
    pub(crate) fn identify(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        user: Option<&str>,
        priority: Option<i64>,
    ) -> Client {
        let client = self.who(caller, headers, user);
        match self.scheduling {
            SchedulingPolicy::Fcfs => client,
            SchedulingPolicy::Priority => {
                // As vLLM: a header that is not an integer is ignored.
                let header = headers
                    .get(PRIORITY_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse().ok());
                let asked = header.or(priority).unwrap_or(0);
                // A key's priority class is the soonest its requests may go.
                let class = caller.key.as_ref().and_then(|k| k.settings.priority);
                client.at(class.map_or(asked, |c| asked.max(c)))
            }
        }
    }

    fn who(&self, caller: &Caller, headers: &HeaderMap, user: Option<&str>) -> Client {
        if self.policy == QueuePolicy::Fifo {
            return self.everyone;
        }
        if let Some(key) = &caller.key {
            let id = name_hash(&key.name);
            let weight = key.settings.weight.or_else(|| self.weights.get(&id).copied());
            return Client::hashed(id, weight.unwrap_or(1));
        }
        let named = headers
            .get(CLIENT_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .or(user.filter(|u| !u.is_empty()));
        let id = match named {
            Some(n) => name_hash(n),
            None => address_hash(caller.addr),
        };
        Client::hashed(id, self.weights.get(&id).copied().unwrap_or(1))
    }
}

/// `name_hash` of the address as text (CLIENT_WEIGHTS may name one). An IPv4 address is
/// written with itoa into a stack buffer: `to_string` goes through `core::fmt` for ~1 300
/// instructions, once per request of an unnamed client.
fn address_hash(addr: IpAddr) -> u64 {
    let IpAddr::V4(v4) = addr else {
        return name_hash(&addr.to_string());
    };
    let mut text = [0u8; 15];
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text[len] = b'.';
            len += 1;
        }
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(octet).as_bytes();
        text[len..len + digits.len()].copy_from_slice(digits);
        len += digits.len();
    }
    name_hash(std::str::from_utf8(&text[..len]).expect("digits and dots"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(key: Option<&str>) -> Caller {
        Caller {
            key: key.map(KeyInfo::named),
            addr: "127.0.0.9".parse().unwrap(),
        }
    }

    #[test]
    fn an_address_hashes_as_its_text() {
        for addr in [
            "0.0.0.0",
            "127.0.0.9",
            "10.20.255.1",
            "255.255.255.255",
            "::1",
            "fe80::1:2",
        ] {
            let ip: IpAddr = addr.parse().unwrap();
            assert_eq!(address_hash(ip), name_hash(addr), "{addr}");
        }
    }

    #[test]
    fn a_client_is_its_key_else_its_header_else_its_user_else_its_address() {
        let clients = Clients::new(
            QueuePolicy::Fair,
            SchedulingPolicy::Fcfs,
            &[(Secret::new("sk-a"), 4), (Secret::new("team-b"), 2)],
        );
        let mut named = HeaderMap::new();
        named.insert(CLIENT_HEADER, "team-b".parse().unwrap());
        let none = HeaderMap::new();
        let c = clients.identify(&caller(Some("sk-a")), &named, Some("u"), None);
        assert_eq!(
            c,
            Client::new("sk-a", 4),
            "a validated key wins over what the client says"
        );
        assert_eq!(
            clients.identify(&caller(None), &named, Some("u"), None),
            Client::new("team-b", 2)
        );
        assert_eq!(
            clients.identify(&caller(None), &none, Some("u"), None),
            Client::new("u", 1)
        );
        assert_eq!(
            clients.identify(&caller(None), &none, Some(""), None),
            Client::new("127.0.0.9", 1)
        );
        let fifo = Clients::new(QueuePolicy::Fifo, SchedulingPolicy::Fcfs, &[(Secret::new("sk-a"), 4)]);
        assert_eq!(
            fifo.identify(&caller(Some("sk-a")), &named, None, Some(-3)),
            Client::new("", 1)
        );
        let shown = format!("{clients:?}");
        assert!(!shown.contains("sk-a") && !shown.contains("team-b"), "{shown}");
    }

    #[test]
    fn a_priority_is_the_header_when_it_is_an_integer_else_the_body_and_only_under_priority() {
        let prio = Clients::new(QueuePolicy::Fifo, SchedulingPolicy::Priority, &[]);
        let everyone = Client::new("", 1);
        let mut headers = HeaderMap::new();
        assert_eq!(prio.identify(&caller(None), &headers, None, None), everyone.at(0));
        assert_eq!(prio.identify(&caller(None), &headers, None, Some(7)), everyone.at(7));
        headers.insert(PRIORITY_HEADER, " -2 ".parse().unwrap());
        assert_eq!(prio.identify(&caller(None), &headers, None, Some(7)), everyone.at(-2));
        headers.insert(PRIORITY_HEADER, "high".parse().unwrap());
        assert_eq!(
            prio.identify(&caller(None), &headers, None, Some(7)),
            everyone.at(7),
            "vLLM ignores a header that is not an integer"
        );
        let fcfs = Clients::new(QueuePolicy::Fifo, SchedulingPolicy::Fcfs, &[]);
        assert_eq!(fcfs.identify(&caller(None), &headers, None, Some(7)), everyone);
    }
}
