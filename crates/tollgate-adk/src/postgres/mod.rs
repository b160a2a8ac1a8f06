//! Sessions in PostgreSQL (`postgres` feature): the database the
//! conversation lives in issues the fence its writes are checked against
//! (docs/spec.md §4, *Sessions in PostgreSQL*).
//!
//! - [`migrate`] brings tollgate's own tables to this version's schema:
//!   versioned migrations embedded in the crate, applied under a
//!   PostgreSQL advisory lock, so replicas starting together do not race.
//!   The tables are tollgate's alone ([`TABLES`]); the ADK's own tables
//!   (`sessions`, `events`, `app_states`, `user_states`, and
//!   `_adk_session_migrations`, as adk-session's `PostgresSessionService`
//!   creates them) are left as they are.
//! - [`Fences`] takes a session's next database fence and checks it inside
//!   a write transaction.
//! - [`PgSessionService`] keeps adk sessions in the ADK's tables, every
//!   write of a turn checked against the turn's database fence.

mod fences;
mod migrate;
mod service;

pub use fences::{DbFence, Fences, SessionRef, Stale};
pub use migrate::{LOCK_KEY, MIGRATIONS, MigrateError, Migration, TABLES, migrate, schema_version};
pub use service::{DEFAULT_MAX_EVENTS, MAX_LIST, PgSessionService, PoolBounds};
