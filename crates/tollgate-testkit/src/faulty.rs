//! A store decorator for fault and interleaving tests: it fails its
//! `k`th call (counting every call from 1) — the call never made (the store
//! unreachable), or, with `lost_reply`, made and its answer lost (a timeout
//! after the store acted) — or runs other work just before it (another
//! replica acting, a config reload landing mid-request). Every other call
//! goes to the wrapped store as it is.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tollgate_core::store::Op;
use tollgate_core::{Store, StoreError, StoreErrorKind};

/// Work run just before the chosen call (another replica acting, a
/// reload).
pub type Hook = Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The decorator over store `S` (clones share the call count).
#[derive(Clone)]
pub struct Faulty<S> {
    inner: S,
    at: usize,
    lost_reply: bool,
    before: Option<Hook>,
    calls: Arc<AtomicUsize>,
    fired: Arc<AtomicBool>,
}

impl<S: Store> Faulty<S> {
    /// A store whose `at`th call fails: not made, or with `lost_reply`
    /// made and its answer lost.
    pub fn new(inner: S, at: usize, lost_reply: bool) -> Self {
        Self {
            inner,
            at,
            lost_reply,
            before: None,
            calls: Arc::default(),
            fired: Arc::default(),
        }
    }

    /// A store that fails nothing but runs `hook` just before its
    /// `at`th call, then makes the call.
    pub fn interleaved(inner: S, at: usize, hook: Hook) -> Self {
        Self {
            before: Some(hook),
            ..Self::new(inner, at, false)
        }
    }

    /// Whether the fault was injected (the store got `at` calls).
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    async fn fault<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n != self.at {
            return op.await;
        }
        self.fired.store(true, Ordering::SeqCst);
        if let Some(hook) = &self.before {
            hook().await;
            return op.await;
        }
        if !self.lost_reply {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "injected: connection refused",
            ));
        }
        let _ = op.await;
        Err(StoreError::new(
            StoreErrorKind::Timeout,
            "injected: the answer was lost",
        ))
    }
}

impl<S: Store> Store for Faulty<S> {
    async fn call<O: Op>(&self, op: O) -> Result<O::Reply, StoreError> {
        self.fault(self.inner.call(op)).await
    }

    fn fallback_decisions(&self) -> u64 {
        self.inner.fallback_decisions()
    }
}
