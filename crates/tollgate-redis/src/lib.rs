//! # tollgate-redis
//!
//! tollgate's [`Store`](tollgate_core::Store) in Redis 7, standalone or
//! Cluster, through one code path. Every operation is one Lua script called
//! by EVALSHA on one hash slot: a user's keys share the tag `{user}`, a
//! session's `{session}`, so turn admission is one atomic script even in
//! Cluster. The scripts use the same exact integer arithmetic as the core
//! (levels scaled by the period, integer ceilings), and time from Redis
//! `TIME`, so a fleet decides on one clock.
//!
//! The failure policy of SPEC §6 is core's
//! [`Failover`](tollgate_core::failover::Failover), generic over any store.
//!
//! The top-users counter (for the admin endpoint) lives in its own slot; a
//! replica counts in memory and writes it in batches, off the decision path.

mod codes;
mod config;
mod error;
mod keys;
mod scripts;
mod store;

pub use config::{RedisConfig, RedisTarget};
pub use scripts::lua_source;
pub use store::RedisStore;
