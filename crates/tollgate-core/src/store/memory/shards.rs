//! The memory store's tables: lock-striped shards of expiring entries
//! under one entry bound, and multi-key steps over several shards.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::{DefaultHashBuilder, HashTable};
use parking_lot::{Mutex, MutexGuard};
use thin_vec::ThinVec;

const SHARDS: usize = 64;
const SWEEP_EVERY_MS: u64 = 60_000;
const MIN_SWEEP_LEN: usize = 1_024;

/// The entry bound, shared by the three tables.
pub(super) struct EntryCap {
    pub(super) max: usize,
    pub(super) count: AtomicUsize,
}

impl EntryCap {
    /// Takes room for one more entry, if there is any.
    pub(super) fn try_add(&self) -> bool {
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    pub(super) fn add(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    pub(super) fn sub(&self, n: usize) {
        if n > 0 {
            self.count.fetch_sub(n, Ordering::AcqRel);
        }
    }

    pub(super) fn has_room(&self, n: usize) -> bool {
        self.count.load(Ordering::Acquire).saturating_add(n) <= self.max
    }
}

/// An operation needed a new entry and the store is at its bound.
#[derive(Debug)]
pub(super) struct Full;

pub(super) trait Expiring: Default {
    /// After this time (ms) the entry is as good as missing.
    fn expires_at(&self) -> u64;

    /// Makes an expired entry as good as new before an operation uses it.
    fn reset(&mut self) {
        *self = Self::default();
    }
}

#[repr(align(128))]
struct Padded<T>(T);

/// Longest key kept inline in its table slot, bytes.
const INLINE_KEY: usize = 14;

/// A table's key, in two words. Keys of up to [`INLINE_KEY`] bytes (short
/// user ids and bucket names) live in the slot itself, so a lookup that
/// finds its slot reads no other memory and a new key costs no allocation;
/// longer ones are on the heap behind one thin pointer (the length is
/// stored with the bytes, so a comparison reads one place).
enum Key {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Boxed(ThinVec<u8>),
}

// Two words: with the named-key entry's three, a slot is 40 bytes (at
// 100,000 named keys the table is 37 % smaller than with 64-byte slots,
// which the keyed check feels past the L2 cache: examples/check_ab.rs).
const _: () = assert!(std::mem::size_of::<Key>() == 16);
const _: () = assert!(std::mem::size_of::<Slot<super::named::KeyEntry>>() == 40);

impl Key {
    fn new(key: &str) -> Self {
        let b = key.as_bytes();
        if b.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..b.len()].copy_from_slice(b);
            Key::Inline {
                len: b.len() as u8,
                bytes,
            }
        } else {
            Key::Boxed(ThinVec::from(b))
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Boxed(b) => b.as_slice(),
        }
    }

    /// Whether this is `key`. An inline key is compared by a few
    /// word loads ([`short_eq`]): no call to `memcmp`, and no copy of the
    /// probe into a buffer (whose byte stores a wide load would then wait
    /// on).
    #[inline(always)]
    fn matches(&self, key: &[u8]) -> bool {
        match self {
            Key::Inline { len, bytes } => {
                usize::from(*len) == key.len() && short_eq(&bytes[..key.len()], key)
            }
            Key::Boxed(k) => k.as_slice() == key,
        }
    }

    /// The key as given (only reads that list keys need it: lookups
    /// compare bytes).
    fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).expect("a key is stored as the whole str it was")
    }
}

/// A table slot: the key and its value.
struct Slot<V>(Key, V);

/// `a == b` for slices of one length of at most [`INLINE_KEY`] bytes, by
/// overlapping word loads that cover every byte.
#[inline(always)]
fn short_eq(a: &[u8], b: &[u8]) -> bool {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let w8 = |s: &[u8], i: usize| u64::from_ne_bytes(s[i..i + 8].try_into().expect("8 bytes"));
    let w4 = |s: &[u8], i: usize| u32::from_ne_bytes(s[i..i + 4].try_into().expect("4 bytes"));
    if n >= 8 {
        // 8..=16: the first and the last 8 bytes cover them all.
        w8(a, 0) == w8(b, 0) && w8(a, n - 8) == w8(b, n - 8)
    } else if n >= 4 {
        w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4)
    } else {
        a == b
    }
}

struct Shard<V> {
    table: HashTable<Slot<V>>,
    sweep_len: usize,
    next_sweep_at: u64,
}

/// A shard behind its lock, alone on its cache lines.
type LockedShard<V> = Padded<Mutex<Shard<V>>>;

pub(super) struct Shards<V> {
    shared: Shared,
    shards: Box<[LockedShard<V>]>,
}

/// What every shard of one table shares: how keys hash, and the bound on
/// entries (of every table of the store).
struct Shared {
    hasher: DefaultHashBuilder,
    cap: Arc<EntryCap>,
}

/// A key's hash: of its bytes, so a stored [`Key`] rehashes without
/// turning back into a `str`.
fn hash(hasher: &DefaultHashBuilder, key: &[u8]) -> u64 {
    hasher.hash_one(key)
}

impl<V: Expiring> Shards<V> {
    pub(super) fn new(cap: Arc<EntryCap>) -> Self {
        Self {
            shared: Shared {
                hasher: DefaultHashBuilder::default(),
                cap,
            },
            shards: (0..SHARDS)
                .map(|_| {
                    Padded(Mutex::new(Shard {
                        table: HashTable::new(),
                        sweep_len: MIN_SWEEP_LEN,
                        next_sweep_at: 0,
                    }))
                })
                .collect(),
        }
    }

    fn locate(&self, key: &str) -> (u64, usize) {
        let hash = hash(&self.shared.hasher, key.as_bytes());
        (hash, ((hash >> 40) as usize) % SHARDS)
    }

    /// Runs `f` on the live entry of `key` (a default one if missing or
    /// expired). Entries left expired by `f` are removed. A missing key is
    /// added only if `f` leaves it live and there is room: else [`Full`],
    /// and nothing changed.
    pub(super) fn with<R>(
        &self,
        key: &str,
        now: u64,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R, Full> {
        let (hash, i) = self.locate(key);
        let mut shard = self.shards[i].0.lock();
        let r = shard.with(&self.shared, true, (hash, key), now, f);
        shard.maybe_sweep(&self.shared, now);
        r
    }

    /// Reads the live entry of `key`, if any, without creating one.
    pub(super) fn read<R>(&self, key: &str, now: u64, f: impl FnOnce(Option<&V>) -> R) -> R {
        let (hash, i) = self.locate(key);
        let shard = self.shards[i].0.lock();
        let entry = shard
            .table
            .find(hash, |Slot(k, _)| k.matches(key.as_bytes()))
            .map(|Slot(_, v)| v)
            .filter(|v| v.expires_at() > now);
        f(entry)
    }

    /// Locks the shards of `keys` in index order (no deadlock), for one
    /// atomic step over several keys. Each key is hashed once.
    pub(super) fn lock_many<'a, 'k>(&'a self, keys: &[&'k str]) -> Multi<'a, 'k, V> {
        let located: Vec<(&'k str, u64, usize)> = keys
            .iter()
            .map(|k| {
                let (h, i) = self.locate(k);
                (*k, h, i)
            })
            .collect();
        let mut idx: Vec<usize> = located.iter().map(|l| l.2).collect();
        idx.sort_unstable();
        idx.dedup();
        let guards = idx.iter().map(|&i| (i, self.shards[i].0.lock())).collect();
        Multi {
            shared: &self.shared,
            located,
            guards,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().table.len()).sum()
    }

    pub(super) fn purge(&self, now: u64) {
        for s in self.shards.iter() {
            s.0.lock().sweep(&self.shared, now);
        }
    }

    pub(super) fn for_each_live(&self, now: u64, mut f: impl FnMut(&str, &V)) {
        for s in self.shards.iter() {
            let shard = s.0.lock();
            for Slot(k, v) in shard.table.iter() {
                if v.expires_at() > now {
                    f(k.as_str(), v);
                }
            }
        }
    }
}

impl<V: Expiring> Shard<V> {
    /// As [`Shards::with`]. With `check`, a new key needs room under `cap`
    /// (a multi-key step checks for room first and passes `false`).
    fn with<R>(
        &mut self,
        shared: &Shared,
        check: bool,
        (hash, key): (u64, &str),
        now: u64,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R, Full> {
        let Shared { hasher, cap } = shared;
        let eq = |Slot(k, _): &Slot<V>| k.matches(key.as_bytes());
        match self
            .table
            .entry(hash, eq, |Slot(k, _)| self::hash(hasher, k.as_bytes()))
        {
            hashbrown::hash_table::Entry::Occupied(mut occupied) => {
                let v = &mut occupied.get_mut().1;
                if v.expires_at() <= now {
                    v.reset();
                }
                let r = f(v);
                if v.expires_at() <= now {
                    occupied.remove();
                    cap.sub(1);
                }
                Ok(r)
            }
            hashbrown::hash_table::Entry::Vacant(vacant) => {
                // Decide on a fresh entry first: one left expired (a read,
                // a refusal) is never stored, so it needs no room.
                let mut v = V::default();
                let r = f(&mut v);
                if v.expires_at() > now {
                    if check {
                        if !cap.try_add() {
                            return Err(Full);
                        }
                    } else {
                        cap.add();
                    }
                    vacant.insert(Slot(Key::new(key), v));
                }
                Ok(r)
            }
        }
    }

    fn maybe_sweep(&mut self, shared: &Shared, now: u64) {
        if self.table.len() > self.sweep_len || now >= self.next_sweep_at {
            self.sweep(shared, now);
        }
    }

    fn sweep(&mut self, Shared { hasher, cap }: &Shared, now: u64) {
        let before = self.table.len();
        self.table.retain(|Slot(_, v)| v.expires_at() > now);
        cap.sub(before - self.table.len());
        // Rehashing moves entries: it must be given their real hashes.
        self.table.shrink_to(self.table.len() * 2, |Slot(k, _)| {
            hash(hasher, k.as_bytes())
        });
        self.sweep_len = (self.table.len() * 2).max(MIN_SWEEP_LEN);
        self.next_sweep_at = now.saturating_add(SWEEP_EVERY_MS);
    }
}

pub(super) struct Multi<'a, 'k, V> {
    shared: &'a Shared,
    located: Vec<(&'k str, u64, usize)>,
    guards: Vec<(usize, MutexGuard<'a, Shard<V>>)>,
}

impl<V: Expiring> Multi<'_, '_, V> {
    fn guard(&mut self, i: usize) -> &mut Shard<V> {
        self.guards
            .iter_mut()
            .find(|(j, _)| *j == i)
            .map(|(_, g)| &mut **g)
            .expect("lock_many locked every key's shard")
    }

    /// [`Full`] unless there is room for every key not held now (each
    /// counted once).
    pub(super) fn check_room(&mut self, now: u64) -> Result<(), Full> {
        self.check_room_of(now, 0..self.located.len())
    }

    /// [`Full`] unless there is room for every key at the positions
    /// `new` names (given to `lock_many`) that is not held now, each
    /// counted once: for a step that creates only some of its keys.
    pub(super) fn check_room_of(
        &mut self,
        now: u64,
        new: impl IntoIterator<Item = usize>,
    ) -> Result<(), Full> {
        let mut missing: Vec<&str> = Vec::new();
        for n in new {
            let (key, hash, i) = self.located[n];
            let held = self
                .guard(i)
                .table
                .find(hash, |Slot(k, _)| k.matches(key.as_bytes()))
                .is_some_and(|Slot(_, v)| v.expires_at() > now);
            if !held && !missing.contains(&key) {
                missing.push(key);
            }
        }
        if self.shared.cap.has_room(missing.len()) {
            Ok(())
        } else {
            Err(Full)
        }
    }

    /// Runs `f` on the entry of the `n`th key given to `lock_many` (room
    /// for a new key was checked by [`check_room`](Self::check_room), so
    /// this never answers [`Full`]).
    pub(super) fn with<R>(
        &mut self,
        n: usize,
        now: u64,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R, Full> {
        let (key, hash, i) = self.located[n];
        let shared = self.shared;
        self.guard(i).with(shared, false, (hash, key), now, f)
    }
}

#[cfg(test)]
mod tests {
    use super::{INLINE_KEY, Key, short_eq};

    #[test]
    fn short_eq_is_slice_equality_at_every_length_and_position() {
        for n in 0..=INLINE_KEY {
            let a: Vec<u8> = (0..n as u8).map(|i| b'a' + i).collect();
            assert!(short_eq(&a, &a.clone()), "length {n}");
            for i in 0..n {
                let mut b = a.clone();
                b[i] ^= 0x20;
                assert!(!short_eq(&a, &b), "length {n}, byte {i}");
            }
        }
    }

    #[test]
    fn a_key_matches_itself_only() {
        for n in [0, 1, 3, 4, 7, 8, 15, 16, 17, 22, 23, 40] {
            let k: String = "k".repeat(n);
            let key = Key::new(&k);
            assert!(key.matches(k.as_bytes()), "length {n}");
            assert!(!key.matches(format!("{k}x").as_bytes()), "length {n}");
            if n > 0 {
                assert!(!key.matches(&k.as_bytes()[1..]), "length {n}");
            }
        }
    }
}
