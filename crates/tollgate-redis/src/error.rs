//! Classifying Redis faults into transient and permanent store errors.

use redis::{ErrorKind, RedisError, ServerErrorKind};
use tollgate_core::{StoreError, StoreErrorKind};

/// Maps a Redis error to a [`StoreError`], keeping it as the source.
///
/// Transient (worth retrying or failing open): timeouts, refused or dropped
/// connections, I/O errors, a cluster that is reconfiguring (`TRYAGAIN`,
/// `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`), and a server busy running a
/// slow script (`BUSY`). Full: Redis at its `maxmemory` refusing a write
/// (`OOM`), as the in-memory store at its bound ([`Failover`] treats it as
/// a fault of the shared store too). Permanent: bad credentials, scripts
/// that fail, answers this client does not understand.
///
/// [`Failover`]: tollgate_core::failover::Failover
pub(crate) fn classify(e: RedisError) -> StoreError {
    let kind = if e.code() == Some("OOM") {
        StoreErrorKind::Full
    } else if e.code() == Some("BUSY") {
        StoreErrorKind::Unavailable
    } else if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_connection_refusal() || e.is_connection_dropped() || e.is_io_error() {
        StoreErrorKind::Unavailable
    } else {
        match e.kind() {
            ErrorKind::AuthenticationFailed => StoreErrorKind::Refused,
            ErrorKind::ClusterConnectionNotFound => StoreErrorKind::Unavailable,
            ErrorKind::Server(
                ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask,
            ) => StoreErrorKind::Unavailable,
            ErrorKind::Server(ServerErrorKind::NoPerm) => StoreErrorKind::Refused,
            _ if e.is_cluster_error() => StoreErrorKind::Unavailable,
            _ => StoreErrorKind::Protocol,
        }
    };
    StoreError::new(kind, format!("redis: {e}")).with_source(e)
}

/// The error of an operation that did not finish within the timeout.
pub(crate) fn timed_out(op: &str, ms: u128) -> StoreError {
    StoreError::new(
        StoreErrorKind::Timeout,
        format!("redis: {op} got no answer within {ms} ms"),
    )
}

/// The error of a script answer that does not have the documented shape.
pub(crate) fn bad_reply(op: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("redis: unexpected {op} reply: {detail}"),
    )
}
