//! The planning subcommands' command lines: [`SimulateArgs`],
//! [`CapacityArgs`] and [`DeriveArgs`] are [`clap::Args`] that the
//! `tollgate` binary embeds as its `simulate`, `capacity` and `derive`
//! subcommands. Each `run` prints the result (a table, the config section,
//! or JSON with `--json`) or the error on stderr, and returns the exit
//! status ([`PlanError::exit_code`] on failure).
#![allow(clippy::print_stdout)] // a CLI prints

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::capacity::{CapacityInput, capacity};
use crate::derive::derive_file;
use crate::simulate::{SimulateOptions, simulate};
use crate::{PlanError, Rational};

/// Replay a traffic trace (JSON lines) through the real limiter on a
/// fake clock and report what was allowed, waited or denied
/// (docs/planning.md).
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The config whose plans, users, overrides and providers to replay
    /// against (the server's TOML; its server-only settings are ignored).
    #[arg(long)]
    pub config: PathBuf,
    /// The trace, one JSON object per line.
    #[arg(long)]
    pub trace: PathBuf,
    /// Put every plan in shadow mode: report would-deny only.
    #[arg(long)]
    pub shadow: bool,
    /// Also draw the replay to this SVG file.
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl SimulateArgs {
    /// Replays the trace and prints the report (or the error): the exit
    /// status of `tollgate simulate`.
    pub fn run(self) -> ExitCode {
        let options = SimulateOptions::new(self.config, self.trace)
            .with_shadow(self.shadow)
            .with_chart(self.chart);
        planned(
            simulate(&options),
            self.json,
            |r| r.to_json(),
            |r| r.to_table(),
        )
    }
}

/// Size a fleet by Little's law against the provider quota.
#[derive(Debug, Clone, Args)]
pub struct CapacityArgs {
    /// Turns arriving per second, fleet-wide.
    #[arg(long)]
    pub arrival_rate: Rational,
    /// Mean turn time, seconds.
    #[arg(long)]
    pub mean_turn_s: Rational,
    /// Mean model calls per turn.
    #[arg(long)]
    pub mean_calls: Rational,
    /// 95th percentile of model calls per turn.
    #[arg(long)]
    pub p95_calls: Option<Rational>,
    /// Tokens per model call (as the quota counts them).
    #[arg(long)]
    pub tokens_per_call: Rational,
    /// Safe in-flight turns per replica.
    #[arg(long)]
    pub per_replica: u64,
    /// Spare replicas on top of those needed (2 for N+2).
    #[arg(long, default_value_t = 0)]
    pub spare: u64,
    /// The provider's requests-per-minute quota.
    #[arg(long)]
    pub quota_rpm: Option<Rational>,
    /// The provider's tokens-per-minute quota.
    #[arg(long)]
    pub quota_tpm: Option<Rational>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl CapacityArgs {
    /// Sizes the fleet and prints the report (or the error): the exit
    /// status of `tollgate capacity`.
    pub fn run(self) -> ExitCode {
        let input = CapacityInput {
            arrival_rate: self.arrival_rate,
            mean_turn_s: self.mean_turn_s,
            mean_calls: self.mean_calls,
            p95_calls: self.p95_calls,
            tokens_per_call: self.tokens_per_call,
            per_replica: self.per_replica,
            spare: self.spare,
            quota_rpm: self.quota_rpm,
            quota_tpm: self.quota_tpm,
        };
        planned(
            capacity(&input),
            self.json,
            |r| r.to_json(),
            |r| r.to_table(),
        )
    }
}

/// Suggest plan limits from per-turn usage records (JSON lines).
#[derive(Debug, Clone, Args)]
pub struct DeriveArgs {
    /// The usage records.
    #[arg(long)]
    pub usage: PathBuf,
    /// Suggested limit = this × the plan's 95th percentile.
    #[arg(long, default_value = "2.5")]
    pub multiple: Rational,
    /// Print JSON instead of the config section.
    #[arg(long)]
    pub json: bool,
}

impl DeriveArgs {
    /// Derives the limits and prints them as a `[plans.<name>]` section (or
    /// JSON, or the error): the exit status of `tollgate derive`.
    pub fn run(self) -> ExitCode {
        planned(
            derive_file(&self.usage, self.multiple),
            self.json,
            |r| r.to_json(),
            |r| r.to_toml(),
        )
    }
}

/// Prints a planning command's result: JSON or text, or the error (with
/// its exit code).
fn planned<R>(
    result: Result<R, PlanError>,
    json: bool,
    to_json: impl FnOnce(&R) -> serde_json::Value,
    to_text: impl FnOnce(&R) -> String,
) -> ExitCode {
    match result {
        Ok(r) if json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&to_json(&r)).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Ok(r) => {
            print!("{}", to_text(&r));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}
