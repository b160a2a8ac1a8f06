//! Provider limits as data: per provider key (provider, model), requests
//! and tokens per period with bursts, a policy, AIMD parameters and
//! optional tenant shares (SPEC §5), validated into [`ProviderBook`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use tollgate_core::aimd::{AimdParams, FULL};
use tollgate_core::bucket::{BucketSpec, MAX_SCALED};
use tollgate_core::fair;
use tollgate_core::plan::{FieldError, InvalidPlans, RateConfig};

use super::feedback::{Feedback, ProviderKind};

/// What a permit does when the provider's buckets cannot grant at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Wait, if the wait fits the call's deadline (`max_wait_ms`).
    #[default]
    Block,
    /// Refuse at once.
    Reject,
}

/// A tenant's part of a provider key's pool: a ceiling (`share`), a weight
/// for fair sharing (`weight`), or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The fraction of every pool rate (and burst) the tenant may use:
    /// more than 0, at most 1. Shares need not add up to 1.
    #[serde(default)]
    pub share: Option<f64>,
    /// Its weight in fair sharing (SPEC §5, *Fair sharing*), 1 to 1,000;
    /// any weight on a key turns fair sharing on for it (unlisted tenants
    /// weigh 1).
    #[serde(default)]
    pub weight: Option<u32>,
}

/// One provider key's limits as written in config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Whose conventions to read in its answers (`openai`, `anthropic`,
    /// `gemini`, `generic`). Defaults to the provider's name when it is one
    /// of those, else `generic`.
    #[serde(default)]
    pub kind: Option<String>,
    /// Requests per period (RPM), with its burst.
    #[serde(default)]
    pub requests: Option<RateConfig>,
    /// Tokens per period (TPM), input and output together.
    #[serde(default)]
    pub tokens: Option<RateConfig>,
    /// Input tokens per period, when the provider limits them apart.
    #[serde(default)]
    pub input_tokens: Option<RateConfig>,
    /// Output tokens per period, when the provider limits them apart.
    #[serde(default)]
    pub output_tokens: Option<RateConfig>,
    /// `block` (default) or `reject`.
    #[serde(default)]
    pub policy: Policy,
    /// The longest a permit waits under `block`, ms (default 4,000). A
    /// call's own deadline can shorten it.
    #[serde(default)]
    pub max_wait_ms: Option<i64>,
    /// AIMD parameters (defaults: floor 10 %, step 5 %, decrease interval
    /// 5 s, increase interval 10 s).
    #[serde(default)]
    pub aimd: Option<AimdParams>,
    /// The longest cooldown one provider answer may set, ms (default
    /// 300,000): a throttled or server-error answer's retry hint is cut to
    /// it. 1 ms to 1 day.
    #[serde(default)]
    pub max_cooldown_ms: Option<i64>,
    /// The longest this replica fails fast after an exhausted answer, ms
    /// (default 60,000): the provider's hint, else
    /// [`EXHAUSTED_HOLD_MS`](super::EXHAUSTED_HOLD_MS), cut to it. 1 ms to
    /// 1 day.
    #[serde(default)]
    pub max_exhausted_ms: Option<i64>,
    /// Tenant shares of the pool, by tenant name.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantConfig>,
}

/// The default `max_wait_ms` of a provider key: 4,000 ms.
pub const DEFAULT_PROVIDER_MAX_WAIT_MS: u64 = 4_000;

/// The default `max_cooldown_ms` of a provider key: 300,000 ms (5 minutes).
pub const DEFAULT_MAX_COOLDOWN_MS: u64 = 300_000;

/// The default `max_exhausted_ms` of a provider key: 60,000 ms, the
/// exhaustion hold ([`EXHAUSTED_HOLD_MS`](super::EXHAUSTED_HOLD_MS)).
pub const DEFAULT_MAX_EXHAUSTED_MS: u64 = super::governor::EXHAUSTED_HOLD_MS;

/// The largest `max_cooldown_ms` and `max_exhausted_ms` allowed: 1 day.
pub const MAX_HINT_CAP_MS: u64 = 86_400_000;

/// Provider keys as written in config: `"provider:model"` → limits.
pub type ProvidersConfig = BTreeMap<String, ProviderConfig>;

/// One validated provider key.
#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    /// The provider, e.g. `openai`.
    pub provider: Arc<str>,
    /// The model, e.g. `gpt-4o`.
    pub model: Arc<str>,
    /// How its answers are read.
    pub kind: ProviderKind,
    /// Requests bucket.
    pub requests: Option<BucketSpec>,
    /// Tokens bucket (input + output).
    pub tokens: Option<BucketSpec>,
    /// Input tokens bucket.
    pub input_tokens: Option<BucketSpec>,
    /// Output tokens bucket.
    pub output_tokens: Option<BucketSpec>,
    /// Block or reject.
    pub policy: Policy,
    /// Longest wait under `block`, ms.
    pub max_wait_ms: u64,
    /// AIMD parameters.
    pub aimd: AimdParams,
    /// The longest cooldown one answer may set, ms.
    pub max_cooldown_ms: u64,
    /// The longest this replica fails fast after one exhausted answer, ms.
    pub max_exhausted_ms: u64,
    /// Tenant shares of the pool.
    pub tenants: HashMap<String, Tenant>,
    /// Fair sharing, when any tenant has a weight.
    pub fair: Option<FairShare>,
    /// The pool's store keys.
    pub keys: ProviderKeys,
}

/// A provider key's fair sharing (SPEC §5, *Fair sharing*): its state's key
/// and the configured weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FairShare {
    /// The state's store key, `{provider:model}:fair`.
    pub key: String,
    /// Configured weights by tenant, sorted by name.
    pub weights: Vec<(String, u32)>,
}

impl FairShare {
    /// The weights as the store takes them.
    pub fn weights(&self) -> Vec<(&str, u32)> {
        self.weights.iter().map(|(n, w)| (n.as_str(), *w)).collect()
    }
}

impl Provider {
    /// `feedback` with its retry hint cut to this key's maximum: an
    /// exhaustion's to `max_exhausted_ms`, a throttled or server-error
    /// answer's to `max_cooldown_ms`. Every hint the governor acts on has
    /// passed through here.
    pub fn bound(&self, feedback: Feedback) -> Feedback {
        match feedback {
            f @ Feedback::Exhausted { .. } => f.with_hint_at_most(self.max_exhausted_ms),
            f => f.with_hint_at_most(self.max_cooldown_ms),
        }
    }
}

/// Validated provider keys, by provider, then model.
#[derive(Debug, Clone, Default)]
pub struct ProviderBook {
    keys: HashMap<String, HashMap<String, Arc<Provider>>>,
}

impl ProviderBook {
    /// The limits of `provider`'s `model`, if configured.
    pub fn get(&self, provider: &str, model: &str) -> Option<&Arc<Provider>> {
        self.keys.get(provider)?.get(model)
    }

    /// Every configured provider key.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Provider>> {
        self.keys.values().flat_map(HashMap::values)
    }

    /// Whether no provider key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The store keys of one provider key; all share the hash tag
/// `{provider:model}`, so one multi-bucket take touches one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderKeys {
    /// Requests bucket.
    pub requests: String,
    /// Tokens bucket.
    pub tokens: String,
    /// Input tokens bucket.
    pub input_tokens: String,
    /// Output tokens bucket.
    pub output_tokens: String,
    /// Cooldown.
    pub cooldown: String,
    /// AIMD state.
    pub aimd: String,
}

impl ProviderKeys {
    fn new(provider: &str, model: &str) -> Self {
        let tag = format!("{{{provider}:{model}}}");
        Self {
            requests: format!("{tag}:rpm"),
            tokens: format!("{tag}:tpm"),
            input_tokens: format!("{tag}:itpm"),
            output_tokens: format!("{tag}:otpm"),
            cooldown: format!("{tag}:cooldown"),
            aimd: format!("{tag}:aimd"),
        }
    }

    /// The same buckets for one tenant (its share of the pool).
    fn tenant(provider: &str, model: &str, tenant: &str) -> Self {
        let tag = format!("{{{provider}:{model}}}:t:{tenant}");
        Self {
            requests: format!("{tag}:rpm"),
            tokens: format!("{tag}:tpm"),
            input_tokens: format!("{tag}:itpm"),
            output_tokens: format!("{tag}:otpm"),
            cooldown: String::new(),
            aimd: String::new(),
        }
    }
}

/// A tenant's share, weight and keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Its share of every pool rate, permille (`None`: no ceiling).
    pub share_permille: Option<u32>,
    /// Its weight in fair sharing.
    pub weight: Option<u32>,
    /// Its buckets' keys.
    pub keys: ProviderKeys,
}

/// Characters a provider, model or tenant name may not contain: they would
/// break the keys' hash tag or separators.
const FORBIDDEN: &[char] = &['{', '}', ':'];

fn name_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 200 && !s.contains(FORBIDDEN) && !s.contains(char::is_control)
}

/// Validates provider keys.
///
/// # Errors
///
/// Every problem, each with its field path (`providers."openai:gpt-4o".requests.amount`):
/// a key that is not `provider:model`, names with `{`, `}` or `:`, no limit
/// at all, bad rates, a negative wait, a share outside (0, 1], AIMD floor or
/// step outside 1..=1000 permille, a `max_cooldown_ms` or
/// `max_exhausted_ms` outside 1 ms ..= 1 day.
pub fn validate_providers(cfg: &ProvidersConfig) -> Result<ProviderBook, InvalidPlans> {
    let mut errors = Vec::new();
    fn err(errors: &mut Vec<FieldError>, path: String, reason: String) {
        errors.push(FieldError { path, reason });
    }
    let mut keys: HashMap<String, HashMap<String, Arc<Provider>>> = HashMap::new();
    for (key, c) in cfg {
        let path = format!("providers.{key:?}");
        let Some((provider, model)) = key.split_once(':') else {
            err(
                &mut errors,
                path,
                "the key must be \"provider:model\"".into(),
            );
            continue;
        };
        if !name_ok(provider) || !name_ok(model) {
            err(
                &mut errors,
                path,
                "provider and model must be non-empty and free of '{', '}', ':' and control characters"
                    .into(),
            );
            continue;
        }
        let kind = match &c.kind {
            Some(k) => match k.parse::<ProviderKind>() {
                Ok(k) => k,
                Err(_) => {
                    err(
                        &mut errors,
                        format!("{path}.kind"),
                        format!("unknown kind {k:?} (openai, anthropic, gemini, generic)"),
                    );
                    ProviderKind::Generic
                }
            },
            None => provider.parse().unwrap_or(ProviderKind::Generic),
        };
        // The one rate rule of core decides; a provider rate's problems are
        // reported at the rate's path (`providers."p:m".requests`), as this
        // table has always named them.
        let mut rate = |name: &str, r: &Option<RateConfig>| -> Option<BucketSpec> {
            let r = r.as_ref()?;
            let p = format!("{path}.{name}");
            let mut problems = Vec::new();
            let spec = r.validate(&p, &mut problems);
            if let Some(first) = problems.first() {
                let reason = if first.path == p {
                    "burst × period_ms and amount × period_ms must not exceed 2^53".to_owned()
                } else {
                    format!(
                        "amount, period_ms and burst must be at least 1 (got {}, {}, {})",
                        r.amount,
                        r.period_ms,
                        r.burst.unwrap_or(r.amount)
                    )
                };
                errors.push(FieldError { path: p, reason });
            }
            spec
        };
        let requests = rate("requests", &c.requests);
        let tokens = rate("tokens", &c.tokens);
        let input_tokens = rate("input_tokens", &c.input_tokens);
        let output_tokens = rate("output_tokens", &c.output_tokens);
        if c.requests.is_none()
            && c.tokens.is_none()
            && c.input_tokens.is_none()
            && c.output_tokens.is_none()
        {
            err(
                &mut errors,
                path.clone(),
                "set at least one of requests, tokens, input_tokens, output_tokens".into(),
            );
        }
        let max_wait_ms = match c.max_wait_ms {
            None => DEFAULT_PROVIDER_MAX_WAIT_MS,
            Some(w) if w < 0 => {
                err(
                    &mut errors,
                    format!("{path}.max_wait_ms"),
                    format!("must not be negative (got {w})"),
                );
                0
            }
            Some(w) => w as u64,
        };
        for spec in [requests, tokens, input_tokens, output_tokens]
            .into_iter()
            .flatten()
        {
            if u128::from(spec.capacity()) * u128::from(spec.period_ms())
                + u128::from(max_wait_ms) * u128::from(spec.amount())
                > MAX_SCALED as u128
            {
                err(
                    &mut errors,
                    format!("{path}.max_wait_ms"),
                    "burst × period_ms + max_wait_ms × amount must not exceed 2^53".into(),
                );
                break;
            }
        }
        let mut cap = |name: &str, v: Option<i64>, default: u64| -> u64 {
            match v {
                None => default,
                Some(v) if (1..=MAX_HINT_CAP_MS as i64).contains(&v) => v as u64,
                Some(v) => {
                    err(
                        &mut errors,
                        format!("{path}.{name}"),
                        format!("must be 1 to {MAX_HINT_CAP_MS} ms (1 day) (got {v})"),
                    );
                    default
                }
            }
        };
        let max_cooldown_ms = cap(
            "max_cooldown_ms",
            c.max_cooldown_ms,
            DEFAULT_MAX_COOLDOWN_MS,
        );
        let max_exhausted_ms = cap(
            "max_exhausted_ms",
            c.max_exhausted_ms,
            DEFAULT_MAX_EXHAUSTED_MS,
        );
        let aimd = c.aimd.unwrap_or_default();
        if !(1..=FULL).contains(&aimd.floor_permille) || !(1..=FULL).contains(&aimd.step_permille) {
            err(
                &mut errors,
                format!("{path}.aimd"),
                "floor_permille and step_permille must be 1 to 1000".into(),
            );
        }
        if aimd.decrease_interval_ms == 0 || aimd.increase_interval_ms == 0 {
            err(
                &mut errors,
                format!("{path}.aimd"),
                "decrease_interval_ms and increase_interval_ms must be at least 1".into(),
            );
        }
        let mut tenants = HashMap::new();
        for (name, t) in &c.tenants {
            let p = format!("{path}.tenants.{name:?}");
            if !name_ok(name) || name.len() > fair::MAX_NAME_BYTES {
                err(
                    &mut errors,
                    p,
                    format!(
                        "tenant names must be at most {} bytes and free of '{{', '}}', ':' and \
                         control characters",
                        fair::MAX_NAME_BYTES
                    ),
                );
                continue;
            }
            if t.share.is_none() && t.weight.is_none() {
                err(
                    &mut errors,
                    p,
                    "a tenant needs a share, a weight or both".into(),
                );
                continue;
            }
            if let Some(share) = t.share
                && !(share > 0.0 && share <= 1.0)
            {
                err(
                    &mut errors,
                    format!("{p}.share"),
                    format!("must be more than 0 and at most 1 (got {share})"),
                );
                continue;
            }
            if let Some(w) = t.weight
                && !(1..=fair::MAX_WEIGHT).contains(&w)
            {
                err(
                    &mut errors,
                    format!("{p}.weight"),
                    format!("must be 1 to {} (got {w})", fair::MAX_WEIGHT),
                );
                continue;
            }
            if t.weight.is_some() && requests.is_none() {
                err(
                    &mut errors,
                    format!("{p}.weight"),
                    "fair sharing counts requests: the key needs a `requests` rate".into(),
                );
                continue;
            }
            // Rounded to permille, at least 1.
            let permille = t
                .share
                .map(|share| ((share * f64::from(FULL)).round() as u32).clamp(1, FULL));
            tenants.insert(
                name.clone(),
                Tenant {
                    share_permille: permille,
                    weight: t.weight,
                    keys: ProviderKeys::tenant(provider, model, name),
                },
            );
        }
        let mut weights: Vec<(String, u32)> = tenants
            .iter()
            .filter_map(|(n, t)| t.weight.map(|w| (n.clone(), w)))
            .collect();
        weights.sort();
        let fair = (!weights.is_empty()).then(|| FairShare {
            key: format!("{{{provider}:{model}}}:fair"),
            weights,
        });
        keys.entry(provider.to_owned()).or_default().insert(
            model.to_owned(),
            Arc::new(Provider {
                provider: provider.into(),
                model: model.into(),
                kind,
                requests,
                tokens,
                input_tokens,
                output_tokens,
                policy: c.policy,
                max_wait_ms,
                aimd: aimd.clamped(),
                max_cooldown_ms,
                max_exhausted_ms,
                tenants,
                fair,
                keys: ProviderKeys::new(provider, model),
            }),
        );
    }
    if errors.is_empty() {
        Ok(ProviderBook { keys })
    } else {
        Err(InvalidPlans { errors })
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Block => "block",
            Policy::Reject => "reject",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(max_cooldown_ms: Option<i64>, max_exhausted_ms: Option<i64>) -> ProvidersConfig {
        let mut cfg = ProvidersConfig::new();
        cfg.insert(
            "openai:gpt-4o".into(),
            ProviderConfig {
                kind: None,
                requests: Some(RateConfig {
                    amount: 600,
                    period_ms: 60_000,
                    burst: None,
                }),
                tokens: None,
                input_tokens: None,
                output_tokens: None,
                policy: Policy::Block,
                max_wait_ms: None,
                aimd: None,
                max_cooldown_ms,
                max_exhausted_ms,
                tenants: BTreeMap::new(),
            },
        );
        cfg
    }

    #[test]
    fn hint_caps_default_and_are_validated_with_their_paths() {
        let book = validate_providers(&row(None, None)).unwrap();
        let p = book.get("openai", "gpt-4o").unwrap();
        assert_eq!((p.max_cooldown_ms, p.max_exhausted_ms), (300_000, 60_000));
        let book = validate_providers(&row(Some(1), Some(86_400_000))).unwrap();
        let p = book.get("openai", "gpt-4o").unwrap();
        assert_eq!((p.max_cooldown_ms, p.max_exhausted_ms), (1, 86_400_000));
        for (bad, field) in [
            (row(Some(0), None), "max_cooldown_ms"),
            (row(Some(-5), None), "max_cooldown_ms"),
            (row(Some(86_400_001), None), "max_cooldown_ms"),
            (row(None, Some(0)), "max_exhausted_ms"),
            (row(None, Some(i64::MAX)), "max_exhausted_ms"),
        ] {
            let e = validate_providers(&bad).unwrap_err();
            assert_eq!(e.errors.len(), 1, "{:?}", e.errors);
            assert_eq!(
                e.errors[0].path,
                format!("providers.\"openai:gpt-4o\".{field}")
            );
            assert!(e.errors[0].reason.contains("1 day"), "{:?}", e.errors[0]);
        }
    }

    #[test]
    fn tenant_names_are_at_most_128_bytes_of_plain_text() {
        let with = |name: &str| {
            let mut cfg = row(None, None);
            let p = cfg.get_mut("openai:gpt-4o").unwrap();
            p.tenants.insert(
                name.to_owned(),
                TenantConfig {
                    share: None,
                    weight: Some(2),
                },
            );
            validate_providers(&cfg)
        };
        assert!(with(&"t".repeat(fair::MAX_NAME_BYTES)).is_ok());
        for bad in [
            "t".repeat(fair::MAX_NAME_BYTES + 1),
            "a\tb".into(),
            "a:b".into(),
        ] {
            let e = with(&bad).unwrap_err();
            assert_eq!(e.errors.len(), 1, "{:?}", e.errors);
            assert!(
                e.errors[0].reason.contains("at most 128 bytes"),
                "{:?}",
                e.errors[0]
            );
        }
    }
}
