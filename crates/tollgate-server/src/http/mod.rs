//! The HTTP/JSON API (SPEC §8): extractors, handlers and the router.

pub mod admin;
pub(crate) mod extract;
pub mod routes;
