//! Top users by tokens, counted per replica and flushed in batches.
//!
//! Every reserve, settle and reconcile changes a user's tokens of the
//! current minute. Those counts go to one sorted set per minute (key
//! [`Keys::top`], tag `{top}`, so the two minutes `top_users` reads share a
//! slot). Written on the decision path, that was a second awaited round trip
//! per call and, in Cluster, a write on one node for every model call of the
//! fleet. Instead the store adds each change to a map in memory
//! ([`TopCounter::add`], a lock and a hash update, no I/O) and a task the
//! store spawns writes the map out ([`flush`]): every [`FLUSH_EVERY`], or
//! sooner once [`FLUSH_AT`] entries wait, as ONE pipeline (a `ZINCRBY` per
//! user and minute, a `PEXPIRE` per minute). Reads (`top_users`) flush this
//! replica's counts first, then read Redis, so a replica always sees its own
//! counts; another replica's reach Redis within [`FLUSH_EVERY`].
//!
//! Why not shard the sets across slots and merge on read: batching already
//! takes the write off the decision path and turns one write per call into
//! one pipeline per replica per interval (one `ZINCRBY` per distinct user),
//! and a read of one slot stays two `ZRANGE`s and two `ZMSCORE`s. The
//! simpler choice suffices.
//!
//! **Bounds.** At most [`MAX_PENDING`] (minute, user) entries wait between
//! flushes (a user id is at most 512 characters, 2 KiB of UTF-8: 32 MiB at most). A new
//! entry past the cap first drops the lighter half of those waiting (by
//! |tokens|): a heavy user is never lost to many light ones; the dropped
//! tokens are missing from the top-users totals, and the drop is logged
//! with the number of entries. Entries older than the minute before the
//! newest are dropped too: no read looks at them.
//!
//! **Failures.** A flush that fails or times out is logged and its batch
//! merged back into the map (under the same cap), to be retried by the next
//! flush; a decision never waits for or depends on it.
//!
//! **Lifetime.** The task holds no reference to the store: it stops when
//! the store (its last clone) is dropped, after one last flush bounded by
//! the op timeout.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::{Notify, oneshot};

use super::Conn;
use crate::error::{classify, timed_out};
use crate::keys::Keys;
use tollgate_core::StoreError;

/// The longest a count waits in memory before a flush starts.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// Entries waiting that start a flush at once.
pub(crate) const FLUSH_AT: usize = 1_024;
/// The most (minute, user) entries that wait between flushes.
pub(crate) const MAX_PENDING: usize = 16_384;
/// How long a minute's set lives in Redis (it is read for two minutes).
const TOP_TTL_MS: u64 = 180_000;

/// Counts not yet written: minute → user → tokens.
#[derive(Default)]
struct Pending {
    minutes: BTreeMap<u64, HashMap<String, i64>>,
    len: usize,
    dropped: usize,
}

impl Pending {
    fn add(&mut self, minute: u64, user: &str, tokens: i64) {
        let newest = self.minutes.keys().next_back().copied().unwrap_or(minute);
        if minute + 1 < newest {
            return;
        }
        if minute > newest {
            // Minutes before `minute - 1` are read by no one any more.
            let keep = self.minutes.split_off(&minute.saturating_sub(1));
            let gone: usize = self.minutes.values().map(HashMap::len).sum();
            self.len -= gone;
            self.minutes = keep;
        }
        if let Some(t) = self.minutes.get_mut(&minute).and_then(|m| m.get_mut(user)) {
            *t = t.saturating_add(tokens);
            return;
        }
        if self.len >= MAX_PENDING {
            self.keep_heaviest(MAX_PENDING / 2);
        }
        self.minutes
            .entry(minute)
            .or_default()
            .insert(user.to_owned(), tokens);
        self.len += 1;
    }

    /// Keeps the `keep` entries of largest |tokens|, drops the rest.
    fn keep_heaviest(&mut self, keep: usize) {
        let mut all: Vec<(u64, String, i64)> = std::mem::take(&mut self.minutes)
            .into_iter()
            .flat_map(|(m, users)| users.into_iter().map(move |(u, t)| (m, u, t)))
            .collect();
        if all.len() > keep {
            all.select_nth_unstable_by_key(keep, |e| std::cmp::Reverse(e.2.unsigned_abs()));
            self.dropped += all.len() - keep;
            all.truncate(keep);
        }
        self.len = all.len();
        for (m, u, t) in all {
            self.minutes.entry(m).or_default().insert(u, t);
        }
    }
}

/// One replica's top-user counts waiting for a flush.
#[derive(Default)]
pub(crate) struct TopCounter {
    pending: Mutex<Pending>,
    wake: Notify,
}

impl TopCounter {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock()
    }

    /// Adds `tokens` (may be negative: a refund) to `user`'s count of the
    /// minute of `now_ms`. No I/O; wakes the flusher past [`FLUSH_AT`].
    pub(crate) fn add(&self, user: &str, now_ms: u64, tokens: i64) {
        if tokens == 0 {
            return;
        }
        let len = {
            let mut p = self.lock();
            p.add(now_ms / 60_000, user, tokens);
            p.len
        };
        if len >= FLUSH_AT {
            self.wake.notify_one();
        }
    }

    /// Entries waiting (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len
    }
}

/// Writes every waiting count to Redis in one pipeline. On failure the
/// batch is merged back (to be retried) and the error returned.
pub(crate) async fn flush(
    top: &TopCounter,
    conn: &Conn,
    keys: &Keys,
    timeout: Duration,
) -> Result<(), StoreError> {
    let batch = {
        let mut p = top.lock();
        if p.dropped > 0 {
            tracing::warn!(
                dropped = p.dropped,
                cap = MAX_PENDING,
                "top-users counts of the lightest users dropped at the cap"
            );
            p.dropped = 0;
        }
        if p.len == 0 {
            return Ok(());
        }
        p.len = 0;
        std::mem::take(&mut p.minutes)
    };
    let mut pipe = redis::pipe();
    for (minute, users) in &batch {
        let key = keys.top(*minute);
        for (user, tokens) in users {
            pipe.zincr(&key, user, *tokens).ignore();
        }
        pipe.pexpire(&key, TOP_TTL_MS as i64).ignore();
    }
    let mut conn = conn.clone();
    let res = match tokio::time::timeout(timeout, pipe.query_async::<()>(&mut conn)).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => classify(e),
        Err(_) => timed_out("top_users_flush", timeout.as_millis()),
    };
    let mut p = top.lock();
    for (minute, users) in batch {
        for (user, tokens) in users {
            p.add(minute, &user, tokens);
        }
    }
    Err(res)
}

/// Spawns the flusher of `top` (if a tokio runtime runs): it flushes every
/// [`FLUSH_EVERY`] or when woken, and stops, after a last flush, when the
/// returned sender is dropped.
pub(crate) fn spawn_flusher(
    top: Arc<TopCounter>,
    conn: Conn,
    keys: Keys,
    timeout: Duration,
) -> (oneshot::Sender<()>, Option<tokio::task::JoinHandle<()>>) {
    let (stop, mut stopped) = oneshot::channel::<()>();
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        // No runtime: counts are written by the reads' flush only.
        return (stop, None);
    };
    let task = rt.spawn(async move {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let last = tokio::select! {
                _ = &mut stopped => true,
                _ = tick.tick() => false,
                () = top.wake.notified() => false,
            };
            if let Err(e) = flush(&top, &conn, &keys, timeout).await {
                tracing::warn!(error = %e, "top-users counts not flushed; kept for the next flush");
            }
            if last {
                break;
            }
        }
    });
    (stop, Some(task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_flusher_stops_with_its_store() {
        // A lazy connection to nowhere: an empty flush does no I/O.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let conn = redis::aio::ConnectionManager::new_lazy_with_config(
            client,
            redis::aio::ConnectionManagerConfig::new(),
        )
        .unwrap();
        let top = Arc::new(TopCounter::default());
        let (stop, task) = spawn_flusher(
            top.clone(),
            Conn::Single(conn),
            Keys::new("t"),
            Duration::from_millis(50),
        );
        let task = task.expect("spawned on the test runtime");
        drop(stop);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task ends once its store is dropped")
            .unwrap();
        assert_eq!(Arc::strong_count(&top), 1, "and lets go of the counter");
    }

    #[test]
    fn counts_add_up_per_minute_and_user() {
        let top = TopCounter::default();
        top.add("a", 60_000, 5);
        top.add("a", 60_001, -2);
        top.add("b", 60_002, 0);
        top.add("a", 120_000, 1);
        let p = top.lock();
        assert_eq!(p.len, 2);
        assert_eq!(p.minutes[&1]["a"], 3);
        assert_eq!(p.minutes[&2]["a"], 1);
        assert!(!p.minutes[&1].contains_key("b"), "a zero is not an entry");
    }

    #[test]
    fn minutes_no_read_looks_at_are_dropped() {
        let top = TopCounter::default();
        top.add("a", 0, 1);
        top.add("b", 60_000, 1);
        top.add("c", 120_000, 1);
        assert_eq!(top.len(), 2, "minute 0 is two minutes old");
        top.add("d", 0, 1);
        assert_eq!(top.len(), 2, "a late count of a minute no one reads");
        let p = top.lock();
        assert_eq!(p.minutes.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn past_the_cap_the_heaviest_stay() {
        let top = TopCounter::default();
        for i in 0..MAX_PENDING {
            top.add(&format!("light{i}"), 0, 1 + (i % 3) as i64);
        }
        top.add("heavy", 0, 1_000_000);
        top.add("refund", 0, -1_000_000);
        let p = top.lock();
        assert!(p.len <= MAX_PENDING);
        assert!(p.dropped >= MAX_PENDING / 2);
        assert_eq!(p.minutes[&0]["heavy"], 1_000_000);
        assert_eq!(p.minutes[&0]["refund"], -1_000_000);
        let kept_min = p.minutes[&0].values().map(|t| t.abs()).min();
        assert!(kept_min >= Some(2), "the lightest went first: {kept_min:?}");
    }
}
