//! How the rate-limit service's listener is guarded: the shared key
//! ([`RlsKey`], checked by [`KeyCheck`] before a message is read) and the
//! in-flight cap, validated from `[rls]` into [`RlsServer`].

use std::fmt;
use std::io::Read as _;
use std::path::Path;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tollgate_core::Store;
use tollgate_core::plan::FieldError;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};

use super::rules::{Check, RlsConfig};
use super::service::{METHOD, RlsService};
use crate::outcome::{ApiError, GrpcStatus};
use crate::state::App;

/// The metadata every `ShouldRateLimit` carries the key in, when a key is
/// configured.
pub const KEY_METADATA: &str = "x-tollgate-rls-key";

/// Fewest bytes a key may have.
pub const MIN_KEY_BYTES: usize = 32;

/// Most bytes a key may have.
pub const MAX_KEY_BYTES: usize = 1_024;

/// Calls the rate-limit service answers at once when `[rls] max_in_flight`
/// is not set.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1_024;

/// Largest `[rls] max_in_flight` accepted.
pub const MAX_MAX_IN_FLIGHT: usize = 1_000_000;

/// Largest `key_file` read, bytes.
const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

/// The shared key of the rate-limit service: printable ASCII without
/// spaces, [`MIN_KEY_BYTES`] to [`MAX_KEY_BYTES`] long. `Debug` never shows
/// it; [`matches`](Self::matches) and `==` compare in constant time (the
/// length aside).
#[derive(Clone)]
pub struct RlsKey(Arc<[u8]>);

impl RlsKey {
    /// A key from its text.
    ///
    /// # Errors
    ///
    /// Why it is no key: too short, too long, or not printable ASCII
    /// without spaces (it travels as gRPC metadata).
    pub fn new(key: &str) -> Result<Self, String> {
        let bytes = key.as_bytes();
        if bytes.len() < MIN_KEY_BYTES {
            return Err(format!(
                "the key is {} bytes; at least {MIN_KEY_BYTES} are required (e.g. openssl rand -base64 48)",
                bytes.len()
            ));
        }
        if bytes.len() > MAX_KEY_BYTES {
            return Err(format!("the key must be at most {MAX_KEY_BYTES} bytes"));
        }
        if !bytes.iter().all(u8::is_ascii_graphic) {
            return Err(
                "the key must be printable ASCII without spaces (it is sent as gRPC metadata)"
                    .to_owned(),
            );
        }
        Ok(Self(bytes.into()))
    }

    /// Whether `presented` is this key, compared in constant time (a
    /// presented value of another length is refused at once).
    pub fn matches(&self, presented: &[u8]) -> bool {
        use subtle::ConstantTimeEq as _;
        bool::from(self.0.ct_eq(presented))
    }
}

impl PartialEq for RlsKey {
    fn eq(&self, other: &Self) -> bool {
        self.matches(&other.0)
    }
}

impl Eq for RlsKey {}

impl fmt::Debug for RlsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RlsKey([redacted])")
    }
}

/// How the rate-limit service's listener is guarded: its key and its
/// in-flight cap (`[rls] key` / `key_file`, `[rls] max_in_flight`). Read
/// at startup; a reload does not change them (restart to apply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsServer {
    /// The key every call must carry in [`KEY_METADATA`]; none: calls are
    /// not authenticated (allowed on a loopback `rls_listen` only).
    pub key: Option<RlsKey>,
    /// Calls answered at once; past it `RESOURCE_EXHAUSTED`.
    pub max_in_flight: usize,
}

impl Default for RlsServer {
    /// No key, [`DEFAULT_MAX_IN_FLIGHT`].
    fn default() -> Self {
        Self {
            key: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

/// Validates the listener settings of `[rls]` (`key`, `key_file`,
/// `max_in_flight`), reading `key_file` relative to `base_dir`; every
/// problem with its field path under `rls.`.
///
/// Whether a key is required (a non-loopback `rls_listen`) is checked
/// with the listen addresses, by [`crate::config`].
///
/// # Errors
///
/// Both `key` and `key_file`; a key file that cannot be read; a key that
/// is too short or too long or not printable ASCII; `max_in_flight` 0 or
/// above [`MAX_MAX_IN_FLIGHT`].
pub fn validate_rls_server(cfg: &RlsConfig, base_dir: &Path) -> Result<RlsServer, Vec<FieldError>> {
    let mut c = Check { errors: Vec::new() };
    let key = match (&cfg.key, &cfg.key_file) {
        (Some(_), Some(_)) => {
            c.err("rls.key_file", "set either key or key_file, not both");
            None
        }
        (Some(k), None) => RlsKey::new(k).map_err(|e| c.err("rls.key", e)).ok(),
        (None, Some(file)) => {
            let path = if file.is_absolute() {
                file.clone()
            } else {
                base_dir.join(file)
            };
            match read_key_file(&path) {
                Ok(text) => RlsKey::new(text.trim_ascii())
                    .map_err(|e| c.err("rls.key_file", format!("{}: {e}", path.display())))
                    .ok(),
                Err(e) => {
                    c.err("rls.key_file", e);
                    None
                }
            }
        }
        (None, None) => None,
    };
    let max_in_flight = cfg.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT);
    if !(1..=MAX_MAX_IN_FLIGHT).contains(&max_in_flight) {
        c.err(
            "rls.max_in_flight",
            format!("must be between 1 and {MAX_MAX_IN_FLIGHT} (got {max_in_flight})"),
        );
    }
    if c.errors.is_empty() {
        Ok(RlsServer { key, max_in_flight })
    } else {
        Err(c.errors)
    }
}

/// The text of a key file of at most [`MAX_KEY_FILE_BYTES`].
fn read_key_file(path: &Path) -> Result<String, String> {
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(format!("{} is larger than 64 KiB", path.display()));
    }
    String::from_utf8(bytes).map_err(|_| {
        format!(
            "{}: the key must be printable ASCII without spaces (it is sent as gRPC metadata)",
            path.display()
        )
    })
}

/// Refuses a call without the service's key (`x-tollgate-rls-key`) before
/// its message is read: `UNAUTHENTICATED`, counted in
/// `tollgate_grpc_requests_total`. With no key configured every call
/// passes.
pub struct KeyCheck<S> {
    pub(super) app: App<S>,
    pub(super) key: Option<RlsKey>,
}

impl<S> Clone for KeyCheck<S> {
    fn clone(&self) -> Self {
        Self {
            app: self.app.clone(),
            key: self.key.clone(),
        }
    }
}

impl<S> std::fmt::Debug for KeyCheck<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCheck")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<S: Store + Clone> Interceptor for KeyCheck<S> {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let Some(key) = &self.key else {
            return Ok(request);
        };
        match request.metadata().get(KEY_METADATA) {
            Some(v) if key.matches(v.as_bytes()) => {
                // Checked: the key goes no further than here.
                request.metadata_mut().remove(KEY_METADATA);
                Ok(request)
            }
            presented => {
                tracing::debug!(
                    key_sent = presented.is_some(),
                    "rate-limit service: call refused, no valid {KEY_METADATA}"
                );
                let status = ApiError::Unauthorized(format!(
                    "the rate-limit service needs the {KEY_METADATA} metadata"
                ))
                .to_status();
                self.app.metrics().grpc_request(METHOD, status.code());
                Err(status)
            }
        }
    }
}

/// The tonic server of [`RlsService`]: the key check, then messages of at
/// most [`MAX_MESSAGE_BYTES`](crate::grpc::api::MAX_MESSAGE_BYTES).
pub type RlsGrpcServer<S> = InterceptedService<RateLimitServiceServer<RlsService<S>>, KeyCheck<S>>;
