//! The [`TurnRateLayer`]: configuration shared by every clone of the service.

use std::fmt;
use std::sync::Arc;

use tollgate_core::Limiter;
use tower_layer::Layer;

use crate::service::TurnRate;

/// Applies [`TurnRate`] to a service: every request is a turn of the user
/// that `identity` names, pre-checked with `limiter` before the inner service
/// sees it.
///
/// Cloning the layer (as axum does per route) shares the one limiter, and so
/// the one store: all routes and replicas on the same store count against the
/// same per-user budget.
pub struct TurnRateLayer<S, E> {
    limiter: Arc<Limiter<S>>,
    identity: E,
}

impl<S, E> TurnRateLayer<S, E> {
    /// A layer checking turns with `limiter` for the user named by
    /// `identity` (an [`IdentityExtractor`](crate::IdentityExtractor), e.g.
    /// [`HeaderIdentity`](crate::HeaderIdentity) or a closure).
    pub fn new(limiter: Arc<Limiter<S>>, identity: E) -> Self {
        Self { limiter, identity }
    }

    /// The limiter deciding (e.g. to swap plans with
    /// [`Limiter::set_plans`]).
    pub fn limiter(&self) -> &Arc<Limiter<S>> {
        &self.limiter
    }
}

impl<S, E: Clone> Clone for TurnRateLayer<S, E> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
            identity: self.identity.clone(),
        }
    }
}

impl<S, E> fmt::Debug for TurnRateLayer<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnRateLayer")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl<Inner, S, E: Clone> Layer<Inner> for TurnRateLayer<S, E> {
    type Service = TurnRate<Inner, S, E>;

    fn layer(&self, inner: Inner) -> Self::Service {
        TurnRate::new(inner, Arc::clone(&self.limiter), self.identity.clone())
    }
}
