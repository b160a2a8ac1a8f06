//! [`FencedSessionService`]: an adk-session `SessionService` kept in a
//! tollgate `Store`, whose event appends are fenced by the turn's session
//! lease.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use adk_core::identity::{AdkIdentity, AppName, SessionId, UserId};
use adk_core::{AdkError, ErrorCategory, ErrorComponent, Result, async_trait};
use adk_session::{
    AppendEventRequest, CreateRequest, DeleteRequest, Event, Events, GetRequest, KEY_PREFIX_TEMP,
    ListRequest, Session, SessionService, State, extract_state_deltas, merge_states,
};
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tollgate_core::session::SessionKey;
use tollgate_core::store::grouped::grouped_name;
use tollgate_core::store::{
    LogWrite, SessionAppend, SessionAppended, SessionCreate, SessionCreated, SessionDelete,
};
use tollgate_core::{Clock, Store, StoreError};

use crate::fence::{TurnFence, current_fence, session_key};

mod service;

pub(crate) type StateMap = HashMap<String, Value>;

/// Records read per store call.
const PAGE: usize = 1_000;
/// Sessions `list` loads at once.
const LIST_CONCURRENCY: usize = 16;

/// Why an event append was refused: the appender does not hold the
/// session's current lease.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    /// No turn fence is current, or it is for another session.
    #[error("no lease is held on session {session}")]
    NotHeld {
        /// The session the append was for: its store key
        /// ([`session_key`]) when the app and user are known, else the
        /// bare session id.
        session: String,
    },
    /// The fence is no longer the session's latest: the lease was granted
    /// to another holder since.
    #[error("fence {fence} is stale: the session lease was granted again (latest fence {latest})")]
    Stale {
        /// The fence the append carried.
        fence: u64,
        /// The session's latest fence.
        latest: u64,
    },
}

impl FenceError {
    /// The [`FenceError`] in `error`'s source chain (`error` included), if
    /// any: how a caller tells a fence rejection from other failures.
    pub fn find_in<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a FenceError> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(fence) = e.downcast_ref::<FenceError>() {
                return Some(fence);
            }
            next = e.source();
        }
        None
    }

    /// The [`AdkError`] code this rejection is reported with.
    pub fn code(&self) -> &'static str {
        match self {
            FenceError::NotHeld { .. } => "session.fence_not_held",
            FenceError::Stale { .. } => "session.fence_stale",
        }
    }
}

impl From<FenceError> for AdkError {
    fn from(error: FenceError) -> Self {
        AdkError::new(
            ErrorComponent::Session,
            ErrorCategory::Forbidden,
            error.code(),
            error.to_string(),
        )
        .with_source(error)
    }
}

/// A record of an adk session's key, as written.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum RecordOut<'a> {
    Created { state: &'a StateMap, at: u64 },
    Event { event: &'a Event },
}

/// A record of an adk session's key, as read.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum RecordIn {
    Created { state: StateMap, at: u64 },
    Event { event: Box<Event> },
}

/// A catalog record.
#[derive(Serialize, Deserialize)]
struct CatalogRecord {
    op: CatalogOp,
    id: String,
}

#[derive(Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum CatalogOp {
    Create,
    Delete,
}

/// An adk [`SessionService`] over a tollgate [`Store`] (the memory store or
/// Redis), whose event appends must carry the current turn's session fence.
///
/// Creation times come from the [`Clock`] given to [`new`](Self::new);
/// events carry their own timestamps.
///
/// # Layout in the store
///
/// Everything lives in the store's sessions: string keys, each with a lease
/// (holder, TTL, fencing number) and an append-only list of records. Every
/// key of one app is a grouped name (`tollgate_core::store::grouped`) in the
/// app's group `adk:{app}`, written below as `⟨app⟩/rest`; in Redis a group
/// is one hash tag, so one Cluster slot (SPEC §4).
///
/// - **An adk session** is the key [`session_key`]`(app, user, id)`,
///   `⟨app⟩/s1:{len(user)}:{user}/{id}` (core's versioned session key,
///   `tollgate_core::session`, scoped to the app's group). Its record 0 is
///   `{"kind":"created","state":{…},"at":<ms>}` (the session-scoped part of
///   the initial state, and the creation time on the service's [`Clock`]);
///   every later record is `{"kind":"event","event":<adk Event>}`. The
///   session's state is the created state updated by the session-scoped
///   part of each event's `state_delta`, in order (`temp:` keys are dropped
///   before an event is stored, as `InMemorySessionService` does); its last
///   update time is the last event's timestamp, else the creation time. The
///   store also keeps the ids of its events (for repeated appends).
/// - **The catalog** of an (app, user), `⟨app⟩/c:{len(user)}:{user}`,
///   records `{"op":"create"|"delete","id":…}`; folded in order it gives the
///   ids [`list`](SessionService::list) loads. An id whose session is gone
///   (its records expired) is skipped.
/// - **User state**, `⟨app⟩/u:{len(user)}:{user}`, and **app state**,
///   `⟨app⟩/a`: each record is a JSON map of changes (prefix stripped),
///   folded in order.
///
/// # One store step per operation
///
/// Each write is one atomic store operation (one Lua script in Redis, one
/// critical section in the memory store), so it is seen whole or not at
/// all, whatever fails:
///
/// - `create` is [`Store::session_create`]: the catalog entry, record 0
///   and the initial app and user state. It issues a fencing number of its
///   own (so a turn that held the session before it was created can no
///   longer write), and fails with `session.busy` while a turn holds the
///   session's lease and with `session.already_exists` if it has records.
/// - an event append is [`Store::session_append`]: the event, its event id,
///   and its app and user deltas, checked against the turn's fence in the
///   same step. An event whose id the session holds already is not
///   appended again (the append answers `Ok`): a retried append whose first
///   attempt did land (its answer lost) is harmless. An event with an empty
///   id is appended every time.
/// - `delete` is [`Store::session_delete`]: the records, the event ids and
///   the catalog's delete entry.
///
/// Every create and append also refreshes the retention of the catalog and
/// the user and app state, so they live as long as their sessions are
/// used.
///
/// # Fencing
///
/// An event append is accepted only with the fence of the current turn
/// ([`with_fence`](crate::with_fence), or the
/// [`TurnExecutor`](crate::TurnExecutor)): no fence, or a fence for another
/// session, is [`FenceError::NotHeld`]; a fence the store no longer accepts
/// (the lease was granted to another holder since) is
/// [`FenceError::Stale`]. Both reach the caller as an [`AdkError`] (codes
/// `session.fence_not_held` / `session.fence_stale`, category
/// [`Forbidden`](ErrorCategory::Forbidden): the writer has lost the right to
/// write, and retrying will not give it back) whose source is the
/// [`FenceError`]; [`FenceError::find_in`] gets it back. A stale append
/// writes nothing: not the event, and not its app or user deltas, which are
/// written in the same step as the event, under the same check. So once a
/// new holder has the session's lease, no app or user change of an earlier
/// holder's turn lands.
///
/// `append_event(session_id, …)`, which carries no app or user, takes them
/// from the current fence's session key (the key encodes app, user and id
/// unambiguously) and accepts only if that key's session id is
/// `session_id`.
///
/// # Limits
///
/// - **One slot per app in Redis Cluster.** App state is shared by all of
///   an app's users, and an append writes it in the same step as the event
///   and under the session's fence, so every key of an app (all its users'
///   sessions, leases, catalogs and state) shares one hash slot: an app's
///   sessions live on one primary, and their memory and write rate are one
///   node's. The cluster spreads apps, and all of tollgate's other keys, not
///   one app. An app that outgrows a node can be split into several app
///   names. (Keying by app and user instead would spread users, but app
///   state would then live in another slot than the session, and an app
///   delta could be neither atomic with its event nor fenced.)
/// - Reads are folds over whole logs: a `get` reads every record of the
///   session and of the app and user state logs; `list` loads every session
///   of the user. Nothing is compacted.
/// - Reads are not one step: `get` and `list` read the session and the two
///   state logs in separate calls, so one racing an append may see its
///   event without its app or user change, or the change without the
///   event. The writes are whole in the store; the next read sees both.
/// - `delete` is not fenced: it removes the records even while a turn holds
///   the session; that turn's next append then finds no session and is
///   refused (not found).
/// - Keys expire after the store's session retention without writes (a
///   session's records and the shared logs it refreshes).
/// - `rewind` and `rewind_steps` are not supported (the trait's default
///   error).
/// - This layout replaced one whose keys were `adk:{len(app)}:{app}/…`,
///   `adk-sessions:…`, `adk-app:…` and `adk-user:…`, written in several
///   steps, and then one whose sessions were `⟨app⟩/s:{len(user)}:{user}/{id}`
///   (before session keys carried a version); sessions written in either
///   are not read (SPEC §4 says what a rolling upgrade sees).
///
/// # Differences from `InMemorySessionService`
///
/// - `create` of an existing session fails (`session.already_exists`)
///   instead of replacing it.
/// - A missing session is `session.not_found` everywhere (`get`,
///   `get_for_identity`, appends), never the legacy `session.legacy` error.
/// - `list` answers each session's current state (app and user scopes
///   included), as `get` does.
/// - Sessions listed with the same last update time are ordered by id.
pub struct FencedSessionService<S> {
    store: S,
    clock: Arc<dyn Clock>,
}

impl<S: Clone> Clone for FencedSessionService<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            clock: Arc::clone(&self.clock),
        }
    }
}

impl<S> fmt::Debug for FencedSessionService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedSessionService")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// An adk session read back from the store: its session-scoped state and
/// events.
pub(crate) struct Loaded {
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) state: StateMap,
    pub(crate) events: Vec<Event>,
}

impl Loaded {
    fn updated_at(&self) -> DateTime<Utc> {
        self.events.last().map_or(self.created_at, |e| e.timestamp)
    }
}

impl<S: Store> FencedSessionService<S> {
    /// A session service keeping its sessions in `store`, taking creation
    /// times from `clock`.
    pub fn new(store: S, clock: impl Clock) -> Self {
        Self {
            store,
            clock: Arc::new(clock),
        }
    }

    /// The store the sessions are kept in.
    pub fn store(&self) -> &S {
        &self.store
    }

    // ----- reads --------------------------------------------------------------

    /// Every record of `key`, in order.
    async fn read_all(&self, key: &str) -> Result<Vec<Vec<u8>>> {
        let mut records = Vec::new();
        loop {
            let page = self
                .store
                .read_records(key, records.len() as u64, PAGE)
                .await
                .map_err(|e| store_error("read", key, e))?;
            let done = page.len() < PAGE;
            records.extend(page);
            if done {
                return Ok(records);
            }
        }
    }

    /// The session at `key`; `None` if it does not exist.
    async fn load(&self, key: &str) -> Result<Option<Loaded>> {
        let records = self.read_all(key).await?;
        let mut records = records.iter().enumerate();
        let Some((_, first)) = records.next() else {
            return Ok(None);
        };
        let (created_at, mut state) = match parse::<RecordIn>(key, 0, first)? {
            RecordIn::Created { state, at } => (from_ms(at), state),
            // An event appended after a delete, before its appender removed
            // it again: there is no session.
            RecordIn::Event { .. } => return Ok(None),
        };
        let mut events = Vec::with_capacity(records.len());
        for (index, record) in records {
            match parse::<RecordIn>(key, index, record)? {
                RecordIn::Event { event } => {
                    let (_, _, session_delta) = extract_state_deltas(&event.actions.state_delta);
                    state.extend(session_delta);
                    events.push(*event);
                }
                RecordIn::Created { .. } => {
                    return Err(corrupt(key, index, "a second creation record"));
                }
            }
        }
        Ok(Some(Loaded {
            created_at,
            state,
            events,
        }))
    }

    /// A state log (app or user) folded into its current map.
    async fn read_state(&self, key: &str) -> Result<StateMap> {
        let mut state = StateMap::new();
        for (index, record) in self.read_all(key).await?.iter().enumerate() {
            state.extend(parse::<StateMap>(key, index, record)?);
        }
        Ok(state)
    }

    /// The ids of the live sessions in the catalog of (`app`, `user`), in
    /// order of creation.
    async fn read_catalog(&self, app: &str, user: &str) -> Result<Vec<String>> {
        let key = Shared::new(app, user).catalog;
        let mut ids: Vec<String> = Vec::new();
        let mut live = HashSet::new();
        for (index, record) in self.read_all(&key).await?.iter().enumerate() {
            let record = parse::<CatalogRecord>(&key, index, record)?;
            match record.op {
                CatalogOp::Create => {
                    if live.insert(record.id.clone()) {
                        ids.push(record.id);
                    }
                }
                CatalogOp::Delete => {
                    if live.remove(&record.id) {
                        ids.retain(|id| *id != record.id);
                    }
                }
            }
        }
        Ok(ids)
    }

    /// App and user state of (`app`, `user`).
    async fn read_scopes(&self, app: &str, user: &str) -> Result<(StateMap, StateMap)> {
        let shared = Shared::new(app, user);
        futures::try_join!(self.read_state(&shared.app), self.read_state(&shared.user))
    }

    async fn get_session(
        &self,
        identity: AdkIdentity,
        num_recent_events: Option<usize>,
        after: Option<DateTime<Utc>>,
    ) -> Result<Box<dyn Session>> {
        let (app, user, id) = parts(&identity);
        let key = session_key(app, user, id);
        let (loaded, (app_state, user_state)) =
            futures::try_join!(self.load(&key), self.read_scopes(app, user))?;
        let Some(mut loaded) = loaded else {
            return Err(not_found(app, user, id));
        };
        if let Some(n) = num_recent_events {
            let start = loaded.events.len().saturating_sub(n);
            loaded.events.drain(..start);
        }
        if let Some(after) = after {
            loaded.events.retain(|e| e.timestamp >= after);
        }
        Ok(Box::new(FencedSession::new(
            identity,
            &app_state,
            &user_state,
            loaded,
        )))
    }

    // ----- writes -------------------------------------------------------------

    /// Appends `event` to the session of `identity` with the current turn's
    /// fence: the event and its app and user deltas in one store step.
    async fn append_fenced_event(
        &self,
        identity: (&str, &str, &str),
        fence: Option<Arc<TurnFence>>,
        mut event: Event,
    ) -> Result<()> {
        let (app, user, id) = identity;
        let key = session_key(app, user, id);
        let fence = match fence {
            Some(fence) if fence.session_key == key => fence,
            _ => return Err(FenceError::NotHeld { session: key }.into()),
        };
        event
            .actions
            .state_delta
            .retain(|k, _| !k.starts_with(KEY_PREFIX_TEMP));
        let record = encode(&RecordOut::Event { event: &event })?;
        let (app_delta, user_delta, _) = extract_state_deltas(&event.actions.state_delta);
        let (app_record, user_record) = (delta(&app_delta)?, delta(&user_delta)?);
        let shared = Shared::new(app, user);
        let logs = shared.logs(None, user_record.as_deref(), app_record.as_deref());
        let appended = self
            .store
            .session_append(SessionAppend {
                session: &key,
                fence: fence.fence,
                id: Some(event.id.as_str()),
                record: &record,
                logs: &logs,
            })
            .await
            .map_err(|e| store_error("append to", &key, e))?;
        match appended {
            SessionAppended::Appended { .. } => Ok(()),
            SessionAppended::Repeated => {
                tracing::debug!(key, event = event.id, "event appended already; not again");
                Ok(())
            }
            SessionAppended::Stale { latest } => Err(FenceError::Stale {
                fence: fence.fence,
                latest,
            }
            .into()),
            // Never created, deleted, or expired.
            SessionAppended::Missing => Err(not_found(app, user, id)),
        }
    }

    async fn delete_session(&self, app: &str, user: &str, id: &str) -> Result<()> {
        let key = session_key(app, user, id);
        let shared = Shared::new(app, user);
        let record = encode(&CatalogRecord {
            op: CatalogOp::Delete,
            id: id.to_owned(),
        })?;
        self.store
            .session_delete(SessionDelete {
                session: &key,
                logs: &[LogWrite {
                    log: &shared.catalog,
                    record: Some(&record),
                }],
            })
            .await
            .map_err(|e| store_error("delete", &key, e))?;
        Ok(())
    }
}

/// A session as read: state merged over the three scopes, and events.
pub(crate) struct FencedSession {
    identity: AdkIdentity,
    state: StateMap,
    events: Vec<Event>,
    updated_at: DateTime<Utc>,
}

impl FencedSession {
    /// A session whose last update is `updated_at` (as stored), not its
    /// last event's time.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn updated(mut self, updated_at: DateTime<Utc>) -> Self {
        self.updated_at = updated_at;
        self
    }

    pub(crate) fn new(
        identity: AdkIdentity,
        app: &StateMap,
        user: &StateMap,
        loaded: Loaded,
    ) -> Self {
        Self {
            identity,
            state: merge_states(app, user, &loaded.state),
            updated_at: loaded.updated_at(),
            events: loaded.events,
        }
    }
}

impl Session for FencedSession {
    fn id(&self) -> &str {
        self.identity.session_id.as_ref()
    }

    fn app_name(&self) -> &str {
        self.identity.app_name.as_ref()
    }

    fn user_id(&self) -> &str {
        self.identity.user_id.as_ref()
    }

    fn state(&self) -> &dyn State {
        self
    }

    fn events(&self) -> &dyn Events {
        self
    }

    fn last_update_time(&self) -> DateTime<Utc> {
        self.updated_at
    }
}

impl State for FencedSession {
    fn get(&self, key: &str) -> Option<Value> {
        self.state.get(key).cloned()
    }

    fn set(&mut self, key: String, value: Value) {
        if let Err(msg) = adk_core::validate_state_key(&key) {
            tracing::warn!(key = %key, "rejecting invalid state key: {msg}");
            return;
        }
        self.state.insert(key, value);
    }

    fn all(&self) -> HashMap<String, Value> {
        self.state.clone()
    }
}

impl Events for FencedSession {
    fn all(&self) -> Vec<Event> {
        self.events.clone()
    }

    fn len(&self) -> usize {
        self.events.len()
    }

    fn at(&self, index: usize) -> Option<&Event> {
        self.events.get(index)
    }
}

// ----- helpers ---------------------------------------------------------------

pub(crate) fn identity(app: &str, user: &str, session: &str) -> Result<AdkIdentity> {
    Ok(AdkIdentity::new(
        AppName::try_from(app)?,
        UserId::try_from(user)?,
        SessionId::try_from(session)?,
    ))
}

pub(crate) fn parts(identity: &AdkIdentity) -> (&str, &str, &str) {
    (
        identity.app_name.as_ref(),
        identity.user_id.as_ref(),
        identity.session_id.as_ref(),
    )
}

/// The store group of an app's sessions: every key of the app (its
/// sessions, their users' catalogs and state, its own state) is in it, so
/// one store step can write any of them together.
pub(crate) fn app_group(app: &str) -> String {
    format!("adk:{app}")
}

/// `{len(user)}:{user}`: a user id, delimited unambiguously.
fn user_part(user: &str) -> String {
    format!("{}:{user}", user.len())
}

/// The keys of the logs the sessions of (`app`, `user`) share, all in the
/// app's group.
struct Shared {
    /// The catalog of (`app`, `user`).
    catalog: String,
    /// The user state of (`app`, `user`).
    user: String,
    /// The app state of `app`.
    app: String,
}

impl Shared {
    fn new(app: &str, user: &str) -> Self {
        let group = app_group(app);
        Self {
            catalog: grouped_name(&group, &format!("c:{}", user_part(user))),
            user: grouped_name(&group, &format!("u:{}", user_part(user))),
            app: grouped_name(&group, "a"),
        }
    }

    /// The writes to the shared logs that go with a session write: each
    /// given record appended, every log's retention refreshed.
    fn logs<'a>(
        &'a self,
        catalog: Option<&'a [u8]>,
        user: Option<&'a [u8]>,
        app: Option<&'a [u8]>,
    ) -> [LogWrite<'a>; 3] {
        [
            LogWrite {
                log: &self.catalog,
                record: catalog,
            },
            LogWrite {
                log: &self.user,
                record: user,
            },
            LogWrite {
                log: &self.app,
                record: app,
            },
        ]
    }
}

/// The record of a state change, `None` if it changes nothing.
fn delta(changes: &StateMap) -> Result<Option<Vec<u8>>> {
    (!changes.is_empty()).then(|| encode(changes)).transpose()
}

/// App, user and session id of a [`session_key`]; `None` if `key` is not
/// one.
pub(crate) fn parse_session_key(key: &str) -> Option<(&str, &str, &str)> {
    let parsed = SessionKey::parse(key)?;
    let app = parsed.scope?.strip_prefix("adk:")?;
    Some((app, parsed.user, parsed.session))
}

/// What an `append_event(session_id, …)` (which names no app or user)
/// writes to: the current turn's fence and the app, user and id of its
/// session key, if that session's id is `session_id`;
/// [`FenceError::NotHeld`] otherwise.
pub(crate) fn legacy_target(session_id: &str) -> Result<(Arc<TurnFence>, [String; 3])> {
    let fence = current_fence();
    let target = fence
        .as_deref()
        .and_then(|f| parse_session_key(&f.session_key))
        .filter(|(_, _, id)| *id == session_id)
        .map(|(app, user, id)| [app.to_owned(), user.to_owned(), id.to_owned()]);
    match (fence, target) {
        (Some(fence), Some(target)) => Ok((fence, target)),
        _ => Err(FenceError::NotHeld {
            session: session_id.to_owned(),
        }
        .into()),
    }
}

fn from_ms(ms: u64) -> DateTime<Utc> {
    i64::try_from(ms)
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .unwrap_or(DateTime::UNIX_EPOCH)
}

fn encode(value: &impl Serialize) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| {
        AdkError::internal(
            ErrorComponent::Session,
            "session.encode_failed",
            format!("could not encode a session record: {e}"),
        )
        .with_source(e)
    })
}

fn parse<T: for<'de> Deserialize<'de>>(key: &str, index: usize, record: &[u8]) -> Result<T> {
    serde_json::from_slice(record).map_err(|e| corrupt(key, index, e))
}

fn corrupt(key: &str, index: usize, why: impl fmt::Display) -> AdkError {
    AdkError::internal(
        ErrorComponent::Session,
        "session.corrupt_record",
        format!("record {index} of {key} is not valid: {why}"),
    )
}

pub(crate) fn not_found(app: &str, user: &str, id: &str) -> AdkError {
    AdkError::not_found(
        ErrorComponent::Session,
        "session.not_found",
        format!("session '{id}' was not found for app '{app}' and user '{user}'"),
    )
}

fn store_error(op: &str, key: &str, error: StoreError) -> AdkError {
    AdkError::unavailable(
        ErrorComponent::Session,
        "session.store_unavailable",
        format!("the session store failed to {op} {key}: {error}"),
    )
    .with_source(error)
}

#[cfg(test)]
mod tests;
