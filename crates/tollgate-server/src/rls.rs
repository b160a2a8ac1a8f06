//! Envoy's rate-limit service (RLS v3) settings: the `[rls]` table, which
//! maps the descriptors Envoy sends to tollgate limits, validated into
//! [`RlsRules`] (reloaded with the config), and says how the service's own
//! listener (`rls_listen`) is guarded, validated into [`RlsServer`] (read
//! at startup). The service itself is [`crate::grpc::rls::RlsService`].
//!
//! ```toml
//! rls_listen = "10.0.0.5:8789"  # its own port, never the API's grpc_listen
//!
//! [rls]
//! key_file = "rls.key"       # Envoy sends it as `x-tollgate-rls-key` metadata
//! max_in_flight = 1024       # calls answered at once; past it RESOURCE_EXHAUSTED
//! domain = "agents"          # Envoy's `domain`; other domains are answered OK
//! shadow = false             # true: answer OK while counting
//!
//! # The user's turn bucket (the plan's `turns`), shared with turn admission.
//! [[rls.descriptors]]
//! key = "user_id"
//! limit = "user_turns"
//!
//! # A named bucket with its own rate, one for the value "search".
//! [[rls.descriptors]]
//! key = "generic_key"
//! value = "search"
//! rate = { amount = 100, period_ms = 1000, burst = 200 }
//!
//! # One bucket per client address.
//! [[rls.descriptors]]
//! key = "remote_address"
//! rate = { amount = 10, period_ms = 1000 }
//!
//! # Per user, on the chat route only: descriptors of exactly these two
//! # entries, `generic_key = "chat"` and any `user_id`.
//! [[rls.descriptors]]
//! key = "user_id"
//! with = { generic_key = "chat" }
//! rate = { amount = 30, period_ms = 60000, burst = 10 }
//! ```
//!
//! # Matching
//!
//! Each descriptor of a request is matched on its own against the rules in
//! order; the first that matches decides, and a descriptor no rule matches
//! is answered OK with no limit (Envoy's semantics). A rule matches a
//! descriptor whose entries are exactly the rule's `key` and the keys of its
//! `with` table, in any order: the `with` entries with exactly the values
//! given, and the `key` entry with any value (or only `value`, when set).
//! Matching the whole descriptor, not a subset of it, keeps
//! `[generic_key=chat, user_id=u1]` and `[user_id=u1]` different limits, as
//! Envoy's reference service does. A rule that an earlier rule always wins
//! over is a config error.
//!
//! # Limits
//!
//! - `limit = "user_turns"`: the `key` entry's value is the user id, and
//!   the user's plan's turn bucket (`turns`) pays `hits_addend` turns: the
//!   same bucket turn admission (`POST /v1/runs`) takes from, so Envoy and
//!   the sidecar share one budget. The plan's `shadow` applies.
//! - `rate = { amount, period_ms, burst }`: a named bucket of its own,
//!   one per distinct descriptor (its entries' values), keyed
//!   `{rls:<domain>:<entries>}` in the store (one hash tag, so one Redis
//!   Cluster slot per bucket).
//!
//! Only a user id from a trusted source may reach a `user_turns` rule:
//! Envoy must set the header (or metadata) it reads from a verified
//! identity, such as `jwt_authn`'s `claim_to_headers`; see docs/envoy.md.
//!
//! # The listener
//!
//! Envoy is a peer the operator names; nobody else may spend a user's
//! turns. The service therefore has a listener of its own (`rls_listen`),
//! and with a `key` (or `key_file`) every call must carry it in the
//! `x-tollgate-rls-key` metadata ([`KEY_METADATA`]), compared in constant
//! time. A listener on an address other than loopback needs a key (config
//! validation refuses it otherwise). `max_in_flight` caps the calls it
//! answers at once.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tollgate_core::BucketSpec;
use tollgate_core::RateConfig;
use tollgate_core::plan::FieldError;

/// The domain answered when the config names none.
pub const DEFAULT_DOMAIN: &str = "tollgate";

/// Longest domain, entry key, `value`/`with` value or rule name accepted in
/// the config, bytes.
pub const MAX_CONFIG_STR: usize = 256;

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

/// `[rls]` as written. `Debug` redacts `key`; `Serialize` writes it (it is
/// the config).
#[derive(Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RlsConfig {
    /// The shared key every `ShouldRateLimit` must carry in the
    /// `x-tollgate-rls-key` metadata. Required (or `key_file`) when
    /// `rls_listen` is not a loopback address. Read at startup only.
    #[serde(default)]
    pub key: Option<String>,
    /// A file holding the key (surrounding whitespace trimmed), relative to
    /// the config file's directory. Instead of `key`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Calls the service answers at once (default
    /// [`DEFAULT_MAX_IN_FLIGHT`]); past it a call is answered
    /// `RESOURCE_EXHAUSTED` at once. Read at startup only.
    #[serde(default)]
    pub max_in_flight: Option<usize>,
    /// The rate-limit domain answered (Envoy's ratelimit filter `domain`);
    /// requests for another domain are answered OK with no limits. Default
    /// `tollgate`.
    #[serde(default = "default_domain")]
    pub domain: String,
    /// Shadow mode for every rule: decide and count (a would-be refusal
    /// takes nothing and is counted `shadow_denied`), but answer OK.
    #[serde(default)]
    pub shadow: bool,
    /// Add `x-ratelimit-limit`, `x-ratelimit-remaining` and
    /// `x-ratelimit-reset` (the draft-03 headers, as Envoy's
    /// `enable_x_ratelimit_headers: DRAFT_VERSION_03` writes them) to the
    /// response Envoy sends (default true). Turn off when Envoy writes them
    /// itself, or the client gets each twice. `retry-after` on OVER_LIMIT
    /// is sent either way.
    #[serde(default = "default_true")]
    pub rate_limit_headers: bool,
    /// The rules, first match wins.
    #[serde(default)]
    pub descriptors: Vec<RuleConfig>,
}

fn default_domain() -> String {
    DEFAULT_DOMAIN.to_owned()
}

fn default_true() -> bool {
    true
}

impl fmt::Debug for RlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RlsConfig")
            .field("key", &self.key.as_ref().map(|_| "[redacted]"))
            .field("key_file", &self.key_file)
            .field("max_in_flight", &self.max_in_flight)
            .field("domain", &self.domain)
            .field("shadow", &self.shadow)
            .field("rate_limit_headers", &self.rate_limit_headers)
            .field("descriptors", &self.descriptors)
            .finish()
    }
}

impl Default for RlsConfig {
    fn default() -> Self {
        Self {
            key: None,
            key_file: None,
            max_in_flight: None,
            domain: default_domain(),
            shadow: false,
            rate_limit_headers: true,
            descriptors: Vec::new(),
        }
    }
}

/// One `[[rls.descriptors]]` rule as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// The descriptor entry this rule limits on (its value keys the bucket,
    /// or is the user id), e.g. `user_id`, `generic_key`, `remote_address`.
    pub key: String,
    /// Match only this value of the `key` entry.
    #[serde(default)]
    pub value: Option<String>,
    /// Other entries the descriptor carries, with exactly these values.
    #[serde(default)]
    pub with: BTreeMap<String, String>,
    /// A tollgate limit: `user_turns`. Exactly one of `limit` and `rate`.
    #[serde(default)]
    pub limit: Option<RlsLimit>,
    /// A named bucket with this rate. Exactly one of `limit` and `rate`.
    #[serde(default)]
    pub rate: Option<RateConfig>,
    /// The limit's name in responses and metrics (default: the rule's
    /// entries, e.g. `generic_key=chat,user_id`).
    #[serde(default)]
    pub name: Option<String>,
}

/// The tollgate limits a rule can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RlsLimit {
    /// The user's turn bucket (the plan's `turns`); the entry's value is the
    /// user id.
    UserTurns,
}

/// What a matched descriptor is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The user's turn bucket, from the user's plan.
    UserTurns,
    /// A named bucket of this rate.
    Bucket(BucketSpec),
}

/// A validated rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    key: String,
    value: Option<String>,
    with: Vec<(String, String)>,
    target: Target,
    name: Arc<str>,
}

impl Rule {
    /// The entry limited on.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The only value matched, if any.
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// The other entries required, sorted by key.
    pub fn with(&self) -> &[(String, String)] {
        &self.with
    }

    /// What a match is charged to.
    pub fn target(&self) -> Target {
        self.target
    }

    /// The limit's name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Whether the descriptor of `entries` (key, value) is exactly this
    /// rule's shape; answers the `key` entry's value.
    fn matches<'e>(&self, entries: &[(&str, &'e str)]) -> Option<&'e str> {
        if entries.len() != 1 + self.with.len() {
            return None;
        }
        let value = entries.iter().find(|(k, _)| *k == self.key)?.1;
        if self.value.as_deref().is_some_and(|v| v != value) {
            return None;
        }
        // The rule's keys are distinct and as many as the entries, so each
        // entry is one of them exactly once.
        for (k, v) in &self.with {
            if !entries.iter().any(|(ek, ev)| ek == k && ev == v) {
                return None;
            }
        }
        Some(value)
    }
}

/// A descriptor matched to its rule.
#[derive(Debug, Clone)]
pub struct Matched<'r, 'e> {
    /// The rule.
    pub rule: &'r Rule,
    /// The `key` entry's value (the user id of a `user_turns` rule).
    pub value: &'e str,
    /// The store key of a named bucket: `{rls:<domain>:<k>=<v>,…}`, entries
    /// sorted by key, `%`, `{`, `}`, `:`, `,` and `=` escaped.
    pub bucket_key: Option<String>,
}

/// The validated `[rls]` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsRules {
    domain: String,
    shadow: bool,
    rate_limit_headers: bool,
    rules: Vec<Rule>,
}

impl Default for RlsRules {
    /// The default `[rls]`: domain `tollgate`, no rules (every descriptor
    /// is answered OK).
    fn default() -> Self {
        Self {
            domain: DEFAULT_DOMAIN.to_owned(),
            shadow: false,
            rate_limit_headers: true,
            rules: Vec::new(),
        }
    }
}

impl RlsRules {
    /// The domain answered.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Whether every rule is in shadow mode.
    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// Whether responses carry the `x-ratelimit-*` headers.
    pub fn rate_limit_headers(&self) -> bool {
        self.rate_limit_headers
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The first rule matching the descriptor of `entries` (key, value).
    pub fn find<'r, 'e>(&'r self, entries: &[(&str, &'e str)]) -> Option<Matched<'r, 'e>> {
        let (rule, value) = self
            .rules
            .iter()
            .find_map(|r| r.matches(entries).map(|v| (r, v)))?;
        let bucket_key = match rule.target {
            Target::UserTurns => None,
            Target::Bucket(_) => Some(self.bucket_key(entries)),
        };
        Some(Matched {
            rule,
            value,
            bucket_key,
        })
    }

    fn bucket_key(&self, entries: &[(&str, &str)]) -> String {
        let mut sorted: Vec<&(&str, &str)> = entries.iter().collect();
        sorted.sort_unstable();
        let mut key = String::with_capacity(64);
        key.push_str("{rls:");
        esc_into(&mut key, &self.domain);
        key.push(':');
        for (i, (k, v)) in sorted.iter().enumerate() {
            if i > 0 {
                key.push(',');
            }
            esc_into(&mut key, k);
            key.push('=');
            esc_into(&mut key, v);
        }
        key.push('}');
        key
    }
}

/// Appends `s` with `%`, `{`, `}`, `:`, `,` and `=` percent-escaped, so no
/// value can close the hash tag or make two descriptors one key.
fn esc_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '%' | '{' | '}' | ':' | ',' | '=' => {
                let _ = write!(out, "%{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
}

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

struct Check {
    errors: Vec<FieldError>,
}

impl Check {
    fn err(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        self.errors.push(FieldError {
            path: path.into(),
            reason: reason.into(),
        });
    }

    fn text(&mut self, path: impl Into<String>, s: &str) {
        if s.is_empty() {
            self.err(path, "must not be empty");
        } else if s.len() > MAX_CONFIG_STR {
            self.err(path, format!("must be at most {MAX_CONFIG_STR} bytes"));
        }
    }

    fn rate(&mut self, path: &str, r: &RateConfig) -> Option<BucketSpec> {
        r.validate(path, &mut self.errors)
    }
}

/// A key as a TOML path writes it: bare when it can be, else quoted.
fn toml_key(k: &str) -> String {
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        k.to_owned()
    } else {
        format!("{k:?}")
    }
}

/// The default name of a rule: its `with` entries, then its key (and value).
fn default_name(key: &str, value: Option<&str>, with: &[(String, String)]) -> String {
    let mut name = String::new();
    for (k, v) in with {
        let _ = write!(name, "{k}={v},");
    }
    name.push_str(key);
    if let Some(v) = value {
        let _ = write!(name, "={v}");
    }
    name
}

/// Validates `[rls]`: every problem, each with its field path under `rls.`.
///
/// # Errors
///
/// Each problem found: an empty domain, key or value; a rule with both or
/// neither of `limit` and `rate`; an invalid rate; a `with` table naming the
/// rule's own key; a name with a `"`; a rule an earlier one always wins over.
pub fn validate_rls(cfg: &RlsConfig) -> Result<RlsRules, Vec<FieldError>> {
    let mut c = Check { errors: Vec::new() };
    c.text("rls.domain", &cfg.domain);
    let mut rules: Vec<Rule> = Vec::with_capacity(cfg.descriptors.len());
    for (i, r) in cfg.descriptors.iter().enumerate() {
        let path = format!("rls.descriptors[{i}]");
        c.text(format!("{path}.key"), &r.key);
        if let Some(v) = &r.value {
            c.text(format!("{path}.value"), v);
        }
        for (k, v) in &r.with {
            let wpath = format!("{path}.with.{}", toml_key(k));
            c.text(wpath.clone(), k);
            c.text(wpath.clone(), v);
            if *k == r.key {
                c.err(
                    wpath,
                    format!("names the rule's own key {k:?}; use `value` to match its value"),
                );
            }
        }
        let target = match (&r.limit, &r.rate) {
            (Some(RlsLimit::UserTurns), None) => Some(Target::UserTurns),
            (None, Some(rate)) => c.rate(&format!("{path}.rate"), rate).map(Target::Bucket),
            (Some(_), Some(_)) => {
                c.err(path.clone(), "has both `limit` and `rate`; give one");
                None
            }
            (None, None) => {
                c.err(
                    path.clone(),
                    "needs `limit = \"user_turns\"` or `rate = { amount, period_ms, burst }`",
                );
                None
            }
        };
        let with: Vec<(String, String)> =
            r.with.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let name = match &r.name {
            Some(n) => {
                c.text(format!("{path}.name"), n);
                if n.contains(['"', '\\']) || n.chars().any(char::is_control) {
                    c.err(
                        format!("{path}.name"),
                        "must not contain quotes, backslashes or control characters (it is sent in a header)",
                    );
                }
                n.clone()
            }
            None => default_name(&r.key, r.value.as_deref(), &with),
        };
        let Some(target) = target else { continue };
        let rule = Rule {
            key: r.key.clone(),
            value: r.value.clone(),
            with,
            target,
            name: name.into(),
        };
        if let Some(j) = cfg.descriptors[..i].iter().position(|e| {
            e.key == r.key && e.with == r.with && (e.value.is_none() || e.value == r.value)
        }) {
            c.err(
                path,
                format!("never matches: rls.descriptors[{j}] comes first and matches every descriptor this rule does"),
            );
        }
        rules.push(rule);
    }
    if c.errors.is_empty() {
        Ok(RlsRules {
            domain: cfg.domain.clone(),
            shadow: cfg.shadow,
            rate_limit_headers: cfg.rate_limit_headers,
            rules,
        })
    } else {
        Err(c.errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> RlsConfig {
        #[derive(Deserialize)]
        struct File {
            rls: RlsConfig,
        }
        toml::from_str::<File>(text).expect("valid toml").rls
    }

    fn rules(text: &str) -> RlsRules {
        validate_rls(&parse(text)).expect("valid rules")
    }

    fn errors(text: &str) -> Vec<String> {
        validate_rls(&parse(text))
            .expect_err("invalid rules")
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    }

    const EXAMPLE: &str = r#"
        [rls]
        domain = "agents"
        [[rls.descriptors]]
        key = "generic_key"
        value = "search"
        rate = { amount = 100, period_ms = 1000, burst = 200 }
        [[rls.descriptors]]
        key = "user_id"
        limit = "user_turns"
        [[rls.descriptors]]
        key = "user_id"
        with = { generic_key = "chat" }
        rate = { amount = 30, period_ms = 60000, burst = 10 }
        name = "chat per user"
        [[rls.descriptors]]
        key = "generic_key"
        rate = { amount = 5, period_ms = 1000 }
    "#;

    #[test]
    fn defaults() {
        let r = validate_rls(&RlsConfig::default()).unwrap();
        assert_eq!(r, RlsRules::default());
        assert_eq!(r.domain(), "tollgate");
        assert!(r.rate_limit_headers() && !r.shadow() && r.rules().is_empty());
        assert!(r.find(&[("user_id", "u1")]).is_none());
    }

    #[test]
    fn whole_descriptors_match_in_order() {
        let r = rules(EXAMPLE);
        let m = r.find(&[("user_id", "u1")]).unwrap();
        assert_eq!((m.rule.target(), m.value), (Target::UserTurns, "u1"));
        assert_eq!(&**m.rule.name(), "user_id");
        assert!(m.bucket_key.is_none());

        // Entries in any order; the `with` value must be exact.
        let m = r
            .find(&[("user_id", "u1"), ("generic_key", "chat")])
            .unwrap();
        assert_eq!(&**m.rule.name(), "chat per user");
        assert_eq!(
            m.bucket_key.as_deref(),
            Some("{rls:agents:generic_key=chat,user_id=u1}")
        );
        assert!(
            r.find(&[("user_id", "u1"), ("generic_key", "other")])
                .is_none()
        );
        // A superset or a subset of a rule's entries is another descriptor.
        assert!(
            r.find(&[("user_id", "u1"), ("generic_key", "chat"), ("x", "y")])
                .is_none()
        );
        assert!(r.find(&[]).is_none());
        assert!(r.find(&[("user_id", "u1"), ("user_id", "u2")]).is_none());

        // Value-specific first, then the rule for every other value.
        let m = r.find(&[("generic_key", "search")]).unwrap();
        assert_eq!(&**m.rule.name(), "generic_key=search");
        assert_eq!(
            m.rule.target(),
            Target::Bucket(BucketSpec::new(100, 1_000, 200).unwrap())
        );
        let m = r.find(&[("generic_key", "x:{y}")]).unwrap();
        assert_eq!(&**m.rule.name(), "generic_key");
        assert_eq!(
            m.bucket_key.as_deref(),
            Some("{rls:agents:generic_key=x%3A%7By%7D}")
        );
        assert!(r.find(&[("remote_address", "10.0.0.1")]).is_none());
    }

    #[test]
    fn escaping_keeps_descriptors_apart() {
        let r = rules(
            r#"
            [rls]
            [[rls.descriptors]]
            key = "a"
            rate = { amount = 1, period_ms = 1000 }
            [[rls.descriptors]]
            key = "a"
            with = { b = "1" }
            rate = { amount = 1, period_ms = 1000 }
        "#,
        );
        let one = r.find(&[("a", "x,b=1")]).unwrap().bucket_key.unwrap();
        let two = r
            .find(&[("a", "x"), ("b", "1")])
            .unwrap()
            .bucket_key
            .unwrap();
        assert_ne!(one, two);
        assert_eq!(one, "{rls:tollgate:a=x%2Cb%3D1}");
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let e = errors(
            r#"
            [rls]
            domain = ""
            [[rls.descriptors]]
            key = ""
            limit = "user_turns"
            [[rls.descriptors]]
            key = "a"
            [[rls.descriptors]]
            key = "b"
            limit = "user_turns"
            rate = { amount = 1, period_ms = 1000 }
            [[rls.descriptors]]
            key = "c"
            value = ""
            with = { c = "x" }
            rate = { amount = 0, period_ms = -1, burst = 0 }
            [[rls.descriptors]]
            key = "d"
            rate = { amount = 1, period_ms = 9007199254740993 }
            name = 'say "hi"'
        "#,
        );
        let expected = [
            "rls.domain: must not be empty",
            "rls.descriptors[0].key: must not be empty",
            "rls.descriptors[1]: needs `limit = \"user_turns\"` or `rate = { amount, period_ms, burst }`",
            "rls.descriptors[2]: has both `limit` and `rate`; give one",
            "rls.descriptors[3].value: must not be empty",
            "rls.descriptors[3].with.c: names the rule's own key \"c\"; use `value` to match its value",
            "rls.descriptors[3].rate.amount: must be at least 1 (got 0)",
            "rls.descriptors[3].rate.period_ms: must be at least 1 (got -1)",
            "rls.descriptors[3].rate.burst: capacity must be at least 1 (got 0)",
            "rls.descriptors[4].rate: burst × period_ms (1 × 9007199254740993) and amount × period_ms must not exceed 2^53",
            "rls.descriptors[4].name: must not contain quotes, backslashes or control characters (it is sent in a header)",
        ];
        assert_eq!(e, expected);
    }

    #[test]
    fn a_rule_behind_a_wider_one_is_an_error() {
        let e = errors(
            r#"
            [rls]
            [[rls.descriptors]]
            key = "generic_key"
            rate = { amount = 1, period_ms = 1000 }
            [[rls.descriptors]]
            key = "generic_key"
            value = "search"
            rate = { amount = 9, period_ms = 1000 }
        "#,
        );
        assert_eq!(
            e,
            [
                "rls.descriptors[1]: never matches: rls.descriptors[0] comes first and matches every descriptor this rule does"
            ]
        );
        // The other way round is the intended order; another `with` is
        // another shape.
        rules(
            r#"
            [rls]
            [[rls.descriptors]]
            key = "generic_key"
            value = "search"
            rate = { amount = 9, period_ms = 1000 }
            [[rls.descriptors]]
            key = "generic_key"
            rate = { amount = 1, period_ms = 1000 }
            [[rls.descriptors]]
            key = "generic_key"
            with = { tenant = "acme" }
            rate = { amount = 1, period_ms = 1000 }
        "#,
        );
    }

    #[test]
    fn keys_are_checked_compared_and_never_shown() {
        const KEY: &str = "0123456789abcdef0123456789abcdef";
        let key = RlsKey::new(KEY).unwrap();
        assert!(key.matches(KEY.as_bytes()));
        assert!(!key.matches(b"0123456789abcdef0123456789abcdeF"));
        assert!(!key.matches(&KEY.as_bytes()[1..]));
        assert!(!key.matches(b""));
        assert_eq!(key, RlsKey::new(KEY).unwrap());
        assert_ne!(key, RlsKey::new(&KEY.repeat(2)).unwrap());
        assert_eq!(format!("{key:?}"), "RlsKey([redacted])");
        for bad in [
            &KEY[1..],
            "0123456789abcdef 0123456789abcdef",
            "0123456789abcdef\t0123456789abcdef",
            "é123456789abcdef0123456789abcdef",
        ] {
            assert!(RlsKey::new(bad).is_err(), "{bad:?}");
        }
        assert!(RlsKey::new(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(RlsKey::new(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());

        let cfg = RlsConfig {
            key: Some(KEY.to_owned()),
            max_in_flight: Some(3),
            ..RlsConfig::default()
        };
        assert!(!format!("{cfg:?}").contains(KEY));
        let server = validate_rls_server(&cfg, Path::new(".")).unwrap();
        assert!(!format!("{server:?}").contains(KEY));
        assert_eq!(server.max_in_flight, 3);
        assert_eq!(
            validate_rls_server(&RlsConfig::default(), Path::new(".")).unwrap(),
            RlsServer::default()
        );
    }

    #[test]
    fn unknown_fields_and_limits_are_rejected() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct File {
            rls: RlsConfig,
        }
        for text in [
            "[rls]\ndomian = \"x\"",
            "[rls]\n[[rls.descriptors]]\nkey = \"a\"\nlimit = \"user_tokens\"",
            "[rls]\n[[rls.descriptors]]\nkey = \"a\"\nlimt = \"user_turns\"",
        ] {
            assert!(toml::from_str::<File>(text).is_err(), "{text}");
        }
    }
}
