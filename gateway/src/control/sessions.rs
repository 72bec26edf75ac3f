//! Console sign-ins (`/console`, docs/operations.md "The console"): a token is exchanged once for
//! a session — the admin token makes an operator's, an API key a team member's (its own usage,
//! no actions) — and the browser holds only the session's random id, in an HttpOnly cookie.
//! Sessions live in memory (a gateway restart signs everyone out) and end at CONSOLE_SESSION_S
//! or at sign-out. Failed sign-ins and admin tokens are limited per address: five a minute.

use std::collections::HashMap;
use std::io::Read as _;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::keys::{sha256, KeyRing};
use crate::api::error::GatewayError;

/// The cookie's name.
pub(crate) const COOKIE: &str = "sparkgate_console";

/// Failed sign-ins (and admin tokens) an address may make in a minute.
const FAILURES_PER_MINUTE: usize = 5;
const MINUTE: Duration = Duration::from_secs(60);

/// Who a session is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// Signed in with the admin token: sees and acts on everything.
    Operator,
    /// Signed in with an API key: the service's state and this key's usage only.
    Member(Arc<str>),
}

#[derive(Debug)]
struct Session {
    role: Role,
    expires: Instant,
}

/// The admin token as it is compared (SHA-256, constant time).
#[derive(Clone)]
pub(crate) struct AdminDigest([u8; 32]);

impl AdminDigest {
    pub(crate) fn of(token: &str) -> AdminDigest {
        AdminDigest(sha256(token))
    }

    pub(crate) fn matches(&self, presented: &str) -> bool {
        use subtle::ConstantTimeEq as _;
        self.0.ct_eq(&sha256(presented)).into()
    }
}

impl std::fmt::Debug for AdminDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminDigest(<redacted>)")
    }
}

/// The live sessions, keyed by their id's SHA-256 (the id itself is only in the cookie).
#[derive(Debug)]
pub(crate) struct Sessions {
    ttl: Duration,
    admin: Option<AdminDigest>,
    keys: Arc<KeyRing>,
    live: Mutex<HashMap<[u8; 32], Session>>,
    /// When each address failed in the last minute (a sliding window, exact: a peek must not
    /// spend anything, which a token bucket's check would).
    failures: Mutex<HashMap<IpAddr, Vec<Instant>>>,
}

impl Sessions {
    pub(crate) fn new(ttl: Duration, admin: Option<AdminDigest>, keys: Arc<KeyRing>) -> Sessions {
        Sessions {
            ttl,
            admin,
            keys,
            live: Mutex::default(),
            failures: Mutex::default(),
        }
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The keys sign-ins are checked against (the console's quota table reads their settings).
    pub(crate) fn keys(&self) -> &KeyRing {
        &self.keys
    }

    pub(crate) fn admin(&self) -> Option<&AdminDigest> {
        self.admin.as_ref()
    }

    /// Refuses an address that failed FAILURES_PER_MINUTE times in the last minute, until
    /// the oldest of those is a minute old.
    pub(crate) fn throttled(&self, peer: IpAddr) -> Result<(), GatewayError> {
        let now = Instant::now();
        let mut failures = self.failures.lock().expect("failures lock");
        let Some(times) = failures.get_mut(&peer) else {
            return Ok(());
        };
        times.retain(|t| now.duration_since(*t) < MINUTE);
        match times.first() {
            Some(oldest) if times.len() >= FAILURES_PER_MINUTE => Err(GatewayError::SignInThrottled {
                retry_after: MINUTE.saturating_sub(now.duration_since(*oldest)),
            }),
            None => {
                failures.remove(&peer);
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }

    /// A failure from `peer` is counted; `err` is what it is answered.
    pub(crate) fn failed(&self, peer: IpAddr, err: GatewayError) -> GatewayError {
        let mut failures = self.failures.lock().expect("failures lock");
        // Bounded: an address's list is pruned at its next look, and addresses are few.
        failures.entry(peer).or_default().push(Instant::now());
        err
    }

    /// Exchanges `token` for a session: its id (the cookie's value) and who it is. With no
    /// ADMIN_TOKEN, an empty token signs a loopback peer in as the operator (as `/admin`
    /// answers loopback peers then).
    pub(crate) fn sign_in(&self, token: &str, peer: IpAddr) -> Result<(String, Role), GatewayError> {
        self.throttled(peer)?;
        let role = match &self.admin {
            Some(admin) if admin.matches(token) => Some(Role::Operator),
            None if token.is_empty() && peer.is_loopback() => Some(Role::Operator),
            _ if token.is_empty() => None,
            _ => self.keys.find(token).map(|k| Role::Member(k.name)),
        };
        let Some(role) = role else {
            return Err(self.failed(
                peer,
                GatewayError::SignIn("the token is neither the admin token nor an API key this gateway accepts"),
            ));
        };
        let id = new_id();
        let session = Session {
            role: role.clone(),
            expires: Instant::now() + self.ttl,
        };
        let mut live = self.live.lock().expect("sessions lock");
        live.retain(|_, s| s.expires > Instant::now());
        live.insert(sha256(&id), session);
        Ok((id, role))
    }

    /// Who the session `id` is, while it lives (and, for a member, while its key does).
    pub(crate) fn find(&self, id: &str) -> Option<Role> {
        let mut live = self.live.lock().expect("sessions lock");
        let d = sha256(id);
        let s = live.get(&d)?;
        let gone = match &s.role {
            Role::Member(name) => !self.keys.names().contains(name),
            Role::Operator => false,
        };
        if s.expires <= Instant::now() || gone {
            live.remove(&d);
            return None;
        }
        Some(s.role.clone())
    }

    /// Ends the session `id` (sign-out).
    pub(crate) fn end(&self, id: &str) {
        self.live.lock().expect("sessions lock").remove(&sha256(id));
    }
}

/// 32 bytes from the kernel's generator, as hex: a session id nobody can guess.
fn new_id() -> String {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("/dev/urandom is readable");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The session id a request's `Cookie` header carries, if any.
pub(crate) fn cookie(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(ttl: Duration) -> Sessions {
        Sessions::new(ttl, Some(AdminDigest::of("admin-secret")), Arc::new(KeyRing::none()))
    }

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 9, 9, 9));

    #[test]
    fn the_admin_token_signs_in_an_operator_until_sign_out() {
        let s = sessions(Duration::from_secs(60));
        let (id, role) = s.sign_in("admin-secret", PEER).unwrap();
        assert_eq!(role, Role::Operator);
        assert_eq!(id.len(), 64);
        assert_eq!(s.find(&id), Some(Role::Operator));
        assert_eq!(s.find(&id.replace('a', "b")), None, "a forged id names nobody");
        s.end(&id);
        assert_eq!(s.find(&id), None);
    }

    #[test]
    fn a_session_ends_at_its_expiry() {
        let s = sessions(Duration::ZERO);
        let (id, _) = s.sign_in("admin-secret", PEER).unwrap();
        assert_eq!(s.find(&id), None);
    }

    #[test]
    fn wrong_tokens_are_refused_then_throttled() {
        let s = sessions(Duration::from_secs(60));
        for _ in 0..FAILURES_PER_MINUTE {
            assert!(matches!(s.sign_in("wrong", PEER), Err(GatewayError::SignIn(_))));
        }
        assert!(matches!(
            s.sign_in("wrong", PEER),
            Err(GatewayError::SignInThrottled { .. })
        ));
        assert!(matches!(s.throttled(PEER), Err(GatewayError::SignInThrottled { .. })));
        let other = IpAddr::V4(std::net::Ipv4Addr::new(10, 9, 9, 8));
        assert!(s.throttled(other).is_ok());
    }

    #[test]
    fn an_empty_token_is_the_operator_only_for_loopback_without_an_admin_token() {
        let s = Sessions::new(Duration::from_secs(60), None, Arc::new(KeyRing::none()));
        assert!(s.sign_in("", PEER).is_err());
        let (_, role) = s.sign_in("", IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)).unwrap();
        assert_eq!(role, Role::Operator);
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut h = axum::http::HeaderMap::new();
        h.insert("cookie", "a=1; sparkgate_console=abc; b=2".parse().unwrap());
        assert_eq!(cookie(&h), Some("abc"));
        h.insert("cookie", "sparkgate_console=".parse().unwrap());
        assert_eq!(cookie(&h), None);
    }
}
