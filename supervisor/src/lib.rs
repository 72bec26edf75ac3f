//! The rank group's lifecycle: preflight, start order, readiness, watching, group restarts with
//! epochs and backoff. Filled in by the supervisor issue; it drives `sparkgate-docker` from the
//! launch plan of `sparkgate-config`.
