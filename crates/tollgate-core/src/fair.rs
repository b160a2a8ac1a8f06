//! Weighted fair sharing of a provider key's pool across its tenants
//! (SPEC §5, *Fair sharing*), as pure transitions: a virtual clock that
//! advances as the pool's fluid share would (generalized processor sharing
//! over the tenants that are ahead of it), a finish tag per tenant, and the
//! gate a permit passes before it takes from the pool.
//!
//! A permit is a promise, so fairness cannot reorder permits already
//! granted; it limits how far ahead each tenant may book instead. While
//! another tenant of the key asked within the key's `max_wait_ms`, a tenant
//! may book (be granted with a wait) only while it is at most one permit
//! ahead of its weighted share ([`Gate::Open`]); a little further — its
//! weighted part of the pool's burst — or while no other tenant is ahead of
//! its share, it may still take capacity that is free now
//! ([`Gate::ImmediateOnly`]: granted only without a wait), which keeps the
//! pool work-conserving; beyond that it is refused with a hint
//! ([`Gate::Closed`]). A tenant alone uses the pool as without tenants.
//!
//! Nothing here reads a clock or touches a store: `MemoryStore` calls these
//! under the provider key's lock, and the Redis script `take_many.lua`
//! restates them. Arithmetic is on `f64` in a fixed order (the script's
//! numbers are doubles) and every stored value is a whole number below
//! 2^53.

use std::collections::BTreeMap;

/// Virtual time per millisecond of pool capacity for a tenant of weight 1.
pub const UNIT: f64 = 1_000.0;

/// Permits a tenant may book ahead of its weighted share while others are
/// active.
pub const LEAD_PERMITS: f64 = 1.0;

/// Most tenants a provider key keeps fair-share state for; past it, tenants
/// that are not configured share the entry [`OTHERS`].
pub const MAX_TENANTS: usize = 64;

/// The entry unconfigured tenants share once [`MAX_TENANTS`] are held (no
/// tenant name may contain `{`).
pub const OTHERS: &str = "{others}";

/// The entry of permits that name no tenant.
pub const NO_TENANT: &str = "{none}";

/// Longest tenant name a provider key keeps an entry of its own for.
pub const MAX_NAME_BYTES: usize = 128;

/// The name `tenant` is held under: itself, or [`OTHERS`] for a name longer
/// than [`MAX_NAME_BYTES`] or with an ASCII control character (a tenant
/// claim may carry any string; configured names never do), so that a key's
/// state stays small and its names are plain text.
pub fn held_name(tenant: &str) -> &str {
    if tenant.len() > MAX_NAME_BYTES || tenant.bytes().any(|b| b.is_ascii_control()) {
        OTHERS
    } else {
        tenant
    }
}

/// Heaviest weight a tenant may be given.
pub const MAX_WEIGHT: u32 = 1_000;

/// What a provider key's fair sharing remembers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FairState {
    /// The virtual clock.
    pub v: u64,
    /// When the clock was last advanced, ms.
    pub at_ms: u64,
    /// The tenants seen within the key's `max_wait_ms` or still ahead of
    /// the clock: name → its entry.
    pub tenants: BTreeMap<String, FairEntry>,
}

/// A tenant's fair-sharing state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FairEntry {
    /// Its finish tag: the virtual time by which the pool, shared by
    /// weight, would have served what it was granted.
    pub finish: u64,
    /// When it last asked, ms.
    pub seen_ms: u64,
    /// Whether `finish` counts one permit it asked for and was refused:
    /// it waits in line for the pool like a backlogged tenant (so the
    /// clock slows for it) and its next grant takes that place.
    pub queued: bool,
}

/// A permit's fair-sharing inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairTake<'a> {
    /// The permit's tenant ([`NO_TENANT`] when it names none).
    pub tenant: &'a str,
    /// The configured weights; a tenant not listed weighs 1.
    pub weights: &'a [(&'a str, u32)],
    /// The pool's requests rate as effective now: permits per period.
    pub amount: u64,
    /// Its period, ms.
    pub period_ms: u64,
    /// Its burst as effective now, permits.
    pub capacity: u64,
    /// The key's `max_wait_ms`: a tenant seen within it is active.
    pub window_ms: u64,
}

impl FairTake<'_> {
    /// The weight of `tenant`.
    pub fn weight(&self, tenant: &str) -> u32 {
        self.weights
            .iter()
            .find(|(n, _)| *n == tenant)
            .map_or(1, |&(_, w)| w.clamp(1, MAX_WEIGHT))
    }

    fn configured(&self, tenant: &str) -> bool {
        self.weights.iter().any(|(n, _)| *n == tenant)
    }

    /// Virtual time one permit costs a tenant of weight `w`: its share of
    /// a permit's pool time, at least 1.
    fn cost(&self, w: u32) -> f64 {
        ((self.period_ms as f64 * UNIT) / (self.amount.max(1) as f64 * f64::from(w)))
            .floor()
            .max(1.0)
    }
}

/// May the permit take from the pool?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// As without tenants: granted with a wait up to `max_wait_ms`.
    Open,
    /// Only capacity free now: granted only without a wait.
    ImmediateOnly,
    /// Refused: the tenant is past its share while another tenant is
    /// behind its own.
    Closed {
        /// When its share is expected to allow it, ms.
        retry_after_ms: u64,
    },
}

/// The decision for one permit: the gate, the entry it is accounted under
/// and the state to save with a grant or a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct FairDecision {
    /// The gate.
    pub gate: Gate,
    /// The entry the permit is accounted under (the tenant, or [`OTHERS`]).
    pub entry: String,
    /// The state to save if the pool grants the permit.
    pub granted: FairState,
    /// The state to save if it does not.
    pub refused: FairState,
}

/// Advances the clock to `now`: over each stretch in which the tenants
/// ahead of it (finish tag past it) weigh `W` in all, it moves `UNIT / W`
/// per ms, as fast as each of them is served under weighted sharing of a
/// fully used pool. With nobody ahead it stops; then everything is set
/// back to 0 (numbers stay small, order is kept).
fn advance(state: &mut FairState, req: &FairTake<'_>, now: u64) {
    let mut dt = now.saturating_sub(state.at_ms) as f64;
    state.at_ms = state.at_ms.max(now);
    loop {
        let mut ahead = 0.0;
        let mut next = u64::MAX;
        for (name, e) in &state.tenants {
            if e.finish > state.v {
                ahead += f64::from(req.weight(name));
                next = next.min(e.finish);
            }
        }
        if ahead == 0.0 {
            state.v = 0;
            for e in state.tenants.values_mut() {
                e.finish = 0;
                e.queued = false;
            }
            return;
        }
        if dt <= 0.0 {
            return;
        }
        let need = ((next - state.v) as f64 * ahead / UNIT).ceil();
        if need <= dt {
            state.v = next;
            dt -= need;
        } else {
            state.v += (dt * UNIT / ahead).floor() as u64;
            return;
        }
    }
}

/// `state` at `now`, and the time from which a tenant seen is active: the
/// clock advanced, and the tenants neither active nor ahead of it
/// forgotten.
fn settled(state: &FairState, req: &FairTake<'_>, now: u64) -> (FairState, u64) {
    let mut s = state.clone();
    advance(&mut s, req, now);
    let since = now.saturating_sub(req.window_ms);
    let v = s.v;
    s.tenants.retain(|_, e| e.seen_ms >= since || e.finish > v);
    (s, since)
}

/// Decides `req`'s gate at `now` (SPEC §5, *Fair sharing*) from `state`
/// (the saved state, or the default for none).
pub fn decide(state: &FairState, req: &FairTake<'_>, now: u64) -> FairDecision {
    let (s, since) = settled(state, req, now);
    let v = s.v;
    let tenant = held_name(req.tenant);
    let entry = if req.configured(tenant)
        || s.tenants.contains_key(tenant)
        || s.tenants.len() < MAX_TENANTS
    {
        tenant
    } else {
        OTHERS
    };
    let w = req.weight(entry);
    let cost = req.cost(w);
    let mine = s.tenants.get(entry).copied().unwrap_or_default();
    let mut active = 0.0;
    let mut others = false;
    let mut others_ahead = false;
    let mut ahead = 0.0;
    for (name, e) in &s.tenants {
        if e.finish > v {
            ahead += f64::from(req.weight(name));
        }
        if name != entry && e.seen_ms >= since {
            others = true;
            active += f64::from(req.weight(name));
            others_ahead |= e.finish > v;
        }
    }
    // Alone, a tenant books as without tenants and keeps no lead: what it
    // booked while nobody else asked is not held against it later. A
    // permit it was refused and asks for again takes its place in line.
    let start = match (others, mine.queued) {
        (false, _) => v,
        (true, false) => mine.finish.max(v),
        (true, true) => mine.finish.saturating_sub(cost as u64).max(v),
    };
    let gate = if !others {
        Gate::Open
    } else {
        active += f64::from(w);
        let lead = (start - v) as f64;
        let open = LEAD_PERMITS * cost;
        let burst = ((req.capacity as f64 * req.period_ms as f64 * UNIT)
            / (req.amount.max(1) as f64 * active))
            .floor();
        if lead <= open {
            Gate::Open
        } else if lead <= open + burst || !others_ahead {
            Gate::ImmediateOnly
        } else {
            Gate::Closed {
                retry_after_ms: (((lead - open) * ahead.max(1.0)) / UNIT).ceil().max(1.0) as u64,
            }
        }
    };
    // Refused while others are active and not ahead of the clock, it
    // joins the line with one permit.
    let join = others && mine.finish <= v;
    let mut refused = s.clone();
    refused.tenants.insert(
        entry.to_owned(),
        FairEntry {
            finish: if join { v + cost as u64 } else { mine.finish },
            seen_ms: now,
            queued: join || (mine.queued && mine.finish > v),
        },
    );
    let mut granted = s;
    granted.tenants.insert(
        entry.to_owned(),
        FairEntry {
            finish: start + cost as u64,
            seen_ms: now,
            queued: false,
        },
    );
    FairDecision {
        gate,
        entry: entry.to_owned(),
        granted,
        refused,
    }
}

/// A tenant of a provider key, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantView {
    /// The name it is held under.
    pub name: String,
    /// Its weight.
    pub weight: u32,
    /// Whether it asked within the key's `max_wait_ms`.
    pub active: bool,
    /// How far ahead of its weighted share it has booked: how long the
    /// pool, shared as it is now, takes to serve what it was granted beyond
    /// that share, ms (0: not ahead).
    pub ahead_ms: u64,
    /// Whether it waits in line with a refused permit.
    pub queued: bool,
}

/// The tenants `state` holds at `now` (the clock advanced as a permit
/// would, nothing saved), by name.
pub fn view(state: &FairState, req: &FairTake<'_>, now: u64) -> Vec<TenantView> {
    let (s, since) = settled(state, req, now);
    let v = s.v;
    let ahead: f64 = s
        .tenants
        .iter()
        .filter(|(_, e)| e.finish > v)
        .map(|(n, _)| f64::from(req.weight(n)))
        .sum();
    s.tenants
        .iter()
        .map(|(name, e)| TenantView {
            name: name.clone(),
            weight: req.weight(name),
            active: e.seen_ms >= since,
            ahead_ms: if e.finish > v {
                ((e.finish - v) as f64 * ahead / UNIT).ceil() as u64
            } else {
                0
            },
            queued: e.queued,
        })
        .collect()
}

#[cfg(test)]
mod tests;
