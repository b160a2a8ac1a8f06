//! # tollgate-planner
//!
//! Planning tools over tollgate's real limiter (SPEC §6–7), as a library,
//! and their command lines: [`cli`] holds the `simulate`, `capacity` and
//! `derive` subcommands as [`clap::Args`] that the `tollgate` binary embeds.
//!
//! * [`simulate`]: replay a traffic trace (JSON lines) through the real
//!   [`Limiter`](tollgate_core::Limiter) and
//!   [`ProviderGovernor`](tollgate_provider::ProviderGovernor) on a
//!   [`FakeClock`](tollgate_core::FakeClock): a day of traffic replays in
//!   seconds, in memory bounded by users and sessions, not by lines. The
//!   [`Report`](simulate::Report) counts decisions per plan and limit, wait
//!   percentiles and the users hit hardest; [`simulate::chart`] draws them
//!   as SVG.
//! * [`capacity`]: Little's law for a fleet, in exact arithmetic.
//! * [`mod@derive`]: limits suggested from per-turn usage records, as a
//!   `[plans.<name>]` section ready to paste into the config file.
//!
//! Every failure is a [`PlanError`]: malformed input names its line and
//! field, and [`PlanError::exit_code`] gives the CLI its status.
//!
//! ```
//! use tollgate_planner::capacity::{CapacityInput, capacity};
//!
//! let input = CapacityInput {
//!     quota_rpm: Some("10000".parse().unwrap()),
//!     quota_tpm: Some("40000000".parse().unwrap()),
//!     ..CapacityInput::new("40", "5.5", "3.2", "6500", 60, 2).unwrap()
//! };
//! let report = capacity(&input).unwrap();
//! assert_eq!(report.turns_in_flight.to_string(), "220");
//! assert_eq!((report.replicas_needed, report.replicas_deploy), (4, 6));
//! assert_eq!(report.binding.as_deref(), Some("tokens"));
//! ```
//!
//! The formats and outputs are described in `docs/planning.md`.

pub mod capacity;
pub mod cli;
pub mod config;
pub mod derive;
mod error;
mod histogram;
mod jsonl;
mod rational;
pub mod simulate;
mod trace;

pub use config::Limits;
pub use error::PlanError;
pub use histogram::Summary;
pub use rational::{Rational, RationalError};
