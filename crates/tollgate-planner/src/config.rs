//! The limit-related part of `tollgate serve`'s config file.
//!
//! `simulate` reads the same TOML file as the server (docs/config.md) but
//! only its limits: top-level `default_plan`, `[plans.<name>]`, `[users]`,
//! `[overrides.<user>]`, `[providers."<provider>:<model>"]`, and the budget
//! data `currency`, `[prices."<provider>:<model>"]` and `[budgets]` with
//! the plans' and overrides' spend budgets. The server-only settings (`listen`, `grpc_listen`, `admin_listen`,
//! `rls_listen`, `admin_token`, `max_in_flight`, `[store]`, `[identity]`,
//! `[rls]`, `[limits]`, `[audit]`, `[telemetry]`) are accepted and ignored; any other top-level key is
//! an error, as in the server, so a typo is never silently dropped. The
//! server's tests check that every top-level key of its config is accepted
//! here (`tollgate-server/tests/config_keys.rs`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use tollgate_core::budget::BudgetSettingsConfig;
use tollgate_core::money::PricesConfig;
use tollgate_core::plan::{FieldError, PlanBook, toml_path};
use tollgate_core::{PlanConfig, PlanOverride, PlansConfig};
use tollgate_provider::{ProviderBook, ProvidersConfig, validate_providers};

use crate::PlanError;

/// The limits of a config file: plans, assignments, overrides and provider
/// quotas, as written (validated by [`Limits::parse`]).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Limits {
    /// Plans, user assignments and overrides.
    pub plans: PlansConfig,
    /// Provider quotas by `"provider:model"`.
    pub providers: ProvidersConfig,
}

/// The file as `simulate` reads it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    #[serde(default)]
    default_plan: Option<String>,
    #[serde(default)]
    plans: BTreeMap<String, PlanConfig>,
    #[serde(default)]
    users: BTreeMap<String, String>,
    #[serde(default)]
    overrides: BTreeMap<String, PlanOverride>,
    #[serde(default)]
    providers: ProvidersConfig,
    #[serde(default)]
    currency: Option<String>,
    #[serde(default)]
    prices: PricesConfig,
    #[serde(default)]
    budgets: BudgetSettingsConfig,
    // Server-only settings: read as any TOML value and dropped.
    #[serde(default, rename = "listen")]
    _listen: Option<toml::Value>,
    #[serde(default, rename = "admin_token")]
    _admin_token: Option<toml::Value>,
    #[serde(default, rename = "max_in_flight")]
    _max_in_flight: Option<toml::Value>,
    #[serde(default, rename = "store")]
    _store: Option<toml::Value>,
    #[serde(default, rename = "identity")]
    _identity: Option<toml::Value>,
    #[serde(default, rename = "grpc_listen")]
    _grpc_listen: Option<toml::Value>,
    #[serde(default, rename = "rls_listen")]
    _rls_listen: Option<toml::Value>,
    #[serde(default, rename = "rls")]
    _rls: Option<toml::Value>,
    #[serde(default, rename = "admin_listen")]
    _admin_listen: Option<toml::Value>,
    #[serde(default, rename = "limits")]
    _limits: Option<toml::Value>,
    #[serde(default, rename = "audit")]
    _audit: Option<toml::Value>,
    #[serde(default, rename = "telemetry")]
    _telemetry: Option<toml::Value>,
}

impl Limits {
    /// Plans and providers from parts.
    pub fn new(plans: PlansConfig, providers: ProvidersConfig) -> Self {
        Self { plans, providers }
    }

    /// Reads and validates the limits of the config file at `path`.
    ///
    /// # Errors
    ///
    /// [`PlanError::Io`] if it cannot be read, [`PlanError::Config`] if it
    /// is not valid.
    pub fn load(path: &Path) -> Result<Self, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|e| PlanError::read(path, e))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates config text; `source_name` names it in errors.
    ///
    /// # Errors
    ///
    /// [`PlanError::Config`]: the first problem if the text is not TOML or
    /// has a field of the wrong type or an unknown field (with its path:
    /// ``plans.support.turns.brust: unknown field `brust` …``), else every
    /// validation problem at once.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, PlanError> {
        let fail = |errors| PlanError::Config {
            source_name: source_name.to_owned(),
            errors,
        };
        let de = toml::Deserializer::parse(text)
            .map_err(|e| fail(vec![field_error("(file)", e.message())]))?;
        let file: LimitsFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = toml_path(e.path());
            let path = if path.is_empty() {
                "(file)".to_owned()
            } else {
                path
            };
            fail(vec![field_error(&path, e.inner().message())])
        })?;
        let limits = Limits {
            plans: PlansConfig {
                default_plan: file.default_plan,
                plans: file.plans,
                users: file.users,
                overrides: file.overrides,
                currency: file.currency,
                prices: file.prices,
                budgets: file.budgets,
            },
            providers: file.providers,
        };
        limits.validate(false).map_err(fail)?;
        Ok(limits)
    }

    /// Validates into the books the limiter and the governor use; with
    /// `shadow`, every plan and override is put in shadow mode first.
    pub(crate) fn validate(
        &self,
        shadow: bool,
    ) -> Result<(PlanBook, ProviderBook), Vec<FieldError>> {
        let mut plans = self.plans.clone();
        if shadow {
            for p in plans.plans.values_mut() {
                p.shadow = true;
            }
            for o in plans.overrides.values_mut() {
                o.shadow = Some(true);
            }
        }
        let mut errors = Vec::new();
        let plans = plans.validate().map_err(|e| errors.extend(e.errors)).ok();
        let providers = validate_providers(&self.providers)
            .map_err(|e| errors.extend(e.errors))
            .ok();
        match (plans, providers) {
            (Some(p), Some(q)) if errors.is_empty() => Ok((p, q)),
            _ => Err(errors),
        }
    }
}

fn field_error(path: &str, reason: &str) -> FieldError {
    FieldError {
        path: path.to_owned(),
        reason: reason.trim().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVER_FILE: &str = r#"
listen = "0.0.0.0:8787"
grpc_listen = "0.0.0.0:8788"
rls_listen = "0.0.0.0:8789"
admin_token = "change-me-to-a-long-random-string"
max_in_flight = 1024
default_plan = "support"

[store]
kind = "redis"
url = "redis://localhost:6379"

[identity]
mode = "dev"

[plans.support]
turns = { amount = 20, period_ms = 60000, burst = 5 }
tokens = { amount = 60000, period_ms = 60000, burst = 60000 }
max_wait_ms = 2000
concurrent_runs = 2

[users]
bob = "support"

[overrides.bob]
max_wait_ms = 6000

[providers."openai:gpt-4o"]
requests = { amount = 600, period_ms = 60000, burst = 60 }

[rls]
key_file = "rls.key"
domain = "agents"

[[rls.descriptors]]
key = "user_id"
limit = "user_turns"
"#;

    #[test]
    fn reads_the_limits_of_a_server_file_and_ignores_the_rest() {
        let l = Limits::parse(SERVER_FILE, "tollgate.toml").unwrap();
        assert_eq!(l.plans.default_plan.as_deref(), Some("support"));
        assert_eq!(l.plans.plans["support"].max_wait_ms, 2_000);
        assert_eq!(l.plans.overrides["bob"].max_wait_ms, Some(6_000));
        assert!(l.providers.contains_key("openai:gpt-4o"));
        let (book, providers) = l.validate(true).unwrap();
        assert!(book.resolve("anyone").unwrap().shadow);
        assert!(book.resolve("bob").unwrap().shadow);
        assert!(providers.get("openai", "gpt-4o").is_some());
    }

    #[test]
    fn unknown_fields_are_named_with_their_path() {
        let bad = SERVER_FILE.replace("burst = 5", "brust = 5");
        let e = Limits::parse(&bad, "c.toml").unwrap_err();
        let PlanError::Config { errors, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(errors[0].path, "plans.support.turns.brust");
        assert!(errors[0].reason.contains("unknown field `brust`"), "{e}");
        let e = Limits::parse("defualt_plan = \"x\"\n", "c.toml").unwrap_err();
        assert!(
            e.to_string().contains("unknown field `defualt_plan`"),
            "{e}"
        );
        let bad = SERVER_FILE.replace("requests = { amount = 600", "requests = { amount = \"600\"");
        let e = Limits::parse(&bad, "c.toml").unwrap_err();
        assert!(
            e.to_string()
                .contains(r#"providers."openai:gpt-4o".requests.amount"#),
            "{e}"
        );
    }

    #[test]
    fn budget_data_and_budgets_are_read() {
        let priced = SERVER_FILE.replace(
            "default_plan = \"support\"",
            "default_plan = \"support\"\ncurrency = \"USD\"",
        ) + "\n[prices.\"openai:gpt-4o\"]\ninput = \"2.50\"\noutput = \"10.00\"\n\n\
             [budgets]\ntime_zone = \"Europe/Paris\"\n";
        let l = Limits::parse(&priced, "c.toml").unwrap();
        assert_eq!(l.plans.currency.as_deref(), Some("USD"));
        assert!(l.plans.prices.contains_key("openai:gpt-4o"));
        let (book, _) = l.validate(false).unwrap();
        assert_eq!(book.budget_zone().name(), "Europe/Paris");
        let budgeted = priced.clone() + "\n[plans.support.budgets]\ndaily = { tokens = 0 }\n";
        let e = Limits::parse(&budgeted, "c.toml").unwrap_err();
        let text = e.to_string();
        let want = "plans.support.budgets.daily.tokens: must be at least 1 (got 0)";
        assert!(text.contains(want), "{want} not in {text}");
        let budgeted = priced + "\n[plans.support.budgets]\nmonthly = { cost = \"50\" }\n";
        let (book, _) = Limits::parse(&budgeted, "c.toml")
            .unwrap()
            .validate(false)
            .unwrap();
        assert!(book.plan("support").unwrap().budgets.is_some());
    }

    #[test]
    fn every_validation_problem_is_listed() {
        let bad = SERVER_FILE
            .replace("amount = 20,", "amount = 0,")
            .replace("max_wait_ms = 2000", "max_wait_ms = -1")
            .replace("default_plan = \"support\"", "default_plan = \"gold\"");
        let e = Limits::parse(&bad, "c.toml").unwrap_err();
        let text = e.to_string();
        for want in [
            "plans.support.turns.amount: must be at least 1 (got 0)",
            "plans.support.max_wait_ms: must not be negative (got -1)",
            "default_plan: unknown plan \"gold\"",
        ] {
            assert!(text.contains(want), "{want} not in {text}");
        }
        assert!(
            Limits::parse("x = [", "c.toml")
                .unwrap_err()
                .to_string()
                .contains("(file)")
        );
    }
}
