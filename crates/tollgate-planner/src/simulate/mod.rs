//! `tollgate simulate`: replay a traffic trace through the real limiter.
//!
//! The trace is JSON lines, sorted by time (docs/planning.md has the
//! format). Each event moves a [`FakeClock`](tollgate_core::FakeClock) to
//! its time and calls the real [`Limiter`](tollgate_core::Limiter) and
//! [`ProviderGovernor`](tollgate_provider::ProviderGovernor) on an
//! in-memory store, so nothing waits for real: a day of traffic replays in
//! seconds.
//!
//! * `turn_start`: the session lease (if the event names a session, held by
//!   the invocation, SPEC §3's order), then turn admission, as the sidecar
//!   does ([`Limiter::admit_turn_in_session`](tollgate_core::Limiter::admit_turn_in_session)). A denied turn is
//!   counted and its later events are skipped. An admitted run renews its
//!   leases every third of their TTL, as a live client does, until its
//!   `turn_end` (released) or `turn_abandon` (left to expire).
//! * `model_call`: a decide-only token reservation. A call that must wait
//!   happens after the wait: its provider permit (when it names a
//!   configured provider key, within what is left of the plan's
//!   `max_wait_ms`: one deadline) and then, after `duration_ms`, its settle
//!   with the actual tokens. A provider refusal refunds the user.
//! * `provider_call` takes a provider permit outside any turn;
//!   `provider_response` feeds the provider's answer (a 429 sets a cooldown
//!   and halves the rate, SPEC §5).
//!
//! The trace is read one line at a time; memory grows with users, sessions
//! and live runs, not with lines. Drawing a chart replays the trace a
//! second time (replays are deterministic) to follow the token levels of
//! the users the first pass found hit hardest.
//!
//! ```
//! use tollgate_planner::Limits;
//! use tollgate_planner::simulate::{ReplayOptions, replay};
//!
//! let limits = Limits::parse(r#"
//! default_plan = "support"
//! [plans.support]
//! turns = { amount = 20, period_ms = 60000, burst = 5 }
//! tokens = { amount = 60000, period_ms = 60000 }
//! concurrent_runs = 2
//! "#, "tollgate.toml").unwrap();
//! let trace = (0..7)
//!     .map(|i| format!(r#"{{"t_ms": 0, "event": "turn_start", "user": "u1", "invocation": "i{i}"}}
//! {{"t_ms": 0, "event": "turn_end", "user": "u1", "invocation": "i{i}"}}
//! "#))
//!     .collect::<String>();
//! let report = replay(&limits, trace.as_bytes(), "burst.jsonl", &ReplayOptions::default()).unwrap();
//! let support = &report.plans["support"];
//! assert_eq!((support.turns.allowed, support.turns.denied), (5, 2));
//! assert_eq!(support.limits["turn_rate"].retry_after_ms.unwrap().max, 3_000);
//! ```

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;

use tollgate_core::session::DEFAULT_SESSION_TTL_MS;

use crate::trace::parse_line;
use crate::{Limits, PlanError, jsonl};

mod chart;
mod engine;
mod report;

pub use report::{
    DecisionCounts, LimitReport, PlanReport, ProviderReport, Report, RunCounts, Skipped, UserReport,
};

use chart::{CHART_USERS, ChartRecorder};
use engine::Engine;

/// The default number of users listed as hit hardest.
pub const DEFAULT_TOP: usize = 10;

/// How to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Put every plan in shadow mode (`--shadow`): nothing is denied and
    /// the report counts would-deny decisions as `shadow_denied`. Provider
    /// refusals are counted the same way and the call goes ahead.
    pub shadow: bool,
    /// How many users to list as hit hardest.
    pub top: usize,
    /// The session lease TTL of turns that name a session, ms (default
    /// [`DEFAULT_SESSION_TTL_MS`], 30 s, as the adk executor's; at least
    /// 3 ms).
    pub session_ttl_ms: u64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            shadow: false,
            top: DEFAULT_TOP,
            session_ttl_ms: DEFAULT_SESSION_TTL_MS,
        }
    }
}

impl ReplayOptions {
    /// Default options, in shadow mode or not.
    pub fn shadow(shadow: bool) -> Self {
        Self {
            shadow,
            ..Self::default()
        }
    }
}

/// `tollgate simulate`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimulateOptions {
    /// The config file (`tollgate serve`'s TOML; only its limits are read).
    pub config: PathBuf,
    /// The trace (JSON lines).
    pub trace: PathBuf,
    /// Where to write the SVG chart, if anywhere.
    pub chart: Option<PathBuf>,
    /// Replay settings.
    pub replay: ReplayOptions,
}

impl SimulateOptions {
    /// Replays `trace` against the limits of `config`, enforcing, no chart.
    pub fn new(config: impl Into<PathBuf>, trace: impl Into<PathBuf>) -> Self {
        Self {
            config: config.into(),
            trace: trace.into(),
            chart: None,
            replay: ReplayOptions::default(),
        }
    }

    /// Sets shadow mode (`--shadow`).
    pub fn with_shadow(mut self, shadow: bool) -> Self {
        self.replay.shadow = shadow;
        self
    }

    /// Writes an SVG chart to `path` (`--chart`).
    pub fn with_chart(mut self, path: Option<PathBuf>) -> Self {
        self.chart = path;
        self
    }
}

/// `tollgate simulate`: reads the config and replays the trace file; with
/// a chart path, replays it again to draw the chart and writes it.
///
/// # Errors
///
/// [`PlanError::Io`] for a file that cannot be read or written,
/// [`PlanError::Config`] for a bad config, [`PlanError::Line`] for a
/// malformed trace line (with its number and field).
pub fn simulate(opts: &SimulateOptions) -> Result<Report, PlanError> {
    let limits = Limits::load(&opts.config)?;
    let name = opts.trace.display().to_string();
    let open = || {
        File::open(&opts.trace)
            .map(|f| BufReader::with_capacity(1 << 16, f))
            .map_err(|e| PlanError::read(&opts.trace, e))
    };
    let report = replay(&limits, open()?, &name, &opts.replay)?;
    if let Some(path) = &opts.chart {
        let svg = chart(&limits, open()?, &name, &opts.replay, &report)?;
        std::fs::write(path, svg).map_err(|e| PlanError::write(path, e))?;
    }
    Ok(report)
}

fn run<R: BufRead>(mut engine: Engine, trace: R, source_name: &str) -> Result<Engine, PlanError> {
    let mut lines = jsonl::Lines::new(trace, source_name);
    while let Some((line, text)) = lines.next_line()? {
        let (t, event) = parse_line(source_name, line, text)?;
        engine.count_line();
        engine.event(line, t, event)?;
    }
    Ok(engine)
}

/// Replays a trace read from `trace` against `limits`; `source_name` names
/// it in errors and in the report.
///
/// # Errors
///
/// [`PlanError::Line`] for a malformed line or one that goes back in time,
/// [`PlanError::Config`] if the limits do not validate.
pub fn replay<R: BufRead>(
    limits: &Limits,
    trace: R,
    source_name: &str,
    opts: &ReplayOptions,
) -> Result<Report, PlanError> {
    let engine = run(Engine::new(limits, opts, source_name)?, trace, source_name)?;
    Ok(engine.finish(source_name, opts.top)?.0)
}

/// Draws the chart of a replay as SVG: replays `trace` (the same trace
/// `report` came from) following the users `report` found hit hardest.
///
/// The first panel has one line per outcome (allowed, waited, denied,
/// shadow-denied): decisions per second, every kind (turn admissions,
/// token reservations, provider permits) together. The second has one line
/// per user (at most 5): the lowest level of the user's token bucket in
/// each time bin (negative: debt).
///
/// # Errors
///
/// As [`replay`], and [`PlanError::Chart`] if drawing fails.
pub fn chart<R: BufRead>(
    limits: &Limits,
    trace: R,
    source_name: &str,
    opts: &ReplayOptions,
    report: &Report,
) -> Result<String, PlanError> {
    let engine = Engine::new(limits, opts, source_name)?;
    let users: Vec<_> = report
        .top_users
        .iter()
        .take(CHART_USERS)
        .filter_map(|u| engine.plan_of(&u.user).map(|p| (u.user.clone(), p)))
        .collect();
    let recorder = ChartRecorder::new(
        report.start_ms.unwrap_or(0),
        report.end_ms.unwrap_or(0),
        users.iter().map(|(u, p)| (u.clone(), &**p)).collect(),
    );
    let engine = run(engine.with_chart(recorder), trace, source_name)?;
    let (_, recorder) = engine.finish(source_name, 0)?;
    let title = format!(
        "tollgate simulate: {source_name}{}",
        if opts.shadow { " (shadow)" } else { "" }
    );
    recorder
        .ok_or_else(|| PlanError::Chart("no chart was recorded".into()))?
        .render(&title)
        .map_err(PlanError::Chart)
}
