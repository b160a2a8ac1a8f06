//! Token estimates for model calls, made before the call and corrected by
//! the actual usage after it.

use std::collections::HashMap;

use adk_core::{LlmRequest, UsageMetadata};
use parking_lot::Mutex;

/// What is known about a model call before it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallShape<'a> {
    /// The calling agent's name.
    pub agent: &'a str,
    /// The model's name.
    pub model: &'a str,
    /// The request's size: bytes of its contents and tool declarations as
    /// JSON.
    pub request_bytes: u64,
    /// The output cap the request asks for (`max_output_tokens`), if any.
    pub max_output_tokens: Option<u64>,
    /// The plan's `estimate_tokens`: the estimate before anything is known.
    pub plan_estimate: u64,
}

impl<'a> CallShape<'a> {
    /// The shape of `request`, made by `agent` to `model` under a plan
    /// estimating `plan_estimate` tokens per call.
    pub fn of(agent: &'a str, model: &'a str, request: &LlmRequest, plan_estimate: u64) -> Self {
        let contents = serde_json::to_vec(&request.contents).map_or(0, |v| v.len());
        let tools: usize = request
            .tools
            .values()
            .map(|t| serde_json::to_vec(t).map_or(0, |v| v.len()))
            .sum();
        let max_output_tokens = request
            .config
            .as_ref()
            .and_then(|c| c.max_output_tokens)
            .and_then(|n| u64::try_from(n).ok());
        Self {
            agent,
            model,
            request_bytes: (contents + tools) as u64,
            max_output_tokens,
            plan_estimate,
        }
    }
}

/// The tokens a model call actually used, from the provider's usage
/// metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Input (prompt) tokens; 0 if the provider did not say.
    pub prompt: u64,
    /// Everything else: output, thinking.
    pub output: u64,
}

impl Usage {
    /// The usage reported by `meta`, or `None` when it reports nothing
    /// (all counts zero or negative).
    pub fn from_metadata(meta: &UsageMetadata) -> Option<Self> {
        let n = |v: i32| u64::try_from(v).unwrap_or(0);
        let prompt = n(meta.prompt_token_count);
        let total = n(meta.total_token_count);
        let parts = n(meta.candidates_token_count) + meta.thinking_token_count.map_or(0, n);
        let output = if total > prompt {
            total - prompt
        } else {
            parts
        };
        (prompt + output > 0).then_some(Self { prompt, output })
    }

    /// Tokens charged for the call: prompt plus output.
    pub fn total(&self) -> u64 {
        self.prompt.saturating_add(self.output)
    }
}

/// Estimates a model call's tokens before it is made, and learns from the
/// actual usage afterwards.
///
/// Any `Fn(&CallShape) -> u64` closure is an estimator that learns nothing.
pub trait Estimator: Send + Sync + 'static {
    /// The tokens to reserve for `call` (at least 1 is reserved).
    fn estimate(&self, call: &CallShape<'_>) -> u64;

    /// The call `call` used `usage`. Called once per settled call that
    /// reported usage.
    fn observe(&self, call: &CallShape<'_>, usage: Usage) {
        let _ = (call, usage);
    }
}

impl<F> Estimator for F
where
    F: Fn(&CallShape<'_>) -> u64 + Send + Sync + 'static,
{
    fn estimate(&self, call: &CallShape<'_>) -> u64 {
        self(call)
    }
}

/// Prompt tokens per request byte assumed before any usage is seen (about
/// four bytes of JSON per token).
const INITIAL_TOKENS_PER_BYTE: f64 = 0.25;

/// The default [`Estimator`]: per agent, an exponentially weighted moving
/// average of actual usage, seeded by the plan's estimate.
///
/// The estimate of a call is `request_bytes × tokens_per_byte + output`,
/// where both terms are moving averages of what the agent's calls used:
/// prompt tokens per request byte, and output tokens per call. Before an
/// agent's first observed call, the estimate is the plan's
/// `estimate_tokens`, or the request's size at four bytes per token if
/// that is larger.
#[derive(Debug)]
pub struct MovingAverage {
    alpha: f64,
    agents: Mutex<HashMap<String, Learned>>,
}

#[derive(Debug, Clone, Copy)]
struct Learned {
    tokens_per_byte: f64,
    output: f64,
}

impl Default for MovingAverage {
    fn default() -> Self {
        Self::new()
    }
}

impl MovingAverage {
    /// The weight of each new observation when none is given: 0.3.
    pub const DEFAULT_ALPHA: f64 = 0.3;

    /// A moving average with weight [`DEFAULT_ALPHA`](Self::DEFAULT_ALPHA).
    pub fn new() -> Self {
        Self::with_alpha(Self::DEFAULT_ALPHA)
    }

    /// A moving average giving each new observation the weight `alpha`
    /// (clamped to `0.01..=1.0`; 1 keeps only the latest call).
    pub fn with_alpha(alpha: f64) -> Self {
        let alpha = if alpha.is_finite() {
            alpha.clamp(0.01, 1.0)
        } else {
            Self::DEFAULT_ALPHA
        };
        Self {
            alpha,
            agents: Mutex::new(HashMap::new()),
        }
    }

    fn blend(&self, old: f64, new: f64) -> f64 {
        self.alpha * new + (1.0 - self.alpha) * old
    }
}

/// `x` rounded up to a whole token count, at least 1.
fn tokens(x: f64) -> u64 {
    if x.is_finite() && x > 1.0 {
        // Saturates at u64::MAX for absurd values; the limiter refuses those.
        x.ceil() as u64
    } else {
        1
    }
}

impl Estimator for MovingAverage {
    fn estimate(&self, call: &CallShape<'_>) -> u64 {
        let bytes = call.request_bytes as f64;
        match self.agents.lock().get(call.agent) {
            Some(l) => tokens(bytes * l.tokens_per_byte + l.output),
            None => call
                .plan_estimate
                .max(tokens(bytes * INITIAL_TOKENS_PER_BYTE)),
        }
    }

    fn observe(&self, call: &CallShape<'_>, usage: Usage) {
        let bytes = call.request_bytes as f64;
        let mut agents = self.agents.lock();
        match agents.get_mut(call.agent) {
            Some(l) => {
                if usage.prompt > 0 && bytes > 0.0 {
                    l.tokens_per_byte = self.blend(l.tokens_per_byte, usage.prompt as f64 / bytes);
                }
                l.output = self.blend(l.output, usage.output as f64);
            }
            None => {
                let tokens_per_byte = if usage.prompt > 0 && bytes > 0.0 {
                    usage.prompt as f64 / bytes
                } else {
                    INITIAL_TOKENS_PER_BYTE
                };
                agents.insert(
                    call.agent.to_owned(),
                    Learned {
                        tokens_per_byte,
                        output: usage.output as f64,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(agent: &str, bytes: u64) -> CallShape<'_> {
        CallShape {
            agent,
            model: "m",
            request_bytes: bytes,
            max_output_tokens: None,
            plan_estimate: 6_000,
        }
    }

    #[test]
    fn starts_at_the_plan_estimate_or_the_request_size() {
        let e = MovingAverage::new();
        assert_eq!(e.estimate(&shape("a", 400)), 6_000);
        assert_eq!(e.estimate(&shape("a", 40_000)), 10_000);
    }

    #[test]
    fn the_first_observation_replaces_the_seed_per_agent() {
        let e = MovingAverage::new();
        e.observe(
            &shape("a", 1_000),
            Usage {
                prompt: 500,
                output: 200,
            },
        );
        assert_eq!(e.estimate(&shape("a", 1_000)), 700);
        // Twice the request: twice the prompt, the same output.
        assert_eq!(e.estimate(&shape("a", 2_000)), 1_200);
        assert_eq!(e.estimate(&shape("b", 1_000)), 6_000, "other agents");
    }

    #[test]
    fn usage_metadata_total_covers_thinking() {
        let meta = UsageMetadata {
            prompt_token_count: 100,
            candidates_token_count: 20,
            total_token_count: 150,
            thinking_token_count: Some(30),
            ..UsageMetadata::default()
        };
        let u = Usage::from_metadata(&meta).expect("usage");
        assert_eq!((u.prompt, u.output, u.total()), (100, 50, 150));
        let no_total = UsageMetadata {
            prompt_token_count: 100,
            candidates_token_count: 20,
            ..UsageMetadata::default()
        };
        assert_eq!(Usage::from_metadata(&no_total).expect("usage").total(), 120);
        assert_eq!(Usage::from_metadata(&UsageMetadata::default()), None);
    }

    #[test]
    fn closures_are_estimators() {
        let fixed = |c: &CallShape<'_>| c.plan_estimate / 2;
        assert_eq!(fixed.estimate(&shape("a", 1)), 3_000);
    }
}
