//! Prices as data and money in exact integer arithmetic.
//!
//! Amounts of money are whole **micro-units** of the config's one
//! `currency` (1 micro-unit = 0.000001 of it; `"50.00"` USD is 50,000,000).
//! Prices are micro-units per **million** tokens, as providers publish them
//! (`"0.15"` per million tokens is 150,000). No float is used anywhere:
//! decimal strings are parsed digit by digit, products are taken in `u128`
//! and every step is overflow-checked.
//!
//! The cost of a call is `Σ tokens × price per million`, divided by
//! 1,000,000 and **rounded up** once to the next micro-unit: a call is
//! never charged less than it costs, and a call that costs anything costs
//! at least one micro-unit.
//!
//! ```
//! use tollgate_core::money::{Price, PriceConfig, TokenSplit};
//!
//! let cfg = PriceConfig {
//!     input: "0.15".into(),
//!     output: "0.60".into(),
//!     cached_input: Some("0.075".into()),
//! };
//! let price: Price = cfg.validate("prices.\"openai:gpt-4o-mini\"", &mut Vec::new()).unwrap();
//! // 1,000 input tokens at 0.15 per million: 0.00015, exactly 150 micro-units.
//! assert_eq!(price.cost(TokenSplit::new(1_000, 0, 0)), Ok(150));
//! // 1 output token at 0.60 per million is 0.0000006: rounded up to 1.
//! assert_eq!(price.cost(TokenSplit::new(0, 1, 0)), Ok(1));
//! // Unsplit, an amount is priced at the higher of input and output.
//! assert_eq!(price.cost_unsplit(1_000), Ok(600));
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::plan::{FieldError, toml_key};

/// Micro-units in one unit of the currency.
pub const MICROS_PER_UNIT: u64 = 1_000_000;
/// Prices are per this many tokens.
pub const TOKENS_PER_PRICE: u64 = 1_000_000;
/// Most decimal places a money amount or price may have (micro-units).
pub const MAX_DECIMALS: usize = 6;
/// The largest price or cost budget a config may set, in micro-units
/// (2^53, about 9 billion units of the currency): what stores count
/// exactly (the Redis scripts' numbers).
pub const MAX_PRICED: u64 = 1 << 53;

/// A cost that does not fit in a `u64` of micro-units (more than about
/// 18.4 trillion units of the currency): no decision can be made on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the cost does not fit in 64 bits of micro-units")]
pub struct CostOverflow;

/// Why a decimal money string was refused (see [`parse_micros`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    /// A leading `-`.
    #[error("must not be negative (got {0:?})")]
    Negative(String),
    /// More than [`MAX_DECIMALS`] digits after the point.
    #[error("at most 6 decimal places, the micro-unit (got {0:?})")]
    TooManyDecimals(String),
    /// Not digits with an optional `.` and 1 to 6 digits after it.
    #[error("must be a decimal string such as \"50.00\" or \"0.15\" (got {0:?})")]
    Malformed(String),
    /// More micro-units than a `u64` holds.
    #[error("too large (got {0:?})")]
    TooLarge(String),
}

/// Parses a non-negative decimal string into micro-units: `"50"` →
/// 50,000,000; `"0.15"` → 150,000; `"0.000001"` → 1.
///
/// Accepted: ASCII digits, optionally followed by `.` and 1 to 6 digits.
/// No sign, exponent, spaces, `_` or thousands separators.
///
/// # Errors
///
/// [`MoneyError`]: negative, too many decimals, malformed, or past `u64`.
pub fn parse_micros(text: &str) -> Result<u64, MoneyError> {
    if text.starts_with('-') {
        return Err(MoneyError::Negative(text.to_owned()));
    }
    let (whole, frac) = match text.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || frac.is_some_and(|f| !digits(f)) {
        return Err(MoneyError::Malformed(text.to_owned()));
    }
    let frac = frac.unwrap_or("");
    if frac.len() > MAX_DECIMALS {
        return Err(MoneyError::TooManyDecimals(text.to_owned()));
    }
    let too_large = || MoneyError::TooLarge(text.to_owned());
    let mut micros: u64 = 0;
    for b in whole.bytes() {
        micros = micros
            .checked_mul(10)
            .and_then(|m| m.checked_add(u64::from(b - b'0')))
            .ok_or_else(too_large)?;
    }
    micros = micros.checked_mul(MICROS_PER_UNIT).ok_or_else(too_large)?;
    let mut scale = MICROS_PER_UNIT;
    for b in frac.bytes() {
        scale /= 10;
        micros = micros
            .checked_add(u64::from(b - b'0') * scale)
            .ok_or_else(too_large)?;
    }
    Ok(micros)
}

/// Micro-units as a decimal string with at least two decimals and no
/// trailing zeros past them: 50,000,000 → `"50.00"`, 150,000 → `"0.15"`,
/// 1 → `"0.000001"`. The inverse of [`parse_micros`] up to trailing zeros.
pub fn format_micros(micros: u64) -> String {
    let whole = micros / MICROS_PER_UNIT;
    let frac = format!("{:06}", micros % MICROS_PER_UNIT);
    let frac = frac.trim_end_matches('0');
    format!("{whole}.{frac:0<2}")
}

/// A price as written in config, `[prices."provider:model"]`: decimal
/// strings in the config's `currency` per million tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// Per million input (prompt) tokens that are not cache reads.
    pub input: String,
    /// Per million output (completion) tokens.
    pub output: String,
    /// Per million input tokens read from the provider's prompt cache;
    /// default: the `input` price (never charged less than written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<String>,
}

impl PriceConfig {
    /// Validates this price; each problem is pushed to `errors` under
    /// `path` (`prices."openai:gpt-4o".input: must not be negative (got
    /// "-1")`).
    ///
    /// Answers the price, or `None` if anything was wrong.
    pub fn validate(&self, path: &str, errors: &mut Vec<FieldError>) -> Option<Price> {
        let mut field = |name: &str, text: &str| match parse_micros(text) {
            Ok(m) if m > MAX_PRICED => {
                errors.push(FieldError {
                    path: format!("{path}.{name}"),
                    reason: format!(
                        "must be at most {} (got {text:?})",
                        format_micros(MAX_PRICED)
                    ),
                });
                None
            }
            Ok(m) => Some(m),
            Err(e) => {
                errors.push(FieldError {
                    path: format!("{path}.{name}"),
                    reason: e.to_string(),
                });
                None
            }
        };
        let input = field("input", &self.input);
        let output = field("output", &self.output);
        let cached = match &self.cached_input {
            Some(c) => field("cached_input", c),
            None => input,
        };
        Some(Price {
            input: input?,
            output: output?,
            cached_input: cached?,
        })
    }
}

/// A validated price: micro-units per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Price {
    /// Per million input tokens (not cache reads).
    pub input: u64,
    /// Per million output tokens.
    pub output: u64,
    /// Per million cached input tokens.
    pub cached_input: u64,
}

/// Token counts of a model call, split by how they are priced. The three
/// counts are disjoint: `input` excludes the cache reads counted in
/// `cached_input` (subtract them from an OpenAI `prompt_tokens`; Anthropic's
/// `input_tokens` already excludes them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenSplit {
    /// Input tokens not read from the cache.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Input tokens read from the cache.
    pub cached_input: u64,
}

impl TokenSplit {
    /// A split from its three counts.
    pub fn new(input: u64, output: u64, cached_input: u64) -> Self {
        Self {
            input,
            output,
            cached_input,
        }
    }

    /// All tokens of the split (saturating at `u64::MAX`).
    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.cached_input)
    }
}

/// `Σ tokens × price`, in micro-units × tokens-per-price, divided by
/// 1,000,000 rounded up.
fn ceil_cost(terms: &[(u64, u64)]) -> Result<u64, CostOverflow> {
    let mut sum: u128 = 0;
    for &(tokens, price) in terms {
        sum = sum
            .checked_add(u128::from(tokens) * u128::from(price))
            .ok_or(CostOverflow)?;
    }
    let cost = sum.div_ceil(u128::from(TOKENS_PER_PRICE));
    u64::try_from(cost).map_err(|_| CostOverflow)
}

impl Price {
    /// The cost of a split estimate or usage, in micro-units, rounded up to
    /// the micro-unit once over the whole call.
    ///
    /// # Errors
    ///
    /// [`CostOverflow`] if it does not fit in a `u64`.
    pub fn cost(&self, tokens: TokenSplit) -> Result<u64, CostOverflow> {
        ceil_cost(&[
            (tokens.input, self.input),
            (tokens.output, self.output),
            (tokens.cached_input, self.cached_input),
        ])
    }

    /// The cost of `tokens` not split into input and output: priced at the
    /// higher of the input and output prices (never less than either),
    /// rounded up to the micro-unit.
    ///
    /// # Errors
    ///
    /// [`CostOverflow`] if it does not fit in a `u64`.
    pub fn cost_unsplit(&self, tokens: u64) -> Result<u64, CostOverflow> {
        ceil_cost(&[(tokens, self.input.max(self.output))])
    }
}

impl fmt::Display for Price {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "input {} / output {} / cached input {} per million tokens",
            format_micros(self.input),
            format_micros(self.output),
            format_micros(self.cached_input)
        )
    }
}

/// Prices as written: `"provider:model"` → price.
pub type PricesConfig = BTreeMap<String, PriceConfig>;

/// Validated prices by provider and model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceBook {
    prices: HashMap<String, HashMap<String, Price>>,
}

/// A provider or model name: non-empty, free of `{`, `}`, `:` and control
/// characters (the rule of `[providers]` keys).
fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| matches!(c, '{' | '}' | ':') || c.is_control())
}

/// Validates `[prices]`; each problem is pushed to `errors` with its path
/// (`prices."openai:gpt-4o".output`). Answers the book of the valid ones.
pub fn validate_prices(cfg: &PricesConfig, errors: &mut Vec<FieldError>) -> PriceBook {
    let mut book = PriceBook::default();
    for (key, c) in cfg {
        let path = format!("prices.{}", toml_key(key));
        let Some((provider, model)) = key.split_once(':') else {
            errors.push(FieldError {
                path,
                reason: "the key must be \"provider:model\"".into(),
            });
            continue;
        };
        if !name_ok(provider) || !name_ok(model) {
            errors.push(FieldError {
                path,
                reason: "provider and model must be non-empty and free of '{', '}', ':' and \
                         control characters"
                    .into(),
            });
            continue;
        }
        if let Some(p) = c.validate(&path, errors) {
            book.prices
                .entry(provider.to_owned())
                .or_default()
                .insert(model.to_owned(), p);
        }
    }
    book
}

impl PriceBook {
    /// The price of `provider`'s `model`, if `[prices]` names it.
    pub fn get(&self, provider: &str, model: &str) -> Option<&Price> {
        self.prices.get(provider)?.get(model)
    }

    /// Whether no price is configured.
    pub fn is_empty(&self) -> bool {
        self.prices.is_empty()
    }
}

/// Validates the config's `currency`: an ISO 4217 code, three ASCII
/// capital letters (`"USD"`, `"EUR"`). The code only names the unit;
/// amounts are never converted.
///
/// # Errors
///
/// A reason to report at the `currency` path.
pub fn validate_currency(code: &str) -> Result<(), String> {
    if code.len() == 3 && code.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(())
    } else {
        Err(format!(
            "must be an ISO 4217 code of three capital letters such as \"USD\" (got {code:?})"
        ))
    }
}

#[cfg(test)]
mod tests;
