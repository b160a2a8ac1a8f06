//! `[identity]` in the config, and its validation into a [`Kind`]: which
//! fields each mode takes, the secret, key and JWKS files they name, and the
//! claim rules. Every problem is reported with its field path.

use std::fmt;
use std::path::{Path, PathBuf};

use axum::http::header::HeaderName;
use jsonwebtoken::Algorithm;
use serde::{Deserialize, Serialize};
use tollgate_core::Clock;

use super::jwks::JwksSource;
use super::jwt::{ClaimRules, Jwt, KeySource};
use super::keys::{load_public_key, read_capped};
use super::trusted::Trusted;
use super::{
    DEFAULT_FEEDBACK_SCOPE, DEFAULT_LEEWAY_S, DEFAULT_SCOPE_CLAIM, DEFAULT_SCOPE_HEADER,
    DEFAULT_TRUSTED_HEADER, DEFAULT_USER_CLAIM, DEV_SECRET, FieldError, Kind, MAX_LEEWAY_S,
    MIN_SECRET_BYTES,
};

/// Claims that cannot name the user (they are set by
/// [`Verifier::mint`](super::Verifier::mint) or checked by the verifier).
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

/// Validates `cfg` and loads its keys: the [`Kind`] of verifier it
/// configures, or every problem found. Relative paths are resolved against
/// `base_dir`.
pub(super) fn kind_of(
    cfg: &IdentityConfig,
    base_dir: &Path,
    clock: &dyn Clock,
) -> Result<Kind, Vec<FieldError>> {
    let mut p = Problems::default();
    let kind = match cfg.mode {
        IdentityMode::TrustedHeader => trusted_header_kind(cfg, &mut p),
        IdentityMode::Dev => dev_kind(cfg, &mut p),
        IdentityMode::Jwt => jwt_kind(cfg, base_dir, clock, &mut p),
    };
    match kind {
        Some(kind) if p.0.is_empty() => Ok(kind),
        _ => {
            if p.0.is_empty() {
                p.add("mode", "the identity settings cannot be used");
            }
            Err(p.0)
        }
    }
}

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
    Some(Kind::Jwt(Box::new(Jwt::new(
        KeySource::hmac(DEV_SECRET.as_bytes(), "the built-in dev secret".to_owned()),
        rules,
        true,
    ))))
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
    source.map(|source| Kind::Jwt(Box::new(Jwt::new(source, rules, false))))
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
    Some(KeySource::hmac(&secret, origin))
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
mod tests;
