//! [`ProviderGovernor`]: fleet-wide permits per provider key, shaped by
//! the provider's own answers (SPEC §5).

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use tollgate_core::aimd::{self, FULL};
use tollgate_core::clock::Clock;
use tollgate_core::decision::{Decision, Denial, Limit, Waited};
use tollgate_core::error::StoreError;
use tollgate_core::fair::{self, FairTake};
use tollgate_core::store::{BucketTake, CooldownCheck, FairCheck, MultiTake, Store};

use super::config::{Policy, Provider, ProviderBook};
use super::feedback::{Feedback, classify};

/// How long a replica fails fast after a provider reported its quota
/// exhausted (per-day or billing) without saying until when: 60 s.
pub const EXHAUSTED_HOLD_MS: u64 = 60_000;

/// (provider, model).
type KeyName = (Arc<str>, Arc<str>);

/// A model call asking the provider for a permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PermitRequest<'a> {
    /// The provider, e.g. `openai`.
    pub provider: &'a str,
    /// The model, e.g. `gpt-4o`.
    pub model: &'a str,
    /// The tenant whose share applies, if any (an unconfigured tenant uses
    /// the pool alone).
    pub tenant: Option<&'a str>,
    /// Estimated tokens of the call, input and output: charged to the
    /// `tokens` bucket.
    pub tokens: u64,
    /// Estimated input tokens (default: `tokens`): charged to the
    /// `input_tokens` bucket.
    pub input_tokens: Option<u64>,
    /// Estimated output tokens (default: 0): charged to the `output_tokens`
    /// bucket.
    pub output_tokens: Option<u64>,
    /// What is left of the call's one deadline, ms: the permit's wait must
    /// fit it (and the key's own `max_wait_ms`).
    pub max_wait_ms: Option<u64>,
}

impl<'a> PermitRequest<'a> {
    /// A request of `tokens` for `provider`'s `model`, no tenant, no
    /// deadline of its own.
    pub fn new(provider: &'a str, model: &'a str, tokens: u64) -> Self {
        Self {
            provider,
            model,
            tenant: None,
            tokens,
            input_tokens: None,
            output_tokens: None,
            max_wait_ms: None,
        }
    }
}

/// A granted permit: wait `wait_ms` before calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderPermit {
    /// How long to wait first, ms.
    pub wait_ms: u64,
    /// The provider key's effective rate when granted, permille of the
    /// configured rate (AIMD).
    pub effective_permille: u32,
}

impl Waited for ProviderPermit {
    fn wait_ms(&self) -> u64 {
        self.wait_ms
    }
}

/// Why a permit could not be decided.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// No limits are configured for this provider key.
    #[error("no limits configured for provider {provider:?} model {model:?}")]
    Unknown {
        /// The provider.
        provider: String,
        /// The model.
        model: String,
    },
    /// The provider reported its quota exhausted (per-day or billing):
    /// fail fast, do not retry before `until_ms`.
    #[error("provider quota exhausted: {reason}")]
    Exhausted {
        /// What the provider said.
        reason: String,
        /// Until when this replica fails fast, ms.
        until_ms: u64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a provider's answer changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedbackOutcome {
    /// How the answer was read, its retry hint cut to the key's
    /// `max_cooldown_ms` (throttled, server error) or `max_exhausted_ms`
    /// (exhausted): the hint the governor acted on.
    pub feedback: Feedback,
    /// The provider key's cooldown end after this answer, if it set one.
    pub cooldown_until_ms: Option<u64>,
    /// The effective rate after this answer, permille (set when a 429
    /// changed it).
    pub effective_permille: Option<u32>,
}

/// This replica's exhaustion hold of a provider key: its permits fail fast
/// ([`ProviderError::Exhausted`]) until `until_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExhaustionHold {
    /// Until when, ms.
    pub until_ms: u64,
    /// What the provider said.
    pub reason: String,
}

/// A provider key's feedback state as this replica sees it now: the shared
/// cooldown and effective rate, and its own exhaustion hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderStatus {
    /// The provider.
    pub provider: Arc<str>,
    /// The model.
    pub model: Arc<str>,
    /// The end of the shared cooldown, ms, if one is live.
    pub cooldown_until_ms: Option<u64>,
    /// How long the cooldown still runs by this replica's clock, ms (0:
    /// none).
    pub cooldown_remaining_ms: u64,
    /// The effective rate (AIMD), permille of the configured rate.
    pub effective_permille: u32,
    /// This replica's exhaustion hold, if one is live.
    pub exhausted: Option<ExhaustionHold>,
    /// Its configured tenants, and those its fair sharing holds, by name.
    pub tenants: Vec<TenantStatus>,
}

/// A tenant of a provider key: its configuration and, with fair sharing,
/// its place in the key's shared state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantStatus {
    /// The tenant (`{others}`: the unconfigured ones past the key's
    /// limit; `{none}`: permits naming none).
    pub name: String,
    /// Its configured weight in fair sharing (`None`: not set).
    pub weight: Option<u32>,
    /// Its configured ceiling, permille of the pool (`None`: none).
    pub share_permille: Option<u32>,
    /// With fair sharing: whether it asked within the key's `max_wait_ms`.
    pub active: bool,
    /// With fair sharing: how far ahead of its weighted share it has
    /// booked, ms at the current sharing (0: not ahead).
    pub ahead_ms: u64,
}

/// What [`ProviderGovernor::clear`] cleared: the provider key's state just
/// before. After it the key has no cooldown, runs at the full rate and
/// this replica does not fail fast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClearOutcome {
    /// The end of the shared cooldown that was cleared, ms (`None`: none
    /// was live).
    pub cooldown_until_ms: Option<u64>,
    /// The effective rate before, permille ([`FULL`]: AIMD was at the full
    /// rate already).
    pub effective_permille: u32,
    /// This replica's exhaustion hold that was cleared, if one was live.
    pub exhausted: Option<ExhaustionHold>,
}

/// Fleet-wide provider permits (SPEC §5): per provider key (provider,
/// model) a requests bucket and token buckets shared through the store,
/// optional tenant shares, a cooldown and AIMD set by the provider's 429s.
///
/// A permit checks tenant buckets, pool buckets and the cooldown in one
/// atomic, all-or-nothing store step ([`Store::take_many`]); its wait is the
/// largest. Rates are scaled by the key's AIMD share, read from the store
/// first (one more round trip).
pub struct ProviderGovernor<S> {
    store: S,
    clock: Arc<dyn Clock>,
    book: ArcSwap<ProviderBook>,
    /// Per provider key: fail fast until (ms), and why.
    exhausted: Mutex<HashMap<KeyName, (u64, String)>>,
}

impl<S> std::fmt::Debug for ProviderGovernor<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderGovernor").finish_non_exhaustive()
    }
}

impl<S: Store> ProviderGovernor<S> {
    /// A governor of the keys in `book`, on `store`, reading `clock` (the
    /// store's clock).
    pub fn new(store: S, clock: impl Clock, book: ProviderBook) -> Self {
        Self {
            store,
            clock: Arc::new(clock),
            book: ArcSwap::from_pointee(book),
            exhausted: Mutex::new(HashMap::new()),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The current provider keys.
    pub fn book(&self) -> Arc<ProviderBook> {
        self.book.load_full()
    }

    /// Replaces the provider keys (a config reload); permits in flight keep
    /// the keys they started with.
    pub fn set_book(&self, book: ProviderBook) {
        self.book.store(Arc::new(book));
    }

    fn provider(&self, provider: &str, model: &str) -> Result<Arc<Provider>, ProviderError> {
        self.book
            .load()
            .get(provider, model)
            .cloned()
            .ok_or_else(|| ProviderError::Unknown {
                provider: provider.to_owned(),
                model: model.to_owned(),
            })
    }

    /// A permit for one call (SPEC §5): granted (wait `wait_ms` first),
    /// refused with [`Limit::Bucket`] (the provider's rate) or
    /// [`Limit::Cooldown`] and a retry hint, or never grantable
    /// ([`Denial::ExceedsCapacity`]). Under `reject` nothing waits; under
    /// `block` the wait must fit the key's `max_wait_ms` and the request's.
    /// A refusal takes nothing.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Unknown`] for an unconfigured key,
    /// [`ProviderError::Exhausted`] while the provider's quota is reported
    /// exhausted, [`ProviderError::Store`] if the store fails.
    pub async fn permit(
        &self,
        req: PermitRequest<'_>,
    ) -> Result<Decision<ProviderPermit>, ProviderError> {
        let p = self.provider(req.provider, req.model)?;
        let now = self.clock.now_ms();
        if let Some((until, reason)) = self.exhausted_until(&p, now) {
            return Err(ProviderError::Exhausted {
                reason,
                until_ms: until,
            });
        }
        let permille = self.store.aimd(&p.keys.aimd, p.aimd, false).await?;
        let max_wait_ms = match p.policy {
            Policy::Reject => 0,
            Policy::Block => p.max_wait_ms.min(req.max_wait_ms.unwrap_or(u64::MAX)),
        };
        let input = req.input_tokens.unwrap_or(req.tokens);
        let output = req.output_tokens.unwrap_or(0);
        let mut takes: Vec<BucketTake<'_>> = Vec::with_capacity(8);
        let tenant = req.tenant.and_then(|t| p.tenants.get(t));
        let sets = std::iter::once((&p.keys, FULL))
            .chain(tenant.and_then(|t| t.share_permille.map(|share| (&t.keys, share))));
        for (keys, share) in sets {
            let scale = |spec| aimd::scale(aimd::scale(spec, share), permille);
            for (spec, key, cost) in [
                (p.requests, &keys.requests, 1),
                (p.tokens, &keys.tokens, req.tokens),
                (p.input_tokens, &keys.input_tokens, input),
                (p.output_tokens, &keys.output_tokens, output),
            ] {
                if let Some(spec) = spec {
                    takes.push(BucketTake {
                        key,
                        spec: scale(spec),
                        cost,
                        max_wait_ms,
                    });
                }
            }
        }
        let cooldown = CooldownCheck {
            key: &p.keys.cooldown,
            max_wait_ms,
            max_ms: p.max_cooldown_ms,
        };
        // Fair sharing (SPEC §5): the pool's requests rate as effective now
        // paces the key's virtual clock; the pool's requests bucket is the
        // first take, named by a closed gate's refusal.
        let weights = p.fair.as_ref().map(|f| f.weights());
        let fair = match (&p.fair, &weights, p.requests) {
            (Some(f), Some(weights), Some(spec)) => {
                let spec = aimd::scale(spec, permille);
                Some(FairCheck {
                    key: &f.key,
                    take: FairTake {
                        tenant: req.tenant.unwrap_or(fair::NO_TENANT),
                        weights,
                        amount: spec.amount(),
                        period_ms: spec.period_ms(),
                        capacity: spec.capacity(),
                        window_ms: p.max_wait_ms,
                    },
                })
            }
            _ => None,
        };
        let out = match fair {
            Some(fair) => {
                self.store
                    .take_many_fair(&takes, Some(cooldown), fair)
                    .await?
            }
            None => self.store.take_many(&takes, Some(cooldown)).await?,
        };
        Ok(match out {
            MultiTake::Granted { wait_ms } => Decision::Allowed {
                grant: ProviderPermit {
                    wait_ms,
                    effective_permille: permille,
                },
                shadow_denied: None,
            },
            MultiTake::Refused {
                index,
                retry_after_ms,
            } => Decision::Denied(Denial::Limited {
                limit: if index.is_some() {
                    Limit::Bucket
                } else {
                    Limit::Cooldown
                },
                retry_after_ms,
            }),
            MultiTake::ExceedsCapacity { index } => {
                let t = &takes[index];
                let max_cost = t.spec.capacity().saturating_add(
                    t.max_wait_ms.saturating_mul(t.spec.amount()) / t.spec.period_ms(),
                );
                Decision::Denied(Denial::ExceedsCapacity {
                    limit: Limit::Bucket,
                    cost: t.cost,
                    max_cost,
                })
            }
        })
    }

    /// The feedback state of `provider`'s `model` now: the shared cooldown
    /// (read from the store without changing it), the effective rate, and
    /// this replica's exhaustion hold.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Unknown`] for an unconfigured key,
    /// [`ProviderError::Store`] if the store fails.
    pub async fn status(
        &self,
        provider: &str,
        model: &str,
    ) -> Result<ProviderStatus, ProviderError> {
        let p = self.provider(provider, model)?;
        self.status_of(&p).await
    }

    /// [`status`](Self::status) of every configured provider key, by
    /// provider, then model.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Store`] if the store fails.
    pub async fn statuses(&self) -> Result<Vec<ProviderStatus>, ProviderError> {
        let book = self.book();
        let mut keys: Vec<&Arc<Provider>> = book.iter().collect();
        keys.sort_by(|a, b| (&a.provider, &a.model).cmp(&(&b.provider, &b.model)));
        let mut out = Vec::with_capacity(keys.len());
        for p in keys {
            out.push(self.status_of(p).await?);
        }
        Ok(out)
    }

    async fn status_of(&self, p: &Provider) -> Result<ProviderStatus, ProviderError> {
        // Extending by 0 changes nothing and answers the live end: a read.
        let until = self
            .store
            .extend_cooldown(&p.keys.cooldown, 0, p.max_cooldown_ms)
            .await?;
        let effective_permille = self.store.aimd(&p.keys.aimd, p.aimd, false).await?;
        let now = self.clock.now_ms();
        let exhausted = self
            .exhausted_until(p, now)
            .map(|(until_ms, reason)| ExhaustionHold { until_ms, reason });
        let tenants = self.tenants_of(p, effective_permille, now).await?;
        Ok(ProviderStatus {
            provider: Arc::clone(&p.provider),
            model: Arc::clone(&p.model),
            cooldown_until_ms: (until > 0).then_some(until),
            cooldown_remaining_ms: until.saturating_sub(now),
            effective_permille,
            exhausted,
            tenants,
        })
    }

    /// The configured tenants of `p` and, with fair sharing, those its
    /// state holds (at most [`fair::MAX_TENANTS`] + 1), by name.
    async fn tenants_of(
        &self,
        p: &Provider,
        permille: u32,
        now: u64,
    ) -> Result<Vec<TenantStatus>, ProviderError> {
        let mut out: std::collections::BTreeMap<String, TenantStatus> = p
            .tenants
            .iter()
            .map(|(name, t)| {
                let s = TenantStatus {
                    name: name.clone(),
                    weight: t.weight,
                    share_permille: t.share_permille,
                    active: false,
                    ahead_ms: 0,
                };
                (name.clone(), s)
            })
            .collect();
        if let (Some(f), Some(spec)) = (&p.fair, p.requests)
            && let Some(state) = self.store.read_fair(&f.key).await?
        {
            let spec = aimd::scale(spec, permille);
            let weights = f.weights();
            let take = FairTake {
                tenant: fair::NO_TENANT,
                weights: &weights,
                amount: spec.amount(),
                period_ms: spec.period_ms(),
                capacity: spec.capacity(),
                window_ms: p.max_wait_ms,
            };
            for v in fair::view(&state, &take, now) {
                let e = out.entry(v.name.clone()).or_insert_with(|| TenantStatus {
                    name: v.name.clone(),
                    weight: None,
                    share_permille: None,
                    active: false,
                    ahead_ms: 0,
                });
                e.active = v.active;
                e.ahead_ms = v.ahead_ms;
            }
        }
        Ok(out.into_values().collect())
    }

    /// Clears what the provider's answers set on `provider`'s `model` (the
    /// operator's tool after a bad hint): the shared cooldown and AIMD state
    /// in one store step ([`Store::clear_provider`]: every replica's next
    /// permit is decided on the buckets alone, at the full rate), then this
    /// replica's exhaustion hold. The buckets are left as they are. Answers
    /// what was cleared.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Unknown`] for an unconfigured key,
    /// [`ProviderError::Store`] if the store fails (then nothing was
    /// cleared on this replica either).
    pub async fn clear(&self, provider: &str, model: &str) -> Result<ClearOutcome, ProviderError> {
        let p = self.provider(provider, model)?;
        let cleared = self
            .store
            .clear_provider(&p.keys.cooldown, &p.keys.aimd, p.aimd)
            .await?;
        let now = self.clock.now_ms();
        let exhausted = self
            .exhausted
            .lock()
            .remove(&(Arc::clone(&p.provider), Arc::clone(&p.model)))
            .filter(|(until, _)| *until > now)
            .map(|(until_ms, reason)| ExhaustionHold { until_ms, reason });
        Ok(ClearOutcome {
            cooldown_until_ms: cleared.cooldown_until_ms,
            effective_permille: cleared.effective_permille,
            exhausted,
        })
    }

    /// This replica's exhaustion holds now: (provider, model, until ms),
    /// one per configured key that has one (a read; held keys whose hold
    /// ended are left out).
    pub fn exhaustion_holds(&self) -> Vec<(Arc<str>, Arc<str>, u64)> {
        let now = self.clock.now_ms();
        self.exhausted
            .lock()
            .iter()
            .filter(|(_, (until, _))| *until > now)
            .map(|((p, m), (until, _))| (Arc::clone(p), Arc::clone(m), *until))
            .collect()
    }

    fn exhausted_until(&self, p: &Provider, now: u64) -> Option<(u64, String)> {
        let mut map = self.exhausted.lock();
        let key = (Arc::clone(&p.provider), Arc::clone(&p.model));
        match map.get(&key) {
            Some((until, reason)) if *until > now => Some((*until, reason.clone())),
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Reads a provider's answer to a call of `provider`'s `model` (its
    /// HTTP status, headers and body) and acts on it (SPEC §5): a
    /// per-minute throttle extends the key's cooldown by the provider's
    /// hint and counts as a 429 for AIMD (in the store: every replica
    /// slows down); an exhaustion makes this replica fail fast
    /// ([`ProviderError::Exhausted`] from `permit`) for the hint, or
    /// [`EXHAUSTED_HOLD_MS`]; a success or an error changes nothing.
    ///
    /// No hint is taken unbounded: a throttled or server-error answer's hint
    /// is cut to the key's `max_cooldown_ms`, an exhaustion's hold to its
    /// `max_exhausted_ms`, and the outcome carries the hints as cut.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Unknown`] for an unconfigured key,
    /// [`ProviderError::Store`] if the store fails.
    pub async fn feedback(
        &self,
        provider: &str,
        model: &str,
        status: u16,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<FeedbackOutcome, ProviderError> {
        let p = self.provider(provider, model)?;
        let now = self.clock.now_ms();
        let feedback = classify(p.kind, status, headers, body, now);
        self.apply(&p, feedback, now).await
    }

    /// Acts on an answer already read (see [`feedback`](Self::feedback)).
    ///
    /// # Errors
    ///
    /// As [`feedback`](Self::feedback).
    pub async fn observe(
        &self,
        provider: &str,
        model: &str,
        feedback: Feedback,
    ) -> Result<FeedbackOutcome, ProviderError> {
        let p = self.provider(provider, model)?;
        let now = self.clock.now_ms();
        self.apply(&p, feedback, now).await
    }

    async fn apply(
        &self,
        p: &Provider,
        feedback: Feedback,
        now: u64,
    ) -> Result<FeedbackOutcome, ProviderError> {
        let feedback = p.bound(feedback);
        let mut out = FeedbackOutcome {
            feedback: feedback.clone(),
            cooldown_until_ms: None,
            effective_permille: None,
        };
        match &feedback {
            Feedback::Throttled { retry_after_ms, .. } => {
                if let Some(hint) = retry_after_ms.filter(|h| *h > 0) {
                    // The hint as a duration: the store ends it on its own
                    // clock, so this replica's skew moves nothing.
                    let until = self
                        .store
                        .extend_cooldown(&p.keys.cooldown, hint, p.max_cooldown_ms)
                        .await?;
                    out.cooldown_until_ms = Some(until);
                }
                out.effective_permille = Some(self.store.aimd(&p.keys.aimd, p.aimd, true).await?);
            }
            Feedback::Exhausted {
                reason,
                retry_after_ms,
            } => {
                let hold = retry_after_ms
                    .filter(|h| *h > 0)
                    .unwrap_or(EXHAUSTED_HOLD_MS)
                    .min(p.max_exhausted_ms);
                self.exhausted.lock().insert(
                    (Arc::clone(&p.provider), Arc::clone(&p.model)),
                    (now.saturating_add(hold), reason.clone()),
                );
            }
            _ => {}
        }
        Ok(out)
    }

    /// The effective rate of `provider`'s `model` now, permille of the
    /// configured rate.
    ///
    /// # Errors
    ///
    /// As [`feedback`](Self::feedback).
    pub async fn effective_permille(
        &self,
        provider: &str,
        model: &str,
    ) -> Result<u32, ProviderError> {
        let p = self.provider(provider, model)?;
        Ok(self.store.aimd(&p.keys.aimd, p.aimd, false).await?)
    }
}

#[cfg(test)]
mod tests;
