//! adk's `SessionService` over [`FencedSessionService`]: create, get, list, delete and append, each one fenced store step.

use super::*;

#[async_trait]
impl<S: Store> SessionService for FencedSessionService<S> {
    /// Creates the session: fails with `session.already_exists` if it
    /// exists, and with `session.busy` while a turn holds its lease.
    async fn create(&self, req: CreateRequest) -> Result<Box<dyn Session>> {
        let id = req
            .session_id
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let identity = identity(&req.app_name, &req.user_id, &id)?;
        let (app, user, id) = parts(&identity);
        let (app_delta, user_delta, session_state) = extract_state_deltas(&req.state);
        let key = session_key(app, user, id);
        let at = self.clock.now_ms();
        let record = encode(&RecordOut::Created {
            state: &session_state,
            at,
        })?;

        let catalog = encode(&CatalogRecord {
            op: CatalogOp::Create,
            id: id.to_owned(),
        })?;
        let (app_record, user_record) = (delta(&app_delta)?, delta(&user_delta)?);
        let shared = Shared::new(app, user);
        let logs = shared.logs(
            Some(&catalog),
            user_record.as_deref(),
            app_record.as_deref(),
        );
        let created = self
            .store
            .session_create(SessionCreate {
                session: &key,
                record: &record,
                logs: &logs,
            })
            .await
            .map_err(|e| store_error("create", &key, e))?;
        match created {
            SessionCreated::Created { .. } => {}
            SessionCreated::Exists => {
                return Err(AdkError::new(
                    ErrorComponent::Session,
                    ErrorCategory::InvalidInput,
                    "session.already_exists",
                    format!("session '{id}' already exists for app '{app}' and user '{user}'"),
                ));
            }
            SessionCreated::Busy { retry_after_ms } => {
                return Err(AdkError::unavailable(
                    ErrorComponent::Session,
                    "session.busy",
                    format!(
                        "session '{id}' for app '{app}' and user '{user}' is leased by a \
                         running turn; it cannot be created"
                    ),
                )
                .with_retry(adk_core::RetryHint {
                    should_retry: true,
                    retry_after_ms: Some(retry_after_ms),
                    max_attempts: None,
                }));
            }
        }
        let (app_state, user_state) = self.read_scopes(app, user).await?;
        let loaded = Loaded {
            created_at: from_ms(at),
            state: session_state,
            events: Vec::new(),
        };
        Ok(Box::new(FencedSession::new(
            identity,
            &app_state,
            &user_state,
            loaded,
        )))
    }

    async fn get(&self, req: GetRequest) -> Result<Box<dyn Session>> {
        let identity = identity(&req.app_name, &req.user_id, &req.session_id)?;
        self.get_session(identity, req.num_recent_events, req.after)
            .await
    }

    /// The live sessions of the app and user, most recently updated first
    /// (ties by id), with their whole history and current state.
    async fn list(&self, req: ListRequest) -> Result<Vec<Box<dyn Session>>> {
        let app = AppName::try_from(req.app_name.as_str())?;
        let user = UserId::try_from(req.user_id.as_str())?;
        let (ids, (app_state, user_state)) = futures::try_join!(
            self.read_catalog(app.as_ref(), user.as_ref()),
            self.read_scopes(app.as_ref(), user.as_ref()),
        )?;
        let loaded: Vec<(String, Option<Loaded>)> = futures::stream::iter(ids)
            .map(|id| async {
                let key = session_key(app.as_ref(), user.as_ref(), &id);
                let loaded = self.load(&key).await?;
                Ok::<_, AdkError>((id, loaded))
            })
            .buffered(LIST_CONCURRENCY)
            .try_collect()
            .await?;
        let mut sessions = Vec::with_capacity(loaded.len());
        for (id, loaded) in loaded {
            let Some(loaded) = loaded else { continue };
            let identity = AdkIdentity::new(app.clone(), user.clone(), SessionId::try_from(id)?);
            sessions.push(FencedSession::new(
                identity,
                &app_state,
                &user_state,
                loaded,
            ));
        }
        sessions.sort_by(|a, b| {
            b.updated_at
                .cmp(&a.updated_at)
                .then_with(|| a.id().cmp(b.id()))
        });
        Ok(sessions
            .into_iter()
            .skip(req.offset.unwrap_or(0))
            .take(req.limit.unwrap_or(usize::MAX))
            .map(|s| Box::new(s) as Box<dyn Session>)
            .collect())
    }

    /// Deletes the session's history (a missing session is not an error).
    /// Not fenced: see [`FencedSessionService`].
    async fn delete(&self, req: DeleteRequest) -> Result<()> {
        let identity = identity(&req.app_name, &req.user_id, &req.session_id)?;
        let (app, user, id) = parts(&identity);
        self.delete_session(app, user, id).await
    }

    /// Appends with the current turn's fence, taking the app and user from
    /// the fence's session key: refused ([`FenceError::NotHeld`]) if no
    /// fence is current or its session id is not `session_id`.
    async fn append_event(&self, session_id: &str, event: Event) -> Result<()> {
        let (fence, [app, user, id]) = legacy_target(session_id)?;
        self.append_fenced_event((&app, &user, &id), Some(fence), event)
            .await
    }

    async fn get_for_identity(&self, identity: &AdkIdentity) -> Result<Box<dyn Session>> {
        self.get_session(identity.clone(), None, None).await
    }

    async fn delete_for_identity(&self, identity: &AdkIdentity) -> Result<()> {
        let (app, user, id) = parts(identity);
        self.delete_session(app, user, id).await
    }

    /// Appends with the current turn's fence, which must be for this
    /// identity's session.
    async fn append_event_for_identity(&self, req: AppendEventRequest) -> Result<()> {
        self.append_fenced_event(parts(&req.identity), current_fence(), req.event)
            .await
    }

    async fn delete_all_sessions(&self, app_name: &str, user_id: &str) -> Result<()> {
        let app = AppName::try_from(app_name)?;
        let user = UserId::try_from(user_id)?;
        for id in self.read_catalog(app.as_ref(), user.as_ref()).await? {
            self.delete_session(app.as_ref(), user.as_ref(), &id)
                .await?;
        }
        Ok(())
    }
}
