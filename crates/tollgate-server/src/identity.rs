//! Who is calling: the verified identity of a request.
//!
//! The user id that every limit is keyed by comes from here and never from a
//! field the client chose (SPEC §6). [`Verifier`] turns the `[identity]`
//! section of the config ([`IdentityConfig`]) into one of three modes:
//!
//! - **`jwt`**: `Authorization: Bearer <JWT>`, verified with the
//!   [`jsonwebtoken`] crate's pure-Rust backend. The key is an HS256 shared
//!   secret (`secret` or `secret_file`), an RS256/ES256 public key in PEM
//!   (`public_key_file`) or a JWKS file (`jwks_file`) whose keys are selected
//!   by `kid` and which is reread when it changes, so keys rotate without a
//!   restart.
//! - **`dev`**: the same, with HS256 and the well-known [`DEV_SECRET`]. Anyone
//!   can mint a token for anyone: for a laptop, never for production.
//! - **`trusted_header`**: the user id is the value of a header (default
//!   `x-tollgate-user`) set by an authenticating proxy in front of tollgate.
//!   It is only safe when that proxy overwrites the header on every request;
//!   it is never on unless the config says `mode = "trusted_header"`.
//!
//! # What a token must satisfy
//!
//! - Its header `alg` is exactly the configured algorithm (for a JWKS: RS256
//!   or ES256, as the selected key says; never an HMAC algorithm). `none`,
//!   any other algorithm, and algorithm confusion (an HS256 token whose
//!   "secret" is the RSA public key) are refused before any key is used.
//! - Its signature verifies with the configured key.
//! - It has an `exp` claim, and `now < exp + leeway`; if it has an `nbf`
//!   claim, `nbf <= now + leeway`. `now` is the injected
//!   [`Clock`] in whole seconds, never the system time;
//!   the leeway defaults to 30 s.
//! - With `issuer` configured, `iss` equals it; with `audience` configured,
//!   `aud` (a string or an array of strings) contains it. A token missing the
//!   claim is refused.
//! - The user claim (default `sub`) is a non-empty string of at most
//!   [`MAX_USER_ID_BYTES`] bytes with no control characters.
//!
//! Every failure is an [`AuthError`] whose message is safe to send to the
//! client in a 401 body: it names what is wrong with the token, never a key.
//!
//! ```
//! use std::path::Path;
//! use std::sync::Arc;
//! use tollgate_core::FakeClock;
//! use tollgate_server::identity::{IdentityConfig, Verifier};
//!
//! let clock = FakeClock::new(1_700_000_000_000);
//! let verifier = Verifier::from_config(&IdentityConfig::dev(), Path::new("."), Arc::new(clock))
//!     .expect("the dev config is valid");
//! let token = verifier.mint("alice", 3_600).expect("dev mode mints");
//! let mut headers = axum::http::HeaderMap::new();
//! headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
//! assert_eq!(verifier.verify(&headers).unwrap(), "alice");
//! ```

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use axum::http::HeaderMap;
use axum::http::HeaderValue;
use axum::http::header::{AUTHORIZATION, HeaderName};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, KeyOperations, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tollgate_core::Clock;

/// One problem in the identity config, addressed by field path (e.g.
/// `identity.secret`).
pub use tollgate_core::plan::FieldError;

/// The well-known HS256 secret of dev mode. It is public, so a server in dev
/// mode accepts a token for any user from anyone: NOT for production.
pub const DEV_SECRET: &str = "tollgate-dev-insecure-secret";

/// Clock skew tolerated on `exp` and `nbf` when `leeway_s` is not set, seconds.
pub const DEFAULT_LEEWAY_S: u64 = 30;

/// The largest accepted `leeway_s`, seconds.
pub const MAX_LEEWAY_S: u64 = 300;

/// The claim naming the user when `user_claim` is not set.
pub const DEFAULT_USER_CLAIM: &str = "sub";

/// The header of `trusted_header` mode when `header` is not set.
pub const DEFAULT_TRUSTED_HEADER: &str = "x-tollgate-user";

/// The longest accepted user id, bytes (the one id rule of core).
pub use tollgate_core::id::MAX_ID_LEN as MAX_USER_ID_BYTES;

/// The shortest accepted HS256 secret, bytes (RFC 7518 §3.2: at least the
/// hash size). The dev secret is exempt: it is public anyway.
pub const MIN_SECRET_BYTES: usize = 32;

/// The longest accepted bearer token, bytes.
pub const MAX_TOKEN_BYTES: usize = 8_192;

/// How often, at most, the JWKS file's modification time is checked, ms.
pub const JWKS_CHECK_INTERVAL_MS: u64 = 1_000;

/// The largest key file (PEM, secret or JWKS) that is read, bytes.
const MAX_KEY_FILE_BYTES: u64 = 1 << 20;

/// Claims that cannot name the user (they are set by [`Verifier::mint`] or
/// checked by the verifier).
const RESERVED_CLAIMS: [&str; 5] = ["exp", "nbf", "iat", "iss", "aud"];

/// `[identity]` in the TOML config.
///
/// `Debug` redacts `secret`; `Serialize` writes it (it is the config).
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// `"jwt"`, `"dev"` or `"trusted_header"`.
    pub mode: IdentityMode,
    /// jwt: `"HS256"`, `"RS256"` or `"ES256"`. Required unless `jwks_file` is
    /// set; with a JWKS it restricts the keys used to that algorithm (RS256 or
    /// ES256 only). dev: absent or `"HS256"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// HS256: the shared secret, at least [`MIN_SECRET_BYTES`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// HS256: a file holding the shared secret (surrounding whitespace is
    /// trimmed). Relative to the config file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    /// RS256/ES256: the public key in PEM (`-----BEGIN PUBLIC KEY-----`).
    /// Relative to the config file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key_file: Option<PathBuf>,
    /// RS256/ES256: a JWKS (`{"keys": [...]}`) whose keys are selected by the
    /// token's `kid`. Reread when its modification time changes (checked at
    /// most once a second), so keys rotate without a restart. Relative to the
    /// config file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_file: Option<PathBuf>,
    /// The required `iss` claim; absent: any issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// The audience `aud` must contain; absent: `aud` is not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf`, seconds (default 30, at most
    /// 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leeway_s: Option<u64>,
    /// The claim holding the user id (default `sub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_claim: Option<String>,
    /// trusted_header mode: the header holding the user id (default
    /// `x-tollgate-user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// jwt mode: `false` accepts tokens for any audience (logged at start).
    /// Default `true`: `audience` is then required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience_check: Option<bool>,
    /// Where a credential's scopes are: the claim (jwt and dev modes, default
    /// `scope`: a space-separated string or an array of strings) or, in
    /// trusted_header mode, the header the proxy sets (default
    /// `x-tollgate-scope`, space-separated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_claim: Option<String>,
    /// The scope a credential needs to report provider answers
    /// (`POST /v1/providers/{provider}/feedback`), a fleet-wide write
    /// (default `tollgate:feedback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback_scope: Option<String>,
    /// Where a credential's tenant is (the claim, or in trusted_header mode
    /// the header): when set, a provider permit's tenant is this verified
    /// value, and a body `tenant` that differs is refused. Absent: the body's
    /// `tenant` is taken as sent (trusted callers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_claim: Option<String>,
    /// trusted_header mode (required there): the peers whose header is
    /// believed, as CIDRs (`10.0.0.0/8`) or addresses; a request from any
    /// other peer is 401.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_proxies: Option<Vec<String>>,
}

impl IdentityConfig {
    /// A config of `mode` with every other field unset.
    pub fn new(mode: IdentityMode) -> Self {
        Self {
            mode,
            algorithm: None,
            secret: None,
            secret_file: None,
            public_key_file: None,
            jwks_file: None,
            issuer: None,
            audience: None,
            leeway_s: None,
            user_claim: None,
            header: None,
            audience_check: None,
            scope_claim: None,
            feedback_scope: None,
            tenant_claim: None,
            trusted_proxies: None,
        }
    }

    /// Dev mode with every default (the embedded development config).
    pub fn dev() -> Self {
        Self::new(IdentityMode::Dev)
    }
}

impl fmt::Debug for IdentityConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityConfig")
            .field("mode", &self.mode)
            .field("algorithm", &self.algorithm)
            .field("secret", &self.secret.as_ref().map(|_| "[redacted]"))
            .field("secret_file", &self.secret_file)
            .field("public_key_file", &self.public_key_file)
            .field("jwks_file", &self.jwks_file)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway_s", &self.leeway_s)
            .field("user_claim", &self.user_claim)
            .field("header", &self.header)
            .field("audience_check", &self.audience_check)
            .field("scope_claim", &self.scope_claim)
            .field("feedback_scope", &self.feedback_scope)
            .field("tenant_claim", &self.tenant_claim)
            .field("trusted_proxies", &self.trusted_proxies)
            .finish()
    }
}

/// How requests prove who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentityMode {
    /// A verified JWT in `Authorization: Bearer`.
    Jwt,
    /// HS256 JWTs signed with the public [`DEV_SECRET`]: development only.
    Dev,
    /// The user id from a header set by an authenticating proxy.
    TrustedHeader,
}

impl IdentityMode {
    /// The config spelling: `jwt`, `dev` or `trusted_header`.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityMode::Jwt => "jwt",
            IdentityMode::Dev => "dev",
            IdentityMode::TrustedHeader => "trusted_header",
        }
    }
}

/// Why a request has no verified identity (a 401).
///
/// The `Display` text ([`message`](AuthError::message)) is meant for the
/// client: it says what is wrong with the credentials and never includes key
/// material or server internals.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header.
    #[error("missing credentials: send `Authorization: Bearer <token>`")]
    MissingCredentials,
    /// The `Authorization` header does not use the `Bearer` scheme.
    #[error("the Authorization header must use the Bearer scheme: `Authorization: Bearer <token>`")]
    NotBearer,
    /// The credentials are not well-formed; the reason is client-safe.
    #[error("malformed credentials: {0}")]
    Malformed(&'static str),
    /// The token's `alg` is not the one this server accepts (this includes
    /// `none` and algorithm confusion).
    #[error("the token's signing algorithm is not accepted by this server")]
    AlgorithmNotAllowed,
    /// No signing key matches the token's `kid` (JWKS).
    #[error("the token's key id (kid) matches no signing key of this server")]
    UnknownKey,
    /// The signature does not verify with the configured key.
    #[error("the token signature is invalid")]
    BadSignature,
    /// The token has no `exp` claim.
    #[error("the token has no expiry (exp claim); tokens without one are refused")]
    MissingExpiry,
    /// `exp` (plus the leeway) has passed.
    #[error("the token has expired")]
    Expired,
    /// `nbf` is still in the future (beyond the leeway).
    #[error("the token is not valid yet (its nbf claim is in the future)")]
    NotYetValid,
    /// `iss` is missing or not the configured issuer.
    #[error("the token's issuer (iss claim) is not one this server trusts")]
    WrongIssuer,
    /// `aud` is missing or does not contain the configured audience.
    #[error("the token's audience (aud claim) does not include this server")]
    WrongAudience,
    /// The configured user claim is absent; holds the claim name.
    #[error("the token has no `{0}` claim naming the user")]
    MissingUserClaim(String),
    /// The user id is empty, too long, not a string or not text; the reason
    /// is client-safe.
    #[error("invalid user id: {0}")]
    InvalidUserId(&'static str),
    /// trusted_header mode: the header is absent.
    #[error("missing the identity header set by the authenticating proxy")]
    MissingTrustedHeader,
    /// The token could not be checked for a reason on the server's side (a
    /// key the crypto backend refused); details are logged, not sent.
    #[error("the token could not be verified")]
    Unverifiable,
    /// trusted_header mode: the request did not come from a trusted proxy.
    #[error("this server takes identities only from its trusted proxies")]
    UntrustedPeer,
}

impl AuthError {
    /// A clear, client-safe sentence for the 401 JSON body.
    pub fn message(&self) -> String {
        self.to_string()
    }

    /// A short stable code for logs and metrics, e.g. `token_expired`.
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::MissingCredentials => "missing_credentials",
            AuthError::NotBearer => "not_bearer",
            AuthError::Malformed(_) => "malformed_credentials",
            AuthError::AlgorithmNotAllowed => "algorithm_not_allowed",
            AuthError::UnknownKey => "unknown_key",
            AuthError::BadSignature => "bad_signature",
            AuthError::MissingExpiry => "missing_expiry",
            AuthError::Expired => "token_expired",
            AuthError::NotYetValid => "token_not_yet_valid",
            AuthError::WrongIssuer => "wrong_issuer",
            AuthError::WrongAudience => "wrong_audience",
            AuthError::MissingUserClaim(_) => "missing_user_claim",
            AuthError::InvalidUserId(_) => "invalid_user_id",
            AuthError::MissingTrustedHeader => "missing_trusted_header",
            AuthError::Unverifiable => "unverifiable_token",
            AuthError::UntrustedPeer => "untrusted_peer",
        }
    }
}

/// Why [`Verifier::mint`] could not make a token.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// This identity mode cannot mint: only HS256 modes hold a signing key.
    #[error("the {0} identity mode cannot mint tokens: {1}")]
    Unsupported(&'static str, &'static str),
    /// The user id is not acceptable (see [`MAX_USER_ID_BYTES`]).
    #[error("invalid user id: {0}")]
    InvalidUser(&'static str),
    /// The lifetime is zero or too large.
    #[error("the token lifetime must be between 1 second and 10 years")]
    InvalidTtl,
    /// Signing failed.
    #[error("signing the token failed")]
    Signing(#[source] jsonwebtoken::errors::Error),
    /// A tenant was asked for, but the config names no `tenant_claim`.
    #[error("a tenant needs `tenant_claim` in [identity]")]
    NoTenantClaim,
}

/// The default scope that lets a credential report provider answers.
pub const DEFAULT_FEEDBACK_SCOPE: &str = "tollgate:feedback";

/// The default scope claim (jwt and dev modes).
pub const DEFAULT_SCOPE_CLAIM: &str = "scope";

/// The default scope header (trusted_header mode).
pub const DEFAULT_SCOPE_HEADER: &str = "x-tollgate-scope";

/// Who a verified request is, and what its credential allows beyond
/// spending the user's own limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user id every limit is keyed by.
    pub user: String,
    /// The credential carries the feedback scope: it may report provider
    /// answers, which change the fleet's provider rates.
    pub feedback: bool,
    /// The verified tenant, when `tenant_claim` is configured and the
    /// credential carries one.
    pub tenant: Option<String>,
}

/// The longest lifetime [`Verifier::mint`] accepts, seconds (10 years).
pub const MAX_MINT_TTL_S: u64 = 10 * 366 * 24 * 3_600;

/// Verifies the identity of requests, as configured. `Send + Sync`; share it
/// in an `Arc` (or inside the application state).
pub struct Verifier {
    kind: Kind,
    clock: Arc<dyn Clock>,
}

enum Kind {
    Jwt(Box<Jwt>),
    TrustedHeader(Box<Trusted>),
}

/// trusted_header mode: which headers, believed from which peers.
struct Trusted {
    user: HeaderName,
    scope: HeaderName,
    tenant: Option<HeaderName>,
    feedback_scope: String,
    proxies: Vec<ipnet::IpNet>,
}

struct Jwt {
    source: KeySource,
    rules: ClaimRules,
    dev: bool,
}

enum KeySource {
    /// HS256 with a shared secret.
    Hmac {
        decoding: DecodingKey,
        encoding: EncodingKey,
        origin: String,
    },
    /// RS256 or ES256 with one public key.
    Public {
        alg: Algorithm,
        key: DecodingKey,
        path: PathBuf,
    },
    /// RS256/ES256 keys from a JWKS file, by `kid`.
    Jwks(JwksSource),
}

struct ClaimRules {
    issuer: Option<String>,
    audience: Option<String>,
    leeway_s: u64,
    user_claim: String,
    scope_claim: String,
    feedback_scope: String,
    tenant_claim: Option<String>,
}

impl Verifier {
    /// Validates the config and loads keys; relative file paths are resolved
    /// against `base_dir` (the config file's directory). `clock` is the wall
    /// clock `exp` and `nbf` are checked on (the system clock in production).
    ///
    /// # Errors
    ///
    /// Every problem found, each addressed by field path (`identity.secret`,
    /// `identity.public_key_file`, …): missing or conflicting fields, an
    /// unknown algorithm, a short secret, an unreadable or invalid key file, a
    /// JWKS without usable keys, an invalid header name, fields that the mode
    /// does not use.
    pub fn from_config(
        cfg: &IdentityConfig,
        base_dir: &Path,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, Vec<FieldError>> {
        let mut p = Problems::default();
        let kind = match cfg.mode {
            IdentityMode::TrustedHeader => trusted_header_kind(cfg, &mut p),
            IdentityMode::Dev => dev_kind(cfg, &mut p),
            IdentityMode::Jwt => jwt_kind(cfg, base_dir, clock.as_ref(), &mut p),
        };
        match kind {
            Some(kind) if p.0.is_empty() => Ok(Self { kind, clock }),
            _ => {
                if p.0.is_empty() {
                    p.add("mode", "the identity settings cannot be used");
                }
                Err(p.0)
            }
        }
    }

    /// The verified user id of a request, from `Authorization: Bearer <JWT>`
    /// (jwt and dev modes) or the trusted header.
    ///
    /// In JWKS mode this may stat the key file (at most once a second of the
    /// clock) and reread it when it changed: a few microseconds of blocking
    /// file I/O.
    ///
    /// # Errors
    ///
    /// Why the request has no verified identity; answer it with a 401 and
    /// [`AuthError::message`].
    pub fn verify(&self, headers: &HeaderMap) -> Result<String, AuthError> {
        self.identify(headers, None).map(|id| id.user)
    }

    /// The verified [`Identity`] of a request from `peer` (the connection's
    /// remote address; `None` when unknown, which no trusted proxy is).
    ///
    /// # Errors
    ///
    /// As [`verify`](Verifier::verify); in trusted_header mode also a peer
    /// that is not a trusted proxy ([`AuthError::UntrustedPeer`]).
    pub fn identify(
        &self,
        headers: &HeaderMap,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Identity, AuthError> {
        match &self.kind {
            Kind::TrustedHeader(t) => t.identify(headers, peer),
            Kind::Jwt(jwt) => {
                let token = bearer_token(headers)?;
                self.verify_jwt(jwt, token)
            }
        }
    }

    /// One line for the startup banner, e.g. `jwt (RS256 public key
    /// /etc/tollgate/key.pem; issuer …, audience …, user claim sub, leeway
    /// 30 s)` or `dev (HS256 with the well-known dev secret: NOT for
    /// production; …)`. Never includes a secret.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::TrustedHeader(t) => format!(
                "trusted_header (the user id is the `{}` header, which the authenticating \
                 proxy in front must set on every request and strip from clients; believed only \
                 from {})",
                t.user,
                t.proxies
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Kind::Jwt(jwt) => {
                let rules = jwt.rules.describe();
                if jwt.dev {
                    return format!(
                        "dev (HS256 with the well-known dev secret: NOT for production; {rules})"
                    );
                }
                let keys = match &jwt.source {
                    KeySource::Hmac { origin, .. } => {
                        format!("HS256 with the secret from {origin}")
                    }
                    KeySource::Public { alg, path, .. } => {
                        format!("{alg:?} public key {}", path.display())
                    }
                    KeySource::Jwks(src) => src.describe(),
                };
                format!("jwt ({keys}; {rules})")
            }
        }
    }

    /// Whether the tenant comes from the credentials (`tenant_claim` is
    /// configured).
    pub fn verifies_tenant(&self) -> bool {
        match &self.kind {
            Kind::TrustedHeader(t) => t.tenant.is_some(),
            Kind::Jwt(jwt) => jwt.rules.tenant_claim.is_some(),
        }
    }

    /// The scope that lets a credential report provider answers.
    pub fn feedback_scope(&self) -> &str {
        match &self.kind {
            Kind::TrustedHeader(t) => &t.feedback_scope,
            Kind::Jwt(jwt) => &jwt.rules.feedback_scope,
        }
    }

    /// The configured mode.
    pub fn mode(&self) -> IdentityMode {
        match &self.kind {
            Kind::TrustedHeader(_) => IdentityMode::TrustedHeader,
            Kind::Jwt(jwt) if jwt.dev => IdentityMode::Dev,
            Kind::Jwt(_) => IdentityMode::Jwt,
        }
    }

    /// Whether [`mint`](Verifier::mint) can make tokens (dev, or jwt with an
    /// HS256 secret).
    pub fn can_mint(&self) -> bool {
        matches!(&self.kind, Kind::Jwt(jwt) if matches!(jwt.source, KeySource::Hmac { .. }))
    }

    /// Mints a token for `user` valid for `ttl_s` seconds (HS256 modes only:
    /// dev, or jwt with a secret), with the configured issuer and audience,
    /// the user in the configured user claim, and `iat`/`exp` from the clock.
    ///
    /// # Errors
    ///
    /// A mode that cannot mint (public keys, JWKS, trusted_header), an
    /// invalid user id, or a lifetime of 0 or over [`MAX_MINT_TTL_S`].
    pub fn mint(&self, user: &str, ttl_s: u64) -> Result<String, MintError> {
        self.mint_with(user, ttl_s, &[], None)
    }

    /// As [`mint`](Verifier::mint), with `scopes` in the scope claim (space
    /// separated) and `tenant` in the tenant claim (when one is configured).
    ///
    /// # Errors
    ///
    /// As [`mint`](Verifier::mint); also a tenant when no `tenant_claim` is
    /// configured.
    pub fn mint_with(
        &self,
        user: &str,
        ttl_s: u64,
        scopes: &[String],
        tenant: Option<&str>,
    ) -> Result<String, MintError> {
        let jwt = match &self.kind {
            Kind::Jwt(jwt) => jwt,
            Kind::TrustedHeader(_) => {
                return Err(MintError::Unsupported(
                    "trusted_header",
                    "the authenticating proxy in front identifies users",
                ));
            }
        };
        let KeySource::Hmac { encoding, .. } = &jwt.source else {
            return Err(MintError::Unsupported(
                "jwt (public key)",
                "only the identity provider holding the private key can issue tokens",
            ));
        };
        check_user_id(user).map_err(MintError::InvalidUser)?;
        if ttl_s == 0 || ttl_s > MAX_MINT_TTL_S {
            return Err(MintError::InvalidTtl);
        }
        let now_s = self.clock.now_ms() / 1_000;
        let mut claims = Map::new();
        claims.insert(jwt.rules.user_claim.clone(), Value::from(user));
        claims.insert("iat".to_owned(), Value::from(now_s));
        claims.insert("exp".to_owned(), Value::from(now_s.saturating_add(ttl_s)));
        if let Some(iss) = &jwt.rules.issuer {
            claims.insert("iss".to_owned(), Value::from(iss.as_str()));
        }
        if let Some(aud) = &jwt.rules.audience {
            claims.insert("aud".to_owned(), Value::from(aud.as_str()));
        }
        if !scopes.is_empty() {
            claims.insert(jwt.rules.scope_claim.clone(), Value::from(scopes.join(" ")));
        }
        if let Some(tenant) = tenant {
            let Some(claim) = &jwt.rules.tenant_claim else {
                return Err(MintError::NoTenantClaim);
            };
            claims.insert(claim.clone(), Value::from(tenant));
        }
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, encoding)
            .map_err(MintError::Signing)
    }

    fn verify_jwt(&self, jwt: &Jwt, token: &str) -> Result<Identity, AuthError> {
        let head = TokenHead::read(token)?;
        let now_ms = self.clock.now_ms();
        let claims = match &jwt.source {
            KeySource::Hmac { decoding, .. } => {
                let alg = head.allowed(&[Algorithm::HS256])?;
                decode_claims(token, decoding, alg)?
            }
            KeySource::Public { alg, key, .. } => {
                let alg = head.allowed(&[*alg])?;
                decode_claims(token, key, alg)?
            }
            KeySource::Jwks(src) => {
                let alg = head.allowed(src.algorithms())?;
                let set = src.current(now_ms);
                let key = set.find(head.kid.as_deref()).ok_or(AuthError::UnknownKey)?;
                if key.alg != alg {
                    return Err(AuthError::AlgorithmNotAllowed);
                }
                decode_claims(token, &key.key, alg)?
            }
        };
        jwt.rules.check(&claims, now_ms / 1_000)
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("mode", &self.mode())
            .field("describe", &self.describe())
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------
// Requests

/// The token of `Authorization: Bearer <token>`.
fn bearer_token(headers: &HeaderMap) -> Result<&str, AuthError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(AuthError::MissingCredentials);
    };
    if values.next().is_some() {
        return Err(AuthError::Malformed("more than one Authorization header"));
    }
    let value = value
        .to_str()
        .map_err(|_| AuthError::Malformed("the Authorization header is not plain ASCII text"))?
        .trim();
    let (scheme, rest) = match value.split_once(' ') {
        Some((scheme, rest)) => (scheme, rest),
        None => (value, ""),
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::NotBearer);
    }
    let token = rest.trim();
    if token.is_empty() {
        return Err(AuthError::Malformed("the bearer token is empty"));
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(AuthError::Malformed(
            "the bearer token is longer than 8192 bytes",
        ));
    }
    Ok(token)
}

impl Trusted {
    /// The identity of trusted_header mode: the headers, if `peer` is a
    /// trusted proxy.
    fn identify(
        &self,
        headers: &HeaderMap,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Identity, AuthError> {
        let trusted = peer.is_some_and(|ip| {
            let ip = ip.to_canonical();
            self.proxies.iter().any(|net| net.contains(&ip))
        });
        if !trusted {
            return Err(AuthError::UntrustedPeer);
        }
        let user = one_header(headers, &self.user)?.ok_or(AuthError::MissingTrustedHeader)?;
        let user = std::str::from_utf8(user.as_bytes())
            .map_err(|_| AuthError::InvalidUserId("it is not valid UTF-8"))?;
        check_user_id(user).map_err(AuthError::InvalidUserId)?;
        let feedback = match one_header(headers, &self.scope)? {
            Some(v) => header_text(v)?.split(' ').any(|s| s == self.feedback_scope),
            None => false,
        };
        let tenant = match &self.tenant {
            None => None,
            Some(name) => match one_header(headers, name)? {
                Some(v) => Some(header_text(v)?.to_owned()),
                None => None,
            },
        };
        Ok(Identity {
            user: user.to_owned(),
            feedback,
            tenant,
        })
    }
}

fn header_text(v: &HeaderValue) -> Result<&str, AuthError> {
    std::str::from_utf8(v.as_bytes())
        .map_err(|_| AuthError::Malformed("an identity header is not valid UTF-8"))
}

/// A header's one value; `None` when absent, an error when repeated.
fn one_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h HeaderValue>, AuthError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(AuthError::Malformed(
            "an identity header appears more than once",
        ));
    }
    Ok(Some(value))
}

/// A user id follows the one id rule ([`tollgate_core::id::check_id`]):
/// non-empty, at most [`MAX_USER_ID_BYTES`] bytes, free of control
/// characters (it ends up in store keys and logs).
fn check_user_id(user: &str) -> Result<(), &'static str> {
    use tollgate_core::id::IdError;
    tollgate_core::id::check_id(user).map_err(|e| match e {
        IdError::Empty => "it is empty",
        IdError::TooLong => "it is longer than 512 bytes",
        _ => "it contains control characters",
    })
}

/// What is read from a token's header before any key is chosen.
struct TokenHead {
    alg: String,
    kid: Option<String>,
}

impl TokenHead {
    fn read(token: &str) -> Result<Self, AuthError> {
        let mut parts = token.split('.');
        let (Some(head), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(AuthError::Malformed(
                "not a JWT: expected three dot-separated base64url parts",
            ));
        };
        if !is_b64url(payload) || !is_b64url(signature) {
            return Err(AuthError::Malformed("a part of the token is not base64url"));
        }
        let bytes =
            b64url_decode(head).ok_or(AuthError::Malformed("the token header is not base64url"))?;
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|_| AuthError::Malformed("the token header is not JSON"))?;
        let Value::Object(fields) = value else {
            return Err(AuthError::Malformed(
                "the token header is not a JSON object",
            ));
        };
        let alg = match fields.get("alg") {
            Some(Value::String(alg)) => alg.clone(),
            _ => return Err(AuthError::Malformed("the token header has no alg")),
        };
        let kid = match fields.get("kid") {
            None | Some(Value::Null) => None,
            Some(Value::String(kid)) => Some(kid.clone()),
            Some(_) => return Err(AuthError::Malformed("the token's kid is not a string")),
        };
        Ok(Self { alg, kid })
    }

    /// The header's algorithm if it is one of `allowed` (exact spelling).
    fn allowed(&self, allowed: &[Algorithm]) -> Result<Algorithm, AuthError> {
        allowed
            .iter()
            .copied()
            .find(|a| alg_name(*a) == self.alg)
            .ok_or(AuthError::AlgorithmNotAllowed)
    }
}

fn alg_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::HS256 => "HS256",
        Algorithm::RS256 => "RS256",
        Algorithm::ES256 => "ES256",
        _ => "unsupported",
    }
}

/// Checks the signature with `key` for exactly `alg` and returns the claims.
/// Time, issuer and audience are checked by [`ClaimRules::check`] on the
/// injected clock, so the crate's own checks (which read the system time) are
/// all off.
fn decode_claims(
    token: &str,
    key: &DecodingKey,
    alg: Algorithm,
) -> Result<Map<String, Value>, AuthError> {
    let mut validation = Validation::new(alg);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.leeway = 0;
    jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation)
        .map(|data| data.claims)
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidSignature => AuthError::BadSignature,
            ErrorKind::InvalidAlgorithm
            | ErrorKind::MissingAlgorithm
            | ErrorKind::InvalidAlgorithmName => AuthError::AlgorithmNotAllowed,
            ErrorKind::InvalidToken => {
                AuthError::Malformed("not a JWT: expected three dot-separated base64url parts")
            }
            ErrorKind::Base64(_) => AuthError::Malformed("a part of the token is not base64url"),
            ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
                AuthError::Malformed("the token header or claims are not a valid JSON object")
            }
            _ => {
                tracing::warn!(error = %e, "a token could not be verified with the configured key");
                AuthError::Unverifiable
            }
        })
}

/// A NumericDate claim in whole seconds: `exp` rounds a fraction down and
/// `nbf` up, so neither gains time.
fn numeric_date(value: &Value, round_up: bool) -> Option<u64> {
    if let Some(n) = value.as_u64() {
        return Some(n);
    }
    let f = value.as_f64()?;
    if !(f.is_finite() && (0.0..1.8e19).contains(&f)) {
        return None;
    }
    let whole = if round_up { f.ceil() } else { f.floor() };
    Some(whole as u64)
}

impl ClaimRules {
    fn check(&self, claims: &Map<String, Value>, now_s: u64) -> Result<Identity, AuthError> {
        let exp = match claims.get("exp") {
            None | Some(Value::Null) => return Err(AuthError::MissingExpiry),
            Some(v) => numeric_date(v, false).ok_or(AuthError::Malformed(
                "the exp claim is not a number of seconds",
            ))?,
        };
        if now_s >= exp.saturating_add(self.leeway_s) {
            return Err(AuthError::Expired);
        }
        match claims.get("nbf") {
            None | Some(Value::Null) => {}
            Some(v) => {
                let nbf = numeric_date(v, true).ok_or(AuthError::Malformed(
                    "the nbf claim is not a number of seconds",
                ))?;
                if nbf > now_s.saturating_add(self.leeway_s) {
                    return Err(AuthError::NotYetValid);
                }
            }
        }
        if let Some(issuer) = &self.issuer {
            match claims.get("iss") {
                Some(Value::String(iss)) if iss == issuer => {}
                _ => return Err(AuthError::WrongIssuer),
            }
        }
        if let Some(audience) = &self.audience {
            let ok = match claims.get("aud") {
                Some(Value::String(aud)) => aud == audience,
                Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(audience)),
                _ => false,
            };
            if !ok {
                return Err(AuthError::WrongAudience);
            }
        }
        let user = match claims.get(&self.user_claim) {
            None | Some(Value::Null) => {
                return Err(AuthError::MissingUserClaim(self.user_claim.clone()));
            }
            Some(Value::String(user)) => {
                check_user_id(user).map_err(AuthError::InvalidUserId)?;
                user.clone()
            }
            Some(_) => return Err(AuthError::InvalidUserId("the user claim is not a string")),
        };
        let feedback = match claims.get(&self.scope_claim) {
            Some(Value::String(scopes)) => scopes.split(' ').any(|s| s == self.feedback_scope),
            Some(Value::Array(scopes)) => scopes
                .iter()
                .any(|s| s.as_str() == Some(self.feedback_scope.as_str())),
            _ => false,
        };
        let tenant = match self.tenant_claim.as_ref().and_then(|c| claims.get(c)) {
            None | Some(Value::Null) => None,
            Some(Value::String(t)) => Some(t.clone()),
            Some(_) => return Err(AuthError::Malformed("the tenant claim is not a string")),
        };
        Ok(Identity {
            user,
            feedback,
            tenant,
        })
    }

    fn describe(&self) -> String {
        let issuer = match &self.issuer {
            Some(iss) => format!("issuer {iss}"),
            None => "any issuer".to_owned(),
        };
        let audience = match &self.audience {
            Some(aud) => format!("audience {aud}"),
            None => "audience not checked".to_owned(),
        };
        format!(
            "{issuer}, {audience}, user claim {}, leeway {} s",
            self.user_claim, self.leeway_s
        )
    }
}

// ---------------------------------------------------------------------------
// JWKS

struct JwksSource {
    path: PathBuf,
    /// The configured `algorithm`, if any: only keys of it are used.
    only: Option<Algorithm>,
    keys: RwLock<Arc<KeySet>>,
    stamp: Mutex<Option<FileStamp>>,
    last_check_ms: AtomicU64,
}

struct KeySet {
    keys: Vec<JwksKey>,
    skipped: usize,
}

struct JwksKey {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// What tells a changed file: modification time, length and (on Unix) inode,
/// so an atomic rename is seen even within one mtime tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp_of(path: &Path) -> std::io::Result<FileStamp> {
    let meta = std::fs::metadata(path)?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Ok(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode,
    })
}

impl KeySet {
    /// The key for `kid`; a token without a `kid` may use the only key.
    fn find(&self, kid: Option<&str>) -> Option<&JwksKey> {
        match kid {
            Some(kid) => self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            None if self.keys.len() == 1 => self.keys.first(),
            None => None,
        }
    }
}

impl JwksSource {
    fn load(path: PathBuf, only: Option<Algorithm>, now_ms: u64) -> Result<Self, Vec<String>> {
        let stamp = stamp_of(&path).ok();
        let set = load_jwks(&path, only)?;
        Ok(Self {
            path,
            only,
            keys: RwLock::new(Arc::new(set)),
            stamp: Mutex::new(stamp),
            last_check_ms: AtomicU64::new(now_ms),
        })
    }

    fn algorithms(&self) -> &'static [Algorithm] {
        match self.only {
            Some(Algorithm::RS256) => &[Algorithm::RS256],
            Some(Algorithm::ES256) => &[Algorithm::ES256],
            _ => &[Algorithm::RS256, Algorithm::ES256],
        }
    }

    /// The current keys, rereading the file first if it is time to check and
    /// it changed. Only one caller checks at a time; the others use the keys
    /// they find. A file that fails to load keeps the previous keys.
    fn current(&self, now_ms: u64) -> Arc<KeySet> {
        let last = self.last_check_ms.load(Ordering::Acquire);
        let due = now_ms < last || now_ms - last >= JWKS_CHECK_INTERVAL_MS;
        if due
            && self
                .last_check_ms
                .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.reload_if_changed();
        }
        self.keys.read().clone()
    }

    fn reload_if_changed(&self) {
        let mut seen = self.stamp.lock();
        let stamp = match stamp_of(&self.path) {
            Ok(stamp) => stamp,
            Err(e) => {
                if seen.take().is_some() {
                    tracing::warn!(path = %self.path.display(), error = %e,
                        "cannot read the JWKS file; keeping its previous keys");
                }
                return;
            }
        };
        if *seen == Some(stamp) {
            return;
        }
        // Recorded before reading: a write after this point changes the
        // stamp again and is picked up at the next check.
        *seen = Some(stamp);
        match load_jwks(&self.path, self.only) {
            Ok(set) => {
                tracing::info!(path = %self.path.display(), keys = set.keys.len(),
                    skipped = set.skipped, "reloaded the JWKS file");
                *self.keys.write() = Arc::new(set);
            }
            Err(problems) => {
                tracing::warn!(path = %self.path.display(), problems = %problems.join("; "),
                    "the changed JWKS file is invalid; keeping its previous keys");
            }
        }
    }

    fn describe(&self) -> String {
        let set = self.keys.read().clone();
        let mut algs: Vec<&str> = set.keys.iter().map(|k| alg_name(k.alg)).collect();
        algs.sort_unstable();
        algs.dedup();
        let skipped = if set.skipped > 0 {
            format!(", {} unusable skipped", set.skipped)
        } else {
            String::new()
        };
        format!(
            "JWKS {}: {} key(s) ({}{skipped}), reread when it changes",
            self.path.display(),
            set.keys.len(),
            algs.join(", ")
        )
    }
}

/// Reads a JWKS: every usable RS256/ES256 signing key, skipping keys of other
/// types or uses (an identity provider's JWKS may hold encryption keys). A
/// usable key that is broken, a duplicate `kid`, or no usable key at all
/// rejects the file.
fn load_jwks(path: &Path, only: Option<Algorithm>) -> Result<KeySet, Vec<String>> {
    let bytes = read_capped(path).map_err(|e| vec![e])?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| vec![format!("{} is not valid JSON: {e}", path.display())])?;
    let Some(Value::Array(raw_keys)) = value.get("keys") else {
        return Err(vec![format!(
            "{} is not a JWKS: expected an object with a \"keys\" array",
            path.display()
        )]);
    };
    let mut problems = Vec::new();
    let mut skipped_reasons = Vec::new();
    let mut keys: Vec<JwksKey> = Vec::new();
    for (i, raw) in raw_keys.iter().enumerate() {
        let label = match raw.get("kid").and_then(Value::as_str) {
            Some(kid) => format!("keys[{i}] (kid {kid:?})"),
            None => format!("keys[{i}]"),
        };
        match jwks_key(raw, only) {
            Ok(key) => {
                if key.kid.is_some() && keys.iter().any(|k| k.kid == key.kid) {
                    problems.push(format!("{label}: duplicate kid"));
                } else {
                    keys.push(key);
                }
            }
            Err(Usable::Skip(reason)) => skipped_reasons.push(format!("{label}: {reason}")),
            Err(Usable::Broken(reason)) => problems.push(format!("{label}: {reason}")),
        }
    }
    if !skipped_reasons.is_empty() {
        tracing::warn!(path = %path.display(), skipped = %skipped_reasons.join("; "),
            "JWKS keys that cannot verify RS256/ES256 tokens are ignored");
    }
    if keys.is_empty() && problems.is_empty() {
        let wanted = match only {
            Some(alg) => alg_name(alg),
            None => "RS256 or ES256",
        };
        let mut reason = format!("{} has no usable {wanted} signing key", path.display());
        if !skipped_reasons.is_empty() {
            reason.push_str(&format!(" (skipped: {})", skipped_reasons.join("; ")));
        }
        problems.push(reason);
    }
    if problems.is_empty() {
        Ok(KeySet {
            keys,
            skipped: skipped_reasons.len(),
        })
    } else {
        Err(problems)
    }
}

enum Usable {
    /// Not a key this server uses (another type, algorithm or use).
    Skip(String),
    /// A key this server would use, but it is broken.
    Broken(String),
}

fn jwks_key(raw: &Value, only: Option<Algorithm>) -> Result<JwksKey, Usable> {
    let jwk = Jwk::deserialize(raw)
        .map_err(|_| Usable::Skip("not an RSA or EC public key in JWK form".to_owned()))?;
    if let Some(public_use) = &jwk.common.public_key_use
        && *public_use != PublicKeyUse::Signature
    {
        return Err(Usable::Skip(
            "not a signing key (use is not \"sig\")".to_owned(),
        ));
    }
    if let Some(ops) = &jwk.common.key_operations
        && !ops.contains(&KeyOperations::Verify)
    {
        return Err(Usable::Skip(
            "key_ops does not include \"verify\"".to_owned(),
        ));
    }
    let declared = jwk.common.key_algorithm;
    let (alg, key) = match &jwk.algorithm {
        AlgorithmParameters::RSA(rsa) => {
            if !matches!(declared, None | Some(KeyAlgorithm::RS256)) {
                return Err(Usable::Skip(format!(
                    "an RSA key for {}, not RS256",
                    declared.map_or_else(String::new, |a| a.to_string())
                )));
            }
            let n = b64url_decode(&rsa.n)
                .ok_or_else(|| Usable::Broken("n is not base64url".to_owned()))?;
            let e = b64url_decode(&rsa.e)
                .ok_or_else(|| Usable::Broken("e is not base64url".to_owned()))?;
            check_rsa_public(&n, &e).map_err(Usable::Broken)?;
            let key = DecodingKey::from_rsa_components(&rsa.n, &rsa.e)
                .map_err(|_| Usable::Broken("invalid RSA components".to_owned()))?;
            (Algorithm::RS256, key)
        }
        AlgorithmParameters::EllipticCurve(ec) => {
            if ec.curve != EllipticCurve::P256 {
                return Err(Usable::Skip(
                    "an EC key on another curve than P-256 (ES256)".to_owned(),
                ));
            }
            if !matches!(declared, None | Some(KeyAlgorithm::ES256)) {
                return Err(Usable::Skip(
                    "a P-256 key not declared for ES256".to_owned(),
                ));
            }
            let key = DecodingKey::from_ec_components(&ec.x, &ec.y)
                .map_err(|_| Usable::Broken("x or y is not base64url".to_owned()))?;
            check_ec_public(&key).map_err(Usable::Broken)?;
            (Algorithm::ES256, key)
        }
        AlgorithmParameters::OctetKey(_) => {
            return Err(Usable::Skip(
                "a symmetric (oct) key: HMAC tokens are never accepted with a JWKS".to_owned(),
            ));
        }
        AlgorithmParameters::OctetKeyPair(_) => {
            return Err(Usable::Skip("an OKP (EdDSA) key: not supported".to_owned()));
        }
    };
    if only.is_some_and(|o| o != alg) {
        return Err(Usable::Skip(format!(
            "an {} key, but identity.algorithm restricts keys to {}",
            alg_name(alg),
            only.map_or("", alg_name)
        )));
    }
    Ok(JwksKey {
        kid: jwk.common.key_id.clone(),
        alg,
        key,
    })
}

// ---------------------------------------------------------------------------
// Keys

/// An RSA public key is 2048 to 4096 bits (the backend refuses larger ones at
/// verification time) with a sane odd exponent.
fn check_rsa_public(n: &[u8], e: &[u8]) -> Result<(), String> {
    let bits = bit_len(n);
    if !(2_048..=4_096).contains(&bits) {
        return Err(format!(
            "the RSA modulus is {bits} bits; 2048 to 4096 bits are accepted"
        ));
    }
    let e = strip_zeros(e);
    let exponent = if e.len() <= 5 {
        e.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
    } else {
        0
    };
    if !(3..(1 << 33)).contains(&exponent) || exponent.is_multiple_of(2) {
        return Err("the RSA public exponent is not valid".to_owned());
    }
    Ok(())
}

/// An EC key parses as a P-256 point (the backend's ES256 verifier accepts it).
fn check_ec_public(key: &DecodingKey) -> Result<(), String> {
    jsonwebtoken::crypto::verify("", b"", key, Algorithm::ES256)
        .map(|_| ())
        .map_err(|_| "not a valid P-256 (ES256) public key".to_owned())
}

fn strip_zeros(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    &bytes[start..]
}

fn bit_len(bytes: &[u8]) -> usize {
    let bytes = strip_zeros(bytes);
    match bytes.first() {
        None => 0,
        Some(first) => bytes.len() * 8 - first.leading_zeros() as usize,
    }
}

/// One DER element: `(tag, contents, rest)`.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return None;
        }
        let (len_bytes, after) = (rest.get(..count)?, rest.get(count..)?);
        rest = after;
        len_bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b))
    };
    Some((tag, rest.get(..len)?, rest.get(len..)?))
}

/// `(n, e)` of a PKCS#1 `RSAPublicKey`: `SEQUENCE { INTEGER n, INTEGER e }`.
fn rsa_public_der(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let (tag, seq, rest) = der_element(der)?;
    if tag != 0x30 || !rest.is_empty() {
        return None;
    }
    let (tag_n, n, rest) = der_element(seq)?;
    let (tag_e, e, rest) = der_element(rest)?;
    (tag_n == 0x02 && tag_e == 0x02 && rest.is_empty()).then_some((n, e))
}

fn load_public_key(path: &Path, alg: Algorithm) -> Result<DecodingKey, String> {
    let pem = read_capped(path)?;
    let shown = path.display();
    if pem.windows(11).any(|w| w == b"PRIVATE KEY") {
        return Err(format!(
            "{shown} holds a private key; give the public key only \
             (openssl pkey -in private.pem -pubout -out public.pem)"
        ));
    }
    match alg {
        Algorithm::RS256 => {
            let key = DecodingKey::from_rsa_pem(&pem).map_err(|_| {
                format!("{shown} is not an RSA public key in PEM (-----BEGIN PUBLIC KEY-----)")
            })?;
            let (n, e) = rsa_public_der(key.as_bytes())
                .ok_or_else(|| format!("{shown} is not an RSA public key"))?;
            check_rsa_public(n, e).map_err(|r| format!("{shown}: {r}"))?;
            Ok(key)
        }
        Algorithm::ES256 => {
            let key = DecodingKey::from_ec_pem(&pem).map_err(|_| {
                format!("{shown} is not an EC public key in PEM (-----BEGIN PUBLIC KEY-----)")
            })?;
            check_ec_public(&key).map_err(|r| format!("{shown}: {r}"))?;
            Ok(key)
        }
        _ => Err("unsupported algorithm".to_owned()),
    }
}

/// Reads a key file of at most [`MAX_KEY_FILE_BYTES`].
fn read_capped(path: &Path) -> Result<Vec<u8>, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(format!("{} is larger than 1 MiB", path.display()));
    }
    Ok(bytes)
}

/// Whether `part` uses only the base64url alphabet (no padding).
fn is_b64url(part: &str) -> bool {
    part.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Decodes unpadded base64url (RFC 4648 §5), refusing padding, other
/// alphabets and non-canonical trailing bits.
fn b64url_decode(input: &str) -> Option<Vec<u8>> {
    if input.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(input.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits: u32 = 0;
    for b in input.bytes() {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (acc == 0).then_some(out)
}

// ---------------------------------------------------------------------------
// Config validation

#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn add(&mut self, field: &str, reason: impl Into<String>) {
        self.0.push(FieldError {
            path: format!("identity.{field}"),
            reason: reason.into(),
        });
    }

    /// Reports each field of `fields` that is set as unused by `why`.
    fn unused(&mut self, fields: &[(&str, bool)], why: &str) {
        for (field, set) in fields {
            if *set {
                self.add(field, format!("not used {why}"));
            }
        }
    }
}

fn resolve(base_dir: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base_dir.join(path)
    }
}

fn trusted_header_kind(cfg: &IdentityConfig, p: &mut Problems) -> Option<Kind> {
    p.unused(
        &[
            ("algorithm", cfg.algorithm.is_some()),
            ("secret", cfg.secret.is_some()),
            ("secret_file", cfg.secret_file.is_some()),
            ("public_key_file", cfg.public_key_file.is_some()),
            ("jwks_file", cfg.jwks_file.is_some()),
            ("issuer", cfg.issuer.is_some()),
            ("audience", cfg.audience.is_some()),
            ("leeway_s", cfg.leeway_s.is_some()),
            ("user_claim", cfg.user_claim.is_some()),
            ("audience_check", cfg.audience_check.is_some()),
        ],
        "in trusted_header mode (the proxy in front verifies identity)",
    );
    let header = |field: &str, name: &str, p: &mut Problems| {
        if name.is_empty() {
            p.add(field, "must not be empty");
            return None;
        }
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(header) => Some(header),
            Err(_) => {
                p.add(field, format!("{name:?} is not a valid HTTP header name"));
                None
            }
        }
    };
    let user = header(
        "header",
        cfg.header.as_deref().unwrap_or(DEFAULT_TRUSTED_HEADER),
        p,
    );
    let scope = header(
        "scope_claim",
        cfg.scope_claim.as_deref().unwrap_or(DEFAULT_SCOPE_HEADER),
        p,
    );
    let tenant = cfg
        .tenant_claim
        .as_deref()
        .map(|name| header("tenant_claim", name, p));
    let feedback_scope = feedback_scope(cfg, p);
    let mut proxies = Vec::new();
    match &cfg.trusted_proxies {
        None => p.add(
            "trusted_proxies",
            "required in trusted_header mode: the addresses (CIDRs) of the proxies that set the \
             identity header; a request from any other peer is refused",
        ),
        Some(list) if list.is_empty() => p.add(
            "trusted_proxies",
            "must name at least one proxy address or CIDR",
        ),
        Some(list) => {
            for (i, raw) in list.iter().enumerate() {
                let parsed = raw.parse::<ipnet::IpNet>().or_else(|_| {
                    raw.parse::<std::net::IpAddr>()
                        .map(|ip| ipnet::IpNet::from(ip.to_canonical()))
                });
                match parsed {
                    Ok(net) => proxies.push(net.trunc()),
                    Err(_) => p.add(
                        &format!("trusted_proxies[{i}]"),
                        format!("{raw:?} is not an IP address or CIDR (e.g. 10.0.0.0/8)"),
                    ),
                }
            }
        }
    }
    let (user, scope) = (user?, scope?);
    let tenant = match tenant {
        None => None,
        Some(t) => Some(t?),
    };
    Some(Kind::TrustedHeader(Box::new(Trusted {
        user,
        scope,
        tenant,
        feedback_scope,
        proxies,
    })))
}

fn feedback_scope(cfg: &IdentityConfig, p: &mut Problems) -> String {
    let scope = cfg
        .feedback_scope
        .clone()
        .unwrap_or_else(|| DEFAULT_FEEDBACK_SCOPE.to_owned());
    if scope.is_empty() || scope.contains(' ') {
        p.add(
            "feedback_scope",
            "must be one scope: non-empty, without spaces",
        );
    }
    scope
}

fn dev_kind(cfg: &IdentityConfig, p: &mut Problems) -> Option<Kind> {
    p.unused(
        &[
            ("secret", cfg.secret.is_some()),
            ("secret_file", cfg.secret_file.is_some()),
            ("public_key_file", cfg.public_key_file.is_some()),
            ("jwks_file", cfg.jwks_file.is_some()),
        ],
        "in dev mode (it always uses the well-known dev secret; use mode = \"jwt\" for your own keys)",
    );
    p.unused(
        &[
            ("header", cfg.header.is_some()),
            ("trusted_proxies", cfg.trusted_proxies.is_some()),
        ],
        "in dev mode (only in trusted_header mode)",
    );
    p.unused(
        &[("audience_check", cfg.audience_check.is_some())],
        "in dev mode (it checks the audience only when `audience` is set)",
    );
    match cfg.algorithm.as_deref() {
        None | Some("HS256") => {}
        Some(other) => p.add(
            "algorithm",
            format!("dev mode is HS256 only, not {other:?}"),
        ),
    }
    let rules = claim_rules(cfg, p);
    Some(Kind::Jwt(Box::new(Jwt {
        source: hmac_source(DEV_SECRET.as_bytes(), "the built-in dev secret".to_owned()),
        rules,
        dev: true,
    })))
}

fn hmac_source(secret: &[u8], origin: String) -> KeySource {
    KeySource::Hmac {
        decoding: DecodingKey::from_secret(secret),
        encoding: EncodingKey::from_secret(secret),
        origin,
    }
}

fn claim_rules(cfg: &IdentityConfig, p: &mut Problems) -> ClaimRules {
    let leeway_s = match cfg.leeway_s {
        Some(v) if v > MAX_LEEWAY_S => {
            p.add(
                "leeway_s",
                format!(
                    "at most {MAX_LEEWAY_S} seconds (a long leeway keeps expired tokens valid)"
                ),
            );
            DEFAULT_LEEWAY_S
        }
        Some(v) => v,
        None => DEFAULT_LEEWAY_S,
    };
    for (field, value, absent) in [
        ("issuer", &cfg.issuer, "any issuer"),
        ("audience", &cfg.audience, "no audience check"),
    ] {
        if value.as_deref().is_some_and(str::is_empty) {
            p.add(
                field,
                format!("must not be empty (leave it out for {absent})"),
            );
        }
    }
    let user_claim = cfg
        .user_claim
        .clone()
        .unwrap_or_else(|| DEFAULT_USER_CLAIM.to_owned());
    if user_claim.is_empty() {
        p.add("user_claim", "must not be empty");
    } else if RESERVED_CLAIMS.contains(&user_claim.as_str()) {
        p.add(
            "user_claim",
            format!("{user_claim:?} is a registered claim that cannot name the user"),
        );
    }
    let scope_claim = cfg
        .scope_claim
        .clone()
        .unwrap_or_else(|| DEFAULT_SCOPE_CLAIM.to_owned());
    for (field, claim) in [
        ("scope_claim", Some(&scope_claim)),
        ("tenant_claim", cfg.tenant_claim.as_ref()),
    ] {
        let Some(claim) = claim else { continue };
        if claim.is_empty() {
            p.add(field, "must not be empty");
        } else if RESERVED_CLAIMS.contains(&claim.as_str()) || *claim == user_claim {
            p.add(
                field,
                format!("{claim:?} is the user claim or a registered claim"),
            );
        }
    }
    ClaimRules {
        issuer: cfg.issuer.clone(),
        audience: cfg.audience.clone(),
        leeway_s,
        user_claim,
        scope_claim,
        feedback_scope: feedback_scope(cfg, p),
        tenant_claim: cfg.tenant_claim.clone(),
    }
}

fn jwt_kind(
    cfg: &IdentityConfig,
    base_dir: &Path,
    clock: &dyn Clock,
    p: &mut Problems,
) -> Option<Kind> {
    p.unused(
        &[
            ("header", cfg.header.is_some()),
            ("trusted_proxies", cfg.trusted_proxies.is_some()),
        ],
        "in jwt mode (only in trusted_header mode)",
    );
    match (&cfg.audience, cfg.audience_check) {
        (None, None | Some(true)) => p.add(
            "audience",
            "required in jwt mode: the `aud` your identity provider issues tokens for tollgate \
             with (or set audience_check = false to accept tokens meant for any service)",
        ),
        (Some(_), Some(false)) => p.add(
            "audience_check",
            "false contradicts `audience`: remove one of them",
        ),
        _ => {}
    }
    let rules = claim_rules(cfg, p);
    let has_secret = cfg.secret.is_some() || cfg.secret_file.is_some();
    let source = match cfg.algorithm.as_deref() {
        Some("HS256") => {
            p.unused(
                &[
                    ("public_key_file", cfg.public_key_file.is_some()),
                    ("jwks_file", cfg.jwks_file.is_some()),
                ],
                "with HS256 (only with RS256 or ES256)",
            );
            load_secret(cfg, base_dir, p)
        }
        Some(name @ ("RS256" | "ES256")) => {
            let alg = if name == "RS256" {
                Algorithm::RS256
            } else {
                Algorithm::ES256
            };
            p.unused(
                &[
                    ("secret", cfg.secret.is_some()),
                    ("secret_file", cfg.secret_file.is_some()),
                ],
                &format!("with {name} (only with HS256)"),
            );
            match (&cfg.public_key_file, &cfg.jwks_file) {
                (Some(_), Some(_)) => {
                    p.add(
                        "jwks_file",
                        "set either public_key_file or jwks_file, not both",
                    );
                    None
                }
                (Some(file), None) => {
                    let path = resolve(base_dir, file);
                    match load_public_key(&path, alg) {
                        Ok(key) => Some(KeySource::Public { alg, key, path }),
                        Err(reason) => {
                            p.add("public_key_file", reason);
                            None
                        }
                    }
                }
                (None, Some(file)) => load_jwks_source(base_dir, file, Some(alg), clock, p),
                (None, None) => {
                    p.add(
                        "public_key_file",
                        format!("required with {name} (or set jwks_file)"),
                    );
                    None
                }
            }
        }
        Some(other) => {
            p.add(
                "algorithm",
                format!(
                    "unsupported algorithm {other:?}: expected \"HS256\", \"RS256\" or \"ES256\""
                ),
            );
            None
        }
        None => match &cfg.jwks_file {
            Some(file) => {
                p.unused(
                    &[
                        ("secret", cfg.secret.is_some()),
                        ("secret_file", cfg.secret_file.is_some()),
                        ("public_key_file", cfg.public_key_file.is_some()),
                    ],
                    "with jwks_file (the JWKS holds the keys)",
                );
                load_jwks_source(base_dir, file, None, clock, p)
            }
            None => {
                let hint = if has_secret {
                    "required: \"HS256\" for secret/secret_file"
                } else if cfg.public_key_file.is_some() {
                    "required: \"RS256\" or \"ES256\" for public_key_file"
                } else {
                    "required: \"HS256\" (with secret or secret_file), or \"RS256\"/\"ES256\" \
                     (with public_key_file or jwks_file)"
                };
                p.add("algorithm", hint);
                None
            }
        },
    };
    source.map(|source| {
        Kind::Jwt(Box::new(Jwt {
            source,
            rules,
            dev: false,
        }))
    })
}

fn load_secret(cfg: &IdentityConfig, base_dir: &Path, p: &mut Problems) -> Option<KeySource> {
    let (field, secret, origin) = match (&cfg.secret, &cfg.secret_file) {
        (Some(_), Some(_)) => {
            p.add("secret_file", "set either secret or secret_file, not both");
            return None;
        }
        (Some(secret), None) => (
            "secret",
            secret.as_bytes().to_vec(),
            "identity.secret".to_owned(),
        ),
        (None, Some(file)) => {
            let path = resolve(base_dir, file);
            match read_capped(&path) {
                Ok(bytes) => (
                    "secret_file",
                    bytes.trim_ascii().to_vec(),
                    path.display().to_string(),
                ),
                Err(reason) => {
                    p.add("secret_file", reason);
                    return None;
                }
            }
        }
        (None, None) => {
            p.add("secret", "required with HS256 (or set secret_file)");
            return None;
        }
    };
    if secret.len() < MIN_SECRET_BYTES {
        p.add(
            field,
            format!(
                "the HS256 secret is {} bytes; at least {MIN_SECRET_BYTES} are required \
                 (e.g. openssl rand -base64 48)",
                secret.len()
            ),
        );
        return None;
    }
    Some(hmac_source(&secret, origin))
}

fn load_jwks_source(
    base_dir: &Path,
    file: &Path,
    only: Option<Algorithm>,
    clock: &dyn Clock,
    p: &mut Problems,
) -> Option<KeySource> {
    let path = resolve(base_dir, file);
    match JwksSource::load(path, only, clock.now_ms()) {
        Ok(src) => Some(KeySource::Jwks(src)),
        Err(problems) => {
            for reason in problems {
                p.add("jwks_file", reason);
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use jsonwebtoken::jwk::JwkSet;
    use serde_json::json;
    use tollgate_core::FakeClock;

    use super::*;

    // Test keys generated once with openssl 3.0 (never at test time):
    //   openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out rsa.pem
    //   openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ec.pem
    //   openssl pkey -in KEY.pem -pubout
    // They sign nothing but these tests.

    const RSA_A_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQClbgkH3lUCA+1Z
f62w4z8Ir14JXlew2B2RyyTfKgbG5smARNsjiBtnV/If/JmbXkneRI+9920fcbED
+mJkXKjk0QLiUi3SjJjagsYTUAZDml9zWd6vqlnZ+tZb3kaAYgdSgibWKhOJZYEQ
9aAw5Dxz8KQUM2WRRqg9KLhr0zE+amF57z4jtoLPo944OiFenxne5PzKZeC4VXgy
Pw3ut61JDDVNacl2UpgSqHBS4wQo59DaCEq6QKydDDk0vMDVsaR1QntvTDaI05ii
/DRto/BLmvHKaZpWGcuAN9gbPDdZWF6JV+GaCaZQUN4wHDZOPu6+6VKAejC5e7g9
Tju7Gj6xAgMBAAECggEAD52OpCvAPfe1bpqPAHC++TimiX9aizKnPeUdVqRurdVI
pX86aUT2gz+Jtyu+qywQEHdL0zx5FDwE39GBeqRFfA3fthHYSfTkE9I+1MFbygNX
KboMu2u63gjftZ3KbWFze/4VoOcpX3GRqJJq+9p7e102e8KrPnabOGSw3dq6XgAB
R8uxzqg36n1Y1BpA5iuoUwaZIzkfYYdWxTlcEzBKBt8HPdGCjyXa26W5SjOK80KI
0ZrLcLXLnHr3Crpmxqqom83whcox0zN43OfJg/uQwU4mpfK9rENmc4IVOgEjkiJs
99e5IWSdC9F8BuIelpIQLlMQNnlV/7k2a+idI61BkQKBgQDZ62QIgx9f6oH9hKV7
3UNfgWbQE8lqQJmqmtmmLl1KvJ6C4GkZZjKroo2qiQeZIUugzjLQ7q5spEUyvrLA
z5PvmUn2WYupNELJl0YKSuyIBnkIOummnMS2m31jTABpJHzSLcKJ6kpb6LAeVvnm
rGsXfGLnIgvf2Tqoi5U7yfnrOQKBgQDCVoYYM08+AyzZ/US3h8Urdxnrdg4AJmif
f91xPx9ViZ9hwfsTP9TbMRt35nA4yiiIJJisWoQYIU7cbfjOP65l32nx67WUwJzD
+ymyQt3x5D18Lv2yZvKqhksBLIj9hqOduiTWCBaBhKqiwxTnibdWwJ3XExfBi/CR
LyPWBSjXOQKBgE7iszeRn83s6lmHpxALrNPp1/oC76qS8A2eOKO7rPHdDdR6wBD9
ueH/2iCdsi5wqxvvCN4xSNrzLEmOVs8NVZQqfWe8Sp5Z2MN5C1W2gaFMFowwJ1y0
61DfQKitXoixOK4s+ntKYNichwS0n4otaCb8VCEvZfUGggF5ZfBa0SmhAoGAa7iY
NbvjNcV+zApmV7ELas9m76yNkCm6Hoc60PYjQT+6t+5VZNMiAqnSxwBVvjTYiLZ4
Zjj6NYHo+6h9nJ2R5ugTCsUT7rNhcgS7lRMZgWZ5ameFuqjz4+/yjWEJQjaqZNh0
aKstBnfqObQW10zv8kdsdnYf2ene3CscGxrbC4kCgYBqjSW74JqUIxlAjc02JA/H
Sl7asjSGsfSV1IK0U6e6jfBghejurqSHvyUHR8PH6YMpcYfX0+Ldwc7iFLeto5Zx
7orRubFYIn4kmUUw0X3cXvUDKcR04DTTSEJSZUrHNlFLvvFLfOVfChlfrXl7udFr
2UxEQ0n68K51K6WKSXVZFA==
-----END PRIVATE KEY-----
";

    const RSA_A_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEApW4JB95VAgPtWX+tsOM/
CK9eCV5XsNgdkcsk3yoGxubJgETbI4gbZ1fyH/yZm15J3kSPvfdtH3GxA/piZFyo
5NEC4lIt0oyY2oLGE1AGQ5pfc1ner6pZ2frWW95GgGIHUoIm1ioTiWWBEPWgMOQ8
c/CkFDNlkUaoPSi4a9MxPmphee8+I7aCz6PeODohXp8Z3uT8ymXguFV4Mj8N7ret
SQw1TWnJdlKYEqhwUuMEKOfQ2ghKukCsnQw5NLzA1bGkdUJ7b0w2iNOYovw0baPw
S5rxymmaVhnLgDfYGzw3WVheiVfhmgmmUFDeMBw2Tj7uvulSgHowuXu4PU47uxo+
sQIDAQAB
-----END PUBLIC KEY-----
";

    const RSA_B_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQCe48/omV3H8dYD
bJGFUBB2xXCJaWz8h/9Bhs/jSkxPa/aGunEUvGBmlij6DoLP6xt/ud3PeCXRXBji
Khki5loVYnq6QML7sP4j0zeR2vaVacQxARf5SqwYgCmPhwDNhoygSs479k2Xt6vk
fWKEMPVWxoD1mXYUCddwQ1xSllxRDHoUqRO+mVGoUT+ArXFxQ0y+hK/5Tmwtj0I7
nJorEm2ZCkEB9s8KEMYcvN4JC9gBIL69CQx0S0Mop3mZ8RlavBUu8Vr9KjSevNqZ
hHN/RKss98DGpGJE9jm/nwuYJ234MrRDOMgLNnlF/j2lo3ysn/5hcaJngzoSdjhC
BrAVooj5AgMBAAECggEAE4uPCPwKtPyK+L9bdER5zf5yHjklgrgA/pDElF9QnUl4
2TBoliYpDp2Em2P7E/QGHTNiNXIAZu1XE0Ud8/TVmoFTewNZ6OeoD4SdNpgykoUg
8O1DQ3N70YS8eA8hmmaleFdTYL1m5JWfs7r3yi6Sk3LWLMAMriDay1DB89fSsdZu
/ifOtqCuSz2p5IWQYXOsdeo0/7cX2qqmvj1pjdrkBQJTqs6TNTzw/L1uBRfPVsrY
K9PIrLfOGCsmBgwbSuPNlIQ+oyZnq3IIF9VAQEQpWspM9J43UgIH21XOEyx2s+kj
1QrbMV+PkDF2cqfKtuSlHkxr2IvuK4VTH+UvrhqXPQKBgQDdPMcCE9vYsiLzb4eA
wOcv0pQlEZS6prqhi8bYUv2iPOi6wAG9y/6AvT4I0CVlMCD9CEeDwaZYPysuIUlS
3mAbC4rsuCMacLZTvFPkaqleZj2XpSlLRVFfWJ+nFnbOU/LsVCH9/BmQExh1+7Ej
CUtcrgV5aOYYjD6pg+dK71QqFQKBgQC32x7YFuaQ2gwf5+p1XD9QZsUpA+eoDjOV
6t7OUrx65WuQNWP6kUW7Bu8FymgQ8c/Y/iqyu7oMbBf3kZQuAcAoJBaiPWe89coE
Qqzic9GKlrV4EW5jzHOtUpUALX2Y7/c6rrEqifr9pBI5cBj33eQdolI8UYZlQEbs
Hm7sP+JQVQKBgGuZXaizA9+Wc8011w9VwprNreOBc3Z8FJTxKFqZsmWvffkl3TLz
/embIIqkwSs/hyvJVQ7NphuRTWz4H3NAWDmPGZgbzmbTnrmHBL446frReu9AEp9b
LUJUFgHruQiMZ79tA8NFUyFxSBpJuVMy+AYxVNRBoncZ7nf/gQQ+9g4pAoGBAKFS
uni/d2ZIfXUNiPObks6Yro0zqPQUKf10zjXZ8Rog7kXmIyj8iWP3TIoXNUMQ+uCa
/JpCEJjPzCPl8FCCJrrSF64aFUl/ndgpLQuytn1Vijulh+g3wJSnrqguQlOM07EB
EeGSmtIuQfN2QeJUJ9I82M2mdzems9SBS7EuyQTVAoGBAJPaOaxY/dbCHO7SZsU3
fvbXxf5Kfx1kvrQVcFy8dsFv1FwZLDg0MelvkKpnnJkQSM1qM6oc1qq2Gau50CMO
WMW2mp5ePyKQNMBXxbpmKpl8OaBJDjPzmImUh9n47eoUmSlRDcWbF1Ujv/C4V8kL
ub8XOClerQC7VDtQxk08CEbR
-----END PRIVATE KEY-----
";

    const EC_A_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg7E6l+szeNMvAHXLV
ahn5eCblNNER1K5BeonG6il6nYmhRANCAATPjeIs2kViTzdwUtyEjBCQ8GnbYCxN
ilDVbjxfpIsyUpG3IuCpangLYJqrESe/x5Ao/21xBRNBIUrhe7ejgyEn
-----END PRIVATE KEY-----
";

    const EC_A_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEz43iLNpFYk83cFLchIwQkPBp22As
TYpQ1W48X6SLMlKRtyLgqWp4C2CaqxEnv8eQKP9tcQUTQSFK4Xu3o4MhJw==
-----END PUBLIC KEY-----
";

    const EC_B_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgieU5mqy/hc7pYgln
XUhcV3Qbs7OgimtXUfVYJluY6RmhRANCAARBTQ1IZeiCWb2hrfKrsL4r1NlJ98J0
ks8PgldkcU9+N61NsEaD8S1xOZdGAtdR4csp/uUBb9HgPZx2ULbbSLZV
-----END PRIVATE KEY-----
";

    /// RSA 1024: too small.
    const RSA_1024_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQCtrHEvFcSHmshy7nyDR4/Wjf9l
Qy/SoyoE+PE6YB+RNJnK0Kxr46ao7iNI+VVIQ+IyjDi88V4bFVTq+w+IjIBQ554N
DJkERGzzgsoj7pajE6ZUOFodUq0jgnv3ytfV7WFwWEAyFJE6WtcWME/WSJ9SeS5j
dk2cIg2qIiRjCmBoOQIDAQAB
-----END PUBLIC KEY-----
";

    /// EC P-384: not ES256.
    const EC_P384_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEMOwIzXnYNn1mvwLiRnAlCSvr1xIt2jl5
IifMeaYYG2ZQ/vk+46q15N695vwLgKpjOmFWNGLVvZEbbOSHvORpSGsgE9Wc/YPf
Ji9YF+U2Y4eLQi7F4x1G89R/3SZLShCg
-----END PUBLIC KEY-----
";

    const NOW_MS: u64 = 1_700_000_000_000;
    const NOW_S: i64 = 1_700_000_000;
    const SECRET: &str = "test-secret-0123456789abcdef0123456789";
    const ISSUER: &str = "https://issuer.test";
    const AUDIENCE: &str = "tollgate";

    /// A directory removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("tollgate-identity-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create temp dir");
            Self(dir)
        }

        fn write(&self, name: &str, contents: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, contents).expect("write temp file");
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn b64url(bytes: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
            for i in 0..=chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            }
        }
        out
    }

    fn hs256_config() -> IdentityConfig {
        IdentityConfig {
            algorithm: Some("HS256".into()),
            secret: Some(SECRET.into()),
            issuer: Some(ISSUER.into()),
            audience: Some(AUDIENCE.into()),
            ..IdentityConfig::new(IdentityMode::Jwt)
        }
    }

    fn build(cfg: &IdentityConfig, dir: &Path, clock: &FakeClock) -> Verifier {
        match Verifier::from_config(cfg, dir, Arc::new(clock.clone())) {
            Ok(v) => v,
            Err(errors) => panic!("config refused: {errors:?}"),
        }
    }

    fn config_errors(cfg: &IdentityConfig, dir: &Path) -> Vec<FieldError> {
        match Verifier::from_config(cfg, dir, Arc::new(FakeClock::new(NOW_MS))) {
            Ok(v) => panic!("config accepted: {v:?}"),
            Err(errors) => errors,
        }
    }

    fn has_error(errors: &[FieldError], path: &str, needle: &str) -> bool {
        errors
            .iter()
            .any(|e| e.path == path && e.reason.contains(needle))
    }

    /// Standard claims for alice, expiring `exp_in_s` from now.
    fn claims(exp_in_s: i64) -> Value {
        json!({ "sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "iat": NOW_S, "exp": NOW_S + exp_in_s })
    }

    fn sign(alg: Algorithm, key: &EncodingKey, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, key).expect("sign")
    }

    fn hs(claims: &Value) -> String {
        sign(
            Algorithm::HS256,
            &EncodingKey::from_secret(SECRET.as_bytes()),
            None,
            claims,
        )
    }

    fn rsa_key(pem: &str) -> EncodingKey {
        EncodingKey::from_rsa_pem(pem.as_bytes()).expect("rsa pem")
    }

    fn ec_key(pem: &str) -> EncodingKey {
        EncodingKey::from_ec_pem(pem.as_bytes()).expect("ec pem")
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).expect("header value"),
        );
        headers
    }

    fn jwk(key: &EncodingKey, alg: Algorithm, kid: &str) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(key, alg).expect("jwk");
        jwk.common.key_id = Some(kid.to_owned());
        jwk
    }

    fn jwks_json(keys: Vec<Jwk>) -> String {
        serde_json::to_string(&JwkSet { keys }).expect("jwks json")
    }

    /// Forces a distinct modification time, so a rewrite within one mtime
    /// tick is still seen.
    fn touch(path: &Path, secs: u64) {
        let file = std::fs::File::options()
            .write(true)
            .open(path)
            .expect("open");
        file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
            .expect("set mtime");
    }

    fn hs_verifier() -> (Verifier, FakeClock) {
        let clock = FakeClock::new(NOW_MS);
        (build(&hs256_config(), Path::new("."), &clock), clock)
    }

    #[test]
    fn verifier_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Verifier>();
        assert_send_sync::<AuthError>();
    }

    #[test]
    fn hs256_happy_path() {
        let (v, _) = hs_verifier();
        assert_eq!(v.verify(&bearer(&hs(&claims(60)))), Ok("alice".to_owned()));
    }

    #[test]
    fn missing_authorization_header() {
        let (v, _) = hs_verifier();
        assert_eq!(
            v.verify(&HeaderMap::new()),
            Err(AuthError::MissingCredentials)
        );
    }

    #[test]
    fn scheme_other_than_bearer() {
        let (v, _) = hs_verifier();
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_static("Basic YWxpY2U6cHc="),
        );
        assert_eq!(v.verify(&headers), Err(AuthError::NotBearer));
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearertoken"));
        assert_eq!(v.verify(&headers), Err(AuthError::NotBearer));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let (v, _) = hs_verifier();
        let mut headers = HeaderMap::new();
        let value = format!("bearer   {}", hs(&claims(60)));
        headers.insert(AUTHORIZATION, HeaderValue::from_str(&value).unwrap());
        assert_eq!(v.verify(&headers), Ok("alice".to_owned()));
    }

    #[test]
    fn empty_duplicate_or_huge_bearer_is_malformed() {
        let (v, _) = hs_verifier();
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert!(matches!(v.verify(&headers), Err(AuthError::Malformed(_))));

        let token = hs(&claims(60));
        let mut headers = bearer(&token);
        headers.append(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        assert!(matches!(v.verify(&headers), Err(AuthError::Malformed(_))));

        let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert!(matches!(
            v.verify(&bearer(&huge)),
            Err(AuthError::Malformed(_))
        ));
    }

    #[test]
    fn garbage_tokens_are_malformed() {
        let (v, _) = hs_verifier();
        let valid = hs(&claims(60));
        let mut parts = valid.split('.');
        let (h, c) = (parts.next().unwrap(), parts.next().unwrap());
        for garbage in [
            "not-a-jwt".to_owned(),
            "a.b".to_owned(),
            "a.b.c.d".to_owned(),
            "%%%.b.c".to_owned(),
            format!("{}.{c}.sig", b64url(b"not json")),
            format!("{}.{c}.sig", b64url(b"[1,2]")),
            format!("{}.{c}.sig", b64url(br#"{"typ":"JWT"}"#)),
            format!("{}.{c}.sig", b64url(br#"{"alg":"HS256","kid":5}"#)),
            format!("{h}.%%%.sig"),
            format!("{h}.{c}.%%%"),
        ] {
            let got = v.verify(&bearer(&garbage));
            assert!(
                matches!(got, Err(AuthError::Malformed(_))),
                "{garbage}: {got:?}"
            );
        }
    }

    #[test]
    fn claims_that_are_not_an_object_are_malformed() {
        let (v, _) = hs_verifier();
        let token = sign(
            Algorithm::HS256,
            &EncodingKey::from_secret(SECRET.as_bytes()),
            None,
            &json!(["alice"]),
        );
        assert!(matches!(
            v.verify(&bearer(&token)),
            Err(AuthError::Malformed(_))
        ));
    }

    #[test]
    fn alg_none_is_refused() {
        let (v, _) = hs_verifier();
        let payload = b64url(claims(60).to_string().as_bytes());
        for alg in ["none", "None", "NONE", "nOnE"] {
            let head = b64url(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#).as_bytes());
            let token = format!("{head}.{payload}.");
            assert_eq!(
                v.verify(&bearer(&token)),
                Err(AuthError::AlgorithmNotAllowed),
                "{alg}"
            );
        }
    }

    #[test]
    fn other_hmac_algorithms_are_refused() {
        let (v, _) = hs_verifier();
        for alg in [Algorithm::HS384, Algorithm::HS512] {
            let token = sign(
                alg,
                &EncodingKey::from_secret(SECRET.as_bytes()),
                None,
                &claims(60),
            );
            assert_eq!(
                v.verify(&bearer(&token)),
                Err(AuthError::AlgorithmNotAllowed)
            );
        }
    }

    #[test]
    fn expired_beyond_leeway_is_refused_within_leeway_accepted() {
        let (v, clock) = hs_verifier();
        // Default leeway: 30 s.
        assert_eq!(
            v.verify(&bearer(&hs(&claims(-31)))),
            Err(AuthError::Expired)
        );
        assert_eq!(
            v.verify(&bearer(&hs(&claims(-30)))),
            Err(AuthError::Expired)
        );
        assert_eq!(v.verify(&bearer(&hs(&claims(-29)))), Ok("alice".to_owned()));

        // The same token expires as the injected clock moves.
        let token = hs(&claims(10));
        assert!(v.verify(&bearer(&token)).is_ok());
        clock.advance(39_999);
        assert!(v.verify(&bearer(&token)).is_ok());
        clock.advance(1);
        assert_eq!(v.verify(&bearer(&token)), Err(AuthError::Expired));
    }

    #[test]
    fn configured_leeway_is_used() {
        let clock = FakeClock::new(NOW_MS);
        let cfg = IdentityConfig {
            leeway_s: Some(0),
            ..hs256_config()
        };
        let v = build(&cfg, Path::new("."), &clock);
        assert_eq!(v.verify(&bearer(&hs(&claims(0)))), Err(AuthError::Expired));
        assert!(v.verify(&bearer(&hs(&claims(1)))).is_ok());
    }

    #[test]
    fn missing_or_non_numeric_exp_is_refused() {
        let (v, _) = hs_verifier();
        let mut c = claims(60);
        c.as_object_mut().unwrap().remove("exp");
        assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::MissingExpiry));
        c["exp"] = json!("tomorrow");
        assert!(matches!(
            v.verify(&bearer(&hs(&c))),
            Err(AuthError::Malformed(_))
        ));
        c["exp"] = json!(-5);
        assert!(matches!(
            v.verify(&bearer(&hs(&c))),
            Err(AuthError::Malformed(_))
        ));
        // A fractional NumericDate is accepted.
        c["exp"] = json!((NOW_S + 60) as f64 + 0.5);
        assert!(v.verify(&bearer(&hs(&c))).is_ok());
    }

    #[test]
    fn nbf_in_the_future_is_refused() {
        let (v, clock) = hs_verifier();
        let mut c = claims(600);
        c["nbf"] = json!(NOW_S + 31);
        let token = hs(&c);
        assert_eq!(v.verify(&bearer(&token)), Err(AuthError::NotYetValid));
        clock.advance(1_000);
        assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
        c["nbf"] = json!(NOW_S + 29);
        assert!(v.verify(&bearer(&hs(&c))).is_ok());
    }

    #[test]
    fn wrong_signing_key_is_a_bad_signature() {
        let (v, _) = hs_verifier();
        let other = EncodingKey::from_secret(b"another-secret-0123456789abcdef-0123456789");
        let token = sign(Algorithm::HS256, &other, None, &claims(60));
        assert_eq!(v.verify(&bearer(&token)), Err(AuthError::BadSignature));

        // A tampered payload with the original signature.
        let good = hs(&claims(60));
        let parts: Vec<&str> = good.split('.').collect();
        let mut forged = claims(60);
        forged["sub"] = json!("mallory");
        let token = format!(
            "{}.{}.{}",
            parts[0],
            b64url(forged.to_string().as_bytes()),
            parts[2]
        );
        assert_eq!(v.verify(&bearer(&token)), Err(AuthError::BadSignature));
    }

    #[test]
    fn wrong_audience_is_refused() {
        let (v, _) = hs_verifier();
        let mut c = claims(60);
        c["aud"] = json!("someone-else");
        assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongAudience));
        c["aud"] = json!(["a", "b"]);
        assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongAudience));
        c.as_object_mut().unwrap().remove("aud");
        assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongAudience));
        c["aud"] = json!(["other", AUDIENCE]);
        assert!(v.verify(&bearer(&hs(&c))).is_ok());
    }

    #[test]
    fn audience_is_required_unless_the_operator_turns_its_check_off() {
        let dir = TempDir::new("audience");
        let cfg = IdentityConfig {
            audience: None,
            ..hs256_config()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.audience", "required in jwt mode"),
            "{e:?}"
        );
        let off = IdentityConfig {
            audience_check: Some(false),
            ..cfg.clone()
        };
        let v = build(&off, Path::new("."), &FakeClock::new(NOW_MS));
        let mut c = claims(60);
        c["aud"] = json!("anything");
        assert!(v.verify(&bearer(&hs(&c))).is_ok());
        assert!(v.describe().contains("audience not checked"));
        let both = IdentityConfig {
            audience_check: Some(false),
            ..hs256_config()
        };
        let e = config_errors(&both, &dir.0);
        assert!(
            has_error(&e, "identity.audience_check", "contradicts"),
            "{e:?}"
        );
    }

    #[test]
    fn scopes_and_tenant_come_from_the_verified_claims() {
        let clock = FakeClock::new(NOW_MS);
        let cfg = IdentityConfig {
            tenant_claim: Some("org".into()),
            ..hs256_config()
        };
        let v = build(&cfg, Path::new("."), &clock);
        assert!(v.verifies_tenant());
        let id = |c: &Value| v.identify(&bearer(&hs(c)), None);
        let plain = id(&claims(60)).unwrap();
        assert_eq!((plain.feedback, plain.tenant.as_deref()), (false, None));
        let mut c = claims(60);
        c["scope"] = json!("read tollgate:feedback write");
        c["org"] = json!("acme");
        let svc = id(&c).unwrap();
        assert_eq!((svc.feedback, svc.tenant.as_deref()), (true, Some("acme")));
        c["scope"] = json!(["read", "tollgate:feedback"]);
        assert!(id(&c).unwrap().feedback);
        // Near misses are not the scope.
        for near in [
            json!("tollgate:feedbackx"),
            json!("Tollgate:feedback"),
            json!(7),
        ] {
            c["scope"] = near;
            assert!(!id(&c).unwrap().feedback);
        }
        c["org"] = json!(1);
        assert!(matches!(id(&c), Err(AuthError::Malformed(_))));
        // Minted tokens carry them.
        let token = v
            .mint_with("svc", 60, &["tollgate:feedback".to_owned()], Some("acme"))
            .unwrap();
        let minted = v.identify(&bearer(&token), None).unwrap();
        assert_eq!(
            minted,
            Identity {
                user: "svc".into(),
                feedback: true,
                tenant: Some("acme".into())
            }
        );
        let (plain_v, _) = hs_verifier();
        assert!(matches!(
            plain_v.mint_with("svc", 60, &[], Some("acme")),
            Err(MintError::NoTenantClaim)
        ));
    }

    #[test]
    fn expiry_is_read_on_the_injected_wall_clock() {
        // The verifier's clock is the one it was given (the system clock in
        // production): a token valid now expires when that clock passes it.
        let (v, clock) = hs_verifier();
        let token = hs(&claims(60));
        assert!(v.verify(&bearer(&token)).is_ok());
        clock.advance((60 + DEFAULT_LEEWAY_S) * 1_000);
        assert_eq!(v.verify(&bearer(&token)), Err(AuthError::Expired));
    }

    #[test]
    fn wrong_issuer_is_refused() {
        let (v, _) = hs_verifier();
        let mut c = claims(60);
        c["iss"] = json!("https://evil.test");
        assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongIssuer));
        c["iss"] = json!([ISSUER]);
        assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongIssuer));
        c.as_object_mut().unwrap().remove("iss");
        assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongIssuer));
    }

    fn rs256_verifier(dir: &TempDir, clock: &FakeClock) -> Verifier {
        dir.write("rsa.pub.pem", RSA_A_PUBLIC);
        let cfg = IdentityConfig {
            algorithm: Some("RS256".into()),
            // Relative: resolved against the config's directory.
            public_key_file: Some("rsa.pub.pem".into()),
            issuer: Some(ISSUER.into()),
            audience: Some(AUDIENCE.into()),
            ..IdentityConfig::new(IdentityMode::Jwt)
        };
        build(&cfg, &dir.0, clock)
    }

    #[test]
    fn rs256_happy_path() {
        let dir = TempDir::new("rs256-happy");
        let clock = FakeClock::new(NOW_MS);
        let v = rs256_verifier(&dir, &clock);
        let token = sign(Algorithm::RS256, &rsa_key(RSA_A_PRIVATE), None, &claims(60));
        assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
        assert!(
            v.describe().starts_with("jwt (RS256 public key"),
            "{}",
            v.describe()
        );
        assert!(!v.can_mint());
        assert!(matches!(
            v.mint("alice", 60),
            Err(MintError::Unsupported(..))
        ));
    }

    #[test]
    fn rs256_with_another_key_is_a_bad_signature() {
        let dir = TempDir::new("rs256-wrong-key");
        let clock = FakeClock::new(NOW_MS);
        let v = rs256_verifier(&dir, &clock);
        let token = sign(Algorithm::RS256, &rsa_key(RSA_B_PRIVATE), None, &claims(60));
        assert_eq!(v.verify(&bearer(&token)), Err(AuthError::BadSignature));
    }

    #[test]
    fn hs256_signed_with_the_rsa_public_key_is_refused() {
        // Algorithm confusion: the attacker uses the (public) PEM bytes as an
        // HMAC secret and hopes the server verifies HS256 with them.
        let dir = TempDir::new("rs-hs-confusion");
        let clock = FakeClock::new(NOW_MS);
        let v = rs256_verifier(&dir, &clock);
        let forged = EncodingKey::from_secret(RSA_A_PUBLIC.as_bytes());
        let token = sign(Algorithm::HS256, &forged, None, &claims(60));
        assert_eq!(
            v.verify(&bearer(&token)),
            Err(AuthError::AlgorithmNotAllowed)
        );
        // Nor any other algorithm than the configured one.
        let token = sign(Algorithm::RS512, &rsa_key(RSA_A_PRIVATE), None, &claims(60));
        assert_eq!(
            v.verify(&bearer(&token)),
            Err(AuthError::AlgorithmNotAllowed)
        );
        let token = sign(Algorithm::PS256, &rsa_key(RSA_A_PRIVATE), None, &claims(60));
        assert_eq!(
            v.verify(&bearer(&token)),
            Err(AuthError::AlgorithmNotAllowed)
        );
    }

    #[test]
    fn rs256_token_is_refused_when_configured_for_hs256() {
        let (v, _) = hs_verifier();
        let token = sign(Algorithm::RS256, &rsa_key(RSA_A_PRIVATE), None, &claims(60));
        assert_eq!(
            v.verify(&bearer(&token)),
            Err(AuthError::AlgorithmNotAllowed)
        );
        let token = sign(Algorithm::ES256, &ec_key(EC_A_PRIVATE), None, &claims(60));
        assert_eq!(
            v.verify(&bearer(&token)),
            Err(AuthError::AlgorithmNotAllowed)
        );
    }

    #[test]
    fn es256_happy_path() {
        let dir = TempDir::new("es256-happy");
        let path = dir.write("ec.pub.pem", EC_A_PUBLIC);
        let clock = FakeClock::new(NOW_MS);
        let cfg = IdentityConfig {
            algorithm: Some("ES256".into()),
            public_key_file: Some(path),
            audience: Some(AUDIENCE.into()),
            ..IdentityConfig::new(IdentityMode::Jwt)
        };
        let v = build(&cfg, Path::new("/nonexistent"), &clock);
        let token = sign(Algorithm::ES256, &ec_key(EC_A_PRIVATE), None, &claims(60));
        assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));

        let other = sign(Algorithm::ES256, &ec_key(EC_B_PRIVATE), None, &claims(60));
        assert_eq!(v.verify(&bearer(&other)), Err(AuthError::BadSignature));
        let rs = sign(Algorithm::RS256, &rsa_key(RSA_A_PRIVATE), None, &claims(60));
        assert_eq!(v.verify(&bearer(&rs)), Err(AuthError::AlgorithmNotAllowed));
        let forged = sign(
            Algorithm::HS256,
            &EncodingKey::from_secret(EC_A_PUBLIC.as_bytes()),
            None,
            &claims(60),
        );
        assert_eq!(
            v.verify(&bearer(&forged)),
            Err(AuthError::AlgorithmNotAllowed)
        );
    }

    fn jwks_config(path: &Path) -> IdentityConfig {
        IdentityConfig {
            jwks_file: Some(path.to_path_buf()),
            issuer: Some(ISSUER.into()),
            audience: Some(AUDIENCE.into()),
            ..IdentityConfig::new(IdentityMode::Jwt)
        }
    }

    #[test]
    fn jwks_happy_path_selects_by_kid() {
        let dir = TempDir::new("jwks-happy");
        let rsa = rsa_key(RSA_A_PRIVATE);
        let ec = ec_key(EC_A_PRIVATE);
        let path = dir.write(
            "jwks.json",
            &jwks_json(vec![
                jwk(&rsa, Algorithm::RS256, "rsa-1"),
                jwk(&ec, Algorithm::ES256, "ec-1"),
            ]),
        );
        let clock = FakeClock::new(NOW_MS);
        let v = build(&jwks_config(&path), Path::new("."), &clock);
        assert!(
            v.describe().contains("2 key(s) (ES256, RS256)"),
            "{}",
            v.describe()
        );

        let rs = sign(Algorithm::RS256, &rsa, Some("rsa-1"), &claims(60));
        assert_eq!(v.verify(&bearer(&rs)), Ok("alice".to_owned()));
        let es = sign(Algorithm::ES256, &ec, Some("ec-1"), &claims(60));
        assert_eq!(v.verify(&bearer(&es)), Ok("alice".to_owned()));

        // The right algorithm with another key's kid.
        let crossed = sign(Algorithm::RS256, &rsa, Some("ec-1"), &claims(60));
        assert_eq!(
            v.verify(&bearer(&crossed)),
            Err(AuthError::AlgorithmNotAllowed)
        );
        let unknown = sign(Algorithm::RS256, &rsa, Some("nope"), &claims(60));
        assert_eq!(v.verify(&bearer(&unknown)), Err(AuthError::UnknownKey));
        // Without a kid, two keys are ambiguous.
        let no_kid = sign(Algorithm::RS256, &rsa, None, &claims(60));
        assert_eq!(v.verify(&bearer(&no_kid)), Err(AuthError::UnknownKey));
        // Signed by another key under a known kid.
        let other = sign(
            Algorithm::RS256,
            &rsa_key(RSA_B_PRIVATE),
            Some("rsa-1"),
            &claims(60),
        );
        assert_eq!(v.verify(&bearer(&other)), Err(AuthError::BadSignature));
    }

    #[test]
    fn jwks_never_accepts_hmac_even_with_an_oct_key() {
        let dir = TempDir::new("jwks-oct");
        let rsa = rsa_key(RSA_A_PRIVATE);
        let oct_secret = b"jwks-oct-secret-0123456789abcdef";
        let oct = jwk(
            &EncodingKey::from_secret(oct_secret),
            Algorithm::HS256,
            "oct-1",
        );
        let path = dir.write(
            "jwks.json",
            &jwks_json(vec![jwk(&rsa, Algorithm::RS256, "rsa-1"), oct]),
        );
        let clock = FakeClock::new(NOW_MS);
        let v = build(&jwks_config(&path), Path::new("."), &clock);
        assert!(
            v.describe()
                .contains("1 key(s) (RS256, 1 unusable skipped)"),
            "{}",
            v.describe()
        );
        let token = sign(
            Algorithm::HS256,
            &EncodingKey::from_secret(oct_secret),
            Some("oct-1"),
            &claims(60),
        );
        assert_eq!(
            v.verify(&bearer(&token)),
            Err(AuthError::AlgorithmNotAllowed)
        );
        // With a single usable key, a token without kid uses it.
        let no_kid = sign(Algorithm::RS256, &rsa, None, &claims(60));
        assert_eq!(v.verify(&bearer(&no_kid)), Ok("alice".to_owned()));
    }

    #[test]
    fn jwks_algorithm_restricts_the_keys() {
        let dir = TempDir::new("jwks-restrict");
        let rsa = rsa_key(RSA_A_PRIVATE);
        let ec = ec_key(EC_A_PRIVATE);
        let path = dir.write(
            "jwks.json",
            &jwks_json(vec![
                jwk(&rsa, Algorithm::RS256, "rsa-1"),
                jwk(&ec, Algorithm::ES256, "ec-1"),
            ]),
        );
        let clock = FakeClock::new(NOW_MS);
        let cfg = IdentityConfig {
            algorithm: Some("ES256".into()),
            ..jwks_config(&path)
        };
        let v = build(&cfg, Path::new("."), &clock);
        let es = sign(Algorithm::ES256, &ec, Some("ec-1"), &claims(60));
        assert!(v.verify(&bearer(&es)).is_ok());
        let rs = sign(Algorithm::RS256, &rsa, Some("rsa-1"), &claims(60));
        assert_eq!(v.verify(&bearer(&rs)), Err(AuthError::AlgorithmNotAllowed));
    }

    #[test]
    fn jwks_key_rotation_without_restart() {
        let dir = TempDir::new("jwks-rotation");
        let old = rsa_key(RSA_A_PRIVATE);
        let new = ec_key(EC_B_PRIVATE);
        let path = dir.write(
            "jwks.json",
            &jwks_json(vec![jwk(&old, Algorithm::RS256, "2024")]),
        );
        touch(&path, 1_000_000);
        let clock = FakeClock::new(NOW_MS);
        let v = build(&jwks_config(&path), Path::new("."), &clock);

        let old_token = sign(Algorithm::RS256, &old, Some("2024"), &claims(600));
        let new_token = sign(Algorithm::ES256, &new, Some("2025"), &claims(600));
        assert_eq!(v.verify(&bearer(&old_token)), Ok("alice".to_owned()));
        assert_eq!(v.verify(&bearer(&new_token)), Err(AuthError::UnknownKey));

        // Rotate: the file now holds only the new key.
        std::fs::write(&path, jwks_json(vec![jwk(&new, Algorithm::ES256, "2025")])).unwrap();
        touch(&path, 2_000_000);
        // Not rechecked within the same second of the clock.
        clock.advance(999);
        assert_eq!(v.verify(&bearer(&new_token)), Err(AuthError::UnknownKey));
        clock.advance(2);
        assert_eq!(v.verify(&bearer(&new_token)), Ok("alice".to_owned()));
        assert_eq!(v.verify(&bearer(&old_token)), Err(AuthError::UnknownKey));

        // A broken rewrite keeps the keys that work.
        std::fs::write(&path, "{ not json").unwrap();
        touch(&path, 3_000_000);
        clock.advance(1_000);
        assert_eq!(v.verify(&bearer(&new_token)), Ok("alice".to_owned()));
        // So does a vanished file; its return is picked up.
        std::fs::remove_file(&path).unwrap();
        clock.advance(1_000);
        assert_eq!(v.verify(&bearer(&new_token)), Ok("alice".to_owned()));
        std::fs::write(&path, jwks_json(vec![jwk(&old, Algorithm::RS256, "2024")])).unwrap();
        touch(&path, 4_000_000);
        clock.advance(1_000);
        assert_eq!(v.verify(&bearer(&old_token)), Ok("alice".to_owned()));
        assert_eq!(v.verify(&bearer(&new_token)), Err(AuthError::UnknownKey));
    }

    #[test]
    fn missing_user_claim_is_refused() {
        let (v, _) = hs_verifier();
        let mut c = claims(60);
        c.as_object_mut().unwrap().remove("sub");
        assert_eq!(
            v.verify(&bearer(&hs(&c))),
            Err(AuthError::MissingUserClaim("sub".into()))
        );
        for bad in [
            json!(""),
            json!(42),
            json!(true),
            json!("x".repeat(513)),
            json!("a\nb"),
        ] {
            c["sub"] = bad.clone();
            assert!(
                matches!(v.verify(&bearer(&hs(&c))), Err(AuthError::InvalidUserId(_))),
                "{bad}"
            );
        }
        // jsonwebtoken's own parsing of `sub` refuses an array or object.
        for bad in [json!(["alice"]), json!({"id": "alice"})] {
            c["sub"] = bad;
            assert!(matches!(
                v.verify(&bearer(&hs(&c))),
                Err(AuthError::Malformed(_))
            ));
        }
        c["sub"] = json!("é".repeat(256)); // 512 bytes
        assert!(v.verify(&bearer(&hs(&c))).is_ok());
    }

    #[test]
    fn custom_user_claim() {
        let clock = FakeClock::new(NOW_MS);
        let cfg = IdentityConfig {
            user_claim: Some("email".into()),
            ..hs256_config()
        };
        let v = build(&cfg, Path::new("."), &clock);
        let mut c = claims(60);
        c["email"] = json!("alice@example.com");
        assert_eq!(
            v.verify(&bearer(&hs(&c))),
            Ok("alice@example.com".to_owned())
        );
        c.as_object_mut().unwrap().remove("email");
        assert_eq!(
            v.verify(&bearer(&hs(&c))),
            Err(AuthError::MissingUserClaim("email".into()))
        );
        assert!(v.describe().contains("user claim email"));
        // Minting writes the user into the configured claim.
        let token = v.mint("bob@example.com", 60).unwrap();
        assert_eq!(v.verify(&bearer(&token)), Ok("bob@example.com".to_owned()));
    }

    #[test]
    fn trusted_header_mode() {
        let clock = FakeClock::new(NOW_MS);
        let v = build(&trusted_config(), Path::new("."), &clock);
        assert_eq!(v.mode(), IdentityMode::TrustedHeader);
        let v = Proxied(v);
        let mut headers = HeaderMap::new();
        assert_eq!(v.verify(&headers), Err(AuthError::MissingTrustedHeader));
        // A bearer token is not an identity in this mode.
        let with_token = bearer(&hs(&claims(60)));
        assert_eq!(v.verify(&with_token), Err(AuthError::MissingTrustedHeader));

        headers.insert(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("carol"));
        assert_eq!(v.verify(&headers), Ok("carol".to_owned()));
        headers.insert(
            DEFAULT_TRUSTED_HEADER,
            HeaderValue::from_bytes("zoë".as_bytes()).unwrap(),
        );
        assert_eq!(v.verify(&headers), Ok("zoë".to_owned()));

        for bad in [
            b"".to_vec(),
            vec![b'x'; 513],
            vec![0xff, 0xfe],
            b"a\tb".to_vec(),
        ] {
            headers.insert(
                DEFAULT_TRUSTED_HEADER,
                HeaderValue::from_bytes(&bad).unwrap(),
            );
            assert!(
                matches!(v.verify(&headers), Err(AuthError::InvalidUserId(_))),
                "{bad:?}"
            );
        }
        headers.insert(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("carol"));
        headers.append(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("mallory"));
        assert!(matches!(v.verify(&headers), Err(AuthError::Malformed(_))));
        assert!(v.describe().contains("x-tollgate-user"));
        assert!(matches!(
            v.mint("carol", 60),
            Err(MintError::Unsupported(..))
        ));
    }

    /// trusted_header mode believing 10.0.0.0/8 and ::1.
    fn trusted_config() -> IdentityConfig {
        IdentityConfig {
            trusted_proxies: Some(vec!["10.0.0.0/8".into(), "::1".into()]),
            ..IdentityConfig::new(IdentityMode::TrustedHeader)
        }
    }

    /// A verifier whose requests come from the trusted proxy 10.1.2.3.
    struct Proxied(Verifier);

    impl Proxied {
        fn verify(&self, headers: &HeaderMap) -> Result<String, AuthError> {
            self.0
                .identify(headers, Some("10.1.2.3".parse().unwrap()))
                .map(|id| id.user)
        }
        fn describe(&self) -> String {
            self.0.describe()
        }
        fn mint(&self, user: &str, ttl_s: u64) -> Result<String, MintError> {
            self.0.mint(user, ttl_s)
        }
    }

    #[test]
    fn trusted_header_is_believed_only_from_trusted_proxies() {
        let clock = FakeClock::new(NOW_MS);
        let v = build(&trusted_config(), Path::new("."), &clock);
        let mut headers = HeaderMap::new();
        headers.insert(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("carol"));
        for peer in ["10.255.0.1", "::1", "::ffff:10.0.0.7"] {
            assert_eq!(
                v.identify(&headers, Some(peer.parse().unwrap()))
                    .map(|i| i.user),
                Ok("carol".to_owned()),
                "{peer}"
            );
        }
        for peer in [Some("11.0.0.1"), Some("127.0.0.1"), Some("::2"), None] {
            assert_eq!(
                v.identify(&headers, peer.map(|p| p.parse().unwrap())),
                Err(AuthError::UntrustedPeer),
                "{peer:?}"
            );
        }
        assert!(v.describe().contains("10.0.0.0/8"));
        // The scope and tenant headers, when the proxy sets them.
        let cfg = IdentityConfig {
            tenant_claim: Some("x-tenant".into()),
            ..trusted_config()
        };
        let v = build(&cfg, Path::new("."), &clock);
        headers.insert(
            DEFAULT_SCOPE_HEADER,
            HeaderValue::from_static("tollgate:feedback"),
        );
        headers.insert("x-tenant", HeaderValue::from_static("acme"));
        let id = v
            .identify(&headers, Some("10.0.0.1".parse().unwrap()))
            .unwrap();
        assert_eq!((id.feedback, id.tenant.as_deref()), (true, Some("acme")));
    }

    #[test]
    fn trusted_header_mode_requires_its_proxies() {
        let dir = TempDir::new("proxies");
        let e = config_errors(&IdentityConfig::new(IdentityMode::TrustedHeader), &dir.0);
        assert!(
            has_error(&e, "identity.trusted_proxies", "required"),
            "{e:?}"
        );
        let cfg = IdentityConfig {
            trusted_proxies: Some(vec![]),
            ..IdentityConfig::new(IdentityMode::TrustedHeader)
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.trusted_proxies", "at least one"),
            "{e:?}"
        );
        let cfg = IdentityConfig {
            trusted_proxies: Some(vec!["10.0.0.0/8".into(), "proxy.local".into()]),
            ..IdentityConfig::new(IdentityMode::TrustedHeader)
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.trusted_proxies[1]", "not an IP"),
            "{e:?}"
        );
        let cfg = IdentityConfig {
            trusted_proxies: Some(vec!["10.0.0.1".into()]),
            ..IdentityConfig::dev()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.trusted_proxies", "not used"),
            "{e:?}"
        );
    }

    #[test]
    fn trusted_header_custom_name() {
        let clock = FakeClock::new(NOW_MS);
        let cfg = IdentityConfig {
            header: Some("X-Forwarded-User".into()),
            ..trusted_config()
        };
        let v = Proxied(build(&cfg, Path::new("."), &clock));
        let mut headers = HeaderMap::new();
        headers.insert(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("carol"));
        assert_eq!(v.verify(&headers), Err(AuthError::MissingTrustedHeader));
        headers.insert("x-forwarded-user", HeaderValue::from_static("dave"));
        assert_eq!(v.verify(&headers), Ok("dave".to_owned()));
    }

    #[test]
    fn trusted_header_is_off_unless_configured() {
        let mut headers = HeaderMap::new();
        headers.insert(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("mallory"));
        let (jwt, _) = hs_verifier();
        assert_eq!(jwt.verify(&headers), Err(AuthError::MissingCredentials));
        let dev = build(
            &IdentityConfig::dev(),
            Path::new("."),
            &FakeClock::new(NOW_MS),
        );
        assert_eq!(dev.verify(&headers), Err(AuthError::MissingCredentials));
    }

    #[test]
    fn mint_verify_round_trip_hs256() {
        let (v, clock) = hs_verifier();
        assert!(v.can_mint());
        let token = v.mint("alice", 60).unwrap();
        assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
        // The claims carry the configured issuer and audience, times from the clock.
        let payload = token.split('.').nth(1).unwrap();
        let claims: Value = serde_json::from_slice(&b64url_decode(payload).unwrap()).unwrap();
        assert_eq!(claims["iss"], ISSUER);
        assert_eq!(claims["aud"], AUDIENCE);
        assert_eq!(claims["iat"], NOW_S);
        assert_eq!(claims["exp"], NOW_S + 60);
        // It expires after ttl + leeway.
        clock.advance(89_999);
        assert!(v.verify(&bearer(&token)).is_ok());
        clock.advance(1);
        assert_eq!(v.verify(&bearer(&token)), Err(AuthError::Expired));

        assert!(matches!(v.mint("", 60), Err(MintError::InvalidUser(_))));
        assert!(matches!(
            v.mint(&"x".repeat(513), 60),
            Err(MintError::InvalidUser(_))
        ));
        assert!(matches!(v.mint("alice", 0), Err(MintError::InvalidTtl)));
        assert!(matches!(
            v.mint("alice", u64::MAX),
            Err(MintError::InvalidTtl)
        ));
    }

    #[test]
    fn dev_mode_uses_the_well_known_secret() {
        let clock = FakeClock::new(NOW_MS);
        let v = build(&IdentityConfig::dev(), Path::new("."), &clock);
        assert_eq!(v.mode(), IdentityMode::Dev);
        assert!(
            v.describe()
                .starts_with("dev (HS256 with the well-known dev secret: NOT for production")
        );
        let token = v.mint("alice", 60).unwrap();
        assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
        // Anyone who knows the public secret can mint: that is what dev means.
        let c = json!({ "sub": "eve", "exp": NOW_S + 60 });
        let token = sign(
            Algorithm::HS256,
            &EncodingKey::from_secret(DEV_SECRET.as_bytes()),
            None,
            &c,
        );
        assert_eq!(v.verify(&bearer(&token)), Ok("eve".to_owned()));
        // But not with the algorithm unconfigured: still HS256 only.
        let rs = sign(Algorithm::RS256, &rsa_key(RSA_A_PRIVATE), None, &c);
        assert_eq!(v.verify(&bearer(&rs)), Err(AuthError::AlgorithmNotAllowed));
    }

    #[test]
    fn secret_file_is_read_and_trimmed() {
        let dir = TempDir::new("secret-file");
        dir.write("secret", &format!("{SECRET}\n"));
        let clock = FakeClock::new(NOW_MS);
        let cfg = IdentityConfig {
            secret: None,
            secret_file: Some("secret".into()),
            ..hs256_config()
        };
        let v = build(&cfg, &dir.0, &clock);
        assert_eq!(v.verify(&bearer(&hs(&claims(60)))), Ok("alice".to_owned()));
        assert!(!v.describe().contains(SECRET));
        assert!(v.describe().contains("secret"));
    }

    #[test]
    fn config_errors_name_their_field() {
        let dir = TempDir::new("config-errors");
        let jwt = || IdentityConfig::new(IdentityMode::Jwt);

        let e = config_errors(&jwt(), &dir.0);
        assert!(has_error(&e, "identity.algorithm", "required"), "{e:?}");

        let cfg = IdentityConfig {
            algorithm: Some("HS256".into()),
            ..jwt()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.secret", "required with HS256"),
            "{e:?}"
        );

        let cfg = IdentityConfig {
            secret_file: Some("secret".into()),
            ..hs256_config()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(has_error(&e, "identity.secret_file", "not both"), "{e:?}");

        let cfg = IdentityConfig {
            secret: Some("short".into()),
            ..hs256_config()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(has_error(&e, "identity.secret", "at least 32"), "{e:?}");

        for alg in ["HS512", "none", "rs256", ""] {
            let cfg = IdentityConfig {
                algorithm: Some(alg.into()),
                ..hs256_config()
            };
            let e = config_errors(&cfg, &dir.0);
            assert!(
                has_error(&e, "identity.algorithm", "unsupported algorithm"),
                "{e:?}"
            );
        }

        let cfg = IdentityConfig {
            algorithm: Some("RS256".into()),
            ..jwt()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.public_key_file", "required with RS256"),
            "{e:?}"
        );

        let cfg = IdentityConfig {
            algorithm: Some("RS256".into()),
            public_key_file: Some("missing.pem".into()),
            audience: Some(AUDIENCE.into()),
            ..jwt()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.public_key_file", "cannot read"),
            "{e:?}"
        );
        assert!(
            e[0].reason
                .contains(&dir.0.join("missing.pem").display().to_string()),
            "{e:?}"
        );

        dir.write("garbage.pem", "not a key");
        dir.write("private.pem", RSA_A_PRIVATE);
        dir.write("small.pem", RSA_1024_PUBLIC);
        dir.write("ec.pem", EC_A_PUBLIC);
        dir.write("p384.pem", EC_P384_PUBLIC);
        dir.write("rsa.pem", RSA_A_PUBLIC);
        for (alg, file, needle) in [
            ("RS256", "garbage.pem", "not an RSA public key"),
            ("RS256", "private.pem", "private key"),
            ("RS256", "small.pem", "1024 bits"),
            ("RS256", "ec.pem", "not an RSA public key"),
            ("ES256", "rsa.pem", "not an EC public key"),
            ("ES256", "p384.pem", "P-256"),
            ("ES256", "garbage.pem", "not an EC public key"),
        ] {
            let cfg = IdentityConfig {
                algorithm: Some(alg.into()),
                public_key_file: Some(file.into()),
                ..jwt()
            };
            let e = config_errors(&cfg, &dir.0);
            assert!(
                has_error(&e, "identity.public_key_file", needle),
                "{alg} {file}: {e:?}"
            );
        }

        let cfg = IdentityConfig {
            algorithm: Some("RS256".into()),
            secret: Some(SECRET.into()),
            public_key_file: Some("rsa.pem".into()),
            jwks_file: Some("jwks.json".into()),
            ..jwt()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(has_error(&e, "identity.secret", "only with HS256"), "{e:?}");
        assert!(has_error(&e, "identity.jwks_file", "not both"), "{e:?}");

        let cfg = IdentityConfig {
            public_key_file: Some("rsa.pem".into()),
            ..hs256_config()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.public_key_file", "not used with HS256"),
            "{e:?}"
        );
    }

    #[test]
    fn jwks_config_errors() {
        let dir = TempDir::new("jwks-errors");
        let rsa = rsa_key(RSA_A_PRIVATE);
        let check = |name: &str, contents: &str, needle: &str| {
            let path = dir.write(name, contents);
            let e = config_errors(&jwks_config(&path), &dir.0);
            assert!(has_error(&e, "identity.jwks_file", needle), "{name}: {e:?}");
        };
        check(
            "empty.json",
            r#"{"keys": []}"#,
            "no usable RS256 or ES256 signing key",
        );
        check("nokeys.json", r#"{"other": 1}"#, "not a JWKS");
        check("bad.json", "[", "not valid JSON");
        let oct = jwk(
            &EncodingKey::from_secret(b"0123456789abcdef0123456789abcdef"),
            Algorithm::HS256,
            "k",
        );
        check("oct.json", &jwks_json(vec![oct]), "symmetric");
        let dup = jwks_json(vec![
            jwk(&rsa, Algorithm::RS256, "k"),
            jwk(&rsa, Algorithm::RS256, "k"),
        ]);
        check("dup.json", &dup, "duplicate kid");
        let small_n =
            json!({"keys": [{"kty": "RSA", "kid": "s", "n": b64url(&[0xff; 128]), "e": "AQAB"}]});
        check("small.json", &small_n.to_string(), "1024 bits");
        let bad_point = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "p", "x": b64url(&[1; 32]), "y": b64url(&[2; 32])}]});
        check("point.json", &bad_point.to_string(), "P-256");

        let e = config_errors(&jwks_config(&dir.0.join("absent.json")), &dir.0);
        assert!(has_error(&e, "identity.jwks_file", "cannot read"), "{e:?}");

        // HS256 keys are never read from a JWKS.
        let path = dir.write(
            "ok.json",
            &jwks_json(vec![jwk(&rsa, Algorithm::RS256, "k")]),
        );
        let cfg = IdentityConfig {
            algorithm: Some("HS256".into()),
            secret: Some(SECRET.into()),
            ..jwks_config(&path)
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.jwks_file", "not used with HS256"),
            "{e:?}"
        );
        // Restricted to ES256, an RSA-only JWKS has no usable key.
        let cfg = IdentityConfig {
            algorithm: Some("ES256".into()),
            ..jwks_config(&path)
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.jwks_file", "no usable ES256"),
            "{e:?}"
        );
    }

    #[test]
    fn mode_specific_config_errors() {
        let dir = TempDir::new("mode-errors");
        let cfg = IdentityConfig {
            header: Some("bad header".into()),
            secret: Some(SECRET.into()),
            issuer: Some(ISSUER.into()),
            ..IdentityConfig::new(IdentityMode::TrustedHeader)
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.header", "not a valid HTTP header name"),
            "{e:?}"
        );
        assert!(has_error(&e, "identity.secret", "trusted_header"), "{e:?}");
        assert!(has_error(&e, "identity.issuer", "trusted_header"), "{e:?}");

        let cfg = IdentityConfig {
            header: Some(String::new()),
            ..IdentityConfig::new(IdentityMode::TrustedHeader)
        };
        assert!(has_error(
            &config_errors(&cfg, &dir.0),
            "identity.header",
            "empty"
        ));

        let cfg = IdentityConfig {
            secret: Some(SECRET.into()),
            algorithm: Some("RS256".into()),
            header: Some("x-user".into()),
            ..IdentityConfig::dev()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(has_error(&e, "identity.secret", "dev mode"), "{e:?}");
        assert!(has_error(&e, "identity.algorithm", "HS256 only"), "{e:?}");
        assert!(has_error(&e, "identity.header", "trusted_header"), "{e:?}");

        let cfg = IdentityConfig {
            header: Some("x-user".into()),
            leeway_s: Some(3_600),
            issuer: Some(String::new()),
            audience: Some(String::new()),
            user_claim: Some("exp".into()),
            ..hs256_config()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(has_error(&e, "identity.header", "jwt mode"), "{e:?}");
        assert!(has_error(&e, "identity.leeway_s", "at most 300"), "{e:?}");
        assert!(has_error(&e, "identity.issuer", "empty"), "{e:?}");
        assert!(has_error(&e, "identity.audience", "empty"), "{e:?}");
        assert!(
            has_error(&e, "identity.user_claim", "registered claim"),
            "{e:?}"
        );
        assert_eq!(e.len(), 5, "every problem is listed: {e:?}");
    }

    #[test]
    fn config_parses_from_toml() {
        let cfg: IdentityConfig = toml::from_str(
            r#"
            mode = "jwt"
            algorithm = "RS256"
            public_key_file = "keys/idp.pem"
            issuer = "https://idp.example.com"
            audience = "tollgate"
            leeway_s = 10
            user_claim = "email"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.mode, IdentityMode::Jwt);
        assert_eq!(
            cfg.public_key_file.as_deref(),
            Some(Path::new("keys/idp.pem"))
        );
        let cfg: IdentityConfig = toml::from_str(r#"mode = "trusted_header""#).unwrap();
        assert_eq!(cfg.mode, IdentityMode::TrustedHeader);
        assert!(toml::from_str::<IdentityConfig>(r#"mode = "none""#).is_err());
        assert!(toml::from_str::<IdentityConfig>("mode = \"dev\"\nsecrets = \"x\"").is_err());
    }

    #[test]
    fn debug_output_never_shows_the_secret() {
        let cfg = hs256_config();
        let shown = format!("{cfg:?}");
        assert!(
            !shown.contains(SECRET) && shown.contains("[redacted]"),
            "{shown}"
        );
        let (v, _) = hs_verifier();
        assert!(!format!("{v:?}").contains(SECRET));
    }

    #[test]
    fn messages_are_client_safe_sentences() {
        let all = [
            AuthError::MissingCredentials,
            AuthError::NotBearer,
            AuthError::Malformed("the bearer token is empty"),
            AuthError::AlgorithmNotAllowed,
            AuthError::UnknownKey,
            AuthError::BadSignature,
            AuthError::MissingExpiry,
            AuthError::Expired,
            AuthError::NotYetValid,
            AuthError::WrongIssuer,
            AuthError::WrongAudience,
            AuthError::MissingUserClaim("sub".into()),
            AuthError::InvalidUserId("it is empty"),
            AuthError::MissingTrustedHeader,
            AuthError::Unverifiable,
        ];
        let mut codes: Vec<&str> = all.iter().map(AuthError::code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        for e in &all {
            let m = e.message();
            assert!(
                !m.is_empty() && !m.contains(SECRET) && !m.contains("BEGIN"),
                "{m}"
            );
        }
    }

    #[test]
    fn base64url_decoding() {
        assert_eq!(b64url_decode("").unwrap(), b"");
        for input in [
            &b"f"[..],
            b"fo",
            b"foo",
            b"foob",
            b"fooba",
            b"foobar",
            &[0xfb, 0xff, 0xfe],
        ] {
            assert_eq!(b64url_decode(&b64url(input)).unwrap(), input);
        }
        assert_eq!(b64url(&[0xfb, 0xff]), "-_8");
        assert!(b64url_decode("Zm9v=").is_none());
        assert!(b64url_decode("Zm9v+").is_none());
        assert!(b64url_decode("Z").is_none());
        assert!(b64url_decode("Zh").is_none()); // non-canonical trailing bits
    }

    #[test]
    fn rsa_public_key_parsing() {
        let key = DecodingKey::from_rsa_pem(RSA_A_PUBLIC.as_bytes()).unwrap();
        let (n, e) = rsa_public_der(key.as_bytes()).unwrap();
        assert_eq!(bit_len(n), 2_048);
        assert_eq!(strip_zeros(e), [1, 0, 1]);
        assert!(check_rsa_public(n, e).is_ok());
        assert!(check_rsa_public(n, &[1]).is_err());
        assert!(check_rsa_public(n, &[1, 0, 0]).is_err());
        assert!(rsa_public_der(&[0x30, 0x03, 0x02, 0x01]).is_none());
        assert!(rsa_public_der(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
        assert!(rsa_public_der(&[]).is_none());
    }
}
