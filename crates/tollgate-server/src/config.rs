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
use tollgate_core::failover::{BreakerConfig, DEFAULT_JOURNAL_CAPACITY, FailurePolicy};
use tollgate_core::plan::{FieldError, toml_path};
use tollgate_core::{PlanBook, PlanConfig, PlanOverride, PlansConfig, SystemClock};
use tollgate_provider::{ProviderBook, ProvidersConfig, validate_providers};
use tollgate_redis::{RedisConfig, RedisTarget};

use crate::identity::{IdentityConfig, Verifier};

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
    /// Envoy's rate-limit service: descriptors → limits (docs/envoy.md).
    #[serde(default)]
    pub rls: crate::envoy::RlsConfig,
    /// What one client may hold of this replica: connections, timeouts,
    /// waiting requests (read at start).
    #[serde(default)]
    pub limits: LimitsConfig,
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
}

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
        limits
    }
}

fn default_listen() -> String {
    "127.0.0.1:8787".to_owned()
}

fn default_max_in_flight() -> usize {
    1_024
}

/// Which store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// In this process (one replica).
    #[default]
    Memory,
    /// One Redis server.
    Redis,
    /// A Redis Cluster.
    Cluster,
}

/// What to do while Redis is unreachable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Answer 503 `store_unavailable`.
    #[default]
    FailClosed,
    /// Decide locally with rates scaled by `fallback_share`.
    FailOpen,
}

/// `[store]` as written.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `memory` (default), `redis` or `cluster`.
    #[serde(default)]
    pub kind: StoreKind,
    /// `redis`: `redis://[user:password@]host:port[/db]` or `rediss://…`.
    #[serde(default)]
    pub url: Option<String>,
    /// `cluster`: seed node URLs.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Key prefix (default `tg`).
    #[serde(default)]
    pub key_prefix: Option<String>,
    /// Per-operation timeout, ms (default 50).
    #[serde(default)]
    pub op_timeout_ms: Option<u64>,
    /// Connect timeout, ms (default 1,000).
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// A PEM CA file to trust for `rediss://` instead of the system roots.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// `fail_closed` (default) or `fail_open`.
    #[serde(default)]
    pub failure: FailureMode,
    /// `fail_open`: this replica's share of each limit, in (0, 1] (default 1).
    #[serde(default)]
    pub fallback_share: Option<f64>,
    /// How long session state is kept after its last activity, ms (default 7 days).
    #[serde(default)]
    pub session_retention_ms: Option<u64>,
    /// How long a session without records (every sidecar session) is kept
    /// past its lease's end, ms (default 600,000; at most the retention).
    #[serde(default)]
    pub session_grace_ms: Option<u64>,
    /// `memory`: most entries the store holds (default 1,000,000; 1 ..=
    /// 100,000,000). Past it requests that need a new key are 503
    /// `store_full`.
    #[serde(default)]
    pub max_entries: Option<u64>,
    /// `redis`/`cluster`: most closes (settles, refunds, releases) this
    /// replica journals while Redis fails (default 100,000; 1 ..=
    /// 10,000,000). Past it a close is 503 `store_full` (retry).
    #[serde(default)]
    pub journal_capacity: Option<u64>,
    /// `redis`/`cluster`: when the circuit breaker in front of Redis opens.
    #[serde(default)]
    pub breaker: Option<BreakerFile>,
}

/// `[store.breaker]` as written (SPEC §6).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerFile {
    /// Transient faults in a row that open it (default 5; 1 ..= 1,000).
    #[serde(default)]
    pub consecutive_failures: Option<u32>,
    /// Share of failed operations in the window that opens it, in (0, 1]
    /// (default 0.5).
    #[serde(default)]
    pub failure_ratio: Option<f64>,
    /// The window the ratio is counted over, ms (default 10,000; 100 ..=
    /// 600,000).
    #[serde(default)]
    pub window_ms: Option<u64>,
    /// Operations in the window before the ratio counts (default 20; 1 ..=
    /// 1,000,000).
    #[serde(default)]
    pub min_calls: Option<u32>,
    /// How long it stays open before a probe, ms (default 1,000; 10 ..=
    /// 600,000).
    #[serde(default)]
    pub open_ms: Option<u64>,
}

/// Most `[store] journal_capacity` accepted.
pub const MAX_JOURNAL_CAPACITY: u64 = 10_000_000;

impl BreakerFile {
    fn validate(&self, errors: &mut Vec<FieldError>) -> BreakerConfig {
        let d = BreakerConfig::default();
        let mut range = |v: Option<u64>, name: &str, lo: u64, hi: u64, default: u64| match v {
            None => default,
            Some(v) if (lo..=hi).contains(&v) => v,
            Some(_) => {
                errors.push(err(
                    format!("store.breaker.{name}"),
                    format!("must be between {lo} and {hi}"),
                ));
                default
            }
        };
        let consecutive = range(
            self.consecutive_failures.map(u64::from),
            "consecutive_failures",
            1,
            1_000,
            u64::from(d.consecutive_failures),
        );
        let window_ms = range(self.window_ms, "window_ms", 100, 600_000, d.window_ms);
        let min_calls = range(
            self.min_calls.map(u64::from),
            "min_calls",
            1,
            1_000_000,
            u64::from(d.min_calls),
        );
        let open_ms = range(self.open_ms, "open_ms", 10, 600_000, d.open_ms);
        let ratio = match self.failure_ratio {
            None => d.failure_ratio_permille,
            Some(r) if r > 0.0 && r <= 1.0 => ((r * 1_000.0).round() as u32).max(1),
            Some(r) => {
                errors.push(err(
                    "store.breaker.failure_ratio",
                    format!("must be in (0, 1], got {r}"),
                ));
                d.failure_ratio_permille
            }
        };
        BreakerConfig {
            consecutive_failures: consecutive as u32,
            failure_ratio_permille: ratio,
            window_ms,
            min_calls: min_calls as u32,
            open_ms,
        }
    }
}

/// Most `[store] max_entries` accepted.
pub const MAX_MAX_ENTRIES: u64 = 100_000_000;

/// The store to build.
#[derive(Debug, Clone)]
pub enum StoreSettings {
    /// In memory.
    Memory(tollgate_core::store::memory::MemoryConfig),
    /// Redis or Redis Cluster, with a failure policy.
    Redis {
        /// Connection settings.
        redis: RedisConfig,
        /// Fail closed or open.
        policy: FailurePolicy,
        /// When the breaker opens.
        breaker: BreakerConfig,
        /// Most closes journalled while Redis fails.
        journal_capacity: usize,
    },
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
        let listen = match self.listen.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                errors.push(err(
                    "listen",
                    format!("{:?} is not an address like 127.0.0.1:8787", self.listen),
                ));
                None
            }
        };
        let grpc_listen = match self.grpc_listen.as_deref() {
            None => None,
            Some(text) => match text.parse::<SocketAddr>() {
                Ok(a) if Some(a) == listen && a.port() != 0 => {
                    errors.push(err(
                        "grpc_listen",
                        format!("{a} is also `listen`: gRPC needs its own port"),
                    ));
                    None
                }
                Ok(a) => Some(a),
                Err(_) => {
                    errors.push(err(
                        "grpc_listen",
                        format!("{text:?} is not an address like 127.0.0.1:8788"),
                    ));
                    None
                }
            },
        };
        let admin_listen = match self.admin_listen.as_deref() {
            None => None,
            Some(text) => {
                match text.parse::<SocketAddr>() {
                    Ok(a) if a.port() != 0 && (Some(a) == listen || Some(a) == grpc_listen) => {
                        errors.push(err(
                        "admin_listen",
                        format!("{a} is also `listen` or `grpc_listen`: the operator's port is its own"),
                    ));
                        None
                    }
                    Ok(a) => Some(a),
                    Err(_) => {
                        errors.push(err(
                            "admin_listen",
                            format!("{text:?} is not an address like 127.0.0.1:9787"),
                        ));
                        None
                    }
                }
            }
        };
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
        let rls_listen = match self.rls_listen.as_deref() {
            None => None,
            Some(text) => match text.parse::<SocketAddr>() {
                Ok(a) if a.port() != 0 && (Some(a) == listen || Some(a) == grpc_listen) => {
                    let other = if Some(a) == listen {
                        "listen"
                    } else {
                        "grpc_listen"
                    };
                    errors.push(err(
                        "rls_listen",
                        format!(
                            "{a} is also `{other}`: Envoy's rate-limit service needs its own port"
                        ),
                    ));
                    None
                }
                Ok(a) => Some(a),
                Err(_) => {
                    errors.push(err(
                        "rls_listen",
                        format!("{text:?} is not an address like 127.0.0.1:8789"),
                    ));
                    None
                }
            },
        };
        if let (Some(a), Some(r)) = (admin_listen, rls_listen)
            && a == r
            && a.port() != 0
        {
            errors.push(err(
                "admin_listen",
                format!("{a} is also `rls_listen`: the operator's port is its own"),
            ));
        }
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
        let rls_server = match crate::envoy::validate_rls_server(&self.rls, base_dir) {
            Ok(s) => Some(s),
            Err(e) => {
                errors.extend(e);
                None
            }
        };
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
        };
        let plans = match plans.validate() {
            Ok(p) => Some(p),
            Err(e) => {
                errors.extend(e.errors);
                None
            }
        };
        let providers = match validate_providers(&self.providers) {
            Ok(p) => Some(p),
            Err(e) => {
                errors.extend(e.errors);
                None
            }
        };
        let rls = match crate::envoy::validate_rls(&self.rls) {
            Ok(r) => Some(r),
            Err(e) => {
                errors.extend(e);
                None
            }
        };
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
                restart_only,
                base_dir: base_dir.to_path_buf(),
                source: None,
            }),
            _ => Err(errors),
        }
    }
}

impl StoreConfig {
    /// `session_retention_ms` (at least 1) and `session_grace_ms` (1 ..=
    /// the retention), with their defaults.
    fn sessions(&self, errors: &mut Vec<FieldError>) -> (u64, u64) {
        let retention = self
            .session_retention_ms
            .unwrap_or(tollgate_core::store::DEFAULT_SESSION_RETENTION_MS);
        if retention == 0 {
            errors.push(err("store.session_retention_ms", "must be at least 1"));
        }
        let grace = match self.session_grace_ms {
            None => tollgate_core::store::DEFAULT_SESSION_GRACE_MS.min(retention),
            Some(g) => {
                if g == 0 || g > retention {
                    errors.push(err(
                        "store.session_grace_ms",
                        format!("must be between 1 and session_retention_ms ({retention})"),
                    ));
                }
                g
            }
        };
        (retention, grace)
    }

    fn validate(&self, base_dir: &Path, errors: &mut Vec<FieldError>) -> Option<StoreSettings> {
        let before = errors.len();
        let target = match self.kind {
            StoreKind::Memory => {
                for (set, name) in [
                    (self.url.is_some(), "url"),
                    (!self.nodes.is_empty(), "nodes"),
                    (self.tls_ca_file.is_some(), "tls_ca_file"),
                    (self.fallback_share.is_some(), "fallback_share"),
                    (self.key_prefix.is_some(), "key_prefix"),
                    (self.op_timeout_ms.is_some(), "op_timeout_ms"),
                    (self.connect_timeout_ms.is_some(), "connect_timeout_ms"),
                    (self.failure != FailureMode::FailClosed, "failure"),
                    (self.journal_capacity.is_some(), "journal_capacity"),
                    (self.breaker.is_some(), "breaker"),
                ] {
                    if set {
                        errors.push(err(
                            format!("store.{name}"),
                            "only applies to kind = \"redis\" or \"cluster\"",
                        ));
                    }
                }
                let (session_retention_ms, session_grace_ms) = self.sessions(errors);
                let max_entries = match self.max_entries {
                    None => tollgate_core::store::memory::DEFAULT_MAX_ENTRIES,
                    Some(n) if (1..=MAX_MAX_ENTRIES).contains(&n) => {
                        usize::try_from(n).unwrap_or(usize::MAX)
                    }
                    Some(_) => {
                        errors.push(err(
                            "store.max_entries",
                            format!("must be between 1 and {MAX_MAX_ENTRIES}"),
                        ));
                        1
                    }
                };
                return (errors.len() == before).then_some(StoreSettings::Memory(
                    tollgate_core::store::memory::MemoryConfig {
                        session_retention_ms,
                        session_grace_ms,
                        max_entries,
                    },
                ));
            }
            StoreKind::Redis if !self.nodes.is_empty() => {
                errors.push(err(
                    "store.nodes",
                    "only applies to kind = \"cluster\" (use url)",
                ));
                return None;
            }
            StoreKind::Cluster if self.url.is_some() => {
                errors.push(err(
                    "store.url",
                    "only applies to kind = \"redis\" (use nodes)",
                ));
                return None;
            }
            StoreKind::Redis => match &self.url {
                Some(u) if is_redis_url(u) => RedisTarget::Standalone(u.clone()),
                Some(u) => {
                    errors.push(err(
                        "store.url",
                        format!("{u:?} is not a redis:// or rediss:// URL"),
                    ));
                    return None;
                }
                None => {
                    errors.push(err("store.url", "required for kind = \"redis\""));
                    return None;
                }
            },
            StoreKind::Cluster => {
                if self.nodes.is_empty() {
                    errors.push(err(
                        "store.nodes",
                        "required for kind = \"cluster\" (seed URLs)",
                    ));
                }
                for (i, n) in self.nodes.iter().enumerate() {
                    if !is_redis_url(n) {
                        errors.push(err(
                            format!("store.nodes[{i}]"),
                            format!("{n:?} is not a redis:// or rediss:// URL"),
                        ));
                    }
                }
                RedisTarget::Cluster(self.nodes.clone())
            }
        };
        let mut redis = match target {
            RedisTarget::Standalone(u) => RedisConfig::standalone(u),
            RedisTarget::Cluster(n) => RedisConfig::cluster(n),
        };
        if let Some(p) = &self.key_prefix {
            if p.is_empty() || p.contains(['{', '}']) {
                errors.push(err("store.key_prefix", "must be non-empty without { or }"));
            }
            redis.key_prefix = p.clone();
        }
        for (v, name) in [
            (self.op_timeout_ms, "op_timeout_ms"),
            (self.connect_timeout_ms, "connect_timeout_ms"),
        ] {
            if let Some(ms) = v
                && !(1..=60_000).contains(&ms)
            {
                errors.push(err(
                    format!("store.{name}"),
                    "must be between 1 and 60000 ms",
                ));
            }
        }
        if let Some(ms) = self.op_timeout_ms {
            redis.op_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.connect_timeout_ms {
            redis.connect_timeout = Duration::from_millis(ms);
        }
        if self.max_entries.is_some() {
            errors.push(err(
                "store.max_entries",
                "only applies to kind = \"memory\"",
            ));
        }
        let (retention, grace) = self.sessions(errors);
        redis.session_retention_ms = retention;
        redis.session_grace_ms = grace;
        let tls = match &self.url {
            Some(u) => u.starts_with("rediss://"),
            None => self.nodes.iter().any(|n| n.starts_with("rediss://")),
        };
        if self.tls_ca_file.is_some() && !tls {
            errors.push(err(
                "store.tls_ca_file",
                "only applies to rediss:// (TLS) URLs",
            ));
        }
        if let Some(f) = &self.tls_ca_file {
            let path = base_dir.join(f);
            match std::fs::read(&path) {
                Ok(pem) if pem.starts_with(b"-----BEGIN") => redis.tls_ca_pem = Some(pem),
                Ok(_) => errors.push(err("store.tls_ca_file", "is not a PEM certificate")),
                Err(e) => errors.push(err(
                    "store.tls_ca_file",
                    format!("cannot read {}: {e}", path.display()),
                )),
            }
        }
        let policy = match self.failure {
            FailureMode::FailClosed => {
                if self.fallback_share.is_some() {
                    errors.push(err(
                        "store.fallback_share",
                        "only applies to failure = \"fail_open\"",
                    ));
                }
                FailurePolicy::FailClosed
            }
            FailureMode::FailOpen => {
                let share = self.fallback_share.unwrap_or(1.0);
                if !(share > 0.0 && share <= 1.0) {
                    errors.push(err(
                        "store.fallback_share",
                        format!("must be in (0, 1], got {share}"),
                    ));
                }
                FailurePolicy::FailOpen {
                    fallback_share: share,
                }
            }
        };
        let breaker = self.breaker.clone().unwrap_or_default().validate(errors);
        let journal_capacity = match self.journal_capacity {
            None => DEFAULT_JOURNAL_CAPACITY,
            Some(n) if (1..=MAX_JOURNAL_CAPACITY).contains(&n) => {
                usize::try_from(n).unwrap_or(usize::MAX)
            }
            Some(_) => {
                errors.push(err(
                    "store.journal_capacity",
                    format!("must be between 1 and {MAX_JOURNAL_CAPACITY}"),
                ));
                1
            }
        };
        (errors.len() == before).then_some(StoreSettings::Redis {
            redis,
            policy,
            breaker,
            journal_capacity,
        })
    }
}

fn is_redis_url(u: &str) -> bool {
    u.starts_with("redis://") || u.starts_with("rediss://")
}
