//! # tollgate-server
//!
//! `tollgate serve`: the admission-control sidecar for agents in any
//! language. It speaks the HTTP/JSON wire contract of SPEC §8 (documented
//! at `/openapi.json`), and the same operations over gRPC on their own port
//! ([`grpc`], `proto/tollgate/v1/tollgate.proto`); both call [`ops`], so
//! they answer alike. Envoy's rate-limit service has a listener of its own
//! (`rls_listen`, [`envoy`]), guarded by a shared key. It identifies
//! users from a verified JWT (or a trusted upstream header) and decides
//! with the `tollgate-core` limiter and provider quota governor on the
//! in-memory store or Redis.
//!
//! [`app`] builds the application from a config so tests can run it on any
//! listener and clock; [`serve`] runs it until a shutdown signal, and
//! [`serve_with`] on listeners the caller bound.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpListener;
use tollgate_core::failover::Failover;
use tollgate_core::{Clock, Limiter, MemoryStore, MonotonicClock, Store, SystemClock};
use tollgate_redis::RedisStore;

pub mod audit;
pub mod config;
pub mod edge;
pub mod envoy;
pub mod grpc;
pub mod http;
pub mod identity;
pub mod metrics;
mod observe;
pub mod ops;
pub mod outcome;
pub mod reload;
pub mod runs;
pub mod shutdown;
pub mod state;
pub mod telemetry;

pub use config::{Config, ConfigError, StoreSettings};
pub use state::App;

use crate::identity::Verifier;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The identity settings are unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store could not be set up.
    #[error("store: {0}")]
    Store(#[from] tollgate_core::StoreError),
    /// The failure policy is invalid.
    #[error(transparent)]
    Policy(#[from] tollgate_core::failover::InvalidShare),
    /// Binding or serving failed.
    #[error("listen: {0}")]
    Io(#[from] std::io::Error),
    /// A configured address (`grpc_listen`, `admin_listen`, `rls_listen`) could not be
    /// bound.
    #[error("{field} {addr}: {source}")]
    Listen {
        /// The config field.
        field: &'static str,
        /// The configured address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A rate-limit service listener on an address other than loopback,
    /// and no `[rls] key` to guard it.
    #[error("rls_listen {addr}: a non-loopback address needs [rls] key or key_file")]
    RlsKeyRequired {
        /// The listener's address.
        addr: std::net::SocketAddr,
    },
    /// The gRPC server failed.
    #[error("grpc: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// Builds the identity verifier of `config`.
///
/// # Errors
///
/// Identity settings that cannot be used (each with its field path).
pub fn verifier(config: &Config, clock: Arc<dyn Clock>) -> Result<Verifier, ConfigError> {
    Verifier::from_config(&config.identity, &config.base_dir, clock).map_err(|errors| ConfigError {
        source_name: "the config".to_owned(),
        errors,
    })
}

/// The application over `store`, deciding on `clock`.
///
/// # Errors
///
/// Identity settings that cannot be used.
pub fn app<S: Store + Clone>(
    config: &Config,
    store: S,
    clock: Arc<dyn Clock>,
) -> Result<App<S>, ConfigError> {
    app_with_metrics(
        config,
        Deciding {
            store,
            store_desc: String::new(),
            clock: clock.clone(),
            wall: clock,
            metrics: Arc::default(),
        },
    )
}

/// What a replica decides with: its store (and how the startup banner
/// names it), the clock decisions run on, the wall clock token expiry is
/// checked on, and the metrics everything reports to.
struct Deciding<S> {
    store: S,
    store_desc: String,
    clock: Arc<dyn Clock>,
    wall: Arc<dyn Clock>,
    metrics: Arc<metrics::Metrics>,
}

/// How the servers run: their listeners, what is told once they listen,
/// and the signal that stops them.
struct Serving<F, G> {
    listeners: Listeners,
    on_start: F,
    shutdown: G,
}

fn app_with_metrics<S: Store + Clone>(
    config: &Config,
    deciding: Deciding<S>,
) -> Result<App<S>, ConfigError> {
    let Deciding {
        store,
        clock,
        wall,
        metrics,
        ..
    } = deciding;
    let verifier = verifier(config, wall)?;
    let limiter = Limiter::new(store, clock, config.plans.clone())
        .with_refusal_cache(config.limits.refusal_cache);
    let m = metrics.clone();
    limiter.on_budget_alert(move |a| {
        m.budget_alerts
            .get_or_create(&metrics::BudgetAlertLabels {
                window: a.period.as_str(),
                percent: a.percent,
                plan: a.plan.into(),
            })
            .inc();
        tracing::info!(
            user = a.user,
            plan = a.plan,
            window = a.period.as_str(),
            percent = a.percent,
            "budget alert: the user's spend reached {}% of their {} budget",
            a.percent,
            a.period
        );
    });
    let audit = match &config.audit {
        None => None,
        Some(a) => Some(
            audit::AuditLog::start(a, limiter.clock().clone(), metrics.audit_dropped.clone())
                .map_err(|e| ConfigError {
                    source_name: "the config".into(),
                    errors: vec![tollgate_core::plan::FieldError {
                        path: "audit.file".into(),
                        reason: format!("cannot be opened for appending: {e}"),
                    }],
                })?,
        ),
    };
    let app = App::with_metrics(
        limiter,
        verifier,
        config.max_in_flight,
        config.admin_token.clone(),
        metrics,
    )
    .with_providers(config.providers.clone())
    .with_edge(config.limits.clone());
    let app = match &config.source {
        Some(path) => app.reloading_from(path.clone(), config.restart_only.clone()),
        None => app,
    };
    let app = match audit {
        Some(a) => app.with_audit(a),
        None => app,
    };
    Ok(match &config.telemetry {
        None => app,
        Some(t) => {
            app.with_telemetry(
                telemetry::Telemetry::start(t).map_err(|reason| ConfigError {
                    source_name: "the config".into(),
                    errors: vec![tollgate_core::plan::FieldError {
                        path: "telemetry.otlp_endpoint".into(),
                        reason,
                    }],
                })?,
            )
        }
    })
}

/// What the server is running, for the startup banner.
#[derive(Debug, Clone)]
pub struct Running {
    /// The address it listens on.
    pub addr: std::net::SocketAddr,
    /// The address of the gRPC API, when it is on.
    pub grpc_addr: Option<std::net::SocketAddr>,
    /// The operator's port (`/metrics`, `/admin/*`), when apart.
    pub admin_addr: Option<std::net::SocketAddr>,
    /// The address of Envoy's rate-limit service, when it is on.
    pub rls_addr: Option<std::net::SocketAddr>,
    /// Whether rate-limit service calls must carry the key.
    pub rls_key: bool,
    /// The store, in words.
    pub store: String,
    /// The identity mode, in words.
    pub identity: String,
}

/// The sockets [`serve_with`] serves on, bound by the caller.
#[derive(Debug)]
pub struct Listeners {
    http: TcpListener,
    grpc: Option<TcpListener>,
    admin: Option<TcpListener>,
    rls: Option<TcpListener>,
}

impl Listeners {
    /// The HTTP/JSON API on `http`, and nothing else.
    pub fn new(http: TcpListener) -> Self {
        Self {
            http,
            grpc: None,
            admin: None,
            rls: None,
        }
    }

    /// Also the gRPC API (`tollgate.v1.Tollgate`) on `grpc`.
    pub fn with_grpc(mut self, grpc: TcpListener) -> Self {
        self.grpc = Some(grpc);
        self
    }

    /// The operator's routes (`/metrics`, `/admin/*`) on `admin`, and no
    /// longer on the API's port.
    pub fn with_admin(mut self, admin: TcpListener) -> Self {
        self.admin = Some(admin);
        self
    }

    /// Also Envoy's rate-limit service on `rls` (guarded by the config's
    /// `[rls] key` and `max_in_flight`).
    pub fn with_rls(mut self, rls: TcpListener) -> Self {
        self.rls = Some(rls);
        self
    }
}

/// Binds `addr` for the config field `field`.
async fn bind(field: &'static str, addr: std::net::SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen {
            field,
            addr,
            source,
        })
}

/// Serves `config` on `listener`, the gRPC API on `grpc_listen` and Envoy's
/// rate-limit service on `rls_listen` when the config sets them, until
/// `shutdown` completes, then drains requests in flight. `clock`: `None`
/// for production time (Redis `TIME` for Redis; a monotonic clock in
/// memory). `on_start` is called once listening.
///
/// # Errors
///
/// A store or identity that cannot be set up, or a failing listener.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    clock: Option<Arc<dyn Clock>>,
    on_start: impl FnOnce(&Running),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let mut listeners = Listeners::new(listener);
    if let Some(addr) = config.grpc_listen {
        listeners = listeners.with_grpc(bind("grpc_listen", addr).await?);
    }
    if let Some(addr) = config.admin_listen {
        listeners = listeners.with_admin(bind("admin_listen", addr).await?);
    }
    if let Some(addr) = config.rls_listen {
        listeners = listeners.with_rls(bind("rls_listen", addr).await?);
    }
    serve_with(config, listeners, clock, on_start, shutdown).await
}

/// As [`serve`], on listeners the caller bound (`grpc_listen` and
/// `rls_listen` are not read: the gRPC API is served when `listeners` has a
/// gRPC listener, the rate-limit service when it has an RLS listener, with
/// the config's `[rls]` key and cap).
///
/// # Errors
///
/// As [`serve`]; also [`StartError::RlsKeyRequired`] for an RLS listener
/// on an address other than loopback when the config has no `[rls] key`.
pub async fn serve_with(
    config: Config,
    listeners: Listeners,
    clock: Option<Arc<dyn Clock>>,
    on_start: impl FnOnce(&Running),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    // Decisions run on a monotonic clock; token expiry (`exp`, `nbf`) is
    // wall time. A test's clock drives both.
    let (clock, wall): (Arc<dyn Clock>, Arc<dyn Clock>) = match clock {
        Some(c) => (c.clone(), c),
        None => (Arc::new(MonotonicClock::new()), Arc::new(SystemClock)),
    };
    let metrics = Arc::new(metrics::Metrics::new());
    let serving = Serving {
        listeners,
        on_start,
        shutdown,
    };
    match &config.store {
        StoreSettings::Memory(memory) => {
            let store = MemoryStore::with_config(clock.clone(), *memory);
            store.on_full(full_hook(&metrics, memory.max_entries));
            let deciding = Deciding {
                store,
                store_desc: "memory (this process only)".into(),
                clock,
                wall,
                metrics,
            };
            run(&config, deciding, serving).await
        }
        StoreSettings::Redis {
            redis,
            policy,
            breaker,
            journal_capacity,
        } => {
            let desc = format!(
                "redis {} ({:?}, key prefix {:?})",
                match &redis.target {
                    tollgate_redis::RedisTarget::Standalone(u) => redact(u),
                    tollgate_redis::RedisTarget::Cluster(n) => format!(
                        "cluster {}",
                        n.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",")
                    ),
                },
                policy,
                redis.key_prefix
            );
            let store = RedisStore::connect(redis.clone()).await?;
            let counted = metrics.clone();
            let transitions = metrics.clone();
            let store = Failover::new(store, *policy, clock.clone())?
                .with_breaker(*breaker)
                .with_journal_capacity(*journal_capacity)
                .with_hook(move |e| {
                    let labels = metrics::FallbackLabels {
                        op: e.op,
                        decided: if e.local { "local" } else { "refused" },
                    };
                    counted.fallbacks.get_or_create(&labels).inc();
                })
                .on_transition(move |_, to| transitions.breaker_entered(to.as_str()));
            store.on_full(full_hook(&metrics, store.fallback().max_entries()));
            let probed = store.clone();
            let clock_for_age = clock.clone();
            metrics.set_store_health(move || {
                let j = probed.journal_stats();
                metrics::StoreHealth {
                    breaker: probed.breaker_state().as_str(),
                    journal_depth: j.depth,
                    journal_oldest_age_ms: if j.depth == 0 {
                        0
                    } else {
                        clock_for_age.now_ms().saturating_sub(j.oldest_at_ms)
                    },
                    journal_expired: j.expired,
                    owed_users: probed.owed_users(),
                }
            });
            // An idle replica still applies its journal and reconciles
            // once Redis answers: the breaker lets one probe through each
            // `open_ms`.
            let recovering = store.clone();
            let recovery = tokio::spawn(async move {
                let mut tick = tokio::time::interval(RECOVERY_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if recovering.needs_recovery() {
                        let r = recovering.recover().await;
                        if r.users > 0 || r.replayed > 0 {
                            tracing::info!(?r, "journal applied and fallback decisions reconciled");
                        }
                    }
                }
            });
            let deciding = Deciding {
                store,
                store_desc: desc,
                clock,
                wall,
                metrics,
            };
            let served = run(&config, deciding, serving).await;
            recovery.abort();
            served
        }
    }
}

/// How often a replica with closes journalled or fallback charges owed
/// tries to apply them (through the breaker: at most one probe per
/// `open_ms` while it is open).
const RECOVERY_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// Counts and logs an operation refused because the store is full
/// (`tollgate_store_full_total{op}`): the memory store at `max_entries`
/// entries, or Redis out of memory.
fn full_hook(metrics: &Arc<metrics::Metrics>, max_entries: usize) -> impl Fn(&'static str) + use<> {
    let metrics = metrics.clone();
    move |op| {
        metrics
            .store_full
            .get_or_create(&metrics::OpLabels { op })
            .inc();
        tracing::warn!(
            op,
            max_entries,
            "store full: an operation that needs a new key was refused"
        );
    }
}

/// A URL without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

async fn run<S: Store + Clone>(
    config: &Config,
    mut deciding: Deciding<S>,
    serving: Serving<impl FnOnce(&Running), impl Future<Output = ()> + Send + 'static>,
) -> Result<(), StartError> {
    let Serving {
        listeners,
        on_start,
        shutdown,
    } = serving;
    let store_desc = std::mem::take(&mut deciding.store_desc);
    let Listeners {
        http,
        grpc,
        rls,
        admin,
    } = listeners;
    let rls_addr = rls.as_ref().map(TcpListener::local_addr).transpose()?;
    if let Some(addr) = rls_addr
        && !addr.ip().is_loopback()
        && config.rls_server.key.is_none()
    {
        return Err(StartError::RlsKeyRequired { addr });
    }
    let app = app_with_metrics(config, deciding)?;
    if config.identity.audience_check == Some(false) {
        tracing::warn!(
            "identity.audience_check = false: tokens issued for any service are accepted"
        );
    }
    // The rate-limit service's rules are swapped on every reload from now.
    let rls = rls.map(|listener| {
        let service = envoy::RlsService::new(app.clone(), config.rls.clone())
            .with_server(config.rls_server.clone());
        app.reload_rls_rules(service.rules_handle());
        (listener, service)
    });
    let reloaders = reload::spawn(app.clone());
    let running = Running {
        addr: http.local_addr()?,
        grpc_addr: grpc.as_ref().map(TcpListener::local_addr).transpose()?,
        admin_addr: admin.as_ref().map(TcpListener::local_addr).transpose()?,
        rls_addr,
        rls_key: config.rls_server.key.is_some(),
        store: store_desc,
        identity: app.verifier().describe(),
    };
    on_start(&running);
    // One shutdown signal for both servers.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let signal = tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        // An error: the sender is gone, which only happens at the end.
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let router = if admin.is_some() {
        http::routes::public_router(app.clone())
    } else {
        http::routes::router(app.clone())
    };
    let limits = &config.limits;
    let operator_routes = admin
        .as_ref()
        .map(|_| http::routes::operator_router(app.clone()));
    let operator = async {
        let (Some(listener), Some(routes)) = (admin, operator_routes) else {
            return Ok(());
        };
        edge::serve_http(
            "admin_listen",
            listener,
            routes,
            limits,
            stopped(stopping.clone()),
        )
        .await
        .map_err(StartError::from)
    };
    let http = async {
        edge::serve_http("listen", http, router, limits, stopped(stopping.clone()))
            .await
            .map_err(StartError::from)
    };
    let grpc = async {
        let Some(listener) = grpc else {
            return Ok(());
        };
        let (close_all, closer) = edge::closer();
        let incoming = edge::CappedIncoming::new("grpc_listen", listener, limits, closer);
        // The API only: Envoy's rate-limit service has a listener of its
        // own, so ShouldRateLimit here is UNIMPLEMENTED.
        let router = limits
            .grpc_server()
            .add_service(grpc::api::TollgateService::new(app.clone()).into_server());
        edge::serve_grpc(
            "grpc_listen",
            router,
            incoming,
            close_all,
            limits,
            stopping.clone(),
        )
        .await
        .map_err(StartError::from)
    };
    let rls = async {
        let Some((listener, service)) = rls else {
            return Ok(());
        };
        let (close_all, closer) = edge::closer();
        let incoming = edge::CappedIncoming::new("rls_listen", listener, limits, closer);
        let router = limits.grpc_server().add_service(service.into_server());
        edge::serve_grpc(
            "rls_listen",
            router,
            incoming,
            close_all,
            limits,
            stopping.clone(),
        )
        .await
        .map_err(StartError::from)
    };
    let served = tokio::try_join!(http, grpc, rls, operator);
    signal.abort();
    for task in reloaders {
        task.abort();
    }
    // The spans still buffered are exported, and the audit lines queued
    // written, before the server returns.
    let flushing = app.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(t) = flushing.telemetry() {
            t.shutdown();
        }
        if let Some(a) = flushing.audit() {
            a.flush(std::time::Duration::from_secs(5));
        }
    })
    .await;
    served?;
    Ok(())
}

/// Loads `path`, or the embedded default when `None`.
///
/// # Errors
///
/// As [`Config::load`].
pub fn load_config(path: Option<&Path>) -> Result<Config, ConfigError> {
    match path {
        Some(p) => Config::load(p),
        None => Config::default_config(),
    }
}
