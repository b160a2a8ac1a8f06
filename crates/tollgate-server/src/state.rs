//! The state every handler shares.

use std::path::PathBuf;
use std::sync::Arc;

use tollgate_core::{Clock, Limiter, ReplicaGate, Store};
use tollgate_provider::{ProviderBook, ProviderGovernor};

use crate::config::{Config, ConfigError, RestartOnly};
use crate::edge::{EdgeLimits, WaitGate};
use crate::identity::Verifier;
use crate::metrics::{Metrics, ReloadLabels};
use crate::runs::Runs;

/// The application: limiter, provider governor, identity, replica gate.
/// Cloning shares it.
pub struct App<S> {
    inner: Arc<Inner<S>>,
}

/// What a reload applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Changed settings that take effect only after a restart (config
    /// field names: `listen`, `store`, `identity`, …); their running values
    /// stay.
    pub needs_restart: Vec<&'static str>,
}

impl<S> Clone for App<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<S> {
    limiter: Limiter<S>,
    providers: Arc<ProviderGovernor<S>>,
    verifier: Verifier,
    gate: ReplicaGate,
    edge: Edge,
    admin_token: Option<String>,
    metrics: Arc<Metrics>,
    runs: Runs,
    reloading: Reloading,
    /// The decision audit log, if configured.
    audit: Option<crate::audit::AuditLog>,
    /// Decision spans over OTLP, if configured.
    telemetry: Option<crate::telemetry::Telemetry>,
}

/// The edge limits and the gate on waiting requests they bound.
struct Edge {
    limits: EdgeLimits,
    waits: WaitGate,
}

impl Edge {
    fn new(limits: EdgeLimits) -> Self {
        Self {
            waits: WaitGate::new(limits.max_waits_per_user, limits.max_waiting),
            limits,
        }
    }
}

/// What a reload needs: the file it rereads and the restart-only settings
/// the server started with (none: the embedded default, nothing to
/// reload), one reload at a time, and the Envoy rate-limit services' rule
/// holders it swaps.
#[derive(Default)]
struct Reloading {
    source: Option<(PathBuf, RestartOnly)>,
    lock: tokio::sync::Mutex<()>,
    rls_rules: parking_lot::Mutex<Vec<crate::envoy::RulesHandle>>,
}

impl<S: Store + Clone> App<S> {
    /// An application deciding with `limiter`, verifying with `verifier`,
    /// serving at most `max_in_flight` requests at once with the default
    /// edge limits ([`EdgeLimits::defaults`]), with no provider quotas
    /// configured.
    pub fn new(
        limiter: Limiter<S>,
        verifier: Verifier,
        max_in_flight: usize,
        admin_token: Option<String>,
    ) -> Self {
        Self::with_metrics(
            limiter,
            verifier,
            max_in_flight,
            admin_token,
            Arc::default(),
        )
        .with_edge(EdgeLimits::defaults(max_in_flight))
    }

    /// The same reporting to `metrics`, with no provider quotas configured
    /// ([`with_providers`](Self::with_providers)) and nothing to reload
    /// ([`reloading_from`](Self::reloading_from)).
    pub fn with_metrics(
        limiter: Limiter<S>,
        verifier: Verifier,
        max_in_flight: usize,
        admin_token: Option<String>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let providers = Arc::new(ProviderGovernor::new(
            limiter.store().clone(),
            limiter.clock().clone(),
            ProviderBook::default(),
        ));
        metrics.max_in_flight.set(max_in_flight as i64);
        let weak = Arc::downgrade(&providers);
        metrics.set_provider_probe(move || {
            weak.upgrade()
                .map(|g| crate::metrics::provider_gauges(&g))
                .unwrap_or_default()
        });
        Self {
            inner: Arc::new(Inner {
                limiter,
                providers,
                verifier,
                gate: ReplicaGate::new(max_in_flight),
                edge: Edge::new(EdgeLimits::defaults(max_in_flight)),
                admin_token,
                runs: Runs::new(metrics.turns_in_flight.clone()),
                metrics,
                reloading: Reloading::default(),
                audit: None,
                telemetry: None,
            }),
        }
    }

    /// The same governing the provider quotas of `providers` (on the
    /// limiter's store and clock).
    pub fn with_providers(self, providers: ProviderBook) -> Self {
        self.inner.providers.set_book(providers);
        self
    }

    /// The same reloading plans and providers from the config file `path`,
    /// whose restart-only settings (`restart_only`, as it started) the
    /// running server keeps. Call it on a new application, before it is
    /// cloned.
    ///
    /// # Panics
    ///
    /// If the application was already cloned.
    #[track_caller]
    pub fn reloading_from(mut self, path: PathBuf, restart_only: RestartOnly) -> Self {
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            panic!("App::reloading_from after the application was shared");
        };
        inner.reloading.source = Some((path, restart_only));
        self
    }

    /// The same with the edge limits `edge` (`[limits]`): the body timeout
    /// of the `/v1` routes and the bounds on waiting requests. Call it on a
    /// new application, before it is cloned.
    ///
    /// # Panics
    ///
    /// If the application was already cloned.
    #[track_caller]
    pub fn with_edge(mut self, edge: EdgeLimits) -> Self {
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            panic!("App::with_edge after the application was shared");
        };
        inner.edge = Edge::new(edge);
        self
    }

    /// The same writing `audit`, the decision audit log. Call it on a new
    /// application, before it is cloned.
    ///
    /// # Panics
    ///
    /// If the application was already cloned.
    #[track_caller]
    pub fn with_audit(mut self, audit: crate::audit::AuditLog) -> Self {
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            panic!("App::with_audit after the application was shared");
        };
        inner.audit = Some(audit);
        self
    }

    /// The decision audit log, if configured.
    pub fn audit(&self) -> Option<&crate::audit::AuditLog> {
        self.inner.audit.as_ref()
    }

    /// The same exporting decision spans with `telemetry`. Call it on a new
    /// application, before it is cloned.
    ///
    /// # Panics
    ///
    /// If the application was already cloned.
    #[track_caller]
    pub fn with_telemetry(mut self, telemetry: crate::telemetry::Telemetry) -> Self {
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            panic!("App::with_telemetry after the application was shared");
        };
        inner.telemetry = Some(telemetry);
        self
    }

    /// Decision spans, if configured.
    pub fn telemetry(&self) -> Option<&crate::telemetry::Telemetry> {
        self.inner.telemetry.as_ref()
    }

    /// The edge limits (`[limits]`).
    pub fn edge(&self) -> &EdgeLimits {
        &self.inner.edge.limits
    }

    /// The bounds on `wait=true` requests waiting.
    pub fn waits(&self) -> &WaitGate {
        &self.inner.edge.waits
    }

    /// The runs admitted through this replica (`tollgate_turns_in_flight`).
    pub fn runs(&self) -> &Runs {
        &self.inner.runs
    }

    /// Swaps `rules`' Envoy rate-limit rules on every reload.
    pub fn reload_rls_rules(&self, rules: crate::envoy::RulesHandle) {
        self.inner.reloading.rls_rules.lock().push(rules);
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Rereads the config file and swaps in its plans, users and overrides
    /// atomically (a decision sees the old plans or the new, never a mix),
    /// then its provider quotas (likewise atomic: a permit sees the old
    /// provider keys or the new). An invalid file is rejected with every
    /// reason, counted and logged, and the old config keeps serving. Other
    /// settings (listeners, store, identity, caps, admin token) need a
    /// restart: the answer names those changed since start (and the log
    /// warns), while the rest still applies.
    ///
    /// # Errors
    ///
    /// The file is unreadable or invalid.
    pub async fn reload(&self) -> Result<Reloaded, ConfigError> {
        let _one_at_a_time = self.inner.reloading.lock.lock().await;
        let Some((path, running)) = &self.inner.reloading.source else {
            tracing::info!("reload: serving the embedded default config; nothing to reload");
            return Ok(Reloaded::default());
        };
        let result = match Config::load(path) {
            Ok(cfg) => {
                let needs_restart = running.changed(&cfg.restart_only);
                self.inner.providers.set_book(cfg.providers);
                for rules in self.inner.reloading.rls_rules.lock().iter() {
                    rules.set(cfg.rls.clone());
                }
                // Last: it also drops the refusals kept under the old
                // plans and rules (SPEC §3).
                self.inner.limiter.set_plans(cfg.plans);
                tracing::info!(path = %path.display(), "config reloaded: plans, users, overrides, providers and rate-limit service rules swapped in");
                if !needs_restart.is_empty() {
                    tracing::warn!(
                        path = %path.display(),
                        fields = ?needs_restart,
                        "config reload: these settings changed but apply only after a restart; the running values stay"
                    );
                }
                Ok(Reloaded { needs_restart })
            }
            Err(e) => {
                tracing::error!(error = %e, "config reload rejected; the old config keeps serving");
                Err(e)
            }
        };
        let label = ReloadLabels {
            result: if result.is_ok() { "ok" } else { "error" },
        };
        self.inner.metrics.reloads.get_or_create(&label).inc();
        result
    }

    /// The config file plans are reloaded from, if any.
    pub fn config_path(&self) -> Option<&std::path::Path> {
        self.inner
            .reloading
            .source
            .as_ref()
            .map(|(p, _)| p.as_path())
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<S> {
        &self.inner.limiter
    }

    /// The provider quota governor (same store and clock as the limiter).
    pub fn providers(&self) -> &Arc<ProviderGovernor<S>> {
        &self.inner.providers
    }

    /// The store.
    pub fn store(&self) -> &S {
        self.inner.limiter.store()
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        self.inner.limiter.clock()
    }

    /// The identity verifier.
    pub fn verifier(&self) -> &Verifier {
        &self.inner.verifier
    }

    /// The replica's in-flight gate.
    pub fn gate(&self) -> &ReplicaGate {
        &self.inner.gate
    }

    /// The admin token, if admin endpoints are on.
    pub fn admin_token(&self) -> Option<&str> {
        self.inner.admin_token.as_deref()
    }
}
