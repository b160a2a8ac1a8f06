//! Session entries: the session lease with its fence, the records and
//! event ids, and grouped writes over a session and its logs. The lease
//! rules are core's pure transitions ([`lease`](crate::lease)); this file
//! looks the entries up under their shards' locks and applies them.

use super::MemoryStore;
use super::shards::{Expiring, Full, Multi};
use crate::lease::{SessionAcquire, SessionGrant, SessionLease};
use crate::store::{
    AppendOutcome, FenceCheck, LogWrite, SessionAppend, SessionAppended, SessionCreate,
    SessionCreated, SessionDelete,
};

#[derive(Default)]
pub(super) struct SessionEntry {
    lease: SessionLease,
    records: Vec<Box<[u8]>>,
    /// The ids of the events appended by [`Store::session_append`], kept
    /// with the records.
    ids: hashbrown::HashSet<Box<str>>,
    expires_at: u64,
}

impl Expiring for SessionEntry {
    fn expires_at(&self) -> u64 {
        self.expires_at
    }
}

impl MemoryStore {
    /// Runs `f` on a session's entry, then keeps the session (SPEC §4): one
    /// with records for the retention past now, one without until its
    /// lease's end (or now, if later) plus the grace; never less than it
    /// was kept before, nor less than its lease.
    fn session<R>(
        &self,
        session: &str,
        f: impl FnOnce(&mut SessionEntry, u64) -> R,
    ) -> Result<R, Full> {
        let now = self.now();
        let retention = self.inner.session_retention_ms;
        let grace = self.inner.session_grace_ms;
        self.inner.sessions.with(session, now, |s| {
            let r = f(s, now);
            keep_session(s, now, retention, grace);
            r
        })
    }

    pub(super) fn session_acquire_now(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<SessionAcquire, Full> {
        self.session(session, |s, now| s.lease.acquire(now, holder, ttl_ms))
    }

    pub(super) fn session_renew_now(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<Option<SessionGrant>, Full> {
        self.session(session, |s, now| s.lease.renew(now, holder, ttl_ms))
    }

    pub(super) fn session_release_now(&self, session: &str, holder: &str) -> Result<bool, Full> {
        self.session(session, |s, now| s.lease.release(now, holder))
    }

    pub(super) fn fence_check_now(&self, session: &str, fence: u64) -> FenceCheck {
        let now = self.now();
        self.inner.sessions.read(session, now, |s| {
            let latest = s.map_or(0, |s| s.lease.fence);
            FenceCheck {
                current: latest != 0 && latest == fence,
                latest,
            }
        })
    }

    pub(super) fn append_fenced_now(
        &self,
        session: &str,
        fence: u64,
        record: &[u8],
    ) -> Result<AppendOutcome, Full> {
        self.session(session, |s, _| {
            if !s.lease.fence_is_current(fence) {
                return AppendOutcome::Stale {
                    latest: s.lease.fence,
                };
            }
            s.records.push(record.into());
            AppendOutcome::Appended {
                index: s.records.len() as u64 - 1,
            }
        })
    }

    pub(super) fn read_records_now(&self, session: &str, from: u64, limit: usize) -> Vec<Vec<u8>> {
        let now = self.now();
        self.inner.sessions.read(session, now, |s| {
            s.map(|s| {
                s.records
                    .iter()
                    .skip(usize::try_from(from).unwrap_or(usize::MAX))
                    .take(limit)
                    .map(|r| r.to_vec())
                    .collect()
            })
            .unwrap_or_default()
        })
    }

    pub(super) fn delete_records_now(&self, session: &str) -> Result<u64, Full> {
        self.session(session, |s, _| {
            let n = s.records.len() as u64;
            s.records = Vec::new();
            s.ids = hashbrown::HashSet::new();
            n
        })
    }
}

/// Keeps a session after an operation on it (SPEC §4): one with records for
/// the retention past now, one without until its lease's end (or now, if
/// later) plus the grace; never less than it was kept before, nor less
/// than its lease. A session with neither records nor a fence is left to
/// expire at once.
fn keep_session(s: &mut SessionEntry, now: u64, retention: u64, grace: u64) {
    if s.lease.fence > 0 || !s.records.is_empty() {
        let lease_end = s.lease.holder.as_ref().map_or(0, |(_, exp)| *exp);
        let keep = if s.records.is_empty() {
            lease_end.max(now).saturating_add(grace)
        } else {
            now.saturating_add(retention)
        };
        s.expires_at = keep.max(s.expires_at).max(lease_end);
    }
}

// ----- grouped session writes ------------------------------------------------

impl MemoryStore {
    /// Locks the shards of a grouped write's session (position 0) and its
    /// logs (positions 1…): the whole write is one critical section.
    fn lock_group<'a, 'k>(
        &'a self,
        session: &'k str,
        logs: &[LogWrite<'k>],
    ) -> Multi<'a, 'k, SessionEntry> {
        let keys: Vec<&'k str> = std::iter::once(session)
            .chain(logs.iter().map(|l| l.log))
            .collect();
        self.inner.sessions.lock_many(&keys)
    }

    /// Room for the keys a grouped write adds: the session if `session`,
    /// and each log it appends a record to.
    fn group_room(
        locked: &mut Multi<'_, '_, SessionEntry>,
        now: u64,
        session: bool,
        logs: &[LogWrite<'_>],
    ) -> Result<(), Full> {
        let new: Vec<usize> = session
            .then_some(0)
            .into_iter()
            .chain(
                logs.iter()
                    .enumerate()
                    .filter(|(_, l)| l.record.is_some())
                    .map(|(i, _)| i + 1),
            )
            .collect();
        locked.check_room_of(now, new.iter().copied())
    }

    /// Runs `f` on the `n`th entry of a locked group, then keeps it.
    fn group_entry<R>(
        &self,
        locked: &mut Multi<'_, '_, SessionEntry>,
        n: usize,
        now: u64,
        f: impl FnOnce(&mut SessionEntry) -> R,
    ) -> Result<R, Full> {
        let (retention, grace) = (self.inner.session_retention_ms, self.inner.session_grace_ms);
        locked.with(n, now, |s| {
            let r = f(s);
            keep_session(s, now, retention, grace);
            r
        })
    }

    /// Writes every log of a locked group (room was checked).
    fn write_logs(
        &self,
        locked: &mut Multi<'_, '_, SessionEntry>,
        now: u64,
        logs: &[LogWrite<'_>],
    ) -> Result<(), Full> {
        for (i, l) in logs.iter().enumerate() {
            self.group_entry(locked, i + 1, now, |s| {
                if let Some(record) = l.record {
                    s.records.push(record.into());
                }
            })?;
        }
        Ok(())
    }

    pub(super) fn create_now(&self, req: SessionCreate<'_>) -> Result<SessionCreated, Full> {
        let mut locked = self.lock_group(req.session, req.logs);
        let now = self.now();
        let refusal = self.group_entry(&mut locked, 0, now, |s| match &s.lease.holder {
            Some((_, exp)) if *exp > now => Some(SessionCreated::Busy {
                retry_after_ms: (exp - now).max(1),
            }),
            _ if !s.records.is_empty() => Some(SessionCreated::Exists),
            _ => None,
        })?;
        if let Some(refusal) = refusal {
            return Ok(refusal);
        }
        Self::group_room(&mut locked, now, true, req.logs)?;
        let fence = self.group_entry(&mut locked, 0, now, |s| {
            s.lease.fence += 1;
            s.lease.holder = None;
            s.records.push(req.record.into());
            s.lease.fence
        })?;
        self.write_logs(&mut locked, now, req.logs)?;
        Ok(SessionCreated::Created { fence })
    }

    pub(super) fn append_now(&self, req: SessionAppend<'_>) -> Result<SessionAppended, Full> {
        let mut locked = self.lock_group(req.session, req.logs);
        let now = self.now();
        let id = req.id.filter(|id| !id.is_empty());
        let refusal = self.group_entry(&mut locked, 0, now, |s| {
            if !s.lease.fence_is_current(req.fence) {
                Some(SessionAppended::Stale {
                    latest: s.lease.fence,
                })
            } else if s.records.is_empty() {
                Some(SessionAppended::Missing)
            } else if id.is_some_and(|id| s.ids.contains(id)) {
                Some(SessionAppended::Repeated)
            } else {
                None
            }
        })?;
        if let Some(refusal) = refusal {
            return Ok(refusal);
        }
        Self::group_room(&mut locked, now, false, req.logs)?;
        let index = self.group_entry(&mut locked, 0, now, |s| {
            s.records.push(req.record.into());
            if let Some(id) = id {
                s.ids.insert(id.into());
            }
            s.records.len() as u64 - 1
        })?;
        self.write_logs(&mut locked, now, req.logs)?;
        Ok(SessionAppended::Appended { index })
    }

    pub(super) fn delete_now(&self, req: SessionDelete<'_>) -> Result<u64, Full> {
        let mut locked = self.lock_group(req.session, req.logs);
        let now = self.now();
        let held = locked.with(0, now, |s| s.records.len() as u64)?;
        if held > 0 {
            Self::group_room(&mut locked, now, false, req.logs)?;
        }
        let deleted = self.group_entry(&mut locked, 0, now, |s| {
            s.records = Vec::new();
            s.ids = hashbrown::HashSet::new();
            held
        })?;
        if deleted > 0 {
            self.write_logs(&mut locked, now, req.logs)?;
        }
        Ok(deleted)
    }
}
