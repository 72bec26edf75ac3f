//! The route table: the one place that says what every upstream path is — whether it runs the
//! engine (normalised, admitted, relayed) or is a utility (checked, forwarded, no permit), its API
//! family (which decides the error envelope) and its metric label — and the canonical form of a
//! request path, computed once before routing so no spelling (`/v1/chat%2Fcompletions`,
//! `//v1/./chat/completions/`) reaches the engine around admission. A path the table does not
//! know is answered 404 by the gateway without reaching vLLM.

use crate::api::family::{Api, Family};

/// What the gateway does with a request on a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Runs the engine: normalised as `Api`, admitted, relayed.
    Generate(Api),
    /// The model is resolved, then forwarded without a permit.
    Utility,
    /// Forwarded unchanged without a permit (it runs nothing on the engine).
    Forward,
    /// Answered by the gateway from its response store (docs/store.md), never by vLLM.
    Stored,
}

/// The HTTP methods a route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Methods {
    Get,
    Post,
    GetPost,
    GetDelete,
}

impl Methods {
    /// Whether the route answers `method` (HEAD wherever GET is, as vLLM's Starlette does).
    pub(crate) fn allow(self, method: &hyper::Method) -> bool {
        use hyper::Method as M;
        match self {
            Methods::Get => matches!(*method, M::GET | M::HEAD),
            Methods::Post => *method == M::POST,
            Methods::GetPost => matches!(*method, M::GET | M::HEAD | M::POST),
            Methods::GetDelete => matches!(*method, M::GET | M::HEAD | M::DELETE),
        }
    }
}

/// One upstream route of vLLM 0.33's surface.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    /// The path (`{id}` stands for one segment).
    pub(crate) path: &'static str,
    pub(crate) methods: Methods,
    pub(crate) role: Role,
    pub(crate) family: Family,
    /// The `route` label of the gateway's metrics.
    pub(crate) label: &'static str,
}

const fn route(path: &'static str, methods: Methods, role: Role, family: Family, label: &'static str) -> Route {
    Route {
        path,
        methods,
        role,
        family,
        label,
    }
}

use Family::{Anthropic, OpenAi};
use Methods::{Get, GetDelete, GetPost, Post};
use Role::{Forward, Generate, Stored, Utility};

/// Every vLLM route the gateway serves (one row a route: a table, not rustfmt's layout).
#[rustfmt::skip]
pub(crate) const ROUTES: &[Route] = &[
    route("/v1/chat/completions", Post, Generate(Api::Chat), OpenAi, "chat"),
    route("/v1/chat/completions/batch", Post, Generate(Api::Batch), OpenAi, "chat_batch"),
    route("/v1/completions", Post, Generate(Api::Completions), OpenAi, "completions"),
    route("/v1/responses", Post, Generate(Api::Responses), OpenAi, "responses"),
    route("/v1/messages", Post, Generate(Api::Messages), Anthropic, "messages"),
    route("/invocations", Post, Generate(Api::Invocations), OpenAi, "invocations"),
    route("/v1/decisions", Post, Generate(Api::Opaque), OpenAi, "decisions"),
    route("/v1/systemone", Post, Generate(Api::Opaque), OpenAi, "systemone"),
    route("/generative_scoring", Post, Generate(Api::Opaque), OpenAi, "generative_scoring"),
    route("/tokenize", Post, Utility, OpenAi, "tokenize"),
    route("/detokenize", Post, Utility, OpenAi, "detokenize"),
    route("/v1/messages/count_tokens", Post, Utility, Anthropic, "count_tokens"),
    route("/v1/models", Get, Forward, OpenAi, "models"),
    route("/v1/responses/{id}", GetDelete, Stored, OpenAi, "responses_get"),
    route("/v1/responses/{id}/input_items", Get, Stored, OpenAi, "responses_input_items"),
    route("/v1/responses/{id}/cancel", Post, Stored, OpenAi, "responses_cancel"),
    route("/load", Get, Forward, OpenAi, "load"),
    route("/version", Get, Forward, OpenAi, "version"),
    route("/ping", GetPost, Forward, OpenAi, "ping"),
];

/// Whether a canonical `path` fits a route pattern (`{name}` stands for one segment).
fn fits(pattern: &str, path: &str) -> bool {
    let (mut p, mut q) = (pattern.split('/'), path.split('/'));
    loop {
        match (p.next(), q.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == b || (a.starts_with('{') && !b.is_empty()) => {}
            _ => return false,
        }
    }
}

/// The upstream route a canonical path belongs to: an exact path first (one string compare
/// for chat, the table's first entry), then the patterns.
pub(crate) fn lookup(path: &str) -> Option<&'static Route> {
    ROUTES
        .iter()
        .find(|r| r.path == path)
        .or_else(|| ROUTES.iter().find(|r| r.path.contains('{') && fits(r.path, path)))
}

impl Route {
    /// Whether API_KEYS guard the route: everything that reaches the model or its tokenizer;
    /// not the liveness answers (`/ping`, `/version`, `/load`) that monitors poll.
    pub(crate) fn needs_key(&self) -> bool {
        !matches!(self.path, "/ping" | "/version" | "/load")
    }
}

/// Rewrites the request's path to its canonical form (`routes::canonical`) before routing, so
/// the route table sees — and the upstream receives — one spelling of every path; the upstream
/// route it belongs to (`None`: the gateway's own, or unknown).
pub(crate) fn canonicalize<B>(req: &mut hyper::Request<B>) -> Option<&'static Route> {
    rewrite(req);
    lookup(req.uri().path())
}

fn rewrite<B>(req: &mut hyper::Request<B>) {
    let uri = req.uri();
    if is_canonical(uri.path()) {
        return;
    }
    let Some(path) = canonical(uri.path()) else {
        // Undecodable: routed as a path no route has (404 envelope).
        *req.uri_mut() = axum::http::Uri::from_static("/%invalid-path");
        return;
    };
    if path == uri.path() {
        return;
    }
    let rebuilt = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    if let Ok(p) = rebuilt.parse::<axum::http::uri::PathAndQuery>() {
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = Some(p);
        if let Ok(u) = axum::http::Uri::from_parts(parts) {
            *req.uri_mut() = u;
        }
    }
}

/// Decodes `%XX` escapes; `None` when they do not decode to UTF-8 (or hold a NUL).
fn percent_decode(path: &str) -> Option<String> {
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8().ok()?;
    (!decoded.contains('\0')).then(|| decoded.into_owned())
}

/// Whether `path` is already in canonical form (`canonical` would return it unchanged): no
/// escape, no empty, `.` or `..` segment, no trailing slash. What nearly every client sends,
/// so the common request is routed without rebuilding its path.
fn is_canonical(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if path == "/" {
        return true;
    }
    !path.contains('%') && rest.split('/').all(|seg| !matches!(seg, "" | "." | ".."))
}

/// The canonical form of a request path, as uvicorn would route it and stricter: escapes
/// decoded, empty and `.` segments dropped, `..` resolved (never above the root), no trailing
/// slash. `None` for a path that cannot be decoded.
pub(crate) fn canonical(path: &str) -> Option<String> {
    let decoded = percent_decode(path)?;
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    Some(format!("/{}", segments.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_taken_as_canonical_is_what_canonical_makes_of_it() {
        for path in [
            "/",
            "/v1/chat/completions",
            "/v1/responses/abc/cancel",
            "/v1/chat/completions/",
            "//v1",
            "/v1/./x",
            "/v1/..",
            "/..",
            "/.",
            "/v1/%63hat",
            "/v1/a.b/c..d",
            "",
            "v1/chat",
        ] {
            if is_canonical(path) {
                assert_eq!(canonical(path).as_deref(), Some(path), "{path:?}");
            } else {
                assert_ne!(
                    canonical(path).as_deref(),
                    Some(path),
                    "{path:?} is canonical after all"
                );
            }
        }
        assert!(is_canonical("/v1/chat/completions") && is_canonical("/v1/a.b/c..d"));
    }

    #[test]
    fn every_spelling_of_a_path_is_one_canonical_path() {
        for spelling in [
            "/v1/chat/completions",
            "/v1/chat%2Fcompletions",
            "/v1/%63hat/completions",
            "/v1/chat/completions/",
            "//v1//chat/./completions",
            "/v1/x/../chat/completions",
            "/v1/chat%2fcompletions",
        ] {
            assert_eq!(
                canonical(spelling).as_deref(),
                Some("/v1/chat/completions"),
                "{spelling}"
            );
        }
        assert_eq!(canonical("/../../etc").as_deref(), Some("/etc"));
        assert_eq!(canonical("/").as_deref(), Some("/"));
        assert_eq!(canonical("/v1/%ff%fe"), None, "not UTF-8");
        assert_eq!(canonical("/v1/a%00b"), None, "NUL");
        assert_eq!(canonical("/v1/100%").as_deref(), Some("/v1/100%"), "a bare % stays");
    }

    #[test]
    fn paths_find_their_route() {
        assert_eq!(lookup("/v1/messages").map(|r| r.label), Some("messages"));
        assert_eq!(lookup("/v1/responses/resp_1").map(|r| r.label), Some("responses_get"));
        assert_eq!(
            lookup("/v1/responses/resp_1/cancel").map(|r| r.label),
            Some("responses_cancel")
        );
        assert!(lookup("/v1/responses/").is_none() && lookup("/v1/nope").is_none());
        assert!(lookup("/tokenize").is_some_and(Route::needs_key));
        assert!(lookup("/ping").is_some_and(|r| !r.needs_key()));
    }

    #[test]
    fn every_generation_route_is_admitted_and_labels_are_unique() {
        let mut labels: Vec<&str> = ROUTES.iter().map(|r| r.label).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), ROUTES.len());
        let generating: Vec<&str> = ROUTES
            .iter()
            .filter(|r| matches!(r.role, Role::Generate(_)))
            .map(|r| r.path)
            .collect();
        for p in [
            "/v1/chat/completions",
            "/v1/chat/completions/batch",
            "/v1/messages",
            "/invocations",
        ] {
            assert!(generating.contains(&p), "{p} runs the engine");
        }
    }
}
