//! The replay: trace events through the real limiter and governor on a
//! fake clock, with the effects that come later (a settle after the wait,
//! a provider permit after the user's wait, lease renewals) kept in a
//! time-ordered queue.
//!
//! Memory is bounded by users, sessions and live runs, never by lines: per
//! user a few counters, per plan and provider fixed-size histograms, per
//! live run one entry and at most a few queued actions.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tollgate_core::Id;
use tollgate_core::limiter::{ModelRef, Reserve};
use tollgate_core::session::{
    SessionAdmit, SessionLease, renew_every_ms, renewable_ttl, session_key,
};
use tollgate_core::store::memory::{MemoryConfig, MemoryStore};
use tollgate_core::{
    Clock, Decision, Denial, FakeClock, Limit, Limiter, LimiterError, Outcome, Plan, ReservationId,
    Store,
};
use tollgate_provider::{PermitRequest, ProviderError, ProviderGovernor};

use super::ReplayOptions;
use super::chart::ChartRecorder;
use super::report::{
    DecisionCounts, LimitReport, PlanReport, ProviderReport, Report, RunCounts, Skipped,
    TenantReport, UserReport,
};
use crate::histogram::LogHistogram;
use crate::trace::{Event, ProviderRef};
use crate::{Limits, PlanError};

mod calls;

mod turns;

/// How long the replay's store keeps an idle session's state: a session's
/// fence counter does not matter to a replay, only its live lease, so it is
/// forgotten sooner than the server's 7 days (bounded memory).
const SESSION_RETENTION_MS: u64 = 10 * 60_000;

/// Polls a future of the in-memory store, which is always ready.
fn ready<F: Future>(f: F) -> Result<F::Output, PlanError> {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Ok(v),
        Poll::Pending => Err(PlanError::Replay(
            "the in-memory store did not answer at once".into(),
        )),
    }
}

fn replay_err(e: impl std::error::Error + Send + Sync + 'static) -> PlanError {
    PlanError::Replay(Box::new(e))
}

/// The name of a denial in the report: the limit, or for a provider's
/// refusal of a model call, `provider_*`.
fn label(d: &Denial, provider: bool) -> &'static str {
    match (d, provider) {
        (Denial::ExceedsCapacity { .. }, true) => "provider_exceeds_capacity",
        (Denial::ExceedsCapacity { limit, .. }, false) => match limit {
            Limit::BudgetDaily | Limit::BudgetWeekly | Limit::BudgetMonthly => {
                "budget_exceeds_capacity"
            }
            _ => "token_exceeds_capacity",
        },
        (_, true) => match d.limit() {
            Limit::Cooldown => "provider_cooldown",
            _ => "provider_rate",
        },
        (_, false) => d.limit().as_str(),
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counts {
    allowed: u64,
    waited: u64,
    denied: u64,
    shadow_denied: u64,
}

impl Counts {
    fn add(&mut self, o: Outcome) {
        match o {
            Outcome::Allowed => self.allowed += 1,
            Outcome::Waited => self.waited += 1,
            Outcome::Denied => self.denied += 1,
            Outcome::ShadowDenied => self.shadow_denied += 1,
        }
    }

    fn report(&self) -> DecisionCounts {
        DecisionCounts {
            allowed: self.allowed,
            waited: self.waited,
            denied: self.denied,
            shadow_denied: self.shadow_denied,
        }
    }
}

#[derive(Default)]
struct LimitAcc {
    denied: u64,
    shadow_denied: u64,
    retry: LogHistogram,
}

fn limits_report(m: &BTreeMap<&'static str, LimitAcc>) -> BTreeMap<String, LimitReport> {
    m.iter()
        .map(|(k, v)| {
            (
                (*k).to_owned(),
                LimitReport {
                    denied: v.denied,
                    shadow_denied: v.shadow_denied,
                    retry_after_ms: v.retry.summary(),
                },
            )
        })
        .collect()
}

fn add_denial(
    m: &mut BTreeMap<&'static str, LimitAcc>,
    label: &'static str,
    retry: Option<u64>,
    shadow: bool,
) {
    let acc = m.entry(label).or_default();
    if shadow {
        acc.shadow_denied += 1;
    } else {
        acc.denied += 1;
    }
    if let Some(r) = retry {
        acc.retry.record(r);
    }
}

#[derive(Default)]
struct PlanAcc {
    users: u64,
    turns: Counts,
    calls: Counts,
    limits: BTreeMap<&'static str, LimitAcc>,
    waits: LogHistogram,
    tokens: u64,
}

struct UserAcc {
    plan: Arc<str>,
    turns: Counts,
    calls: Counts,
    wait_total: u64,
    wait_max: u64,
    tokens: u64,
}

impl UserAcc {
    fn denials(&self) -> u64 {
        self.turns.denied + self.turns.shadow_denied + self.calls.denied + self.calls.shadow_denied
    }
}

#[derive(Default)]
struct ProviderAcc {
    permits: Counts,
    limits: BTreeMap<&'static str, LimitAcc>,
    waits: LogHistogram,
    responses: BTreeMap<&'static str, u64>,
    cooldowns: u64,
    /// Per tenant named by its permits (at most [`MAX_TENANTS`], then
    /// [`fair::OTHERS`](tollgate_core::fair::OTHERS)).
    tenants: BTreeMap<String, TenantAcc>,
    /// When the last granted call starts (its time plus its wait), ms.
    last_start: Option<u64>,
}

/// Tenants a provider key's report keeps apart (the store's own bound).
const MAX_TENANTS: usize = tollgate_core::fair::MAX_TENANTS;

#[derive(Default)]
struct TenantAcc {
    permits: Counts,
    waits: LogHistogram,
}

impl ProviderAcc {
    /// The accumulator of `tenant`'s permits (`None`: the permits naming
    /// none).
    fn tenant(&mut self, tenant: Option<&str>) -> &mut TenantAcc {
        let name = tenant.unwrap_or(tollgate_core::fair::NO_TENANT);
        let name = if self.tenants.contains_key(name) || self.tenants.len() < MAX_TENANTS {
            name
        } else {
            tollgate_core::fair::OTHERS
        };
        self.tenants.entry(name.to_owned()).or_default()
    }
}

/// A run admitted and not yet ended or abandoned.
struct Run {
    id: u64,
    user: Arc<str>,
    invocation: Box<str>,
    plan: Arc<Plan>,
    session: Option<String>,
    renew_every: u64,
}

/// A model call between its user reservation and its provider permit.
struct CallInFlight {
    user: Arc<str>,
    plan: Arc<Plan>,
    reservation: ReservationId,
    estimate: u64,
    actual: u64,
    duration_ms: u64,
    provider: String,
    model: String,
    tenant: Option<String>,
    user_wait: u64,
    user_shadow: bool,
    line: u64,
}

enum Action {
    /// Renew the leases of the run at `key` if it is still run `id`.
    Renew { key: String, id: u64 },
    /// Take the provider permit of a model call, after the user's wait.
    Permit(Box<CallInFlight>),
    /// The model call is over: settle with the actual tokens.
    Settle {
        user: Arc<str>,
        reservation: ReservationId,
        actual: u64,
        line: u64,
    },
}

struct Pending {
    due: u64,
    seq: u64,
    action: Action,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

/// What a provider permit answered.
enum PermitResult {
    Granted {
        wait_ms: u64,
    },
    Refused {
        label: &'static str,
        retry: Option<u64>,
        shadow: bool,
    },
    Unconfigured,
}

fn run_key(user: &str, invocation: &str) -> String {
    let mut k = String::with_capacity(user.len() + invocation.len() + 1);
    k.push_str(user);
    k.push('\u{1f}');
    k.push_str(invocation);
    k
}

/// One replay.
pub(super) struct Engine {
    src: String,
    clock: FakeClock,
    limiter: Limiter<MemoryStore>,
    governor: ProviderGovernor<MemoryStore>,
    shadow: bool,
    session_ttl_ms: u64,
    runs: HashMap<String, Run>,
    next_run: u64,
    pending: BinaryHeap<Reverse<Pending>>,
    seq: u64,
    last_t: Option<u64>,
    first_t: Option<u64>,
    lines: u64,
    events: u64,
    users: HashMap<Arc<str>, UserAcc>,
    plans: BTreeMap<Arc<str>, PlanAcc>,
    providers: BTreeMap<String, ProviderAcc>,
    run_counts: RunCounts,
    skipped: Skipped,
    chart: Option<ChartRecorder>,
    /// The config has spend budgets: the trace must be in Unix time.
    budgeted: bool,
}

/// 2000-01-01T00:00Z: a trace of a budgeted config starts after it.
const UNIX_2000_MS: u64 = 946_684_800_000;

impl Engine {
    pub(super) fn new(
        limits: &Limits,
        opts: &ReplayOptions,
        source_name: &str,
    ) -> Result<Self, PlanError> {
        let (plans, providers) =
            limits
                .validate(opts.shadow)
                .map_err(|errors| PlanError::Config {
                    source_name: "the config".into(),
                    errors,
                })?;
        let budgeted = limits.plans.plans.values().any(|p| p.budgets.is_some())
            || limits.plans.overrides.values().any(|o| o.budgets.is_some());
        let clock = FakeClock::new(0);
        // A replay holds a whole trace's users: no entry bound (the
        // sidecar's `[store] max_entries` protects a live process).
        let store = MemoryStore::with_config(
            clock.clone(),
            MemoryConfig {
                session_retention_ms: SESSION_RETENTION_MS,
                max_entries: usize::MAX,
                ..MemoryConfig::default()
            },
        );
        Ok(Self {
            src: source_name.to_owned(),
            limiter: Limiter::new(store.clone(), clock.clone(), plans),
            governor: ProviderGovernor::new(store, clock.clone(), providers),
            clock,
            shadow: opts.shadow,
            budgeted,
            session_ttl_ms: renewable_ttl(opts.session_ttl_ms),
            runs: HashMap::new(),
            next_run: 0,
            pending: BinaryHeap::new(),
            seq: 0,
            last_t: None,
            first_t: None,
            lines: 0,
            events: 0,
            users: HashMap::new(),
            plans: BTreeMap::new(),
            providers: BTreeMap::new(),
            run_counts: RunCounts::default(),
            skipped: Skipped::default(),
            chart: None,
        })
    }

    pub(super) fn with_chart(mut self, chart: ChartRecorder) -> Self {
        self.chart = Some(chart);
        self
    }

    /// The plan of `user`, if any (for the chart's tracked users).
    pub(super) fn plan_of(&self, user: &str) -> Option<Arc<Plan>> {
        self.limiter.plan_for(user).ok()
    }

    fn line_err(&self, line: u64, field: &str, reason: impl Into<String>) -> PlanError {
        PlanError::line(&self.src, line, Some(field), reason)
    }

    fn limiter_err(&self, line: u64, e: LimiterError) -> PlanError {
        match e {
            LimiterError::InvalidRequest { field, message } => {
                let field = match field {
                    "invocation_id" => "invocation",
                    other => other,
                };
                self.line_err(line, field, message)
            }
            other => replay_err(other),
        }
    }

    fn schedule(&mut self, due: u64, action: Action) {
        self.seq += 1;
        self.pending.push(Reverse(Pending {
            due,
            seq: self.seq,
            action,
        }));
    }

    pub(super) fn count_line(&mut self) {
        self.lines += 1;
    }

    /// Applies one event at `t`.
    pub(super) fn event(&mut self, line: u64, t: u64, ev: Event<'_>) -> Result<(), PlanError> {
        if let Some(last) = self.last_t
            && t < last
        {
            return Err(self.line_err(
                line,
                "t_ms",
                format!(
                    "{t} is earlier than the previous event's {last}: a trace must be sorted by time"
                ),
            ));
        }
        if self.first_t.is_none() {
            if self.budgeted && t < UNIX_2000_MS {
                return Err(self.line_err(
                    line,
                    "t_ms",
                    format!(
                        "{t} is not Unix time: the config has spend budgets, whose calendar \
                         windows (a day, a week, a month in [budgets] time_zone) need the \
                         events' real times, in ms since 1970 (from 2000 on)"
                    ),
                ));
            }
            self.clock.set(t);
            self.first_t = Some(t);
        }
        self.advance(t, false)?;
        self.last_t = Some(t);
        self.events += 1;
        match ev {
            Event::TurnStart {
                user,
                invocation,
                session,
            } => self.turn_start(line, t, &user, &invocation, session.as_deref()),
            Event::ModelCall {
                user,
                invocation,
                estimate,
                actual,
                duration_ms,
                provider,
            } => self.model_call(
                line,
                t,
                calls::ModelCall {
                    user: &user,
                    invocation: &invocation,
                    estimate,
                    actual,
                    duration_ms,
                    provider,
                },
            ),
            Event::TurnEnd { user, invocation } => self.turn_end(line, &user, &invocation),
            Event::TurnAbandon { user, invocation } => {
                if self.runs.remove(&run_key(&user, &invocation)).is_some() {
                    self.run_counts.abandoned += 1;
                } else {
                    self.skipped.not_running += 1;
                }
                Ok(())
            }
            Event::ProviderCall { provider, tokens } => {
                let key = format!("{}:{}", provider.provider, provider.model);
                let req = PermitRequest {
                    tenant: provider.tenant.as_deref(),
                    ..PermitRequest::new(&provider.provider, &provider.model, tokens)
                };
                if let PermitResult::Unconfigured = self.permit(t, &key, req)? {
                    self.skipped.unknown_provider += 1;
                }
                Ok(())
            }
            Event::ProviderResponse {
                provider,
                status,
                headers,
                body,
            } => self.provider_response(&provider, status, &headers, body.as_deref()),
        }
    }

    /// Runs the queued actions and chart samples due by `t`, in time order,
    /// then sets the clock to `t`. With `last`, runs everything left except
    /// renewals (the trace is over).
    fn advance(&mut self, t: u64, last: bool) -> Result<(), PlanError> {
        loop {
            let action_due = self.pending.peek().map(|Reverse(p)| p.due);
            let sample_due = self.chart.as_ref().and_then(ChartRecorder::next_sample);
            let (due, take_action) = match (action_due, sample_due) {
                (Some(a), Some(s)) if a <= s => (a, true),
                (Some(a), None) => (a, true),
                (_, Some(s)) => (s, false),
                (None, None) => break,
            };
            if due > t {
                break;
            }
            if due > self.clock.now_ms() {
                self.clock.set(due);
            }
            if take_action {
                let Some(Reverse(p)) = self.pending.pop() else {
                    break;
                };
                if last && matches!(p.action, Action::Renew { .. }) {
                    continue;
                }
                self.act(p.due, p.action)?;
            } else {
                self.sample()?;
            }
        }
        if !last && t > self.clock.now_ms() {
            self.clock.set(t);
        }
        Ok(())
    }

    fn act(&mut self, now: u64, action: Action) -> Result<(), PlanError> {
        match action {
            Action::Renew { key, id } => self.renew(now, key, id),
            Action::Permit(call) => self.call_permit(now, *call),
            Action::Settle {
                user,
                reservation,
                actual,
                line,
            } => {
                match ready(self.limiter.settle(&*user, &reservation, actual))? {
                    Ok(_) => {}
                    Err(LimiterError::UnknownReservation(_)) => {
                        self.skipped.unknown_reservation += 1;
                    }
                    Err(e) => return Err(self.limiter_err(line, e)),
                }
                self.touch(&user)
            }
        }
    }

    fn user_acc(&mut self, user: &str, plan: &Arc<str>) -> Arc<str> {
        if let Some((k, _)) = self.users.get_key_value(user) {
            return Arc::clone(k);
        }
        let name: Arc<str> = user.into();
        self.users.insert(
            Arc::clone(&name),
            UserAcc {
                plan: Arc::clone(plan),
                turns: Counts::default(),
                calls: Counts::default(),
                wait_total: 0,
                wait_max: 0,
                tokens: 0,
            },
        );
        self.plans.entry(Arc::clone(plan)).or_default().users += 1;
        name
    }

    fn plan_acc(&mut self, plan: &Plan) -> &mut PlanAcc {
        self.plans.entry(Arc::clone(&plan.name)).or_default()
    }

    fn decided(&mut self, t: u64, o: Outcome) {
        if let Some(c) = &mut self.chart {
            c.decision(t, o);
        }
    }

    fn record_turn(&mut self, t: u64, plan: &Plan, user: &str, o: Outcome) {
        self.plan_acc(plan).turns.add(o);
        if let Some(u) = self.users.get_mut(user) {
            u.turns.add(o);
        }
        self.decided(t, o);
    }

    fn record_denial(
        &mut self,
        plan: &Plan,
        label: &'static str,
        retry: Option<u64>,
        shadow: bool,
    ) {
        add_denial(&mut self.plan_acc(plan).limits, label, retry, shadow);
    }

    /// A model call's final outcome; `wait` for a call that went ahead.
    fn record_call(&mut self, plan: &Plan, user: &str, o: Outcome, wait: u64, tokens: u64) {
        let acc = self.plan_acc(plan);
        acc.calls.add(o);
        if o != Outcome::Denied {
            acc.waits.record(wait);
            acc.tokens += tokens;
        }
        if let Some(u) = self.users.get_mut(user) {
            u.calls.add(o);
            if o != Outcome::Denied {
                u.wait_total += wait;
                u.wait_max = u.wait_max.max(wait);
                u.tokens += tokens;
            }
        }
    }

    /// Notes a tracked user's token level for the chart.
    fn touch(&mut self, user: &str) -> Result<(), PlanError> {
        let Some(chart) = &mut self.chart else {
            return Ok(());
        };
        let Some(i) = chart.tracked(user) else {
            return Ok(());
        };
        let (turns, tokens) = chart.specs(i);
        let state =
            ready(self.limiter.store().user_state(user, turns, tokens))?.map_err(replay_err)?;
        chart.observe(i, state.tokens_available);
        Ok(())
    }

    /// A chart sample at the end of a bin: every tracked user's level.
    fn sample(&mut self) -> Result<(), PlanError> {
        let Some(chart) = &mut self.chart else {
            return Ok(());
        };
        let mut levels = Vec::with_capacity(chart.tracked_len());
        for i in 0..chart.tracked_len() {
            let (turns, tokens) = chart.specs(i);
            let state = ready(
                self.limiter
                    .store()
                    .user_state(chart.user(i), turns, tokens),
            )?
            .map_err(replay_err)?;
            levels.push(state.tokens_available);
        }
        chart.sample(&levels);
        Ok(())
    }

    /// Ends the replay: what is still queued (settles, provider permits)
    /// runs; live runs stop renewing.
    pub(super) fn finish(
        mut self,
        trace: &str,
        top: usize,
    ) -> Result<(Report, Option<ChartRecorder>), PlanError> {
        self.advance(u64::MAX, true)?;
        self.run_counts.still_running = self.runs.len() as u64;
        self.run_counts.leases_reclaimed = self.limiter.reclaimed_leases();
        let mut users: Vec<(&Arc<str>, &UserAcc)> = self.users.iter().collect();
        users.sort_by(|(an, a), (bn, b)| {
            b.denials()
                .cmp(&a.denials())
                .then(b.wait_total.cmp(&a.wait_total))
                .then(b.tokens.cmp(&a.tokens))
                .then(an.cmp(bn))
        });
        let top_users = users
            .into_iter()
            .take(top)
            .map(|(name, u)| UserReport {
                user: name.to_string(),
                plan: u.plan.to_string(),
                turns: u.turns.report(),
                model_calls: u.calls.report(),
                wait_ms_total: u.wait_total,
                wait_ms_max: u.wait_max,
                tokens: u.tokens,
            })
            .collect();
        let plans = self
            .plans
            .iter()
            .map(|(name, p)| {
                (
                    name.to_string(),
                    PlanReport {
                        users: p.users,
                        turns: p.turns.report(),
                        model_calls: p.calls.report(),
                        limits: limits_report(&p.limits),
                        wait_ms: p.waits.summary(),
                        tokens: p.tokens,
                    },
                )
            })
            .collect();
        let providers = self
            .providers
            .iter()
            .map(|(name, p)| {
                (name.clone(), {
                    let conf = self.governor.book();
                    let conf = name
                        .split_once(':')
                        .and_then(|(pr, m)| conf.get(pr, m).cloned());
                    provider_report(p, conf.as_deref(), self.first_t, self.last_t)
                })
            })
            .collect();
        let report = Report {
            trace: trace.to_owned(),
            shadow: self.shadow,
            lines: self.lines,
            events: self.events,
            start_ms: self.first_t,
            end_ms: self.last_t,
            users: self.users.len() as u64,
            plans,
            providers,
            top_users,
            runs: self.run_counts,
            skipped: self.skipped,
        };
        Ok((report, self.chart))
    }
}

/// A provider key's report: its permits, and with tenants each one's, the
/// pool's utilisation and Jain's fairness index over the backlogged ones.
fn provider_report(
    p: &ProviderAcc,
    conf: Option<&tollgate_provider::Provider>,
    first_t: Option<u64>,
    last_t: Option<u64>,
) -> ProviderReport {
    let granted = |c: &Counts| c.allowed + c.waited + c.shadow_denied;
    let all: u64 = granted(&p.permits);
    let weight = |name: &str| {
        conf.and_then(|c| c.fair.as_ref()).map(|f| {
            f.weights()
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(1, |w| w.1)
        })
    };
    let tenants: BTreeMap<String, TenantReport> = if p
        .tenants
        .keys()
        .all(|k| k == tollgate_core::fair::NO_TENANT)
    {
        BTreeMap::new()
    } else {
        p.tenants
            .iter()
            .map(|(name, a)| {
                let r = TenantReport {
                    permits: a.permits.report(),
                    share: if all == 0 {
                        0.0
                    } else {
                        granted(&a.permits) as f64 / all as f64
                    },
                    weight: weight(name),
                    wait_ms: a.waits.summary(),
                };
                (name.clone(), r)
            })
            .collect()
    };
    // Capacity over the replay: the burst plus the rate from its first
    // event to its last or, if later, the last granted call's start (a
    // permit granted with a wait uses the pool then).
    let last = last_t.max(p.last_start);
    let utilisation = match (conf.and_then(|c| c.requests), first_t, last) {
        (Some(spec), Some(a), Some(b)) if b > a => {
            let capacity = spec.capacity() as f64
                + spec.amount() as f64 * (b - a) as f64 / spec.period_ms() as f64;
            Some(all as f64 / capacity)
        }
        _ => None,
    };
    // Jain's index of the backlogged tenants' permits per unit of weight.
    let backlogged: Vec<f64> = tenants
        .values()
        .filter(|t| t.permits.denied > 0)
        .map(|t| t.allowed_total() as f64 / f64::from(t.weight.unwrap_or(1)))
        .collect();
    let fairness = (!backlogged.is_empty()).then(|| {
        let sum: f64 = backlogged.iter().sum();
        let squares: f64 = backlogged.iter().map(|x| x * x).sum();
        if squares == 0.0 {
            1.0
        } else {
            sum * sum / (backlogged.len() as f64 * squares)
        }
    });
    ProviderReport {
        permits: p.permits.report(),
        limits: limits_report(&p.limits),
        wait_ms: p.waits.summary(),
        responses: p
            .responses
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect(),
        cooldowns: p.cooldowns,
        tenants,
        utilisation,
        fairness,
        backlogged: backlogged.len() as u64,
    }
}
