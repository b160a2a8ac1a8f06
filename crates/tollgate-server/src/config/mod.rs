//! The server's configuration: TOML, validated into a typed [`Config`] with
//! every problem reported by field path. The core owns the plan and provider
//! types; this module owns loading them.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_core::budget::BudgetSettingsConfig;
use tollgate_core::failover::{BreakerConfig, DEFAULT_JOURNAL_CAPACITY, FailurePolicy};
use tollgate_core::money::PricesConfig;
use tollgate_core::plan::{FieldError, toml_path};
use tollgate_core::{PlanBook, PlanConfig, PlanOverride, PlansConfig, SystemClock};
use tollgate_provider::{ProviderBook, ProvidersConfig, validate_providers};
use tollgate_redis::{RedisConfig, RedisTarget};

use crate::identity::{IdentityConfig, Verifier};

mod store;
pub use store::{
    BreakerFile, FailureMode, MAX_JOURNAL_CAPACITY, MAX_MAX_ENTRIES, StoreConfig, StoreKind,
    StoreSettings,
};

/// The embedded default config (`tollgate serve` with no file).
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// The config file as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Address to listen on (default `127.0.0.1:8787`).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Address of the gRPC API (`tollgate.v1.Tollgate`); none: no gRPC
    /// server.
    #[serde(default)]
    pub grpc_listen: Option<String>,
    /// Address of the operator's port: when set, `/metrics` and `/admin/*`
    /// are served there and not on `listen`. None: they share `listen`.
    #[serde(default)]
    pub admin_listen: Option<String>,
    /// Address of Envoy's rate-limit service (its own listener, never
    /// `listen` or `grpc_listen`); none: the service is off. Not loopback:
    /// `[rls] key` or `key_file` is required.
    #[serde(default)]
    pub rls_listen: Option<String>,
    /// Bearer token for `/admin/*` endpoints; none: they are off.
    #[serde(default)]
    pub admin_token: Option<String>,
    /// Requests this replica serves at once; past it, 429 `overloaded`.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Where state lives.
    #[serde(default)]
    pub store: StoreConfig,
    /// How requests prove who they are.
    pub identity: IdentityConfig,
    /// The plan of users with no assignment.
    #[serde(default)]
    pub default_plan: Option<String>,
    /// Plans by name.
    #[serde(default)]
    pub plans: BTreeMap<String, PlanConfig>,
    /// User id → plan name.
    #[serde(default)]
    pub users: BTreeMap<String, String>,
    /// User id → changes over that user's plan.
    #[serde(default)]
    pub overrides: BTreeMap<String, PlanOverride>,
    /// Provider quotas by provider key, `"provider:model"` (SPEC §5).
    #[serde(default)]
    pub providers: ProvidersConfig,
    /// The one currency of prices and cost budgets, an ISO 4217 code.
    #[serde(default)]
    pub currency: Option<String>,
    /// Prices per million tokens by `"provider:model"`.
    #[serde(default)]
    pub prices: PricesConfig,
    /// Settings of every plan's budgets: `time_zone`.
    #[serde(default)]
    pub budgets: BudgetSettingsConfig,
    /// Envoy's rate-limit service: descriptors → limits (docs/envoy.md).
    #[serde(default)]
    pub rls: crate::envoy::RlsConfig,
    /// What one client may hold of this replica: connections, timeouts,
    /// waiting requests (read at start).
    #[serde(default)]
    pub limits: LimitsConfig,
    /// The decision audit log (`[audit]`): off without it.
    #[serde(default)]
    pub audit: Option<crate::audit::AuditConfig>,
    /// OpenTelemetry traces (`[telemetry]`): off without it.
    #[serde(default)]
    pub telemetry: Option<crate::telemetry::TelemetryConfig>,
}

/// `[limits]` as written: the edge's bounds ([`crate::edge`]); each field
/// absent takes its default. All are read at start (restart to change).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Open connections per listener (default 4,096; 1 to 1,000,000).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// HTTP/1: a request's headers complete within this of the connection
    /// opening or its previous response, so also the longest a kept-alive
    /// connection may idle; gRPC: the first byte within it. ms (default
    /// 10,000; 1 to 600,000).
    #[serde(default)]
    pub header_timeout_ms: Option<u64>,
    /// A `/v1` request's whole body within this of its headers, else 408,
    /// ms (default 10,000; 1 to 600,000).
    #[serde(default)]
    pub body_timeout_ms: Option<u64>,
    /// How long shutdown lets open connections finish before it closes
    /// them, ms (default 30,000; 0 to 3,600,000).
    #[serde(default)]
    pub drain_timeout_ms: Option<u64>,
    /// `wait=true` requests one user may have waiting at once (default 8).
    #[serde(default)]
    pub max_waits_per_user: Option<usize>,
    /// `wait=true` requests waiting at once on this replica (default half
    /// of `max_in_flight`, at least 1; at most `max_in_flight`).
    #[serde(default)]
    pub max_waiting: Option<usize>,
    /// gRPC: concurrent streams per connection (default 100; 1 to 10,000).
    #[serde(default)]
    pub grpc_max_streams: Option<u32>,
    /// gRPC: HTTP/2 keep-alive ping interval and ping timeout, also the TCP
    /// keep-alive time, ms (default 20,000; 1,000 to 3,600,000).
    #[serde(default)]
    pub grpc_keepalive_ms: Option<u64>,
    /// Rate refusals kept to answer locally until the store's hint ends
    /// (SPEC §3): entries of a fixed table of about 48 bytes each (default
    /// 65,536; 0 keeps none; at most 16,777,216).
    #[serde(default)]
    pub refusal_cache: Option<usize>,
}

/// Largest `[limits] refusal_cache` accepted.
const MAX_REFUSAL_CACHE: usize = 1 << 24;

/// Largest `[limits] max_connections` accepted.
const MAX_CONNECTIONS: usize = 1_000_000;

impl LimitsConfig {
    fn validate(
        &self,
        max_in_flight: usize,
        errors: &mut Vec<FieldError>,
    ) -> crate::edge::EdgeLimits {
        let mut limits = crate::edge::EdgeLimits::defaults(max_in_flight);
        let ms = |v: Option<u64>,
                  name: &str,
                  range: std::ops::RangeInclusive<u64>,
                  errors: &mut Vec<FieldError>| {
            let v = v?;
            if range.contains(&v) {
                Some(Duration::from_millis(v))
            } else {
                errors.push(err(
                    format!("limits.{name}"),
                    format!("must be between {} and {} ms", range.start(), range.end()),
                ));
                None
            }
        };
        if let Some(d) = ms(
            self.header_timeout_ms,
            "header_timeout_ms",
            1..=600_000,
            errors,
        ) {
            limits.header_timeout = d;
        }
        if let Some(d) = ms(self.body_timeout_ms, "body_timeout_ms", 1..=600_000, errors) {
            limits.body_timeout = d;
        }
        if let Some(d) = ms(
            self.drain_timeout_ms,
            "drain_timeout_ms",
            0..=3_600_000,
            errors,
        ) {
            limits.drain_timeout = d;
        }
        if let Some(d) = ms(
            self.grpc_keepalive_ms,
            "grpc_keepalive_ms",
            1_000..=3_600_000,
            errors,
        ) {
            limits.grpc_keepalive = d;
        }
        if let Some(n) = self.max_connections {
            if (1..=MAX_CONNECTIONS).contains(&n) {
                limits.max_connections = n;
            } else {
                errors.push(err(
                    "limits.max_connections",
                    format!("must be between 1 and {MAX_CONNECTIONS}"),
                ));
            }
        }
        if let Some(n) = self.grpc_max_streams {
            if (1..=10_000).contains(&n) {
                limits.grpc_max_streams = n;
            } else {
                errors.push(err(
                    "limits.grpc_max_streams",
                    "must be between 1 and 10000",
                ));
            }
        }
        if let Some(n) = self.max_waiting {
            if (1..=max_in_flight.max(1)).contains(&n) {
                limits.max_waiting = n;
            } else {
                errors.push(err(
                    "limits.max_waiting",
                    format!(
                        "must be between 1 and max_in_flight ({max_in_flight}): waiting requests \
                         hold in-flight places, and some must stay for the rest"
                    ),
                ));
            }
        }
        if let Some(n) = self.max_waits_per_user {
            if (1..=limits.max_waiting).contains(&n) {
                limits.max_waits_per_user = n;
            } else {
                errors.push(err(
                    "limits.max_waits_per_user",
                    format!("must be between 1 and max_waiting ({})", limits.max_waiting),
                ));
            }
        } else {
            limits.max_waits_per_user = limits.max_waits_per_user.min(limits.max_waiting);
        }
        if let Some(n) = self.refusal_cache {
            if n <= MAX_REFUSAL_CACHE {
                limits.refusal_cache = n;
            } else {
                errors.push(err(
                    "limits.refusal_cache",
                    format!("must be between 0 and {MAX_REFUSAL_CACHE}"),
                ));
            }
        }
        limits
    }
}

fn default_listen() -> String {
    "127.0.0.1:8787".to_owned()
}

fn default_max_in_flight() -> usize {
    1_024
}
/// A validated config.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where the gRPC API listens, if it is on.
    pub grpc_listen: Option<SocketAddr>,
    /// The operator's port (`/metrics`, `/admin/*`), if apart from `listen`.
    pub admin_listen: Option<SocketAddr>,
    /// Where Envoy's rate-limit service listens, if it is on. Read at
    /// startup only.
    pub rls_listen: Option<SocketAddr>,
    /// The rate-limit service's key and in-flight cap (`[rls] key`,
    /// `key_file`, `max_in_flight`). Read at startup only: a reload does
    /// not apply a change (restart).
    pub rls_server: crate::envoy::RlsServer,
    /// Admin bearer token, if admin endpoints are on.
    pub admin_token: Option<String>,
    /// The replica's in-flight cap.
    pub max_in_flight: usize,
    /// The store.
    pub store: StoreSettings,
    /// Identity settings (verified into a `Verifier` at startup).
    pub identity: IdentityConfig,
    /// The plans.
    pub plans: PlanBook,
    /// The provider quotas (`[providers."<provider>:<model>"]`).
    pub providers: ProviderBook,
    /// Envoy's rate-limit service rules (`[rls]`); they reload.
    pub rls: crate::envoy::RlsRules,
    /// The edge's bounds (`[limits]`). Read at startup only.
    pub limits: crate::edge::EdgeLimits,
    /// The settings a running server cannot change, as written: a reload
    /// The decision audit log, if configured. Read at startup only.
    pub audit: Option<crate::audit::AuditSettings>,
    /// Decision spans over OTLP, if configured. Read at startup only.
    pub telemetry: Option<crate::telemetry::TelemetrySettings>,
    /// compares them ([`RestartOnly::changed`]).
    pub restart_only: RestartOnly,
    /// Directory relative paths in the config are resolved against.
    pub base_dir: PathBuf,
    /// The file it was loaded from (none: the embedded default); reloads
    /// reread it.
    pub source: Option<PathBuf>,
}

/// The settings that take effect only at start (listeners, store, identity,
/// caps, admin token, the rate-limit service's key), as written in the file.
/// `Debug` names the fields only: their values hold secrets.
#[derive(Clone, PartialEq)]
pub struct RestartOnly {
    fields: Vec<(&'static str, serde_json::Value)>,
}

impl fmt::Debug for RestartOnly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.fields.iter().map(|(name, _)| name))
            .finish()
    }
}

impl RestartOnly {
    fn of(file: &FileConfig) -> Self {
        Self {
            fields: vec![
                ("listen", written(&file.listen)),
                ("grpc_listen", written(&file.grpc_listen)),
                ("admin_listen", written(&file.admin_listen)),
                ("rls_listen", written(&file.rls_listen)),
                ("rls.key", written(&file.rls.key)),
                ("rls.key_file", written(&file.rls.key_file)),
                ("rls.max_in_flight", written(&file.rls.max_in_flight)),
                ("admin_token", written(&file.admin_token)),
                ("max_in_flight", written(&file.max_in_flight)),
                ("store", written(&file.store)),
                ("identity", written(&file.identity)),
                ("audit", written(&file.audit)),
                ("telemetry", written(&file.telemetry)),
                (
                    "limits.max_connections",
                    written(&file.limits.max_connections),
                ),
                (
                    "limits.header_timeout_ms",
                    written(&file.limits.header_timeout_ms),
                ),
                (
                    "limits.body_timeout_ms",
                    written(&file.limits.body_timeout_ms),
                ),
                (
                    "limits.drain_timeout_ms",
                    written(&file.limits.drain_timeout_ms),
                ),
                (
                    "limits.max_waits_per_user",
                    written(&file.limits.max_waits_per_user),
                ),
                ("limits.max_waiting", written(&file.limits.max_waiting)),
                (
                    "limits.grpc_max_streams",
                    written(&file.limits.grpc_max_streams),
                ),
                (
                    "limits.grpc_keepalive_ms",
                    written(&file.limits.grpc_keepalive_ms),
                ),
                ("limits.refusal_cache", written(&file.limits.refusal_cache)),
            ],
        }
    }

    /// The fields whose value in `new` differs from this one's: what a
    /// reload to `new` cannot apply without a restart.
    pub fn changed(&self, new: &RestartOnly) -> Vec<&'static str> {
        self.fields
            .iter()
            .zip(&new.fields)
            .filter(|(a, b)| a != b)
            .map(|(a, _)| a.0)
            .collect()
    }
}

/// A setting as JSON, for comparing what was written.
fn written<T: Serialize>(x: &T) -> serde_json::Value {
    serde_json::to_value(x).unwrap_or(serde_json::Value::Null)
}

/// A config that cannot be used: every problem, each with its field path.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigError {
    /// Where the config came from.
    pub source_name: String,
    /// Each problem.
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is not a valid tollgate config:", self.source_name)?;
        for e in &self.errors {
            write!(f, "\n  - {}: {}", e.path, e.reason)?;
        }
        Ok(())
    }
}

/// The listeners' addresses of a config ([`FileConfig::validate`]).
struct Addresses {
    listen: Option<SocketAddr>,
    grpc_listen: Option<SocketAddr>,
    admin_listen: Option<SocketAddr>,
    rls_listen: Option<SocketAddr>,
}

/// `text` as the socket address of `field`, or an error showing `example`.
fn socket_addr(
    field: &str,
    text: &str,
    example: &str,
    errors: &mut Vec<FieldError>,
) -> Option<SocketAddr> {
    match text.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            errors.push(err(
                field,
                format!("{text:?} is not an address like {example}"),
            ));
            None
        }
    }
}

/// The optional listener `field` at `text`: refused when it shares a
/// non-zero port with one of `taken` (name, address), saying `why(name)`.
fn own_listener(
    field: &str,
    text: Option<&str>,
    example: &str,
    taken: &[(&str, Option<SocketAddr>)],
    why: impl Fn(&str) -> String,
    errors: &mut Vec<FieldError>,
) -> Option<SocketAddr> {
    let a = socket_addr(field, text?, example, errors)?;
    if a.port() != 0
        && let Some((other, _)) = taken.iter().find(|(_, t)| *t == Some(a))
    {
        errors.push(err(field, format!("{a} is also {}", why(other))));
        return None;
    }
    Some(a)
}

/// The value of a part's validation, its errors added to `errors`.
fn collect<T>(r: Result<T, Vec<FieldError>>, errors: &mut Vec<FieldError>) -> Option<T> {
    r.map_err(|e| errors.extend(e)).ok()
}

fn err(path: impl Into<String>, reason: impl Into<String>) -> FieldError {
    FieldError {
        path: path.into(),
        reason: reason.into(),
    }
}

impl Config {
    /// Reads and validates a config file.
    ///
    /// # Errors
    ///
    /// The file cannot be read, is not TOML of the right shape, or fails
    /// validation; every problem is listed with its field path.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            source_name: name.clone(),
            errors: vec![err("(file)", format!("cannot read: {e}"))],
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut cfg = Self::parse(&text, &name, &base)?;
        cfg.source = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// The embedded default config.
    ///
    /// # Errors
    ///
    /// Never in a released build (a test checks it).
    pub fn default_config() -> Result<Self, ConfigError> {
        Self::parse(
            DEFAULT_CONFIG,
            "the embedded default config",
            Path::new("."),
        )
    }

    /// Parses and validates config text; `base_dir` resolves relative paths.
    ///
    /// # Errors
    ///
    /// As [`load`](Self::load).
    pub fn parse(text: &str, source_name: &str, base_dir: &Path) -> Result<Self, ConfigError> {
        let fail = |errors| ConfigError {
            source_name: source_name.to_owned(),
            errors,
        };
        let de = toml::Deserializer::parse(text).map_err(|e| fail(vec![toml_error(&e)]))?;
        let file: FileConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = toml_path(e.path());
            let inner = e.into_inner();
            fail(vec![err(
                if path.is_empty() {
                    "(file)".to_owned()
                } else {
                    path
                },
                toml_message(&inner),
            )])
        })?;
        file.validate(base_dir).map_err(fail)
    }
}

fn toml_error(e: &toml::de::Error) -> FieldError {
    err("(file)", toml_message(e))
}

fn toml_message(e: &toml::de::Error) -> String {
    e.message().trim().to_owned()
}

impl FileConfig {
    /// Checks every field; answers a usable [`Config`] or every problem.
    ///
    /// # Errors
    ///
    /// Each problem with its field path.
    pub fn validate(self, base_dir: &Path) -> Result<Config, Vec<FieldError>> {
        let restart_only = RestartOnly::of(&self);
        let mut errors = Vec::new();
        let Addresses {
            listen,
            grpc_listen,
            admin_listen,
            rls_listen,
        } = self.addresses(&mut errors);
        self.check_rls_listener(rls_listen, &mut errors);
        let rls_server = collect(
            crate::envoy::validate_rls_server(&self.rls, base_dir),
            &mut errors,
        );
        if self.max_in_flight == 0 || self.max_in_flight > crate::envoy::MAX_MAX_IN_FLIGHT {
            errors.push(err(
                "max_in_flight",
                format!(
                    "must be 1 to {} (got {})",
                    crate::envoy::MAX_MAX_IN_FLIGHT,
                    self.max_in_flight
                ),
            ));
        }
        let limits = self.limits.validate(self.max_in_flight, &mut errors);
        let telemetry = self
            .telemetry
            .as_ref()
            .and_then(|t| collect(t.validate(), &mut errors));
        let audit = self
            .audit
            .as_ref()
            .and_then(|a| collect(a.validate(base_dir), &mut errors));
        if let Some(t) = &self.admin_token
            && t.len() < 16
        {
            errors.push(err("admin_token", "must be at least 16 characters"));
        }
        let store = self.store.validate(base_dir, &mut errors);
        // The identity settings are checked (keys loaded) here too, so that
        // `check-config` and startup report them with the rest.
        if let Err(e) = Verifier::from_config(&self.identity, base_dir, Arc::new(SystemClock)) {
            errors.extend(e);
        }
        let plans = PlansConfig {
            default_plan: self.default_plan,
            plans: self.plans,
            users: self.users,
            overrides: self.overrides,
            currency: self.currency,
            prices: self.prices,
            budgets: self.budgets,
        };
        let plans = collect(plans.validate().map_err(|e| e.errors), &mut errors);
        let providers = collect(
            validate_providers(&self.providers).map_err(|e| e.errors),
            &mut errors,
        );
        let rls = collect(crate::envoy::validate_rls(&self.rls), &mut errors);
        match (listen, store, plans, providers, rls, rls_server) {
            (
                Some(listen),
                Some(store),
                Some(plans),
                Some(providers),
                Some(rls),
                Some(rls_server),
            ) if errors.is_empty() => Ok(Config {
                listen,
                grpc_listen,
                rls_listen,
                rls_server,
                admin_listen,
                admin_token: self.admin_token,
                max_in_flight: self.max_in_flight,
                store,
                identity: self.identity,
                plans,
                providers,
                rls,
                limits,
                audit,
                telemetry,
                restart_only,
                base_dir: base_dir.to_path_buf(),
                source: None,
            }),
            _ => Err(errors),
        }
    }

    /// The four listeners' addresses, each parsed once and refused (with
    /// an error naming it) when it is no address or shares a port with an
    /// earlier one (port 0, any free port, is never shared); the dev
    /// identity mode serves loopback only.
    fn addresses(&self, errors: &mut Vec<FieldError>) -> Addresses {
        let listen = socket_addr("listen", &self.listen, "127.0.0.1:8787", errors);
        let grpc_listen = own_listener(
            "grpc_listen",
            self.grpc_listen.as_deref(),
            "127.0.0.1:8788",
            &[("listen", listen)],
            |other| format!("`{other}`: gRPC needs its own port"),
            errors,
        );
        let admin_listen = own_listener(
            "admin_listen",
            self.admin_listen.as_deref(),
            "127.0.0.1:9787",
            &[("listen", listen), ("grpc_listen", grpc_listen)],
            |_| "`listen` or `grpc_listen`: the operator's port is its own".to_owned(),
            errors,
        );
        // Anyone can mint a dev token for anyone: dev mode serves this
        // machine only.
        if self.identity.mode == crate::identity::IdentityMode::Dev {
            for (field, addr) in [("listen", listen), ("grpc_listen", grpc_listen)] {
                if let Some(a) = addr
                    && !a.ip().is_loopback()
                {
                    errors.push(err(
                        field,
                        format!(
                            "{a} is not a loopback address: the dev identity mode (a well-known \
                             secret) serves this machine only; use mode = \"jwt\" to serve others"
                        ),
                    ));
                }
            }
        }
        let rls_listen = own_listener(
            "rls_listen",
            self.rls_listen.as_deref(),
            "127.0.0.1:8789",
            &[("listen", listen), ("grpc_listen", grpc_listen)],
            |other| format!("`{other}`: Envoy's rate-limit service needs its own port"),
            errors,
        );
        if let (Some(a), Some(r)) = (admin_listen, rls_listen)
            && a == r
            && a.port() != 0
        {
            errors.push(err(
                "admin_listen",
                format!("{a} is also `rls_listen`: the operator's port is its own"),
            ));
        }
        Addresses {
            listen,
            grpc_listen,
            admin_listen,
            rls_listen,
        }
    }

    /// What `[rls]` needs of `rls_listen`: a key off loopback, and nothing
    /// of the service's settings without the listener.
    fn check_rls_listener(&self, rls_listen: Option<SocketAddr>, errors: &mut Vec<FieldError>) {
        let has_key = self.rls.key.is_some() || self.rls.key_file.is_some();
        match (&self.rls_listen, rls_listen) {
            (Some(_), Some(a)) if !a.ip().is_loopback() && !has_key => errors.push(err(
                "rls_listen",
                "a non-loopback address needs [rls] key or key_file",
            )),
            (None, _) => {
                for (set, name) in [
                    (self.rls.key.is_some(), "key"),
                    (self.rls.key_file.is_some(), "key_file"),
                    (self.rls.max_in_flight.is_some(), "max_in_flight"),
                ] {
                    if set {
                        errors.push(err(
                            format!("rls.{name}"),
                            "only applies when rls_listen is set",
                        ));
                    }
                }
                if !self.rls.descriptors.is_empty() {
                    errors.push(err(
                        "rls.descriptors",
                        "Envoy's rate-limit service is off without rls_listen (it is no longer \
                         served on grpc_listen): set rls_listen and point Envoy at it",
                    ));
                }
            }
            _ => {}
        }
    }
}
