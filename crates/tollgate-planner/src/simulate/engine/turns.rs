//! The replay's turns: admission inside a session lease, lease renewals and the end of a turn.

use super::*;

impl Engine {
    pub(super) fn turn_start(
        &mut self,
        line: u64,
        t: u64,
        user: &str,
        invocation: &str,
        session: Option<&str>,
    ) -> Result<(), PlanError> {
        let plan = match self.limiter.plan_for(user) {
            Ok(p) => p,
            Err(LimiterError::UnknownUser { .. }) => {
                self.skipped.unknown_user += 1;
                return Ok(());
            }
            Err(e) => return Err(self.limiter_err(line, e)),
        };
        let user = self.user_acc(user, &plan.name);
        let key = run_key(&user, invocation);
        let live = self.runs.contains_key(&key);
        let mut shadow = false;
        // A run already live is a retry: it holds its session already.
        let mut skey = session.filter(|_| !live).map(|s| session_key(&user, s));
        let decision = loop {
            let lease = skey.as_deref().map(|key| SessionLease {
                key,
                ttl_ms: self.session_ttl_ms,
            });
            let admitted = ready(
                self.limiter
                    .admit_turn_in_session(&*user, invocation, lease),
            )?
            .map_err(|e| self.limiter_err(line, e))?;
            match admitted {
                SessionAdmit::Decided(d) => break d,
                SessionAdmit::Busy { retry_after_ms } => {
                    self.record_denial(&plan, "session", Some(retry_after_ms), plan.shadow);
                    if !plan.shadow {
                        self.record_turn(t, &plan, &user, Outcome::Denied);
                        return Ok(());
                    }
                    // Shadow mode: the turn goes ahead without the lease.
                    shadow = true;
                    skey = None;
                }
            }
        };
        match decision {
            Decision::Allowed {
                grant,
                shadow_denied,
            } => {
                let held = grant.session.and(skey);
                if let Some(d) = shadow_denied {
                    self.record_denial(&plan, label(&d, false), d.retry_after_ms(), true);
                    shadow = true;
                }
                let o = if shadow {
                    Outcome::ShadowDenied
                } else {
                    Outcome::Allowed
                };
                self.record_turn(t, &plan, &user, o);
                if !live {
                    self.run_counts.admitted += 1;
                    self.next_run += 1;
                    let renew_every = renew_every_ms(match &held {
                        Some(_) => self.session_ttl_ms.min(plan.lease_ttl_ms),
                        None => plan.lease_ttl_ms,
                    });
                    let id = self.next_run;
                    self.schedule(
                        t + renew_every,
                        Action::Renew {
                            key: key.clone(),
                            id,
                        },
                    );
                    self.runs.insert(
                        key,
                        Run {
                            id,
                            user: Arc::clone(&user),
                            invocation: invocation.into(),
                            plan: Arc::clone(&plan),
                            session: held,
                            renew_every,
                        },
                    );
                }
            }
            Decision::Denied(d) => {
                self.record_denial(&plan, label(&d, false), d.retry_after_ms(), false);
                self.record_turn(t, &plan, &user, Outcome::Denied);
            }
        }
        Ok(())
    }

    pub(super) fn renew(&mut self, now: u64, key: String, id: u64) -> Result<(), PlanError> {
        let Some(run) = self.runs.get(&key).filter(|r| r.id == id) else {
            return Ok(());
        };
        let (user, inv, session, every) = (
            Arc::clone(&run.user),
            run.invocation.clone(),
            run.session.clone(),
            run.renew_every,
        );
        let run_ok = ready(self.limiter.renew_run(&*user, &*inv))?
            .map_err(replay_err)?
            .is_some();
        let session_ok = match &session {
            Some(skey) => ready(self.limiter.renew_session(skey, &inv, self.session_ttl_ms))?
                .map_err(replay_err)?
                .is_some(),
            None => true,
        };
        if run_ok && session_ok {
            self.schedule(now + every, Action::Renew { key, id });
        } else {
            self.run_counts.leases_lost += 1;
        }
        Ok(())
    }

    pub(super) fn turn_end(
        &mut self,
        line: u64,
        user: &str,
        invocation: &str,
    ) -> Result<(), PlanError> {
        let Some(run) = self.runs.remove(&run_key(user, invocation)) else {
            self.skipped.not_running += 1;
            return Ok(());
        };
        ready(self.limiter.release_run(&*run.user, &*run.invocation))?
            .map_err(|e| self.limiter_err(line, e))?;
        if let Some(skey) = &run.session {
            ready(self.limiter.release_session(skey, &run.invocation))?.map_err(replay_err)?;
        }
        self.run_counts.ended += 1;
        Ok(())
    }
}
