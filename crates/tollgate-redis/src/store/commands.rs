//! The `Store` operations of [`RedisStore`]: each one Lua script (one `EVALSHA`) or one read.

use super::*;
use crate::codes::*;
use std::future::Future;
use tollgate_core::store::{Backend, Op};

impl Store for RedisStore {
    fn call<O: Op>(&self, op: O) -> impl Future<Output = Result<O::Reply, StoreError>> + Send {
        op.apply(self)
    }
}

impl Backend for RedisStore {
    async fn admit_turn(&self, req: TurnRequest<'_>) -> Result<TurnOutcome, StoreError> {
        let k = &self.inner.keys;
        let p = &req.params;
        let mut inv = self.inner.scripts.admit_turn.prepare_invoke();
        inv.key(k.turn(req.user))
            .key(k.leases(req.user))
            .key(k.spend(req.user));
        let mut args = Packed::default();
        args.push(self.now_arg())
            .spec(&p.turns)
            .push(clamp_ttl(p.lease_ttl_ms))
            .push(u64::from(p.max_runs))
            .push(p.concurrency_retry_ms);
        inv.arg(args.0)
            .arg(req.invocation_id)
            .arg(Packed::turn_budgets(req.budgets));
        let r: Vec<u8> = self.run("admit_turn", &inv).await?;
        let Some([ok, a, b, reclaimed]) = unpacked::<4>(&r) else {
            return Err(bad_reply("admit_turn", format!("{r:?}")));
        };
        let admit = match (ok, a) {
            (GRANTED, exp) => Admit::Admitted {
                lease_expires_at: u(exp),
                refreshed: b == 1,
            },
            (DENIED, ADMIT_TURN_RATE) => Admit::Denied(Denial::Limited {
                limit: Limit::TurnRate,
                retry_after_ms: u(b),
            }),
            (DENIED, ADMIT_CONCURRENCY) => Admit::Denied(Denial::Limited {
                limit: Limit::Concurrency,
                retry_after_ms: u(b),
            }),
            (DENIED, code) if budget_code(code, ADMIT_BUDGET).is_some() => {
                Admit::Denied(Denial::Limited {
                    limit: budget_code(code, ADMIT_BUDGET).unwrap_or(Limit::BudgetDaily),
                    retry_after_ms: u(b),
                })
            }
            _ => return Err(bad_reply("admit_turn", format!("{r:?}"))),
        };
        Ok(TurnOutcome {
            admit,
            reclaimed: u32::try_from(reclaimed).unwrap_or(u32::MAX),
        })
    }

    async fn release_run(&self, user: &str, invocation_id: &str) -> Result<Release, StoreError> {
        let mut inv = self.inner.scripts.release_run.prepare_invoke();
        inv.key(self.inner.keys.leases(user))
            .arg(self.now_arg())
            .arg(invocation_id);
        let r: i64 = self.run("release_run", &inv).await?;
        Ok(if r == 1 {
            Release::Released
        } else {
            Release::NotHeld
        })
    }

    async fn renew_run(
        &self,
        user: &str,
        invocation_id: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let mut inv = self.inner.scripts.renew_run.prepare_invoke();
        inv.key(self.inner.keys.leases(user))
            .arg(self.now_arg())
            .arg(invocation_id)
            .arg(clamp_ttl(ttl_ms));
        let r: i64 = self.run("renew_run", &inv).await?;
        Ok((r >= 0).then_some(u(r)))
    }

    async fn reserve_tokens(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        let k = &self.inner.keys;
        let max_wait = req.max_wait_ms.min(req.tokens.max_wait_limit());
        let too_big = req.tokens.exceeds(req.estimate, max_wait);
        let mut inv = self.inner.scripts.reserve_tokens.prepare_invoke();
        inv.key(k.tokens(req.user))
            .key(k.invocation(req.user, req.invocation_id))
            .key(k.runs(req.user))
            .key(k.spend(req.user));
        let mut args = Packed::default();
        args.push(self.now_arg())
            .spec(&req.tokens)
            .push(if too_big { 0 } else { req.estimate })
            .push(max_wait)
            .push(req.max_llm_calls)
            .push(u64::from(req.shadow))
            .push(u64::from(too_big))
            .push(RESERVATION_RETENTION_MS)
            .push(MAX_TRACKED_RUNS as u64);
        inv.arg(args.0)
            .arg(crate::keys::esc(req.invocation_id).as_ref())
            .arg(k.invocation_prefix(req.user))
            .arg(req.request_id.unwrap_or(""))
            .arg(Packed::reserve_budgets(req.budget.as_ref(), req.estimate));
        let r: Vec<u8> = self.run("reserve_tokens", &inv).await?;
        let reservation = |call: i64| ReservationId::new(req.invocation_id, u(call));
        if let Some([GRANTED, call, wait, now, crossed]) = unpacked::<5>(&r) {
            self.count_top(req.user, u(now), req.estimate as i64);
            return Ok(ReserveOutcome::Granted {
                reservation: reservation(call),
                wait_ms: u(wait),
                crossed: Crossed(u32::try_from(crossed).unwrap_or(0)),
            });
        }
        let Some(r) = unpacked::<4>(&r) else {
            return Err(bad_reply("reserve_tokens", format!("{r:?}")));
        };
        match r {
            [SUPERSEDED, ..] => Ok(ReserveOutcome::Superseded),
            [REPEATED, call, wait, _] => Ok(ReserveOutcome::Granted {
                reservation: reservation(call),
                wait_ms: u(wait),
                crossed: Crossed::NONE,
            }),
            [DENIED, code, hint, call] => {
                let denial = match code {
                    RESERVE_MAX_CALLS => Denial::CapReached {
                        limit: Limit::MaxLlmCalls,
                        cap: req.max_llm_calls,
                    },
                    RESERVE_TOKEN_RATE => Denial::Limited {
                        limit: Limit::TokenRate,
                        retry_after_ms: u(hint),
                    },
                    RESERVE_EXCEEDS => Denial::ExceedsCapacity {
                        limit: Limit::TokenRate,
                        cost: req.estimate,
                        max_cost: req.tokens.max_cost(req.max_wait_ms),
                    },
                    code if budget_code(code, RESERVE_BUDGET).is_some() => Denial::Limited {
                        limit: budget_code(code, RESERVE_BUDGET)
                            .ok_or_else(|| bad_reply("reserve_tokens", format!("{r:?}")))?,
                        retry_after_ms: u(hint),
                    },
                    code if budget_code(code, RESERVE_BUDGET_EXCEEDS).is_some() => {
                        let limit = budget_code(code, RESERVE_BUDGET_EXCEEDS);
                        let b = req.budget.as_ref().and_then(|b| {
                            let c = b.checks.iter().find(|c| Some(c.limit_name()) == limit)?;
                            Some(Denial::ExceedsCapacity {
                                limit: c.limit_name(),
                                cost: spend::amount(
                                    c.unit,
                                    b.price.as_ref(),
                                    req.estimate,
                                    b.split,
                                ),
                                // The limit with the window's top-ups.
                                max_cost: u(hint),
                            })
                        });
                        b.ok_or_else(|| bad_reply("reserve_tokens", format!("{r:?}")))?
                    }
                    _ => return Err(bad_reply("reserve_tokens", format!("{r:?}"))),
                };
                Ok(ReserveOutcome::Denied {
                    denial,
                    shadow_reservation: (call > 0).then(|| reservation(call)),
                })
            }
            _ => Err(bad_reply("reserve_tokens", format!("{r:?}"))),
        }
    }

    async fn settle(&self, req: SettleRequest<'_>) -> Result<SettleOutcome, StoreError> {
        let k = &self.inner.keys;
        let rid = req.reservation;
        if rid.call > 1 << 53 {
            return Ok(SettleOutcome::Unknown);
        }
        let mut inv = self.inner.scripts.settle.prepare_invoke();
        inv.key(k.tokens(req.user))
            .key(k.invocation(req.user, &rid.invocation_id))
            .key(k.spend(req.user));
        let mut args = Packed::default();
        args.push(self.now_arg())
            .spec(&req.tokens)
            .push(rid.call)
            .push_signed(req.actual.map_or(-1, |a| lua_count(a) as i64))
            .push(RESERVATION_RETENTION_MS);
        inv.arg(args.0)
            .arg(Packed::settle_budgets(req.budget.as_ref()));
        let r: Vec<u8> = self.run("settle", &inv).await?;
        if let Some([SETTLE_APPLIED, balance, delta, now, crossed]) = unpacked::<5>(&r) {
            self.count_top(req.user, u(now), delta);
            return Ok(SettleOutcome::Applied {
                balance,
                crossed: Crossed(u32::try_from(crossed).unwrap_or(0)),
            });
        }
        match unpacked::<4>(&r) {
            Some([SETTLE_CLOSED, balance, ..]) => Ok(SettleOutcome::AlreadyClosed { balance }),
            Some([SETTLE_UNKNOWN, ..]) => Ok(SettleOutcome::Unknown),
            _ => Err(bad_reply("settle", format!("{r:?}"))),
        }
    }

    async fn take_many(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
    ) -> Result<MultiTake, StoreError> {
        if takes.is_empty() && cooldown.is_none() {
            return Ok(MultiTake::Granted { wait_ms: 0 });
        }
        let k = &self.inner.keys;
        if let ([t], None) = (takes, cooldown) {
            // One bucket (an Envoy descriptor, a provider quota): the same
            // rules in take_one.lua, which builds no tables.
            let max_wait = t.max_wait_ms.min(t.spec.max_wait_limit());
            let key = k.named_bucket(t.key);
            return match self
                .take_single("take_many", key, &t.spec, t.cost, max_wait, true)
                .await?
            {
                [TAKE_GRANTED, wait, _] => Ok(MultiTake::Granted { wait_ms: u(wait) }),
                [TAKE_REFUSED, hint, _] => Ok(MultiTake::Refused {
                    index: Some(0),
                    retry_after_ms: u(hint),
                }),
                [TAKE_EXCEEDS, ..] => Ok(MultiTake::ExceedsCapacity { index: 0 }),
                r => Err(bad_reply("take_many", format!("{r:?}"))),
            };
        }
        self.take_many_script(takes, cooldown, None).await
    }

    async fn take_many_fair(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
        fair: FairCheck<'_>,
    ) -> Result<MultiTake, StoreError> {
        self.take_many_script(takes, cooldown, Some(fair)).await
    }

    async fn take_one(&self, req: TakeRequest<'_>) -> Result<TakeOutcome, StoreError> {
        let k = &self.inner.keys;
        let key = match req.bucket {
            BucketRef::Turns(user) => k.turn(user),
            BucketRef::Named(name) => k.named_bucket(name),
        };
        let (take, level) = match self
            .take_single("take_one", key, &req.spec, req.cost, 0, false)
            .await?
        {
            [TAKE_GRANTED, _, level] => (Take::Granted { wait_ms: 0 }, level),
            [TAKE_REFUSED, hint, level] => (
                Take::Refused {
                    retry_after_ms: u(hint).max(1),
                },
                level,
            ),
            [TAKE_EXCEEDS, _, level] => (Take::ExceedsCapacity, level),
            r => return Err(bad_reply("take_one", format!("{r:?}"))),
        };
        Ok(TakeOutcome::new(take, &req.spec, level))
    }

    async fn extend_cooldown(
        &self,
        key: &str,
        for_ms: u64,
        max_ms: u64,
    ) -> Result<u64, StoreError> {
        let mut inv = self.inner.scripts.extend_cooldown.prepare_invoke();
        // Durations within 2^50 ms keep now + them exact in a double.
        inv.key(self.inner.keys.named(key))
            .arg(self.now_arg())
            .arg(for_ms.min(1 << 50))
            .arg(max_ms.min(1 << 50));
        let r: i64 = self.run("extend_cooldown", &inv).await?;
        Ok(u(r))
    }

    async fn aimd(
        &self,
        key: &str,
        params: AimdParams,
        throttled: bool,
    ) -> Result<u32, StoreError> {
        let p = params.clamped();
        let mut inv = self.inner.scripts.aimd.prepare_invoke();
        inv.key(self.inner.keys.named(key))
            .arg(self.now_arg())
            .arg(p.floor_permille)
            .arg(p.step_permille)
            .arg(lua_count(p.decrease_interval_ms))
            .arg(lua_count(p.increase_interval_ms))
            .arg(u8::from(throttled));
        let r: i64 = self.run("aimd", &inv).await?;
        Ok(u32::try_from(r.clamp(0, i64::from(aimd::FULL))).unwrap_or(aimd::FULL))
    }

    async fn read_fair(
        &self,
        key: &str,
    ) -> Result<Option<tollgate_core::fair::FairState>, StoreError> {
        let now = self.now().await?;
        let raw: Option<Vec<u8>> = self
            .cmd(
                "read_fair",
                redis::cmd("GET").arg(self.inner.keys.named(key)),
            )
            .await?;
        match raw {
            None => Ok(None),
            Some(raw) => parse_fair(&raw, now)
                .ok_or_else(|| bad_reply("read_fair", format!("{} bytes", raw.len()))),
        }
    }

    async fn clear_provider(
        &self,
        cooldown: &str,
        aimd: &str,
        params: AimdParams,
    ) -> Result<ProviderCleared, StoreError> {
        let p = params.clamped();
        let k = &self.inner.keys;
        let mut inv = self.inner.scripts.clear_provider.prepare_invoke();
        inv.key(k.named(cooldown))
            .key(k.named(aimd))
            .arg(self.now_arg())
            .arg(p.step_permille)
            .arg(lua_count(p.increase_interval_ms));
        let r: Vec<i64> = self.run("clear_provider", &inv).await?;
        match r[..] {
            [until, permille] => Ok(ProviderCleared {
                cooldown_until_ms: (until > 0).then(|| u(until)),
                effective_permille: u32::try_from(permille.clamp(0, i64::from(aimd::FULL)))
                    .unwrap_or(aimd::FULL),
            }),
            _ => Err(bad_reply("clear_provider", format!("{r:?}"))),
        }
    }

    async fn claim_session(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let hold = clamp_ttl(req.lease_ttl_ms)
            .saturating_add(self.inner.session_grace_ms)
            .saturating_add(CLAIM_SLACK_MS);
        let mut inv = self.inner.scripts.claim_session.prepare_invoke();
        inv.key(self.inner.keys.session_claims(req.user))
            .arg(self.now_arg())
            .arg(req.session)
            .arg(lua_count(hold))
            .arg(req.max_sessions)
            .arg(u8::from(req.create));
        let r: Vec<i64> = self.run("claim_session", &inv).await?;
        let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
        match r[..] {
            [1, n] => Ok(Claim::Claimed { sessions: count(n) }),
            [2, n] => Ok(Claim::Unclaimed { sessions: count(n) }),
            [0, retry] => Ok(Claim::Full {
                retry_after_ms: u(retry).max(1),
            }),
            _ => Err(bad_reply("claim_session", format!("{r:?}"))),
        }
    }

    async fn session_acquire(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<SessionAcquire, StoreError> {
        let mut inv = self.session_call(session, "acquire");
        inv.arg(holder).arg(clamp_ttl(ttl_ms));
        let r: Vec<i64> = self.run("session_acquire", &inv).await?;
        match r[..] {
            [1, fence, exp] => Ok(SessionAcquire::Acquired(SessionGrant {
                fence: u(fence),
                expires_at_ms: u(exp),
            })),
            [0, retry] => Ok(SessionAcquire::Busy {
                retry_after_ms: u(retry),
            }),
            _ => Err(bad_reply("session_acquire", format!("{r:?}"))),
        }
    }

    async fn session_renew(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<Option<SessionGrant>, StoreError> {
        let mut inv = self.session_call(session, "renew");
        inv.arg(holder).arg(clamp_ttl(ttl_ms));
        let r: Vec<i64> = self.run("session_renew", &inv).await?;
        match r[..] {
            [1, fence, exp] => Ok(Some(SessionGrant {
                fence: u(fence),
                expires_at_ms: u(exp),
            })),
            [0] => Ok(None),
            _ => Err(bad_reply("session_renew", format!("{r:?}"))),
        }
    }

    async fn session_release(&self, session: &str, holder: &str) -> Result<bool, StoreError> {
        let mut inv = self.session_call(session, "release");
        inv.arg(holder);
        let r: Vec<i64> = self.run("session_release", &inv).await?;
        Ok(r.first() == Some(&1))
    }

    async fn fence_check(&self, session: &str, fence: u64) -> Result<FenceCheck, StoreError> {
        let mut inv = self.session_call(session, "check");
        inv.arg(lua_count(fence));
        let r: Vec<i64> = self.run("fence_check", &inv).await?;
        match r[..] {
            [current, latest] => Ok(FenceCheck {
                current: current == 1 && fence == u(latest),
                latest: u(latest),
            }),
            _ => Err(bad_reply("fence_check", format!("{r:?}"))),
        }
    }

    async fn append_fenced(
        &self,
        session: &str,
        fence: u64,
        record: &[u8],
    ) -> Result<AppendOutcome, StoreError> {
        let mut inv = self.session_call(session, "append");
        inv.arg(lua_count(fence)).arg(record);
        let r: Vec<i64> = self.run("append_fenced", &inv).await?;
        match r[..] {
            [1, index] => Ok(AppendOutcome::Appended { index: u(index) }),
            [0, latest] => Ok(AppendOutcome::Stale { latest: u(latest) }),
            _ => Err(bad_reply("append_fenced", format!("{r:?}"))),
        }
    }

    async fn read_records(
        &self,
        session: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        const MAX: u64 = i32::MAX as u64;
        if from >= MAX || limit == 0 {
            return Ok(Vec::new());
        }
        let limit = (limit as u64).min(MAX - from);
        let mut inv = self.session_call(session, "read");
        inv.arg(from).arg(limit);
        self.run("read_records", &inv).await
    }

    async fn delete_records(&self, session: &str) -> Result<u64, StoreError> {
        let inv = self.session_call(session, "delete");
        let r: Vec<i64> = self.run("delete_records", &inv).await?;
        r.first()
            .map(|n| u(*n))
            .ok_or_else(|| bad_reply("delete_records", "empty"))
    }

    async fn budget_spent(
        &self,
        user: &str,
        checks: &[BudgetCheck],
        adjust: Option<(Period, BudgetAdjust<'_>)>,
    ) -> Result<Vec<SpentNow>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        let mut args = Packed::default();
        args.push(checks.len() as u64);
        for c in checks {
            args.check(c, false);
        }
        let at = adjust.and_then(|(p, a)| Some((checks.iter().position(|c| c.period == p)?, a)));
        let mut id = "";
        match at {
            None => args.push(0).push(0).push(0),
            Some((i, BudgetAdjust::Reset)) => args.push(1).push(i as u64).push(0),
            Some((i, BudgetAdjust::TopUp { amount, request_id })) => {
                id = request_id.unwrap_or("");
                args.push(2)
                    .push(i as u64)
                    .push(amount.min(spend::MAX_AMOUNT))
            }
        };
        let k = &self.inner.keys;
        let mut inv = self.inner.scripts.budget_spent.prepare_invoke();
        inv.key(k.spend(user))
            .key(k.top_ups(user))
            .arg(self.now_arg())
            .arg(args.0)
            .arg(id);
        let r: Vec<u8> = self.run("budget_spent", &inv).await?;
        if r.len() != 16 * checks.len() {
            return Err(bad_reply("budget_spent", format!("{r:?}")));
        }
        let n = |c: &[u8]| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            f64::from_le_bytes(b) as u64
        };
        Ok(r.chunks_exact(16)
            .map(|c| SpentNow {
                spent: n(&c[..8]),
                granted: n(&c[8..]),
            })
            .collect())
    }

    async fn user_state(
        &self,
        user: &str,
        turns: BucketSpec,
        tokens: BucketSpec,
    ) -> Result<UserState, StoreError> {
        let k = &self.inner.keys;
        let mut inv = self.inner.scripts.user_state.prepare_invoke();
        inv.key(k.turn(user))
            .key(k.tokens(user))
            .key(k.leases(user))
            .key(k.tokens_hash(user))
            .arg(self.now_arg());
        Self::spec_args(&mut inv, &turns);
        Self::spec_args(&mut inv, &tokens);
        let r: Vec<Value> = self.run("user_state", &inv).await?;
        if r.len() < 3 || !(r.len() - 3).is_multiple_of(2) {
            return Err(bad_reply("user_state", format!("{} values", r.len())));
        }
        let mut leases = Vec::new();
        for pair in r[3..].chunks(2) {
            let id = match &pair[0] {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => return Err(bad_reply("user_state", format!("{other:?}"))),
            };
            leases.push((id, u(int(&pair[1], "user_state")?)));
        }
        Ok(UserState {
            turns_available: int(&r[0], "user_state")?,
            tokens_available: int(&r[1], "user_state")?,
            leases,
            tokens_last_minute: int(&r[2], "user_state")?,
        })
    }

    async fn top_users(&self, n: usize) -> Result<Vec<TopUser>, StoreError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        // This replica's counts first, so it always reads its own.
        self.flush_top_users().await?;
        let now = self.now().await?;
        let minute = now / 60_000;
        let (cur, prev) = (self.inner.keys.top(minute), self.inner.keys.top(minute - 1));
        // Candidates: the leaders of this minute and of the last; their exact
        // sliding-minute totals are then computed here as the memory store
        // does. Exact unless more than `k` users lead one minute or the other.
        let k = (4 * n).max(1_000) as isize;
        let mut candidates: Vec<String> = Vec::new();
        for key in [&cur, &prev] {
            let mut c = redis::cmd("ZRANGE");
            c.arg(key).arg(0).arg(k - 1).arg("REV");
            let users: Vec<String> = self.cmd("top_users", &c).await?;
            candidates.extend(users);
        }
        candidates.sort();
        candidates.dedup();
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let mut scores = Vec::with_capacity(2);
        for key in [&cur, &prev] {
            let mut c = redis::cmd("ZMSCORE");
            c.arg(key).arg(&candidates);
            let s: Vec<Option<f64>> = self.cmd("top_users", &c).await?;
            scores.push(s);
        }
        let all: Vec<TopUser> = candidates
            .into_iter()
            .enumerate()
            .map(|(i, user)| {
                let c = scores[0][i].unwrap_or(0.0) as i64;
                let p = scores[1][i].unwrap_or(0.0) as i64;
                TopUser {
                    user,
                    tokens_last_minute: sliding_minute(c, p, now),
                }
            })
            .collect();
        Ok(rank_top(all, n))
    }

    async fn reset_user(&self, user: &str) -> Result<bool, StoreError> {
        let k = &self.inner.keys;
        let mut inv = self.inner.scripts.reset_user.prepare_invoke();
        inv.key(k.turn(user))
            .key(k.tokens(user))
            .arg(self.now_arg());
        let r: i64 = self.run("reset_user", &inv).await?;
        Ok(r == 1)
    }

    async fn reconcile(&self, req: ReconcileRequest<'_>) -> Result<Reconciled, StoreError> {
        let k = &self.inner.keys;
        let mut inv = self.inner.scripts.reconcile.prepare_invoke();
        inv.key(k.turn(req.user))
            .key(k.tokens(req.user))
            .key(k.leases(req.user))
            .key(k.runs(req.user))
            .key(k.reconciled(req.user))
            .key(k.spend(req.user))
            .arg(self.now_arg());
        Self::spec_args(&mut inv, &req.turns);
        Self::spec_args(&mut inv, &req.tokens)
            .arg(lua_count(req.turns_taken))
            .arg(req.tokens_net.clamp(-(1 << 53), 1 << 53))
            .arg(RESERVATION_RETENTION_MS)
            .arg(MAX_TRACKED_RUNS)
            .arg(k.invocation_prefix(req.user))
            .arg(req.replica)
            .arg(req.batch.min(1 << 53))
            .arg(req.ambiguous_reserves.len());
        for (invocation, request) in req.ambiguous_reserves {
            inv.arg(crate::keys::esc(invocation).as_ref()).arg(*request);
        }
        inv.arg(req.ambiguous_admissions.len());
        for invocation in req.ambiguous_admissions {
            inv.arg(*invocation);
        }
        let mut budgets = Packed::default();
        if !req.budgets.is_empty() {
            budgets.push(req.budgets.len() as u64);
            for b in req.budgets {
                budgets
                    .push(b.period.index() as u64)
                    .push(u64::from(b.unit == BudgetUnit::Cost))
                    .push(b.window.start_ms)
                    .push(b.window.end_ms)
                    .push_signed(b.delta);
            }
        }
        inv.arg(budgets.0);
        let r: Vec<i64> = self.run("reconcile", &inv).await?;
        match r[..] {
            [turns, tokens, refunded, now] => {
                self.count_top(req.user, u(now), tokens);
                Ok(Reconciled {
                    turns: u(turns),
                    tokens,
                    refunded: u32::try_from(refunded).unwrap_or(u32::MAX),
                })
            }
            _ => Err(bad_reply("reconcile", format!("{r:?}"))),
        }
    }

    async fn session_create(&self, req: SessionCreate<'_>) -> Result<SessionCreated, StoreError> {
        let mut inv = self.grouped_call(req.session, "create", req.logs)?;
        inv.arg(req.record);
        Self::log_args(&mut inv, req.logs);
        let r: Vec<i64> = self.run("session_create", &inv).await?;
        match r[..] {
            [1, fence] => Ok(SessionCreated::Created { fence: u(fence) }),
            [2] => Ok(SessionCreated::Exists),
            [3, retry] => Ok(SessionCreated::Busy {
                retry_after_ms: u(retry).max(1),
            }),
            _ => Err(bad_reply("session_create", format!("{r:?}"))),
        }
    }

    async fn session_append(&self, req: SessionAppend<'_>) -> Result<SessionAppended, StoreError> {
        let id = req.id.filter(|id| !id.is_empty());
        let mut inv = self.grouped_call(req.session, "event", req.logs)?;
        inv.arg(lua_count(req.fence))
            .arg(u8::from(id.is_some()))
            .arg(id.unwrap_or(""))
            .arg(req.record);
        Self::log_args(&mut inv, req.logs);
        let r: Vec<i64> = self.run("session_append", &inv).await?;
        match r[..] {
            [1, index] => Ok(SessionAppended::Appended { index: u(index) }),
            [0, latest] => Ok(SessionAppended::Stale { latest: u(latest) }),
            [2] => Ok(SessionAppended::Repeated),
            [4] => Ok(SessionAppended::Missing),
            _ => Err(bad_reply("session_append", format!("{r:?}"))),
        }
    }

    async fn session_delete(&self, req: SessionDelete<'_>) -> Result<u64, StoreError> {
        let mut inv = self.grouped_call(req.session, "drop", req.logs)?;
        Self::log_args(&mut inv, req.logs);
        let r: Vec<i64> = self.run("session_delete", &inv).await?;
        r.first()
            .map(|n| u(*n))
            .ok_or_else(|| bad_reply("session_delete", "empty"))
    }
}

/// A provider key's fair state as `take_many.lua` saves it ('<dddddd' v, at,
/// nt, weights' version, expiry, key expiry; per tenant 'sdddd' name,
/// weight, finish, seen, queued): `Some(None)` past its expiry at `now`,
/// `None` for bytes that are not such a state.
fn parse_fair(raw: &[u8], now: u64) -> Option<Option<tollgate_core::fair::FairState>> {
    use tollgate_core::fair::{FairEntry, FairState};
    let double = |at: usize| -> Option<f64> {
        Some(f64::from_le_bytes(raw.get(at..at + 8)?.try_into().ok()?))
    };
    let whole =
        |x: f64| (x >= 0.0 && x.fract() == 0.0 && x < 9_007_199_254_740_992.0).then_some(x as u64);
    let (v, at, n, expires) = (
        whole(double(0)?)?,
        whole(double(8)?)?,
        whole(double(16)?)?,
        whole(double(32)?)?,
    );
    let mut state = FairState {
        v,
        at_ms: at,
        tenants: Default::default(),
    };
    let mut pos = 48;
    for _ in 0..n {
        let len = raw.get(pos..)?.iter().position(|&b| b == 0)?;
        let name = std::str::from_utf8(&raw[pos..pos + len]).ok()?.to_owned();
        pos += len + 1;
        let entry = FairEntry {
            finish: whole(double(pos + 8)?)?,
            seen_ms: whole(double(pos + 16)?)?,
            queued: double(pos + 24)? == 1.0,
        };
        pos += 32;
        state.tenants.insert(name, entry);
    }
    if pos != raw.len() {
        return None;
    }
    Some((expires > now).then_some(state))
}
