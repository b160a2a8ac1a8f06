//! The state every handler shares.

use std::sync::Arc;

use tollgate_core::{Clock, Limiter, ReplicaGate, Store};

use crate::identity::Verifier;

/// The application: limiter, identity, replica gate. Cloning shares it.
pub struct App<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for App<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<S> {
    limiter: Limiter<S>,
    verifier: Verifier,
    gate: ReplicaGate,
    admin_token: Option<String>,
}

impl<S: Store + Clone> App<S> {
    /// An application deciding with `limiter`, verifying with `verifier`,
    /// serving at most `max_in_flight` requests at once.
    pub fn new(
        limiter: Limiter<S>,
        verifier: Verifier,
        max_in_flight: usize,
        admin_token: Option<String>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                limiter,
                verifier,
                gate: ReplicaGate::new(max_in_flight),
                admin_token,
            }),
        }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<S> {
        &self.inner.limiter
    }

    /// The store.
    pub fn store(&self) -> &S {
        self.inner.limiter.store()
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        self.inner.limiter.clock()
    }

    /// The identity verifier.
    pub fn verifier(&self) -> &Verifier {
        &self.inner.verifier
    }

    /// The replica's in-flight gate.
    pub fn gate(&self) -> &ReplicaGate {
        &self.inner.gate
    }

    /// The admin token, if admin endpoints are on.
    pub fn admin_token(&self) -> Option<&str> {
        self.inner.admin_token.as_deref()
    }
}
