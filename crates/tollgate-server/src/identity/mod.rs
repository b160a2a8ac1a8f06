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
//!   [`MAX_USER_ID_LEN`] characters with no control characters.
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
//!
//! # Layout
//!
//! - this file: the public types, [`AuthError`] and the [`Verifier`] entry;
//! - `config.rs`: [`IdentityConfig`] and its validation (every problem with
//!   its field path);
//! - `jwt.rs`: jwt and dev modes: the bearer token, algorithm pinning,
//!   signature, claims on the injected clock, minting;
//! - `cache.rs`: the verified-token cache of jwt and dev modes (bounded,
//!   keyed by the token's SHA-256, `exp`/`nbf` checked on every hit, dropped
//!   when a JWKS's keys change; successes only);
//! - `jwks.rs`: a JWKS file as a key source, reread when it changes;
//! - `keys.rs`: key files and key material (PEM, JWK) and their checks, all
//!   parsed by maintained crates (`jsonwebtoken`, `rsa`, `p256`,
//!   `base64`);
//! - `trusted.rs`: trusted_header mode.

mod cache;
mod config;
mod jwks;
mod jwt;
mod keys;
mod trusted;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use axum::http::HeaderMap;
use tollgate_core::Clock;
use tollgate_core::IdBuf;

pub use self::cache::{TOKEN_CACHE_CAPACITY, TokenCacheStats};
pub use self::config::{IdentityConfig, IdentityMode};
use self::jwt::{Jwt, KeySource};
use self::trusted::Trusted;

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

/// The longest accepted user id, characters (the one id rule of core).
pub use tollgate_core::id::MAX_ID_LEN as MAX_USER_ID_LEN;

/// The shortest accepted HS256 secret, bytes (RFC 7518 §3.2: at least the
/// hash size). The dev secret is exempt: it is public anyway.
pub const MIN_SECRET_BYTES: usize = 32;

/// The longest accepted bearer token, bytes.
pub const MAX_TOKEN_BYTES: usize = 8_192;

/// How often, at most, the JWKS file's modification time is checked, ms.
pub const JWKS_CHECK_INTERVAL_MS: u64 = 1_000;

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
    /// The user id is not acceptable (see [`MAX_USER_ID_LEN`]).
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
    pub user: IdBuf,
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

/// The verifier of one mode.
enum Kind {
    Jwt(Box<Jwt>),
    TrustedHeader(Box<Trusted>),
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
        let kind = config::kind_of(cfg, base_dir, clock.as_ref())?;
        Ok(Self { kind, clock })
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
        self.identify(headers, None).map(|id| id.user.into())
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
            Kind::Jwt(jwt) => jwt.identify(headers, self.clock.now_ms()),
        }
    }

    /// One line for the startup banner, e.g. `jwt (RS256 public key
    /// /etc/tollgate/key.pem; issuer …, audience …, user claim sub, leeway
    /// 30 s)` or `dev (HS256 with the well-known dev secret: NOT for
    /// production; …)`. Never includes a secret.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::TrustedHeader(t) => t.describe(),
            Kind::Jwt(jwt) => jwt.describe(),
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

    /// The verified-token cache's entries and counters (jwt and dev modes;
    /// `None` in trusted_header mode, which verifies no token).
    pub fn token_cache_stats(&self) -> Option<TokenCacheStats> {
        match &self.kind {
            Kind::TrustedHeader(_) => None,
            Kind::Jwt(jwt) => Some(jwt.cache_stats()),
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
        match &self.kind {
            Kind::Jwt(jwt) => jwt.mint(user, ttl_s, scopes, tenant, self.clock.now_ms() / 1_000),
            Kind::TrustedHeader(_) => Err(MintError::Unsupported(
                "trusted_header",
                "the authenticating proxy in front identifies users",
            )),
        }
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

/// A user id follows the one id rule ([`tollgate_core::id`]): non-empty,
/// at most [`MAX_USER_ID_LEN`] characters, free of control characters (it
/// ends up in store keys and logs). Checked here, once per verified
/// credential; the request carries it on as an [`IdBuf`].
fn user_id(user: &str) -> Result<IdBuf, &'static str> {
    use tollgate_core::id::IdError;
    IdBuf::new(user).map_err(|e| match e {
        IdError::Empty => "it is empty",
        IdError::TooLong => "it is longer than 512 characters",
        _ => "it contains control characters",
    })
}

#[cfg(test)]
mod tests;
