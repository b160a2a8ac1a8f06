//! `[store]` as written and validated: memory or Redis, the failure policy and its breaker, session retention and the entry bound.

use super::*;

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

impl StoreConfig {
    /// `session_retention_ms` (at least 1) and `session_grace_ms` (1 ..=
    /// the retention), with their defaults.
    pub(super) fn sessions(&self, errors: &mut Vec<FieldError>) -> (u64, u64) {
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

    pub(super) fn validate(
        &self,
        base_dir: &Path,
        errors: &mut Vec<FieldError>,
    ) -> Option<StoreSettings> {
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
