//! The runs this replica admitted and their leases' expiry: the replica's
//! own state of its turns in flight, read by `tollgate_turns_in_flight`.

use std::collections::{BTreeSet, HashMap};

use prometheus_client::metrics::gauge::Gauge;

/// The runs admitted through this replica, each counted until its lease
/// ends or expires ([`RunTable`]), and the gauge that shows their number
/// (`tollgate_turns_in_flight`, [`Metrics::turns_in_flight`]).
///
/// [`Metrics::turns_in_flight`]: crate::metrics::Metrics::turns_in_flight
#[derive(Debug)]
pub struct Runs {
    table: parking_lot::Mutex<RunTable>,
    gauge: Gauge,
}

impl Runs {
    /// An empty table whose count `gauge` shows.
    pub fn new(gauge: Gauge) -> Self {
        Self {
            table: parking_lot::Mutex::default(),
            gauge,
        }
    }

    /// Run `invocation_id` of `user` was admitted through this replica
    /// with a new lease (not a refresh, not a turn only shadow mode let
    /// through) expiring at `expires_at_ms` (the store's clock), seen at
    /// `now_ms` (this replica's clock).
    pub fn started(&self, user: &str, invocation_id: &str, expires_at_ms: u64, now_ms: u64) {
        let n = self
            .table
            .lock()
            .admitted(run_key(user, invocation_id), expires_at_ms, now_ms);
        self.gauge.set(n as i64);
    }

    /// The lease of a run was pushed to `expires_at_ms` (a renewal, or an
    /// admission that refreshed it). Counted only if this replica admitted
    /// the run: a refresh or renewal never adds a run.
    pub fn renewed(&self, user: &str, invocation_id: &str, expires_at_ms: u64, now_ms: u64) {
        let n = self
            .table
            .lock()
            .extended(run_key(user, invocation_id), expires_at_ms, now_ms);
        self.gauge.set(n as i64);
    }

    /// A run's lease ended: released (whether or not the store still held
    /// it), force-released by an operator, or answered lost on renewal.
    pub fn ended(&self, user: &str, invocation_id: &str, now_ms: u64) {
        let n = self
            .table
            .lock()
            .ended(run_key(user, invocation_id), now_ms);
        self.gauge.set(n as i64);
    }

    /// Drops the runs whose leases have expired by `now_ms` and sets the
    /// gauge to those left (before a scrape).
    pub fn sync(&self, now_ms: u64) {
        let n = self.table.lock().live(now_ms);
        self.gauge.set(n as i64);
    }
}

/// Most runs [`RunTable`] tracks at once. Past it, admitting one more drops
/// the run whose lease expires first (that run is no longer counted). An
/// entry is a 128-bit key and an expiry, about 100 bytes with the table's
/// overhead whatever the length of the ids (a client chooses invocation
/// ids of up to 512 characters): some 26 MiB at this cap.
pub const MAX_RUN_TABLE_ENTRIES: usize = 1 << 18;

/// A run's key in [`RunTable`]: its user and invocation id (length-
/// prefixed, so unambiguous) hashed to 128 bits under keys drawn at random
/// once per process, so no client can aim two runs at one key (two runs
/// share one by chance with probability about n² / 2^129).
fn run_key(user: &str, invocation_id: &str) -> u128 {
    use std::hash::{BuildHasher, Hash, Hasher};
    static KEYS: std::sync::OnceLock<[std::hash::RandomState; 2]> = std::sync::OnceLock::new();
    let keys = KEYS.get_or_init(|| [std::hash::RandomState::new(), std::hash::RandomState::new()]);
    let half = |state: &std::hash::RandomState| {
        let mut h = state.build_hasher();
        user.len().hash(&mut h);
        user.hash(&mut h);
        invocation_id.hash(&mut h);
        h.finish()
    };
    (u128::from(half(&keys[0])) << 64) | u128::from(half(&keys[1]))
}

/// The run leases this replica admitted, by run, with their expiry as the
/// store answered it: the source of `tollgate_turns_in_flight`, so a run
/// admitted and abandoned (never released) stops counting when its lease
/// expires, as the store reclaims it.
///
/// Every operation first drops the entries whose expiry is at or before
/// `now` (the order of `by_expiry`: each entry is dropped once, in
/// O(log n), so pruning is amortised into the updates that added them).
/// The table therefore never holds more entries than there are run leases
/// this replica admitted that are live by their last known expiry: at most
/// the live leases of the store, and never more than [`MAX_RUN_TABLE_ENTRIES`].
///
/// Expiries come from the store (with Redis, its `TIME`); `now` is this
/// replica's clock. A replica whose clock runs `d` ms ahead of the store's
/// stops counting an abandoned run `d` ms before the store reclaims it (and
/// a run renewed at ttl/3, as clients do, stays counted while `d` is under
/// two thirds of the lease TTL); one `d` ms behind counts it `d` ms longer.
/// Runs admitted through another replica are counted there, even when this
/// one renews or releases them (a release here while another replica
/// counts the run leaves it counted there until its expiry).
#[derive(Debug, Default)]
pub struct RunTable {
    expiry: HashMap<u128, u64>,
    by_expiry: BTreeSet<(u64, u128)>,
}

impl RunTable {
    /// Drops every entry expired at `now`.
    fn prune(&mut self, now: u64) {
        while let Some((exp, _)) = self.by_expiry.first() {
            if *exp > now {
                break;
            }
            if let Some((_, key)) = self.by_expiry.pop_first() {
                self.expiry.remove(&key);
            }
        }
    }

    fn remove(&mut self, key: u128) {
        if let Some(exp) = self.expiry.remove(&key) {
            self.by_expiry.remove(&(exp, key));
        }
    }

    fn set(&mut self, key: u128, expires_at: u64) {
        self.remove(key);
        self.expiry.insert(key, expires_at);
        self.by_expiry.insert((expires_at, key));
    }

    /// A new lease of `key` expiring at `expires_at`; answers the runs
    /// counted.
    pub fn admitted(&mut self, key: u128, expires_at: u64, now: u64) -> usize {
        self.prune(now);
        if expires_at <= now {
            return self.expiry.len();
        }
        let expires_at = match self.expiry.get(&key) {
            Some(old) => (*old).max(expires_at),
            None => {
                if self.expiry.len() >= MAX_RUN_TABLE_ENTRIES
                    && let Some((_, first)) = self.by_expiry.pop_first()
                {
                    self.expiry.remove(&first);
                }
                expires_at
            }
        };
        self.set(key, expires_at);
        self.expiry.len()
    }

    /// `key`'s lease now expires at `expires_at` (never earlier than it
    /// did), if the table has it; answers the runs counted.
    pub fn extended(&mut self, key: u128, expires_at: u64, now: u64) -> usize {
        self.prune(now);
        if self.expiry.get(&key).is_some_and(|old| expires_at > *old) {
            self.set(key, expires_at);
        }
        self.expiry.len()
    }

    /// `key`'s lease ended; answers the runs counted.
    pub fn ended(&mut self, key: u128, now: u64) -> usize {
        self.prune(now);
        self.remove(key);
        self.expiry.len()
    }

    /// The runs counted at `now`, expired ones dropped.
    pub fn live(&mut self, now: u64) -> usize {
        self.prune(now);
        self.expiry.len()
    }

    /// Entries held (for tests of the bound).
    pub fn len(&self) -> usize {
        debug_assert_eq!(self.expiry.len(), self.by_expiry.len());
        self.expiry.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.expiry.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(inv: &str) -> u128 {
        run_key("alice", inv)
    }

    #[test]
    fn a_run_key_names_one_user_and_invocation() {
        assert_eq!(run_key("alice", "r1"), run_key("alice", "r1"));
        assert_ne!(run_key("alice", "r1"), run_key("alice", "r2"));
        assert_ne!(run_key("a", "b/c"), run_key("a/b", "c"));
        assert_ne!(run_key("ab", "c"), run_key("a", "bc"));
        // A key is 16 bytes whatever the ids' length.
        let long = "é".repeat(512);
        assert_ne!(run_key(&long, &long), run_key(&long, "x"));
    }

    #[test]
    fn expired_runs_stop_counting_and_are_dropped() {
        let mut t = RunTable::default();
        assert_eq!(t.admitted(k("a"), 1_000, 0), 1);
        assert_eq!(t.admitted(k("b"), 1_000, 0), 2);
        assert_eq!(t.admitted(k("c"), 2_000, 0), 3);
        assert_eq!(t.ended(k("a"), 10), 2);
        // A repeat of an admission (a retry) counts once.
        assert_eq!(t.admitted(k("b"), 1_000, 10), 2);
        assert_eq!(t.live(999), 2);
        // Expiry is exclusive, as the stores' (a lease at `exp <= now` is gone).
        assert_eq!(t.live(1_000), 1);
        assert_eq!(
            t.len(),
            1,
            "the expired entry is dropped, not just uncounted"
        );
        assert_eq!(t.live(2_000), 0);
        assert!(t.is_empty());
    }

    #[test]
    fn renewals_extend_only_runs_admitted_here_and_never_shorten() {
        let mut t = RunTable::default();
        t.admitted(k("a"), 1_000, 0);
        assert_eq!(t.extended(k("a"), 3_000, 900), 1);
        assert_eq!(t.extended(k("a"), 2_000, 950), 1, "never shortened");
        assert_eq!(t.live(2_500), 1);
        // A renewal of a run admitted elsewhere adds nothing.
        assert_eq!(t.extended(k("other"), 9_000, 2_500), 1);
        assert_eq!(t.live(3_000), 0);
        // Nor does a renewal after expiry bring it back.
        assert_eq!(t.extended(k("a"), 9_000, 3_000), 0);
        // A lease already expired when the answer arrives is not counted.
        assert_eq!(t.admitted(k("late"), 3_000, 3_000), 0);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = RunTable::default();
        for i in 0..MAX_RUN_TABLE_ENTRIES as u64 + 10 {
            t.admitted(k(&i.to_string()), 1_000_000 + i, 0);
        }
        assert_eq!(t.len(), MAX_RUN_TABLE_ENTRIES);
        // The runs expiring first were the ones dropped.
        assert_eq!(t.live(1_000_009), MAX_RUN_TABLE_ENTRIES);
        assert_eq!(t.live(1_000_010), MAX_RUN_TABLE_ENTRIES - 1);
    }
}
