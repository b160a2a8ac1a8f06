//! The [`TurnRate`] service: extracts the user, pre-checks the turn, and
//! calls the inner service only when the turn is allowed.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::{HeaderName, Request, Response};
use tollgate_core::{Decision, Denial, Limiter, Store};
use tollgate_outcome::ApiError;
use tower_service::Service;

use crate::error;
use crate::future::{ResponseBody, ResponseFuture};
use crate::identity::IdentityExtractor;

/// The response header naming the limit that would have refused a request
/// that was let through only because the user's plan is in shadow mode
/// (SPEC §6), e.g. `x-tollgate-shadow-denied: turn_rate`.
pub const SHADOW_DENIED_HEADER: HeaderName = HeaderName::from_static("x-tollgate-shadow-denied");

/// A request extension the layer inserts into every request it lets
/// through, so handlers can read the verified user (and, in shadow mode, the
/// limit that would have refused) with axum's `Extension<TurnChecked>`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TurnChecked {
    /// The user the identity extractor named.
    pub user: String,
    /// In shadow mode, the refusal that enforcement would have answered.
    pub shadow_denied: Option<Denial>,
}

/// Pre-checks each request's turn against the user's plan before calling
/// `Inner`. Built by [`TurnRateLayer`](crate::TurnRateLayer); see the crate
/// docs for the semantics.
///
/// # Readiness
///
/// [`poll_ready`](Service::poll_ready) delegates to the inner service: this
/// layer has no capacity of its own (the limiter is async and is consulted
/// inside the [`ResponseFuture`]). [`call`](Service::call) moves the inner
/// service that was driven to readiness into the future and leaves a clone in
/// its place (the usual tower pattern for middleware that calls the inner
/// service later), so readiness reserved by the inner service (a `Buffer`
/// slot, a concurrency permit) is held while the limiter decides and is
/// released unused if the turn is refused.
pub struct TurnRate<Inner, S, E> {
    inner: Inner,
    limiter: Arc<Limiter<S>>,
    identity: E,
}

impl<Inner, S, E> TurnRate<Inner, S, E> {
    /// Wraps `inner`, checking turns with `limiter` for the user `identity`
    /// names.
    pub fn new(inner: Inner, limiter: Arc<Limiter<S>>, identity: E) -> Self {
        Self {
            inner,
            limiter,
            identity,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &Inner {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> Inner {
        self.inner
    }

    /// The limiter deciding.
    pub fn limiter(&self) -> &Arc<Limiter<S>> {
        &self.limiter
    }
}

impl<Inner: Clone, S, E: Clone> Clone for TurnRate<Inner, S, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
            identity: self.identity.clone(),
        }
    }
}

impl<Inner: fmt::Debug, S, E> fmt::Debug for TurnRate<Inner, S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnRate")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<Inner, S, E, ReqB, ResB> Service<Request<ReqB>> for TurnRate<Inner, S, E>
where
    Inner: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    S: Store,
    E: IdentityExtractor<ReqB>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = Inner::Error;
    type Future = ResponseFuture<Inner, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let Some(user) = self.identity.user(&req).filter(|u| !u.is_empty()) else {
            // The inner service keeps its readiness for the next call.
            return ResponseFuture::rejected(error::unauthorized());
        };
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let check = Box::pin(check(Arc::clone(&self.limiter), user));
        ResponseFuture::checking(check, ready, req)
    }
}

/// The limiter's answer for one request.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Call the inner service.
    Allow {
        /// The verified user.
        user: String,
        /// In shadow mode, the limit that would have refused.
        shadow_denied: Option<Denial>,
    },
    /// Answer this refusal instead.
    Reject(ApiError),
}

/// The pending limiter check of one request.
pub(crate) type Check = Pin<Box<dyn Future<Output = Verdict> + Send + 'static>>;

/// Admits a turn under a fresh invocation id and releases its run lease at
/// once: the pre-check charges the turn bucket (and is refused while the
/// user is at its concurrent-run cap) but holds no lease.
async fn check<S: Store>(limiter: Arc<Limiter<S>>, user: String) -> Verdict {
    let invocation_id = fresh_invocation_id();
    match limiter.admit_turn(&user, &invocation_id).await {
        Ok(Decision::Allowed {
            shadow_denied: None,
            ..
        }) => {
            // Admitted for real: a lease was taken. A failed release is not
            // the caller's problem; the lease expires after the plan's
            // lease_ttl_ms.
            if let Err(e) = limiter.release_run(&user, &invocation_id).await {
                tracing::warn!(%user, invocation_id, error = %e,
                    "turn-rate pre-check: releasing the pre-check lease failed; it expires with its TTL");
            }
            Verdict::Allow {
                user,
                shadow_denied: None,
            }
        }
        // Shadow mode turned a refusal into an allowance: nothing was taken.
        Ok(Decision::Allowed { shadow_denied, .. }) => Verdict::Allow {
            user,
            shadow_denied,
        },
        Ok(Decision::Denied(d)) => Verdict::Reject(ApiError::Denied(d)),
        Err(e) => Verdict::Reject(ApiError::from(e)),
    }
}

/// A run id no other request uses, in this process or any other sharing the
/// store: a per-process random salt and a counter. It must be unique, because
/// admitting an invocation id that already holds a live lease refreshes that
/// lease and charges nothing.
fn fresh_invocation_id() -> String {
    static SALT: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // `RandomState` keys come from the OS's randomness: no extra dependency,
    // no clock read.
    let salt = *SALT.get_or_init(|| RandomState::new().hash_one(0x746f_6c6c_6761_7465_u64));
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("tollgate-tower.{salt:016x}.{n}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocation_ids_are_unique() {
        let a = fresh_invocation_id();
        let b = fresh_invocation_id();
        assert_ne!(a, b);
        assert!(a.starts_with("tollgate-tower."));
        assert!(a.len() <= tollgate_core::id::MAX_ID_LEN);
    }
}
