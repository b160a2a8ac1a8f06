//! Connection settings.

use std::time::Duration;

use tollgate_core::store::{DEFAULT_SESSION_GRACE_MS, DEFAULT_SESSION_RETENTION_MS};

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (or a proxy): `redis://[user:password@]host:port[/db]`, or
    /// `rediss://…` for TLS.
    Standalone(String),
    /// A Redis Cluster: one or more seed node URLs (same forms).
    Cluster(Vec<String>),
}

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// The server or cluster. Credentials and TLS (`rediss://`) go in the URLs.
    pub target: RedisTarget,
    /// Prefix of every key (default `tg`), so several deployments or tests
    /// can share one Redis.
    pub key_prefix: String,
    /// Longest wait for one operation's answer (default 50 ms). Past it the
    /// operation fails with a transient `Timeout`. Tests use at least 1 s.
    pub op_timeout: Duration,
    /// Longest wait to connect (default 1 s).
    pub connect_timeout: Duration,
    /// How long a session with records (or that had records) is kept after
    /// its last activity, with its lease state and fence counter (default
    /// 7 days).
    pub session_retention_ms: u64,
    /// How long a session that holds no record is kept past its lease's end
    /// (or its last activity), ms (default 10 minutes; at most the
    /// retention).
    pub session_grace_ms: u64,
    /// For `rediss://`: a PEM CA certificate to trust instead of the system's
    /// roots (a private CA). `None`: the system's trust store.
    pub tls_ca_pem: Option<Vec<u8>>,
}

impl RedisConfig {
    /// Defaults for one server at `url`.
    pub fn standalone(url: impl Into<String>) -> Self {
        Self::new(RedisTarget::Standalone(url.into()))
    }

    /// Defaults for a cluster reached through `seeds`.
    pub fn cluster<I, S>(seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(RedisTarget::Cluster(
            seeds.into_iter().map(Into::into).collect(),
        ))
    }

    fn new(target: RedisTarget) -> Self {
        Self {
            target,
            key_prefix: "tg".to_owned(),
            op_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            session_retention_ms: DEFAULT_SESSION_RETENTION_MS,
            session_grace_ms: DEFAULT_SESSION_GRACE_MS,
            tls_ca_pem: None,
        }
    }

    /// The same settings trusting `pem` (a CA certificate) for TLS.
    pub fn with_tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca_pem = Some(pem.into());
        self
    }

    /// The same settings with another key prefix.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The same settings with another operation timeout.
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// The same settings with another session retention.
    pub fn with_session_retention_ms(mut self, ms: u64) -> Self {
        self.session_retention_ms = ms;
        self
    }

    /// The same settings with another session grace.
    pub fn with_session_grace_ms(mut self, ms: u64) -> Self {
        self.session_grace_ms = ms;
        self
    }

    /// The grace the scripts apply: at most the retention.
    pub(crate) fn effective_grace_ms(&self) -> u64 {
        self.session_grace_ms.min(self.session_retention_ms)
    }
}
