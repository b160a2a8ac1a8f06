//! Sessions (SPEC §4): the one key scheme of a session in the store, the
//! TTL rules of its lease, the lease operations, and a turn admitted inside
//! a session lease (SPEC §3: the session lease first, then the turn, and
//! the session lease released again if the turn is not admitted).
//!
//! The sidecar, the adk crate's `TurnExecutor` and the planner's replay all
//! take their sessions from here.
//!
//! # The key scheme (version 1)
//!
//! A session of `user` named `session` is the store name
//! `s1:{len(user)}:{user}/{session}` ([`SessionKey`]): `s1` names the
//! scheme and its version, then the user's byte length in canonical
//! decimal, the user, `/` and the session id. The length prefix makes the
//! name unambiguous whatever the ids contain (`/`, `:`, digits), so one
//! user can never name, lock or fence another user's session; the version
//! lets a later scheme be told from this one. The scheme before it (the
//! sidecar's `{len(user)}:{user}/{session}`, the adk crate's
//! `…/s:{len(user)}:{user}/{session}`) had none: SPEC §4 says what a
//! rolling upgrade from it sees.
//!
//! A session may be *scoped* to a store group
//! ([`grouped`](crate::store::grouped)): its name is then the grouped name
//! of the same key in that group, `@{len(group)}:{group}/s1:{len(user)}:{user}/{session}`,
//! so one store step can write it with the group's other names. The adk
//! crate scopes every session of an app to the app's group (`adk:{app}`),
//! where the app's and its users' shared state live; the sidecar's
//! sessions are unscoped (each a group of its own).

use crate::decision::{Decision, Waited};
use crate::error::LimiterError;
use crate::id::{Id, IntoId};
use crate::lease::{SessionAcquire, SessionGrant};
use crate::limiter::{ForUser, Limiter, RunLease};
use crate::store::grouped::{grouped_name, split_grouped};
use crate::store::{FenceCheck, Store};

/// The scheme-and-version tag every session key starts with (after its
/// group, if scoped).
pub const KEY_VERSION: &str = "s1";

/// The session lease TTL of a turn that names a session without one, ms
/// (the sidecar's `session_ttl_ms` default, the adk executor's and the
/// replay's default).
pub const DEFAULT_SESSION_TTL_MS: u64 = 30_000;

/// The longest session lease TTL a client may ask for, ms (1 hour; renew
/// to keep a lease longer). See [`check_ttl`].
pub const MAX_SESSION_TTL_MS: u64 = 3_600_000;

/// The shortest lease TTL a holder that renews every third of it can use,
/// ms ([`renewable_ttl`]).
pub const MIN_RENEWABLE_TTL_MS: u64 = 3;

/// A session's identity in the store: its scope (a store group, or none),
/// its user and its id. Its [`Display`](std::fmt::Display) is the store
/// name (the module's key scheme); [`parse`](Self::parse) reads one back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionKey<'a> {
    /// The store group the session is written in (not empty), or `None`
    /// for a session that is a group of its own.
    pub scope: Option<&'a str>,
    /// The user the session belongs to.
    pub user: &'a str,
    /// The session id.
    pub session: &'a str,
}

impl<'a> SessionKey<'a> {
    /// The unscoped session `session` of `user` (the sidecar's, the
    /// replay's).
    pub fn new(user: &'a str, session: &'a str) -> Self {
        Self {
            scope: None,
            user,
            session,
        }
    }

    /// The session `session` of `user` in store group `scope`, which must
    /// not be empty (an empty group names no group).
    pub fn scoped(scope: &'a str, user: &'a str, session: &'a str) -> Self {
        Self {
            scope: Some(scope),
            user,
            session,
        }
    }

    /// The parts of a session key written by this scheme; `None` if `key`
    /// is not one (another version, another kind of name, or not in
    /// canonical form).
    pub fn parse(key: &'a str) -> Option<Self> {
        let (scope, rest) = match split_grouped(key) {
            Some((group, rest)) => (Some(group), rest),
            None => (None, key),
        };
        let (digits, tail) = rest
            .strip_prefix(KEY_VERSION)?
            .strip_prefix(':')?
            .split_once(':')?;
        let len: usize = digits.parse().ok()?;
        let user = tail.get(..len)?;
        let session = tail.get(len..)?.strip_prefix('/')?;
        let parsed = Self {
            scope,
            user,
            session,
        };
        (parsed.to_string() == key).then_some(parsed)
    }

    /// The unscoped part: `s1:{len(user)}:{user}/{session}`.
    fn unscoped(&self) -> String {
        format!(
            "{KEY_VERSION}:{}:{}/{}",
            self.user.len(),
            self.user,
            self.session
        )
    }
}

impl std::fmt::Display for SessionKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.scope {
            Some(group) => f.write_str(&grouped_name(group, &self.unscoped())),
            None => f.write_str(&self.unscoped()),
        }
    }
}

/// The store name of the unscoped session `session` of `user`:
/// `s1:{len(user)}:{user}/{session}` ([`SessionKey::new`]).
pub fn session_key(user: &str, session: &str) -> String {
    SessionKey::new(user, session).to_string()
}

/// Checks a session lease TTL a client asked for: 1 ..=
/// [`MAX_SESSION_TTL_MS`] ms.
///
/// # Errors
///
/// [`LimiterError::InvalidRequest`] naming `field`.
pub fn check_ttl(field: &'static str, ttl_ms: u64) -> Result<u64, LimiterError> {
    if ttl_ms == 0 || ttl_ms > MAX_SESSION_TTL_MS {
        return Err(LimiterError::invalid(
            field,
            format!("must be between 1 and {MAX_SESSION_TTL_MS} ms"),
        ));
    }
    Ok(ttl_ms)
}

/// `ttl_ms`, raised to [`MIN_RENEWABLE_TTL_MS`] so that a holder renewing
/// every third of it ([`renew_every_ms`]) renews before it lapses: the TTL
/// of an embedded caller's setting (the adk executor, the replay), which is
/// not refused.
pub fn renewable_ttl(ttl_ms: u64) -> u64 {
    ttl_ms.max(MIN_RENEWABLE_TTL_MS)
}

/// How often a holder renews a lease of `ttl_ms` (SPEC §3, §4): every
/// third of it, at least every 1 ms. A turn holding a session lease and a
/// run lease renews both at the period of the shorter.
pub fn renew_every_ms(ttl_ms: u64) -> u64 {
    ttl_ms.div_ceil(3).max(1)
}

/// A session lease for a turn to hold
/// ([`Limiter::admit_turn_in_session`]); its holder is the turn's
/// invocation id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLease<'a> {
    /// The session's store name ([`SessionKey`]).
    pub key: &'a str,
    /// The lease's TTL, ms.
    pub ttl_ms: u64,
}

/// What a turn admitted by [`Limiter::admit_turn_in_session`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnInSession {
    /// The run lease (as [`Limiter::admit_turn`] grants it).
    pub run: RunLease,
    /// The session lease and its fence; `Some` exactly when a session was
    /// named.
    pub session: Option<SessionGrant>,
}

impl Waited for TurnInSession {
    fn wait_ms(&self) -> u64 {
        self.run.wait_ms()
    }
}

/// The answer to [`Limiter::admit_turn_in_session`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum SessionAdmit {
    /// Another holder holds the session's lease live: nothing was taken
    /// and the turn was not decided.
    Busy {
        /// The other holder's remaining TTL, ms (at least 1).
        retry_after_ms: u64,
    },
    /// The turn was decided. Allowed: it holds its run lease and the
    /// session lease. Denied: it holds nothing (the session lease taken
    /// for it was released again).
    Decided(Decision<TurnInSession>),
}

/// Session leases (SPEC §4) and turns inside them (SPEC §3). Every
/// operation takes the session's store name ([`SessionKey`]).
impl<S: Store> Limiter<S> {
    /// [`ForUser::admit_turn_in_session`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`Limiter::user`] and [`ForUser::admit_turn_in_session`].
    pub async fn admit_turn_in_session<'u>(
        &self,
        user: impl IntoId<'u>,
        invocation_id: impl IntoId<'u>,
        session: Option<SessionLease<'_>>,
    ) -> Result<SessionAdmit, LimiterError> {
        let invocation_id = invocation_id
            .into_id()
            .map_err(|e| LimiterError::invalid("invocation_id", e.to_string()))?;
        self.user(user)?
            .admit_turn_in_session(invocation_id, session)
            .await
    }

    /// Releases the session lease a refused turn took; a failure is logged
    /// (the lease then ends by its TTL).
    async fn release_after_refusal(&self, key: &str, holder: &str) {
        if let Err(error) = self.release_session(key, holder).await {
            tracing::warn!(session = key, %error, "session lease not released after a refused turn; it expires by its TTL");
        }
    }

    /// Acquires the lease of session `key` for `holder` for `ttl_ms`: a new
    /// fence for a new holder, the same fence for a live holder's refresh;
    /// [`SessionAcquire::Busy`] while another holder holds it live.
    ///
    /// # Errors
    ///
    /// A store fault (session leases always fail closed, SPEC §6).
    pub async fn acquire_session(
        &self,
        key: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<SessionAcquire, LimiterError> {
        Ok(self.store().session_acquire(key, holder, ttl_ms).await?)
    }

    /// Renews the lease of session `key` that `holder` holds live, by
    /// `ttl_ms`; `None`: it does not (it lapsed or was taken over).
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn renew_session(
        &self,
        key: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<Option<SessionGrant>, LimiterError> {
        Ok(self.store().session_renew(key, holder, ttl_ms).await?)
    }

    /// Releases the lease of session `key` if `holder` holds it; `false`:
    /// it does not.
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn release_session(&self, key: &str, holder: &str) -> Result<bool, LimiterError> {
        Ok(self.store().session_release(key, holder).await?)
    }

    /// Checks that `fence` is the latest fence issued for session `key`.
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn check_fence(&self, key: &str, fence: u64) -> Result<FenceCheck, LimiterError> {
        Ok(self.store().fence_check(key, fence).await?)
    }
}

/// A turn inside a session lease, on one request's snapshot of its user.
impl<S: Store> ForUser<'_, '_, S> {
    /// Admits a turn (as [`admit_turn`](Self::admit_turn)), holding
    /// `session`'s lease for it when one is named (holder:
    /// `invocation_id`): the session lease is acquired first, then the turn
    /// is admitted, and if the turn is denied or its admission fails the
    /// session lease is released again, so a refused turn holds nothing.
    /// A session lease the turn's invocation already holds live is
    /// refreshed (same fence).
    ///
    /// The caller counts the session among the user's sessions first if it
    /// bounds them ([`claim_session`](Self::claim_session)); shadow mode
    /// never waives a busy session.
    ///
    /// # Errors
    ///
    /// As [`admit_turn`](Self::admit_turn); a store fault of the session
    /// lease.
    pub async fn admit_turn_in_session(
        &self,
        invocation_id: Id<'_>,
        session: Option<SessionLease<'_>>,
    ) -> Result<SessionAdmit, LimiterError> {
        let limiter = self.limiter();
        // A turn refused here (SPEC §3) needs no session lease either.
        if session.is_some()
            && let Some(d) = self.kept_turn_refusal(invocation_id)
        {
            return Ok(SessionAdmit::Decided(Decision::Denied(d)));
        }
        let grant = match session {
            Some(lease) => {
                match limiter
                    .acquire_session(lease.key, invocation_id.as_str(), lease.ttl_ms)
                    .await?
                {
                    SessionAcquire::Acquired(grant) => Some((lease.key, grant)),
                    SessionAcquire::Busy { retry_after_ms } => {
                        return Ok(SessionAdmit::Busy { retry_after_ms });
                    }
                }
            }
            None => None,
        };
        let decision = self.admit_turn(invocation_id).await;
        let release = async |key| {
            if let Some(key) = key {
                limiter
                    .release_after_refusal(key, invocation_id.as_str())
                    .await;
            }
        };
        Ok(SessionAdmit::Decided(match decision {
            Ok(Decision::Allowed {
                grant: run,
                shadow_denied,
            }) => Decision::Allowed {
                grant: TurnInSession {
                    run,
                    session: grant.map(|(_, g)| g),
                },
                shadow_denied,
            },
            Ok(Decision::Denied(denial)) => {
                release(grant.map(|(k, _)| k)).await;
                Decision::Denied(denial)
            }
            Err(e) => {
                release(grant.map(|(k, _)| k)).await;
                return Err(e);
            }
        }))
    }
}

#[cfg(test)]
mod tests;
