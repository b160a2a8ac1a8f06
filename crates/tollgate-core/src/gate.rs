//! The replica gate: an in-flight cap for one process (SPEC §1).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// The retry hint of an [`Overloaded`] answer: 1 s (`Retry-After: 1`).
pub const OVERLOADED_RETRY_MS: u64 = 1_000;

/// Caps the turns in flight on this replica. Cloning shares the cap.
#[derive(Debug, Clone)]
pub struct ReplicaGate {
    sem: Arc<Semaphore>,
    cap: usize,
}

/// One turn's place in the replica. Dropping it frees the place.
#[must_use = "the place is freed as soon as the permit is dropped"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct ReplicaPermit {
    _permit: OwnedSemaphorePermit,
}

/// The replica is at its in-flight cap. Retryable after
/// [`OVERLOADED_RETRY_MS`] (on this or another replica).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("replica is at its in-flight cap; retry in 1 s")]
pub struct Overloaded {
    _p: (),
}

impl Overloaded {
    /// The retry hint, ms.
    pub fn retry_after_ms(&self) -> u64 {
        OVERLOADED_RETRY_MS
    }
}

impl ReplicaGate {
    /// A gate admitting at most `cap` turns at once.
    ///
    /// # Panics
    ///
    /// If `cap` exceeds tokio's semaphore limit (`usize::MAX >> 3`).
    #[track_caller]
    pub fn new(cap: usize) -> Self {
        Self {
            sem: Arc::new(Semaphore::new(cap)),
            cap,
        }
    }

    /// Takes a place now, or answers [`Overloaded`]. Never waits.
    pub fn try_acquire(&self) -> Result<ReplicaPermit, Overloaded> {
        match self.sem.clone().try_acquire_owned() {
            Ok(permit) => Ok(ReplicaPermit { _permit: permit }),
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => Err(Overloaded { _p: () }),
        }
    }

    /// Turns in flight now.
    pub fn in_flight(&self) -> usize {
        self.cap - self.sem.available_permits()
    }

    /// The cap.
    pub fn capacity(&self) -> usize {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_over_cap_and_frees_on_drop() {
        let gate = ReplicaGate::new(2);
        let a = gate.try_acquire().unwrap();
        let _b = gate.clone().try_acquire().unwrap();
        assert_eq!(gate.in_flight(), 2);
        let err = gate.try_acquire().unwrap_err();
        assert_eq!(err.retry_after_ms(), 1_000);
        drop(a);
        assert_eq!(gate.in_flight(), 1);
        assert!(gate.try_acquire().is_ok());
    }
}
