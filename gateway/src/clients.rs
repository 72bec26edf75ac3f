//! Who a generation request is for the admission queue (QUEUE_POLICY, CLIENT_WEIGHTS): its
//! validated API key, else the `x-sparkgate-client` header, else the body's `user`, else the
//! address it came from; under `fifo` everyone is one client. The weights are looked up by that
//! same name; unlisted clients weigh 1. Without API_KEYS the header and `user` are the client's
//! own word: a client may name itself as it likes (and so claim a listed weight, or split its
//! burst over many names); with API_KEYS the key decides. Names are kept only as keyed hashes
//! (`fairq::name_hash`), never as text.

use std::collections::HashMap;
use std::net::IpAddr;

use axum::http::HeaderMap;
use sparkgate_config::{QueuePolicy, Secret};

use crate::fairq::{name_hash, Client};

/// The header a client may name itself by (when no API key names it).
const CLIENT_HEADER: &str = "x-sparkgate-client";

/// What the edge knows of a request's sender.
#[derive(Clone)]
pub(crate) struct Caller {
    /// The API key the request was checked by (when API_KEYS is set).
    pub(crate) key: Option<String>,
    pub(crate) addr: IpAddr,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("key", &self.key.as_ref().map(|_| sparkgate_config::REDACTED))
            .field("addr", &self.addr)
            .finish()
    }
}

#[derive(Debug)]
pub(crate) struct Clients {
    policy: QueuePolicy,
    /// By `name_hash` of the client's name.
    weights: HashMap<u64, u32>,
    /// The one client of `fifo`.
    everyone: Client,
}

impl Clients {
    pub(crate) fn new(policy: QueuePolicy, weights: &[(Secret, u32)]) -> Clients {
        Clients {
            policy,
            weights: weights.iter().map(|(c, w)| (name_hash(c.expose()), *w)).collect(),
            everyone: Client::new("", 1),
        }
    }

    /// The queue's client for a request from `caller` with `headers` and the body's `user`.
    pub(crate) fn identify(&self, caller: &Caller, headers: &HeaderMap, user: Option<&str>) -> Client {
        if self.policy == QueuePolicy::Fifo {
            return self.everyone;
        }
        let named = caller
            .key
            .as_deref()
            .or_else(|| headers.get(CLIENT_HEADER).and_then(|v| v.to_str().ok()).map(str::trim))
            .filter(|n| !n.is_empty())
            .or(user.filter(|u| !u.is_empty()));
        let id = match named {
            Some(n) => name_hash(n),
            None => name_hash(&caller.addr.to_string()),
        };
        Client::hashed(id, self.weights.get(&id).copied().unwrap_or(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(key: Option<&str>) -> Caller {
        Caller {
            key: key.map(str::to_owned),
            addr: "127.0.0.9".parse().unwrap(),
        }
    }

    #[test]
    fn a_client_is_its_key_else_its_header_else_its_user_else_its_address() {
        let clients = Clients::new(
            QueuePolicy::Fair,
            &[(Secret::new("sk-a"), 4), (Secret::new("team-b"), 2)],
        );
        let mut named = HeaderMap::new();
        named.insert(CLIENT_HEADER, "team-b".parse().unwrap());
        let none = HeaderMap::new();
        let c = clients.identify(&caller(Some("sk-a")), &named, Some("u"));
        assert_eq!(
            c,
            Client::new("sk-a", 4),
            "a validated key wins over what the client says"
        );
        assert_eq!(
            clients.identify(&caller(None), &named, Some("u")),
            Client::new("team-b", 2)
        );
        assert_eq!(clients.identify(&caller(None), &none, Some("u")), Client::new("u", 1));
        assert_eq!(
            clients.identify(&caller(None), &none, Some("")),
            Client::new("127.0.0.9", 1)
        );
        let fifo = Clients::new(QueuePolicy::Fifo, &[(Secret::new("sk-a"), 4)]);
        assert_eq!(fifo.identify(&caller(Some("sk-a")), &named, None), Client::new("", 1));
        let shown = format!("{:?} {clients:?}", caller(Some("sk-a")));
        assert!(!shown.contains("sk-a") && !shown.contains("team-b"), "{shown}");
    }
}
