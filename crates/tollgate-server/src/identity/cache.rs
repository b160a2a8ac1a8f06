//! The verified-token cache of jwt and dev modes: a token whose signature
//! and claims were verified once is not verified again while it is cached.
//!
//! - **Key**: the token's SHA-256 digest (256 bits: no two tokens share one
//!   in practice, and an attacker cannot aim a collision), compared in full
//!   on every lookup. The token itself is not kept, so an entry is its digest
//!   and the [`Identity`] it verified to, whatever the token's length.
//! - **Bounded**: [`TOKEN_CACHE_CAPACITY`] entries in [`SHARDS`] shards of
//!   equal capacity; a token's shard comes from a keyed hash (SipHash with a
//!   random per-cache key) of its digest, so no caller can steer tokens into
//!   one shard. A full shard evicts by the clock algorithm: a hand sweeps
//!   the slots, sparing (and clearing the mark of) each entry hit since it
//!   last passed, evicting the first unmarked one.
//! - **Time**: an entry keeps the token's `exp` and `nbf`; every hit is
//!   checked against the injected clock by the same rule as a full
//!   verification (`ClaimRules::check_times` in `jwt.rs`), so an expired
//!   token is refused on a hit exactly as it would be without the cache.
//! - **Keys**: every lookup and insert names the *epoch* of the keys
//!   (a JWKS key set's generation; 0 for a secret or public key, which never
//!   change for the life of the verifier: identity settings apply only after
//!   a restart, and a restart builds a new verifier and a new cache). A shard
//!   that sees a newer epoch drops all its entries first, and an insert
//!   verified under an older epoch is not kept: a token is never accepted on
//!   keys that no longer verify it.
//! - **Only successes** are cached: a refused token is verified (and
//!   refused) again on every request.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::Identity;

/// How many verified tokens one verifier caches, at most.
pub const TOKEN_CACHE_CAPACITY: usize = 16_384;

/// How many independently locked shards the cache has (a power of two).
pub(super) const SHARDS: usize = 16;

/// A token's cache key: its SHA-256 digest.
pub(super) type TokenDigest = [u8; 32];

/// The digest a token is cached under.
pub(super) fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// What a verified token stands for, and when it is valid.
#[derive(Debug, Clone)]
pub(super) struct Cached {
    /// The identity the token verified to.
    pub(super) identity: Identity,
    /// Its `exp` claim, whole seconds (rounded down).
    pub(super) exp_s: u64,
    /// Its `nbf` claim, whole seconds (rounded up), if any.
    pub(super) nbf_s: Option<u64>,
}

/// The cache: [`SHARDS`] shards, each under its own lock.
pub(super) struct TokenCache {
    /// The key of the hash that picks a token's shard.
    keys: RandomState,
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
}

/// One shard: the slots the clock hand sweeps, and an index from digest to
/// slot.
struct Shard {
    index: HashMap<TokenDigest, usize>,
    slots: Vec<Slot>,
    hand: usize,
    /// The epoch of the keys the entries were verified with.
    epoch: u64,
    /// Lookups answered from this shard since the cache was made.
    hits: u64,
}

struct Slot {
    digest: TokenDigest,
    cached: Cached,
    /// Hit since the clock hand last passed.
    referenced: bool,
}

/// What the cache holds and has done, for tests and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCacheStats {
    /// Tokens cached now.
    pub entries: usize,
    /// Lookups answered from the cache (no verification).
    pub hits: u64,
    /// Tokens whose signature and claims were verified in full (cache
    /// misses, the cache bypassed, and refused tokens).
    pub verifications: u64,
}

impl TokenCache {
    /// An empty cache of at most `capacity` entries (rounded up to a
    /// multiple of [`SHARDS`]).
    pub(super) fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Self {
            keys: RandomState::new(),
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        index: HashMap::new(),
                        slots: Vec::new(),
                        hand: 0,
                        epoch: 0,
                        hits: 0,
                    })
                })
                .collect(),
            per_shard,
        }
    }

    fn shard(&self, digest: &TokenDigest) -> &Mutex<Shard> {
        let h = self.keys.hash_one(digest) as usize;
        &self.shards[h % SHARDS]
    }

    /// The cached verification of the token with `digest` under keys of
    /// `epoch`, if any; it still has to pass the time checks.
    pub(super) fn get(&self, digest: &TokenDigest, epoch: u64) -> Option<Cached> {
        let mut shard = self.shard(digest).lock();
        if epoch != shard.epoch {
            if epoch > shard.epoch {
                shard.reset(epoch);
            }
            return None;
        }
        let i = *shard.index.get(digest)?;
        shard.hits += 1;
        let slot = &mut shard.slots[i];
        slot.referenced = true;
        Some(slot.cached.clone())
    }

    /// Caches a successful verification of the token with `digest`, made
    /// with keys of `epoch` (not kept if the keys have changed since).
    pub(super) fn insert(&self, digest: TokenDigest, epoch: u64, cached: Cached) {
        let mut shard = self.shard(&digest).lock();
        if epoch < shard.epoch {
            return;
        }
        if epoch > shard.epoch {
            shard.reset(epoch);
        }
        let per_shard = self.per_shard;
        shard.insert(digest, cached, per_shard);
    }

    /// Entries and counters.
    pub(super) fn stats(&self) -> TokenCacheStats {
        let mut stats = TokenCacheStats::default();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            stats.entries += shard.slots.len();
            stats.hits += shard.hits;
        }
        stats
    }
}

impl Shard {
    /// Drops every entry: the keys are now those of `epoch`.
    fn reset(&mut self, epoch: u64) {
        self.index.clear();
        self.slots.clear();
        self.hand = 0;
        self.epoch = epoch;
    }

    fn insert(&mut self, digest: TokenDigest, cached: Cached, capacity: usize) {
        if let Some(&i) = self.index.get(&digest) {
            self.slots[i].cached = cached;
            return;
        }
        let slot = Slot {
            digest,
            cached,
            referenced: false,
        };
        if self.slots.len() < capacity {
            self.index.insert(digest, self.slots.len());
            self.slots.push(slot);
            return;
        }
        // The clock: at most one full sweep clears every mark, so this
        // ends within two.
        loop {
            let i = self.hand;
            self.hand = (i + 1) % self.slots.len();
            let victim = &mut self.slots[i];
            if victim.referenced {
                victim.referenced = false;
                continue;
            }
            self.index.remove(&victim.digest);
            *victim = slot;
            self.index.insert(digest, i);
            return;
        }
    }
}

#[cfg(test)]
mod tests;
