//! tollgate's gRPC API, served on its own port (`grpc_listen`) beside
//! HTTP over the same [`App`](crate::App): the same limiter, identity,
//! in-flight cap, config reloads and metrics.
//!
//! - [`api`]: the `tollgate.v1.Tollgate` service, the operations of SPEC §8
//!   with the same outcomes as the HTTP/JSON API (the status table is in
//!   [`crate::outcome`]).
//! - [`proto`]: the messages, server and client generated from
//!   `proto/tollgate/v1/tollgate.proto`, where the API is documented.
//!
//! Envoy's rate-limit service is not here: it has a listener of its own
//! (`rls_listen`, guarded by `[rls] key`), see [`crate::envoy`].

pub mod api;

/// The code generated from `proto/tollgate/v1/tollgate.proto` (package
/// `tollgate.v1`): messages, the server ([`proto::tollgate_server`]) and a
/// client ([`proto::tollgate_client::TollgateClient`]).
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    rustdoc::all
)]
pub mod proto {
    tonic::include_proto!("tollgate.v1");
}
