//! The `[rls]` rules: the table as written ([`RlsConfig`]), validated
//! into [`RlsRules`], and the matching of a descriptor to its rule and its
//! named bucket's store key (see the module docs for the syntax).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tollgate_core::plan::{FieldError, toml_key};
use tollgate_core::{BucketSpec, Id, RateConfig};

/// The domain answered when the config names none.
pub const DEFAULT_DOMAIN: &str = "tollgate";

/// Longest domain, entry key, `value`/`with` value or rule name accepted in
/// the config, bytes.
pub const MAX_CONFIG_STR: usize = 256;

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
    /// [`DEFAULT_MAX_IN_FLIGHT`](super::DEFAULT_MAX_IN_FLIGHT)); past it a
    /// call is answered `RESOURCE_EXHAUSTED` at once. Read at startup only.
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
    fn matches<'e>(&self, entries: &[(&str, Id<'e>)]) -> Option<Id<'e>> {
        if entries.len() != 1 + self.with.len() {
            return None;
        }
        let value = entries.iter().find(|(k, _)| *k == self.key)?.1;
        if self.value.as_deref().is_some_and(|v| v != value.as_str()) {
            return None;
        }
        // The rule's keys are distinct and as many as the entries, so each
        // entry is one of them exactly once.
        for (k, v) in &self.with {
            if !entries.iter().any(|(ek, ev)| ek == k && ev.as_str() == v) {
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
    pub value: Id<'e>,
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
    pub fn find<'r, 'e>(&'r self, entries: &[(&str, Id<'e>)]) -> Option<Matched<'r, 'e>> {
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

    fn bucket_key(&self, entries: &[(&str, Id<'_>)]) -> String {
        let mut sorted: Vec<&(&str, Id<'_>)> = entries.iter().collect();
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

pub(super) struct Check {
    pub(super) errors: Vec<FieldError>,
}

impl Check {
    pub(super) fn err(&mut self, path: impl Into<String>, reason: impl Into<String>) {
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
