//! Prometheus metrics (SPEC §6). No label ever carries a user id: top users
//! come from `/admin/top` and the logs.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of a decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `admit` or `reserve`.
    pub op: &'static str,
    /// The refusing limit (or the one shadow mode would have refused
    /// with); `none` when allowed.
    pub limit: &'static str,
    /// `allowed`, `waited`, `denied` or `shadow_denied`.
    pub outcome: &'static str,
    /// The plan name (shared with the plan: no allocation per decision).
    pub plan: Arc<str>,
}

/// Labels of a budget alert threshold reached.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetAlertLabels {
    /// `daily`, `weekly` or `monthly`.
    pub window: &'static str,
    /// The threshold, percent of the window's limit.
    pub percent: u8,
    /// The user's plan.
    pub plan: Arc<str>,
}

/// Labels naming an operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// The store operation.
    pub op: &'static str,
}

/// Labels of a fallback decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    /// The store operation.
    pub op: &'static str,
    /// `local` (fail open) or `refused` (fail closed).
    pub decided: &'static str,
}

/// Labels of a config reload.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Labels of a provider permit. Provider and model are only ever those of
/// a configured provider key, so their values are bounded by the config.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderPermitLabels {
    /// The provider, e.g. `openai`.
    pub provider: String,
    /// The model, e.g. `gpt-4o`.
    pub model: String,
    /// `granted` (no wait), `waited` (granted after a wait) or `refused`
    /// (rate, cooldown, exceeds capacity, or quota exhausted).
    pub outcome: &'static str,
}

/// Labels of a provider answer reported through feedback.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderResponseLabels {
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
    /// `success`, `throttled`, `exhausted`, `server_error` or
    /// `client_error`.
    pub class: &'static str,
}

/// Labels of a provider permit counted for its tenant (keys with tenants
/// only; the label set is bounded: each configured tenant, and `other` for
/// every tenant not configured and permits naming none).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderTenantLabels {
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
    /// A configured tenant, or `other`.
    pub tenant: String,
    /// As [`ProviderPermitLabels::outcome`].
    pub outcome: &'static str,
}

/// Labels naming a configured tenant of a provider key.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderTenantKeyLabels {
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
    /// The tenant.
    pub tenant: String,
}

/// Labels naming a provider key.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderKeyLabels {
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
}

/// A configured provider key's quota, as a gauge's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderQuotaLabels {
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
    /// `requests`, `tokens`, `input_tokens` or `output_tokens`.
    pub kind: &'static str,
}

/// What a scrape reads about the provider keys ([`Metrics::set_provider_probe`]).
#[derive(Debug, Clone, Default)]
pub struct ProviderGauges {
    /// Each configured key's quotas per minute: (provider, model, kind,
    /// amount per minute).
    pub quotas: Vec<(String, String, &'static str, f64)>,
    /// This replica's exhaustion holds: (provider, model, until ms).
    pub exhausted: Vec<(String, String, u64)>,
    /// Each configured tenant's weight in fair sharing: (provider, model,
    /// tenant, weight).
    pub weights: Vec<(String, String, String, u32)>,
}

type ProviderProbe = Box<dyn Fn() -> ProviderGauges + Send + Sync>;

/// Labels of a gRPC call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcLabels {
    /// The method, e.g. `AdmitRun`.
    pub method: &'static str,
    /// The status code's canonical name, e.g. `OK`, `RESOURCE_EXHAUSTED`
    /// (`CANCELLED` when the client went away first).
    pub code: &'static str,
}

/// The canonical name of a gRPC status code (`google.rpc.Code`).
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    /// Decisions by op, limit, outcome and plan.
    pub decisions: Family<DecisionLabels, Counter>,
    /// Waits granted to token reservations, seconds.
    pub wait: Histogram,
    /// Store faults seen by requests.
    pub store_errors: Counter,
    /// Decisions taken without the shared store.
    pub fallbacks: Family<FallbackLabels, Counter>,
    /// Operations refused because the store is full, by operation.
    pub store_full: Family<OpLabels, Counter>,
    /// Leaked run leases reclaimed by expiry.
    pub reclaimed: Counter,
    /// Rate refusals answered without asking the store (SPEC §3).
    pub local_refusals: Counter,
    /// Fence checks answered stale.
    pub fence_rejected: Counter,
    /// Requests being served now (the replica's in-flight count).
    pub requests_in_flight: Gauge,
    /// Run leases admitted through this replica and live: the size of
    /// [`Runs`](crate::runs::Runs) after pruning (set on every update and
    /// on a scrape).
    pub turns_in_flight: Gauge,
    /// Config reloads by result.
    pub reloads: Family<ReloadLabels, Counter>,
    /// Provider permits by provider key and outcome.
    pub provider_permits: Family<ProviderPermitLabels, Counter>,
    /// Provider permits of keys with tenants, by tenant and outcome.
    pub provider_tenant_permits: Family<ProviderTenantLabels, Counter>,
    /// Each configured tenant's weight in fair sharing of its key's pool.
    pub provider_tenant_weight: Family<ProviderTenantKeyLabels, Gauge>,
    /// Provider answers reported through feedback, by provider key and class.
    pub provider_responses: Family<ProviderResponseLabels, Counter>,
    /// A provider key's effective rate (AIMD), permille of the configured
    /// rate, as last seen by this replica.
    pub provider_effective_rate: Family<ProviderKeyLabels, Gauge>,
    /// gRPC calls by method and status code.
    pub grpc_requests: Family<GrpcLabels, Counter>,
    /// The breaker in front of the shared store: 1 for its state now.
    pub breaker_state: Family<StateLabels, Gauge>,
    /// Breaker transitions, by the state entered.
    pub breaker_transitions: Family<StateLabels, Counter>,
    /// Closes waiting in the journal for the shared store.
    pub journal_depth: Gauge,
    /// Age of the oldest close in the journal, seconds (0: empty).
    pub journal_oldest_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Journalled closes dropped unapplied (older than the reservation
    /// retention).
    pub journal_expired: Counter,
    /// Users whose fallback charges wait to be reconciled.
    pub owed_users: Gauge,
    /// 1 while the shared store is taken to answer (its breaker is not
    /// open), 0 while it is taken to be down; 1 for the memory store.
    pub store_up: Gauge,
    /// The replica's in-flight cap (`max_in_flight`).
    pub max_in_flight: Gauge,
    /// Configured provider quotas per minute, by key and kind (read from
    /// the provider book at each scrape: reloads show).
    pub provider_quota: Family<ProviderQuotaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The end of a provider key's shared cooldown as this replica last
    /// saw it (a feedback that set one, a permit refused for it), seconds
    /// since the epoch; 0: none seen.
    pub provider_cooldown_until:
        Family<ProviderKeyLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The end of this replica's exhaustion hold of a provider key, seconds
    /// since the epoch (0: none).
    pub provider_exhausted_until:
        Family<ProviderKeyLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    providers: std::sync::OnceLock<ProviderProbe>,
    /// Audit lines not written: over `[audit] max_lines_per_second`, or
    /// the writer's queue full.
    pub audit_dropped: Counter,
    /// Users whose spend reached a budget alert threshold, once per user,
    /// window and threshold (no user id: the log line names them).
    pub budget_alerts: Family<BudgetAlertLabels, Counter>,
    health: std::sync::OnceLock<HealthProbe>,
    recent: RecentPermits,
}

/// Slots of [`RecentPermits`]: ten seconds each, six to a minute.
const RECENT_SLOT_MS: u64 = 10_000;
const RECENT_SLOTS: usize = 6;

/// Permits granted on this replica in the last minute, per provider key and
/// tenant label (the bounded set of the per-tenant series), in ten-second
/// slots: what the admin view's `recent_share` divides.
#[derive(Default)]
struct RecentPermits {
    keys: parking_lot::Mutex<HashMap<(String, String), HashMap<String, Slots>>>,
}

/// One tenant's counts: `counts[s % RECENT_SLOTS]` for the slots up to
/// `newest`.
#[derive(Default)]
struct Slots {
    newest: u64,
    counts: [u64; RECENT_SLOTS],
}

impl Slots {
    /// Moves to slot `now` (zeroing the slots it passes) and answers the
    /// count of the last minute.
    fn roll(&mut self, now: u64) -> u64 {
        if now > self.newest {
            let passed = (now - self.newest).min(RECENT_SLOTS as u64);
            for s in 1..=passed {
                self.counts[((self.newest + s) % RECENT_SLOTS as u64) as usize] = 0;
            }
            self.newest = now;
        }
        self.counts.iter().sum()
    }
}

impl RecentPermits {
    fn add(&self, provider: &str, model: &str, tenant: &str, now_ms: u64) {
        let slot = now_ms / RECENT_SLOT_MS;
        let mut keys = self.keys.lock();
        let tenants = keys
            .entry((provider.to_owned(), model.to_owned()))
            .or_default();
        let s = tenants.entry(tenant.to_owned()).or_default();
        s.roll(slot);
        s.counts[(slot % RECENT_SLOTS as u64) as usize] += 1;
    }

    /// Each tenant label's share of the key's permits granted in the last
    /// minute (empty: none granted).
    fn shares(&self, provider: &str, model: &str, now_ms: u64) -> HashMap<String, f64> {
        let slot = now_ms / RECENT_SLOT_MS;
        let mut keys = self.keys.lock();
        let Some(tenants) = keys.get_mut(&(provider.to_owned(), model.to_owned())) else {
            return HashMap::new();
        };
        let counts: Vec<(String, u64)> = tenants
            .iter_mut()
            .map(|(t, s)| (t.clone(), s.roll(slot)))
            .collect();
        let total: u64 = counts.iter().map(|(_, n)| n).sum();
        if total == 0 {
            return HashMap::new();
        }
        counts
            .into_iter()
            .map(|(t, n)| (t, n as f64 / total as f64))
            .collect()
    }
}

/// The shared store's health as the failure policy sees it, read at each
/// scrape.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreHealth {
    /// `closed`, `open` or `half_open`.
    pub breaker: &'static str,
    /// Closes in the journal.
    pub journal_depth: usize,
    /// Age of the oldest, ms.
    pub journal_oldest_age_ms: u64,
    /// Closes dropped unapplied, since start.
    pub journal_expired: u64,
    /// Users with charges owed.
    pub owed_users: usize,
}

type HealthProbe = Box<dyn Fn() -> StoreHealth + Send + Sync>;

/// `{state}` of the breaker.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// `closed`, `open`, `half_open`.
    pub state: &'static str,
}

/// The breaker's states, as labels.
pub const BREAKER_STATES: [&str; 3] = ["closed", "open", "half_open"];

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tollgate");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "Limit decisions by operation, refusing limit, outcome and plan",
            decisions.clone(),
        );
        let wait = Histogram::new([
            0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
        ]);
        registry.register(
            "token_wait_seconds",
            "Waits granted to token reservations",
            wait.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "store_errors",
            "Requests that failed on a store fault",
            store_errors.clone(),
        );
        let fallbacks = Family::<FallbackLabels, Counter>::default();
        registry.register(
            "store_fallbacks",
            "Decisions taken while the shared store was unreachable",
            fallbacks.clone(),
        );
        let store_full = Family::<OpLabels, Counter>::default();
        registry.register(
            "store_full",
            "Operations refused because the store is full (the memory store at max_entries, or Redis out of memory), by store operation",
            store_full.clone(),
        );
        let reclaimed = Counter::default();
        registry.register(
            "leases_reclaimed",
            "Run leases that expired without a release and were reclaimed",
            reclaimed.clone(),
        );
        let local_refusals = Counter::default();
        registry.register(
            "refusals_answered_locally",
            "Rate refusals this replica answered without asking the store: the store had refused the same request until a time still ahead",
            local_refusals.clone(),
        );
        let fence_rejected = Counter::default();
        registry.register(
            "fence_rejected",
            "Fence checks (fenced writes) refused as stale",
            fence_rejected.clone(),
        );
        let requests_in_flight = Gauge::default();
        registry.register(
            "requests_in_flight",
            "Requests this replica is serving now",
            requests_in_flight.clone(),
        );
        let turns_in_flight = Gauge::default();
        registry.register(
            "turns_in_flight",
            "Run leases admitted through this replica, not released and not expired (by the expiry the store answered, read on this replica's clock): the autoscaling signal",
            turns_in_flight.clone(),
        );
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Config reloads by result",
            reloads.clone(),
        );
        let provider_permits = Family::<ProviderPermitLabels, Counter>::default();
        registry.register(
            "provider_permits",
            "Provider permits by provider key and outcome (granted, waited, refused)",
            provider_permits.clone(),
        );
        let provider_tenant_permits = Family::<ProviderTenantLabels, Counter>::default();
        registry.register(
            "provider_tenant_permits",
            "Provider permits of keys with tenants, by tenant (configured ones, and other) and outcome",
            provider_tenant_permits.clone(),
        );
        let provider_tenant_weight = Family::<ProviderTenantKeyLabels, Gauge>::default();
        registry.register(
            "provider_tenant_weight",
            "Each configured tenant's weight in fair sharing of its provider key's pool",
            provider_tenant_weight.clone(),
        );
        let provider_responses = Family::<ProviderResponseLabels, Counter>::default();
        registry.register(
            "provider_responses",
            "Provider answers reported through feedback, by provider key and class",
            provider_responses.clone(),
        );
        let provider_effective_rate = Family::<ProviderKeyLabels, Gauge>::default();
        registry.register(
            "provider_effective_rate_permille",
            "A provider key's effective rate after AIMD, permille of the configured rate, as last seen by this replica (updated by granted permits and by throttled feedback)",
            provider_effective_rate.clone(),
        );
        let grpc_requests = Family::<GrpcLabels, Counter>::default();
        registry.register(
            "grpc_requests",
            "Calls to the gRPC API (tollgate.v1.Tollgate) by method and status code",
            grpc_requests.clone(),
        );
        let breaker_state = Family::<StateLabels, Gauge>::default();
        registry.register(
            "store_breaker_state",
            "The circuit breaker in front of the shared store: 1 for the state it is in (closed: decisions from the store; open: from the failure policy; half_open: probing)",
            breaker_state.clone(),
        );
        let breaker_transitions = Family::<StateLabels, Counter>::default();
        registry.register(
            "store_breaker_transitions",
            "Circuit breaker transitions, by the state entered",
            breaker_transitions.clone(),
        );
        let journal_depth = Gauge::default();
        registry.register(
            "store_journal_depth",
            "Closes (settles, refunds, releases) journalled while the shared store fails, waiting to be applied",
            journal_depth.clone(),
        );
        let journal_oldest_age = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "store_journal_oldest_age_seconds",
            "Age of the oldest journalled close (0: the journal is empty)",
            journal_oldest_age.clone(),
        );
        let journal_expired = Counter::default();
        registry.register(
            "store_journal_expired",
            "Journalled closes dropped unapplied because they outlived the reservation retention",
            journal_expired.clone(),
        );
        let owed_users = Gauge::default();
        registry.register(
            "store_owed_users",
            "Users whose fallback decisions wait to be charged to the shared store, or whose refused reserves (sent, then failed) wait to be checked there",
            owed_users.clone(),
        );
        let store_up = Gauge::default();
        registry.register(
            "store_up",
            "1 while the shared store is taken to answer (its breaker is not open), 0 while it is taken to be down",
            store_up.clone(),
        );
        let max_in_flight = Gauge::default();
        registry.register(
            "max_in_flight",
            "The replica's in-flight cap (max_in_flight): requests it serves at once",
            max_in_flight.clone(),
        );
        let provider_quota = Family::default();
        registry.register(
            "provider_quota_per_minute",
            "Configured provider quotas per minute, by provider key and kind (requests, tokens, input_tokens, output_tokens)",
            provider_quota.clone(),
        );
        let provider_cooldown_until = Family::default();
        registry.register(
            "provider_cooldown_until_seconds",
            "End of the provider key's shared cooldown as this replica last saw it, seconds since the epoch (0: none seen)",
            provider_cooldown_until.clone(),
        );
        let provider_exhausted_until = Family::default();
        registry.register(
            "provider_exhausted_until_seconds",
            "End of this replica's exhaustion hold of the provider key (permits fail fast), seconds since the epoch (0: none)",
            provider_exhausted_until.clone(),
        );
        let audit_dropped = Counter::default();
        registry.register(
            "audit_dropped",
            "Audit lines not written: over [audit] max_lines_per_second, or the writer's queue full",
            audit_dropped.clone(),
        );
        let budget_alerts = Family::<BudgetAlertLabels, Counter>::default();
        registry.register(
            "budget_alerts",
            "Users whose spend in a budget window reached an alert threshold ([budgets] alert_percent), counted once per window",
            budget_alerts.clone(),
        );
        Self {
            registry,
            store_up,
            max_in_flight,
            provider_quota,
            provider_cooldown_until,
            provider_exhausted_until,
            providers: std::sync::OnceLock::new(),
            audit_dropped,
            budget_alerts,
            breaker_state,
            breaker_transitions,
            journal_depth,
            journal_oldest_age,
            journal_expired,
            owed_users,
            health: std::sync::OnceLock::new(),
            decisions,
            wait,
            store_errors,
            fallbacks,
            store_full,
            reclaimed,
            local_refusals,
            fence_rejected,
            requests_in_flight,
            turns_in_flight,
            reloads,
            provider_permits,
            provider_tenant_permits,
            provider_tenant_weight,
            provider_responses,
            provider_effective_rate,
            grpc_requests,
            recent: RecentPermits::default(),
        }
    }

    /// Each tenant label's share of `provider`'s `model` permits granted on
    /// this replica in the last minute (by ten-second slots) up to `now_ms`;
    /// empty when none were.
    pub fn recent_tenant_shares(
        &self,
        provider: &str,
        model: &str,
        now_ms: u64,
    ) -> HashMap<String, f64> {
        self.recent.shares(provider, model, now_ms)
    }

    /// Counts a gRPC call of `method` answered with `code`.
    pub fn grpc_request(&self, method: &'static str, code: tonic::Code) {
        self.grpc_requests
            .get_or_create(&GrpcLabels {
                method,
                code: grpc_code_name(code),
            })
            .inc();
    }

    /// Brings the reclaimed-lease counter up to `total`.
    pub fn sync_reclaimed(&self, total: u64) {
        let seen = self.reclaimed.get();
        if total > seen {
            self.reclaimed.inc_by(total - seen);
        }
    }

    /// Brings the locally answered refusals counter up to `total`.
    pub fn sync_local_refusals(&self, total: u64) {
        let seen = self.local_refusals.get();
        if total > seen {
            self.local_refusals.inc_by(total - seen);
        }
    }

    /// Counts a permit decision for a configured provider key, and for
    /// `tenant` (a configured tenant or `other`; `None` for a key without
    /// tenants).
    pub fn provider_permit(
        &self,
        provider: &str,
        model: &str,
        tenant: Option<&str>,
        outcome: &'static str,
        now_ms: u64,
    ) {
        if let Some(tenant) = tenant
            && outcome != "refused"
        {
            self.recent.add(provider, model, tenant, now_ms);
        }
        self.provider_permits
            .get_or_create(&ProviderPermitLabels {
                provider: provider.to_owned(),
                model: model.to_owned(),
                outcome,
            })
            .inc();
        if let Some(tenant) = tenant {
            self.provider_tenant_permits
                .get_or_create(&ProviderTenantLabels {
                    provider: provider.to_owned(),
                    model: model.to_owned(),
                    tenant: tenant.to_owned(),
                    outcome,
                })
                .inc();
        }
    }

    /// Counts a provider answer of `class` for a configured provider key.
    pub fn provider_response(&self, provider: &str, model: &str, class: &'static str) {
        self.provider_responses
            .get_or_create(&ProviderResponseLabels {
                provider: provider.to_owned(),
                model: model.to_owned(),
                class,
            })
            .inc();
    }

    /// Records a configured provider key's effective rate, permille.
    pub fn provider_rate(&self, provider: &str, model: &str, permille: u32) {
        self.provider_effective_rate
            .get_or_create(&ProviderKeyLabels {
                provider: provider.to_owned(),
                model: model.to_owned(),
            })
            .set(i64::from(permille));
    }

    /// Reads the shared store's health from `probe` at every scrape. Set
    /// once (the Redis store's failure policy).
    pub fn set_store_health(&self, probe: impl Fn() -> StoreHealth + Send + Sync + 'static) {
        let _ = self.health.set(Box::new(probe));
    }

    /// A breaker transition into `to`.
    pub fn breaker_entered(&self, to: &'static str) {
        self.breaker_transitions
            .get_or_create(&StateLabels { state: to })
            .inc();
    }

    /// Reads the provider keys' quotas and this replica's exhaustion holds
    /// from `probe` at every scrape. Set once.
    pub fn set_provider_probe(&self, probe: impl Fn() -> ProviderGauges + Send + Sync + 'static) {
        let _ = self.providers.set(Box::new(probe));
    }

    /// A provider key's cooldown, seen to end at `until_ms`.
    pub fn provider_cooldown(&self, provider: &str, model: &str, until_ms: u64) {
        self.provider_cooldown_until
            .get_or_create(&ProviderKeyLabels {
                provider: provider.to_owned(),
                model: model.to_owned(),
            })
            .set(until_ms as f64 / 1_000.0);
    }

    fn sync_providers(&self) {
        let Some(probe) = self.providers.get() else {
            return;
        };
        let g = probe();
        // A key removed by a reload, or a kind no longer set, leaves.
        self.provider_quota.clear();
        for (provider, model, kind, per_min) in g.quotas {
            self.provider_quota
                .get_or_create(&ProviderQuotaLabels {
                    provider,
                    model,
                    kind,
                })
                .set(per_min);
        }
        self.provider_exhausted_until.clear();
        for (provider, model, until) in g.exhausted {
            self.provider_exhausted_until
                .get_or_create(&ProviderKeyLabels { provider, model })
                .set(until as f64 / 1_000.0);
        }
        self.provider_tenant_weight.clear();
        for (provider, model, tenant, weight) in g.weights {
            self.provider_tenant_weight
                .get_or_create(&ProviderTenantKeyLabels {
                    provider,
                    model,
                    tenant,
                })
                .set(i64::from(weight));
        }
    }

    fn sync_health(&self) {
        let Some(probe) = self.health.get() else {
            self.store_up.set(1);
            return;
        };
        let h = probe();
        self.store_up.set(i64::from(h.breaker != "open"));
        for state in BREAKER_STATES {
            self.breaker_state
                .get_or_create(&StateLabels { state })
                .set(i64::from(state == h.breaker));
        }
        self.journal_depth
            .set(i64::try_from(h.journal_depth).unwrap_or(i64::MAX));
        self.journal_oldest_age
            .set(h.journal_oldest_age_ms as f64 / 1_000.0);
        let seen = self.journal_expired.get();
        if h.journal_expired > seen {
            self.journal_expired.inc_by(h.journal_expired - seen);
        }
        self.owed_users
            .set(i64::try_from(h.owed_users).unwrap_or(i64::MAX));
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        self.sync_health();
        self.sync_providers();
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The provider keys' quotas per minute (from `governor`'s book) and its
/// exhaustion holds, for a scrape.
pub fn provider_gauges<S: tollgate_core::Store>(
    governor: &tollgate_provider::ProviderGovernor<S>,
) -> ProviderGauges {
    let per_min =
        |b: &tollgate_core::BucketSpec| b.amount() as f64 * 60_000.0 / b.period_ms() as f64;
    let mut out = ProviderGauges::default();
    for p in governor.book().iter() {
        for (kind, spec) in [
            ("requests", &p.requests),
            ("tokens", &p.tokens),
            ("input_tokens", &p.input_tokens),
            ("output_tokens", &p.output_tokens),
        ] {
            if let Some(b) = spec {
                out.quotas.push((
                    p.provider.to_string(),
                    p.model.to_string(),
                    kind,
                    per_min(b),
                ));
            }
        }
    }
    for p in governor.book().iter() {
        if let Some(fair) = &p.fair {
            for (tenant, weight) in &fair.weights {
                out.weights.push((
                    p.provider.to_string(),
                    p.model.to_string(),
                    tenant.clone(),
                    *weight,
                ));
            }
        }
    }
    out.exhausted = governor
        .exhaustion_holds()
        .into_iter()
        .map(|(p, m, until)| (p.to_string(), m.to_string(), until))
        .collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recent shares count the last minute in ten-second slots: a slot
    /// leaves once six newer ones began, refusals never count, and keys
    /// are apart.
    #[test]
    fn recent_tenant_shares_cover_the_last_minute() {
        let m = Metrics::new();
        let t0 = 1_000_000;
        for (tenant, outcome, at) in [
            ("a", "granted", t0),
            ("a", "waited", t0 + 1),
            ("b", "granted", t0 + 2),
            ("b", "refused", t0 + 3),
            ("a", "granted", t0 + 30_000),
        ] {
            m.provider_permit("p", "m", Some(tenant), outcome, at);
        }
        m.provider_permit("p", "other-model", Some("b"), "granted", t0);
        let at = |now| {
            let mut s: Vec<(String, f64)> =
                m.recent_tenant_shares("p", "m", now).into_iter().collect();
            s.sort_by(|x, y| x.0.cmp(&y.0));
            s
        };
        assert_eq!(
            at(t0 + 30_000),
            [("a".to_owned(), 0.75), ("b".to_owned(), 0.25)]
        );
        // The first slot (t0 … t0 + 10 s) leaves at t0 + 60 s.
        assert_eq!(at(t0 + 59_999).len(), 2);
        assert_eq!(
            at(t0 + 60_000),
            [("a".to_owned(), 1.0), ("b".to_owned(), 0.0)]
        );
        assert!(at(t0 + 200_000).is_empty(), "nothing in the last minute");
    }
}
