//! jwt and dev modes: the bearer token, its header, its signature (by
//! [`jsonwebtoken`], for exactly the configured algorithm) and its claims,
//! checked on the injected clock; and minting HS256 tokens. A verified
//! token is cached ([`super::cache`]): a hit skips the header, signature and
//! claim checks but not the time checks.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::{Map, Value};

use super::cache::{Cached, TOKEN_CACHE_CAPACITY, TokenCache, TokenCacheStats, digest};
use super::jwks::JwksSource;
use super::{AuthError, Identity, MAX_MINT_TTL_S, MAX_TOKEN_BYTES, MintError, user_id};

/// jwt or dev mode: where the keys are, and what the claims must say.
pub(super) struct Jwt {
    pub(super) source: KeySource,
    pub(super) rules: ClaimRules,
    /// Dev mode: the well-known [`DEV_SECRET`](super::DEV_SECRET).
    pub(super) dev: bool,
    /// Tokens verified already.
    cache: TokenCache,
    /// Tokens verified in full (not answered from the cache).
    verifications: AtomicU64,
}

/// The keys a token's signature is checked with.
pub(super) enum KeySource {
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

/// What a token's claims must satisfy, and where its user, scopes and
/// tenant are.
pub(super) struct ClaimRules {
    pub(super) issuer: Option<String>,
    pub(super) audience: Option<String>,
    pub(super) leeway_s: u64,
    pub(super) user_claim: String,
    pub(super) scope_claim: String,
    pub(super) feedback_scope: String,
    pub(super) tenant_claim: Option<String>,
}

impl KeySource {
    /// HS256 with `secret`; `origin` says where it came from (never the
    /// secret itself).
    pub(super) fn hmac(secret: &[u8], origin: String) -> Self {
        KeySource::Hmac {
            decoding: DecodingKey::from_secret(secret),
            encoding: EncodingKey::from_secret(secret),
            origin,
        }
    }

    fn describe(&self) -> String {
        match self {
            KeySource::Hmac { origin, .. } => format!("HS256 with the secret from {origin}"),
            KeySource::Public { alg, path, .. } => {
                format!("{alg:?} public key {}", path.display())
            }
            KeySource::Jwks(src) => src.describe(),
        }
    }
}

impl Jwt {
    /// jwt or dev mode with `source`'s keys and `rules`, with an empty
    /// token cache of [`TOKEN_CACHE_CAPACITY`] entries.
    pub(super) fn new(source: KeySource, rules: ClaimRules, dev: bool) -> Self {
        Self {
            source,
            rules,
            dev,
            cache: TokenCache::new(TOKEN_CACHE_CAPACITY),
            verifications: AtomicU64::new(0),
        }
    }

    /// The identity in `headers`' bearer token, checked at `now_ms` of the
    /// wall clock: from the cache when this token was verified with the
    /// current keys (its `exp` and `nbf` checked again), else verified in
    /// full and, if valid, cached.
    pub(super) fn identify(&self, headers: &HeaderMap, now_ms: u64) -> Result<Identity, AuthError> {
        let token = bearer_token(headers)?;
        let now_s = now_ms / 1_000;
        // A JWKS's keys, reread first if the file changed: their generation
        // is the cache's epoch. Other keys never change.
        let jwks = match &self.source {
            KeySource::Jwks(src) => Some(src.current(now_ms)),
            _ => None,
        };
        let epoch = jwks.as_ref().map_or(0, |set| set.generation);
        let digest = digest(token);
        if let Some(hit) = self.cache.get(&digest, epoch) {
            self.rules.check_times(hit.exp_s, hit.nbf_s, now_s)?;
            return Ok(hit.identity);
        }
        self.verifications.fetch_add(1, Ordering::Relaxed);
        let head = TokenHead::read(token)?;
        let claims = match &self.source {
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
                // The keys of the epoch read above (always there for a JWKS).
                let set = jwks.unwrap_or_else(|| src.current(now_ms));
                let key = set.find(head.kid.as_deref()).ok_or(AuthError::UnknownKey)?;
                if key.alg != alg {
                    return Err(AuthError::AlgorithmNotAllowed);
                }
                decode_claims(token, &key.key, alg)?
            }
        };
        let verified = self.rules.check(&claims, now_s)?;
        self.cache.insert(digest, epoch, verified.clone());
        Ok(verified.identity)
    }

    /// The token cache's entries and counters.
    pub(super) fn cache_stats(&self) -> TokenCacheStats {
        TokenCacheStats {
            verifications: self.verifications.load(Ordering::Relaxed),
            ..self.cache.stats()
        }
    }

    /// An HS256 token for `user`, issued at `now_s` and valid for `ttl_s`
    /// seconds (see [`Verifier::mint_with`](super::Verifier::mint_with)).
    pub(super) fn mint(
        &self,
        user: &str,
        ttl_s: u64,
        scopes: &[String],
        tenant: Option<&str>,
        now_s: u64,
    ) -> Result<String, MintError> {
        let KeySource::Hmac { encoding, .. } = &self.source else {
            return Err(MintError::Unsupported(
                "jwt (public key)",
                "only the identity provider holding the private key can issue tokens",
            ));
        };
        user_id(user).map_err(MintError::InvalidUser)?;
        if ttl_s == 0 || ttl_s > MAX_MINT_TTL_S {
            return Err(MintError::InvalidTtl);
        }
        let rules = &self.rules;
        let mut claims = Map::new();
        claims.insert(rules.user_claim.clone(), Value::from(user));
        claims.insert("iat".to_owned(), Value::from(now_s));
        claims.insert("exp".to_owned(), Value::from(now_s.saturating_add(ttl_s)));
        if let Some(iss) = &rules.issuer {
            claims.insert("iss".to_owned(), Value::from(iss.as_str()));
        }
        if let Some(aud) = &rules.audience {
            claims.insert("aud".to_owned(), Value::from(aud.as_str()));
        }
        if !scopes.is_empty() {
            claims.insert(rules.scope_claim.clone(), Value::from(scopes.join(" ")));
        }
        if let Some(tenant) = tenant {
            let Some(claim) = &rules.tenant_claim else {
                return Err(MintError::NoTenantClaim);
            };
            claims.insert(claim.clone(), Value::from(tenant));
        }
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, encoding)
            .map_err(MintError::Signing)
    }

    /// The startup banner's description of this mode.
    pub(super) fn describe(&self) -> String {
        let rules = self.rules.describe();
        if self.dev {
            return format!(
                "dev (HS256 with the well-known dev secret: NOT for production; {rules})"
            );
        }
        format!("jwt ({}; {rules})", self.source.describe())
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
        if URL_SAFE_NO_PAD.decode(payload).is_err() || URL_SAFE_NO_PAD.decode(signature).is_err() {
            return Err(AuthError::Malformed("a part of the token is not base64url"));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(head)
            .map_err(|_| AuthError::Malformed("the token header is not base64url"))?;
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

/// The JOSE name of an algorithm this server uses.
pub(super) fn alg_name(alg: Algorithm) -> &'static str {
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
    /// `exp` (whole seconds) has not passed at `now_s`, with the leeway.
    fn check_exp(&self, exp_s: u64, now_s: u64) -> Result<(), AuthError> {
        if now_s >= exp_s.saturating_add(self.leeway_s) {
            return Err(AuthError::Expired);
        }
        Ok(())
    }

    /// `nbf` (whole seconds) has come at `now_s`, with the leeway.
    fn check_nbf(&self, nbf_s: u64, now_s: u64) -> Result<(), AuthError> {
        if nbf_s > now_s.saturating_add(self.leeway_s) {
            return Err(AuthError::NotYetValid);
        }
        Ok(())
    }

    /// The time checks of [`check`](ClaimRules::check), in its order, for
    /// a token found in the cache.
    pub(super) fn check_times(
        &self,
        exp_s: u64,
        nbf_s: Option<u64>,
        now_s: u64,
    ) -> Result<(), AuthError> {
        self.check_exp(exp_s, now_s)?;
        nbf_s.map_or(Ok(()), |nbf| self.check_nbf(nbf, now_s))
    }

    /// Checks verified `claims` at `now_s`: the identity they give, with
    /// their `exp` and `nbf` for the cache.
    fn check(&self, claims: &Map<String, Value>, now_s: u64) -> Result<Cached, AuthError> {
        let exp_s = match claims.get("exp") {
            None | Some(Value::Null) => return Err(AuthError::MissingExpiry),
            Some(v) => numeric_date(v, false).ok_or(AuthError::Malformed(
                "the exp claim is not a number of seconds",
            ))?,
        };
        self.check_exp(exp_s, now_s)?;
        let nbf_s = match claims.get("nbf") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let nbf = numeric_date(v, true).ok_or(AuthError::Malformed(
                    "the nbf claim is not a number of seconds",
                ))?;
                self.check_nbf(nbf, now_s)?;
                Some(nbf)
            }
        };
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
            Some(Value::String(user)) => user_id(user).map_err(AuthError::InvalidUserId)?,
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
        Ok(Cached {
            identity: Identity {
                user,
                feedback,
                tenant,
            },
            exp_s,
            nbf_s,
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

#[cfg(test)]
mod tests;
