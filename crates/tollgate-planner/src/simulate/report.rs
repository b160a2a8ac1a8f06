//! What a replay found: [`Report`], as a table for people and JSON for
//! machines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::histogram::Summary;
use crate::rational::group;

/// Decisions by outcome (SPEC §6 metrics labels).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DecisionCounts {
    /// Allowed at once.
    pub allowed: u64,
    /// Allowed after a wait.
    pub waited: u64,
    /// Denied.
    pub denied: u64,
    /// Allowed only because the plan is in shadow mode: enforcement would
    /// have denied.
    pub shadow_denied: u64,
}

impl DecisionCounts {
    /// All decisions.
    pub fn total(&self) -> u64 {
        self.allowed + self.waited + self.denied + self.shadow_denied
    }
}

/// Denials by one limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LimitReport {
    /// Denied by it.
    pub denied: u64,
    /// Would have been denied by it (shadow mode).
    pub shadow_denied: u64,
    /// The retry hints it gave, when retryable.
    pub retry_after_ms: Option<Summary>,
}

/// One plan's decisions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PlanReport {
    /// Distinct users seen on it.
    pub users: u64,
    /// Turn admissions (turn rate, concurrency, session lease).
    pub turns: DecisionCounts,
    /// Model calls, each counted once with its final outcome: the user's
    /// token reservation and, when the call names a configured provider,
    /// the provider permit after it.
    pub model_calls: DecisionCounts,
    /// Denials by limit: `turn_rate`, `concurrency`, `session`,
    /// `token_rate`, `token_exceeds_capacity`, `max_llm_calls`,
    /// `provider_rate`, `provider_cooldown`, `provider_exhausted`,
    /// `provider_exceeds_capacity`.
    pub limits: BTreeMap<String, LimitReport>,
    /// The wait of every model call that went ahead (0 for those that did
    /// not wait): the user's token wait plus the provider's.
    pub wait_ms: Option<Summary>,
    /// Actual tokens of the model calls that went ahead.
    pub tokens: u64,
}

/// One provider key's permits and answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ProviderReport {
    /// Permits, from model calls and `provider_call` events.
    pub permits: DecisionCounts,
    /// Refusals by limit (`provider_rate`, `provider_cooldown`,
    /// `provider_exhausted`, `provider_exceeds_capacity`).
    pub limits: BTreeMap<String, LimitReport>,
    /// The wait of every granted permit.
    pub wait_ms: Option<Summary>,
    /// Provider answers by class (`success`, `throttled`, `exhausted`,
    /// `server_error`, `client_error`).
    pub responses: BTreeMap<String, u64>,
    /// Answers that set or extended a cooldown.
    pub cooldowns: u64,
    /// Per tenant its permits named (empty when none named one; at most 64
    /// apart, then `{others}`; `{none}`: permits naming none).
    pub tenants: BTreeMap<String, TenantReport>,
    /// Permits granted over the pool's capacity during the replay (its
    /// burst plus its requests rate from the trace's first event to its
    /// last, or to the last granted call's start if later; `None` without a
    /// requests rate).
    pub utilisation: Option<f64>,
    /// Jain's fairness index of the backlogged tenants (those refused at
    /// least once): (Σx)² / (n·Σx²) of each one's granted permits per unit
    /// of weight; 1 is weighted-fair. `None` when no tenant was refused.
    pub fairness: Option<f64>,
    /// How many tenants were backlogged.
    pub backlogged: u64,
}

/// One tenant's permits of a provider key.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct TenantReport {
    /// Its permits.
    pub permits: DecisionCounts,
    /// Its part of the key's granted permits.
    pub share: f64,
    /// Its weight, when the key shares fairly (1 when not configured).
    pub weight: Option<u32>,
    /// The wait of its granted permits.
    pub wait_ms: Option<Summary>,
}

impl TenantReport {
    /// Permits granted (at once, after a wait, or only in shadow mode).
    pub fn allowed_total(&self) -> u64 {
        self.permits.allowed + self.permits.waited + self.permits.shadow_denied
    }
}

/// One user, among those hit hardest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct UserReport {
    /// The user id.
    pub user: String,
    /// The user's plan (`name+override` with an override).
    pub plan: String,
    /// Turn admissions.
    pub turns: DecisionCounts,
    /// Model calls.
    pub model_calls: DecisionCounts,
    /// Total wait of the user's model calls.
    pub wait_ms_total: u64,
    /// The longest wait of one model call.
    pub wait_ms_max: u64,
    /// Actual tokens of the user's model calls.
    pub tokens: u64,
}

impl UserReport {
    /// Denials and shadow denials, turns and model calls together (the
    /// first ranking key of "hit hardest").
    pub fn denials(&self) -> u64 {
        self.turns.denied
            + self.turns.shadow_denied
            + self.model_calls.denied
            + self.model_calls.shadow_denied
    }
}

/// Runs (admitted turns) and their leases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RunCounts {
    /// Turns admitted (including shadow-admitted ones).
    pub admitted: u64,
    /// Runs that ended with `turn_end` (leases released).
    pub ended: u64,
    /// Runs whose client vanished (`turn_abandon`): their leases expire.
    pub abandoned: u64,
    /// Runs still running when the trace ended.
    pub still_running: u64,
    /// Renewals that found the run's lease (or session lease) gone.
    pub leases_lost: u64,
    /// Leaked run leases that expiry gave back to later turns.
    pub leases_reclaimed: u64,
}

/// Events that could not apply, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Skipped {
    /// `model_call`, `turn_end` or `turn_abandon` of a turn that is not
    /// running: it was denied (expected) or never started.
    pub not_running: u64,
    /// Turns of users with no plan and no `default_plan`.
    pub unknown_user: u64,
    /// Provider keys that are not configured (their events change nothing).
    pub unknown_provider: u64,
    /// Settles or refunds of reservations the store no longer knew.
    pub unknown_reservation: u64,
}

/// What a replay found (see `docs/planning.md`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// The trace's name.
    pub trace: String,
    /// Whether every plan was replayed in shadow mode (`--shadow`): then
    /// nothing is denied and `shadow_denied` counts would-deny decisions.
    pub shadow: bool,
    /// Non-blank lines read.
    pub lines: u64,
    /// Events applied (every line is one).
    pub events: u64,
    /// The first event's time, ms.
    pub start_ms: Option<u64>,
    /// The last event's time, ms.
    pub end_ms: Option<u64>,
    /// Distinct users with a plan.
    pub users: u64,
    /// Per plan, by name.
    pub plans: BTreeMap<String, PlanReport>,
    /// Per provider key `provider:model`.
    pub providers: BTreeMap<String, ProviderReport>,
    /// The users hit hardest: most denials (and shadow denials), then the
    /// longest total wait, then the most tokens.
    pub top_users: Vec<UserReport>,
    /// Runs and leases.
    pub runs: RunCounts,
    /// Events that changed nothing.
    pub skipped: Skipped,
}

fn ms(v: u64) -> String {
    format!("{} ms", group(u128::from(v)))
}

fn duration(ms: u64) -> String {
    let s = ms / 1_000;
    let frac = ms % 1_000;
    let (h, m, s) = (s / 3_600, (s / 60) % 60, s % 60);
    if frac == 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{h}:{m:02}:{s:02}.{frac:03}")
    }
}

fn n(v: u64) -> String {
    group(u128::from(v))
}

fn wait_line(s: &Summary) -> String {
    format!(
        "n={} p50 {}, p90 {}, p95 {}, p99 {}, max {}, mean {}",
        n(s.count),
        ms(s.p50),
        ms(s.p90),
        ms(s.p95),
        ms(s.p99),
        ms(s.max),
        ms(s.mean)
    )
}

/// Lays out rows in columns: the first left-aligned, the rest right.
fn columns(rows: &[Vec<String>]) -> String {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; width];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let pad = widths[i] - c.chars().count();
            if i == 0 {
                line.push_str(c);
                line.extend(std::iter::repeat_n(' ', pad));
            } else {
                line.push_str("  ");
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(c);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn count_row(label: String, c: &DecisionCounts, waits: bool) -> Vec<String> {
    vec![
        label,
        n(c.allowed),
        if waits { n(c.waited) } else { "-".into() },
        n(c.denied),
        n(c.shadow_denied),
        String::new(),
        String::new(),
    ]
}

fn limit_rows(rows: &mut Vec<Vec<String>>, limits: &BTreeMap<String, LimitReport>) {
    for (name, l) in limits {
        let (p50, max) = match &l.retry_after_ms {
            Some(s) => (ms(s.p50), ms(s.max)),
            None => ("-".into(), "-".into()),
        };
        rows.push(vec![
            format!("    {name}"),
            String::new(),
            String::new(),
            n(l.denied),
            n(l.shadow_denied),
            p50,
            max,
        ]);
    }
}

impl Report {
    /// The report as JSON (the same fields as the struct).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The report as a table for people.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let span = match (self.start_ms, self.end_ms) {
            (Some(a), Some(b)) => duration(b - a),
            _ => duration(0),
        };
        let _ = writeln!(
            out,
            "{}: {} events, {} users, over {span}",
            self.trace,
            n(self.events),
            n(self.users)
        );
        if self.shadow {
            let _ = writeln!(
                out,
                "shadow mode (--shadow): nothing was denied; \"would deny\" counts what enforcement would have denied"
            );
        }
        out.push('\n');
        let denied = if self.shadow { "(denied)" } else { "denied" };
        let mut rows = vec![vec![
            "plan / decision / limit".to_owned(),
            "allowed".into(),
            "waited".into(),
            denied.into(),
            if self.shadow {
                "would deny".into()
            } else {
                "shadow-denied".into()
            },
            "retry p50".into(),
            "retry max".into(),
        ]];
        for (name, p) in &self.plans {
            rows.push(vec![format!(
                "{name} ({} user{})",
                n(p.users),
                if p.users == 1 { "" } else { "s" }
            )]);
            rows.push(count_row("  turns".into(), &p.turns, false));
            let turn_limits = p
                .limits
                .iter()
                .filter(|(k, _)| matches!(k.as_str(), "turn_rate" | "concurrency" | "session"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            limit_rows(&mut rows, &turn_limits);
            rows.push(count_row("  model calls".into(), &p.model_calls, true));
            let call_limits = p
                .limits
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "turn_rate" | "concurrency" | "session"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            limit_rows(&mut rows, &call_limits);
        }
        for (name, p) in &self.providers {
            rows.push(vec![format!("provider {name}")]);
            rows.push(count_row("  permits".into(), &p.permits, true));
            limit_rows(&mut rows, &p.limits);
        }
        out.push_str(&columns(&rows));
        let mut notes = String::new();
        for (name, p) in &self.plans {
            if let Some(s) = &p.wait_ms {
                let _ = writeln!(notes, "  {name}: model-call wait {}", wait_line(s));
            }
        }
        for (name, p) in &self.providers {
            if let Some(s) = &p.wait_ms {
                let _ = writeln!(notes, "  provider {name}: permit wait {}", wait_line(s));
            }
            if let Some(u) = p.utilisation {
                let _ = writeln!(
                    notes,
                    "  provider {name}: pool utilisation {:.1} %",
                    u * 100.0
                );
            }
            for (tenant, r) in &p.tenants {
                let weight = r.weight.map_or(String::new(), |w| format!(" (weight {w})"));
                let wait = r
                    .wait_ms
                    .as_ref()
                    .map_or("no permit granted".to_owned(), |s| {
                        format!("wait p50 {}, p99 {}", ms(s.p50), ms(s.p99))
                    });
                let _ = writeln!(
                    notes,
                    "  provider {name} tenant {tenant}{weight}: {:.1} % of permits ({} granted, {} refused), {wait}",
                    r.share * 100.0,
                    n(r.allowed_total()),
                    n(r.permits.denied),
                );
            }
            if let Some(j) = p.fairness {
                let _ = writeln!(
                    notes,
                    "  provider {name}: Jain's fairness index {j:.3} over {} backlogged tenants (permits per unit of weight)",
                    n(p.backlogged),
                );
            }
            if !p.responses.is_empty() {
                let answers: Vec<String> = p
                    .responses
                    .iter()
                    .map(|(k, v)| format!("{k} {}", n(*v)))
                    .collect();
                let _ = writeln!(
                    notes,
                    "  provider {name}: answers {}; cooldowns set {}",
                    answers.join(", "),
                    n(p.cooldowns)
                );
            }
        }
        if !notes.is_empty() {
            out.push_str("\nwaits\n");
            out.push_str(&notes);
        }
        if !self.top_users.is_empty() {
            out.push_str("\nusers hit hardest\n");
            let refused = if self.shadow { "would deny" } else { "denied" };
            let mut rows = vec![vec![
                "  user".to_owned(),
                "plan".into(),
                format!("turns {refused}"),
                format!("calls {refused}"),
                "calls waited".into(),
                "total wait".into(),
                "max wait".into(),
                "tokens".into(),
            ]];
            for u in &self.top_users {
                rows.push(vec![
                    format!("  {}", u.user),
                    u.plan.clone(),
                    n(u.turns.denied + u.turns.shadow_denied),
                    n(u.model_calls.denied + u.model_calls.shadow_denied),
                    n(u.model_calls.waited),
                    ms(u.wait_ms_total),
                    ms(u.wait_ms_max),
                    n(u.tokens),
                ]);
            }
            out.push_str(&columns(&rows));
        }
        let r = &self.runs;
        let _ = writeln!(
            out,
            "\nruns: {} admitted, {} ended, {} abandoned, {} still running; {} leases lost, {} reclaimed by expiry",
            n(r.admitted),
            n(r.ended),
            n(r.abandoned),
            n(r.still_running),
            n(r.leases_lost),
            n(r.leases_reclaimed)
        );
        let s = &self.skipped;
        if s.not_running + s.unknown_user + s.unknown_provider + s.unknown_reservation > 0 {
            let _ = writeln!(
                out,
                "skipped: {} events of turns not running (denied or never started), {} turns of users with no plan, {} events of unconfigured providers, {} unknown reservations",
                n(s.not_running),
                n(s.unknown_user),
                n(s.unknown_provider),
                n(s.unknown_reservation)
            );
        }
        out
    }
}
