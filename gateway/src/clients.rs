//! Who a generation request is for the admission queue (QUEUE_POLICY, CLIENT_WEIGHTS): its
//! validated API key, else the `x-sparkgate-client` header, else the body's `user`, else the
//! address it came from; under `fifo` everyone is one client. The weights are looked up by that
//! same name; unlisted clients weigh 1.

use std::collections::HashMap;
use std::net::IpAddr;

use axum::http::HeaderMap;
use sparkgate_config::{QueuePolicy, Secret};

use crate::fairq::Client;

/// The header a client may name itself by (when no API key names it).
pub(crate) const CLIENT_HEADER: &str = "x-sparkgate-client";

/// What the edge knows of a request's sender.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The API key the request was checked by (when API_KEYS is set).
    pub(crate) key: Option<String>,
    pub(crate) addr: IpAddr,
}

#[derive(Debug)]
pub(crate) struct Clients {
    policy: QueuePolicy,
    weights: HashMap<String, u32>,
    /// The one client of `fifo`.
    everyone: Client,
}

impl Clients {
    pub(crate) fn new(policy: QueuePolicy, weights: &[(Secret, u32)]) -> Clients {
        Clients {
            policy,
            weights: weights.iter().map(|(c, w)| (c.expose().to_owned(), *w)).collect(),
            everyone: Client::new("", 1),
        }
    }

    /// The queue's client for a request from `caller` with `headers` and the body's `user`.
    pub(crate) fn identify(&self, caller: &Caller, headers: &HeaderMap, user: Option<&str>) -> Client {
        if self.policy == QueuePolicy::Fifo {
            return self.everyone.clone();
        }
        let named = caller
            .key
            .as_deref()
            .or_else(|| headers.get(CLIENT_HEADER).and_then(|v| v.to_str().ok()).map(str::trim))
            .filter(|n| !n.is_empty())
            .or(user.filter(|u| !u.is_empty()));
        let id = match named {
            Some(n) => n.to_owned(),
            None => caller.addr.to_string(),
        };
        let weight = self.weights.get(&id).copied().unwrap_or(1);
        Client::new(id, weight)
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
    }
}
