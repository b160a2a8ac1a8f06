//! [`RedisStore`]: the core `Store` over Redis or Redis Cluster.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{
    Cmd, FromRedisValue, IntoConnectionInfo, Pipeline, RedisFuture, ScriptInvocation, Value,
};
use tollgate_core::aimd::{self, AimdParams};
use tollgate_core::bucket::{Take, clamp_ttl};
use tollgate_core::calendar::Period;
use tollgate_core::lease::{Admit, SessionAcquire, SessionGrant};
use tollgate_core::money::Price;
use tollgate_core::spend::{
    self, BudgetAdjust, BudgetCheck, BudgetRequest, BudgetUnit, Crossed, SpentNow,
};
use tollgate_core::store::{
    AppendOutcome, BucketRef, BucketTake, CLAIM_SLACK_MS, Claim, ClaimRequest, CooldownCheck,
    FairCheck, FenceCheck, MAX_TRACKED_RUNS, MultiTake, ProviderCleared, RESERVATION_RETENTION_MS,
    ReconcileRequest, Reconciled, Release, ReservationId, ReserveOutcome, ReserveRequest,
    SettleOutcome, SettleRequest, TakeOutcome, TakeRequest, TopUser, TurnOutcome, TurnRequest,
    UserState, rank_top, sliding_minute,
};
use tollgate_core::{BucketSpec, Clock, Denial, Limit, Store, StoreError};

use tollgate_core::store::grouped::check_group;
use tollgate_core::store::{
    LogWrite, SessionAppend, SessionAppended, SessionCreate, SessionCreated, SessionDelete,
};

use crate::config::{RedisConfig, RedisTarget};
use crate::error::{bad_reply, classify, timed_out};
use crate::keys::Keys;
use crate::scripts::Scripts;

mod commands;
mod top;

use top::TopCounter;

/// One connection type for both deployments: a reconnecting multiplexed
/// connection to one server, or a cluster connection that follows slots.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// tollgate's [`Store`] in Redis 7, standalone or Cluster, through one code
/// path: every operation is one Lua script (EVALSHA) on one hash slot.
///
/// Time comes from Redis `TIME` inside each script, so every replica of a
/// fleet decides on one clock. Cloning shares the connection.
///
/// Top users are counted in memory and written to Redis in batches by a
/// task the store spawns (see `store/top.rs`), never on the decision path;
/// the task ends when the last clone is dropped.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    scripts: Scripts,
    keys: Keys,
    op_timeout: Duration,
    session_retention_ms: u64,
    session_grace_ms: u64,
    clock: Option<Arc<dyn Clock>>,
    top: Arc<TopCounter>,
    /// Dropped with the store: stops its top-users flusher.
    _flusher: tokio::sync::oneshot::Sender<()>,
}

impl Inner {
    fn new(
        conn: Conn,
        keys: Keys,
        op_timeout: Duration,
        session_retention_ms: u64,
        session_grace_ms: u64,
    ) -> Self {
        let top = Arc::new(TopCounter::default());
        let (flusher, _task) =
            top::spawn_flusher(top.clone(), conn.clone(), keys.clone(), op_timeout);
        Self {
            conn,
            scripts: Scripts::new(),
            keys,
            op_timeout,
            session_retention_ms,
            session_grace_ms,
            clock: None,
            top,
            _flusher: flusher,
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("keys", &self.inner.keys)
            .field("op_timeout", &self.inner.op_timeout)
            .field("clock_override", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

fn certs(ca_pem: &[u8]) -> redis::TlsCertificates {
    install_tls_provider();
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca_pem.to_vec()),
    }
}

fn install_tls_provider() {
    // rustls needs a process-wide crypto provider; ring builds without cmake.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn int(v: &Value, op: &str) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .map(|f| f as i64)
            .ok_or_else(|| bad_reply(op, "not a number")),
        other => Err(bad_reply(op, format!("{other:?}"))),
    }
}

/// TCP_NODELAY, as hiredis and redis-server set it. redis-rs leaves Nagle on
/// by default; on a multiplexed connection that holds each new request
/// back until the last segment is acknowledged, and a request a little past
/// one MSS can wait for the server's delayed ACK (40 ms on Linux), most of
/// the default 50 ms op timeout.
fn nodelay() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Clamp for values passed into Lua, which only counts exactly to 2^53.
fn lua_count(v: u64) -> u64 {
    v.min(1 << 53)
}

/// Numbers for a script in one argument, as little-endian doubles (read by
/// `struct.unpack('<d…')`): Redis's Lua parses no text and builds a smaller
/// ARGV. Each value is clamped by [`lua_count`], so each is exact.
#[derive(Default)]
struct Packed(Vec<u8>);

impl Packed {
    fn push(&mut self, v: u64) -> &mut Self {
        self.0
            .extend_from_slice(&(lua_count(v) as f64).to_le_bytes());
        self
    }

    /// A signed value, clamped to ±2^53.
    fn push_signed(&mut self, v: i64) -> &mut Self {
        let v = v.clamp(-(1 << 53), 1 << 53) as f64;
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// amount, period_ms, capacity scaled: as `RedisStore::spec_args`.
    fn spec(&mut self, spec: &BucketSpec) -> &mut Self {
        self.push(spec.amount())
            .push(spec.period_ms())
            .push_signed(spec.capacity_scaled())
    }
}

impl Packed {
    /// A budget check's period, unit, limit and windows (as the scripts'
    /// budget blocks read them).
    fn check(&mut self, c: &BudgetCheck, limit: bool) -> &mut Self {
        self.push(c.period.index() as u64)
            .push(u64::from(c.unit == BudgetUnit::Cost));
        if limit {
            self.push(c.limit);
        }
        self.push(c.current.start_ms)
            .push(c.current.end_ms)
            .push(c.next.start_ms)
            .push(c.next.end_ms)
    }

    /// The turn-admission budget block of admit_turn.lua (empty: none).
    fn turn_budgets(checks: &[BudgetCheck]) -> Vec<u8> {
        let mut p = Packed::default();
        if !checks.is_empty() {
            p.push(checks.len() as u64);
            for c in checks {
                p.check(c, true);
            }
        }
        p.0
    }

    /// The budget block of reserve_tokens.lua (empty: none).
    fn reserve_budgets(b: Option<&BudgetRequest<'_>>, estimate: u64) -> Vec<u8> {
        let mut p = Packed::default();
        let Some(b) = b.filter(|b| !b.checks.is_empty()) else {
            return p.0;
        };
        p.push(b.checks.len() as u64);
        p.price(b.price.as_ref());
        for c in b.checks {
            p.check(c, true)
                .push(spend::amount(c.unit, b.price.as_ref(), estimate, b.split));
        }
        p.alerts(b.alerts);
        p.0
    }

    /// The alert thresholds: k, then the k percents.
    fn alerts(&mut self, alerts: &[u8]) -> &mut Self {
        let alerts = &alerts[..alerts.len().min(spend::MAX_ALERTS)];
        self.push(alerts.len() as u64);
        for a in alerts {
            self.push(u64::from(*a));
        }
        self
    }

    /// The budget block of settle.lua (empty: none).
    fn settle_budgets(b: Option<&BudgetRequest<'_>>) -> Vec<u8> {
        let mut p = Packed::default();
        let Some(b) = b.filter(|b| !b.checks.is_empty()) else {
            return p.0;
        };
        p.push(b.checks.len() as u64);
        let s = b.split.unwrap_or_default();
        p.push(u64::from(b.split.is_some()))
            .push(s.input)
            .push(s.output)
            .push(s.cached_input);
        for c in b.checks {
            p.check(c, true);
        }
        p.alerts(b.alerts);
        p.0
    }

    /// A price (-1 three times: none).
    fn price(&mut self, price: Option<&Price>) -> &mut Self {
        match price {
            Some(pr) => self.push(pr.input).push(pr.output).push(pr.cached_input),
            None => self.push_signed(-1).push_signed(-1).push_signed(-1),
        }
    }
}

/// The budget limit a script's period number names.
/// The budget limit a reply code names, if `code` is one of the
/// [`BUDGET_PERIODS`](crate::codes::BUDGET_PERIODS) codes from `base`
/// (`ADMIT_BUDGET`, `RESERVE_BUDGET`, `RESERVE_BUDGET_EXCEEDS`).
fn budget_code(code: i64, base: i64) -> Option<Limit> {
    (base..base + crate::codes::BUDGET_PERIODS)
        .contains(&code)
        .then(|| budget_limit(code - base))
        .flatten()
}

fn budget_limit(period: i64) -> Option<Limit> {
    Some(match period {
        0 => Limit::BudgetDaily,
        1 => Limit::BudgetWeekly,
        2 => Limit::BudgetMonthly,
        _ => return None,
    })
}

/// A reply of little-endian doubles (`struct.pack('<d…')`), each an integer
/// the script computed; `None` unless it is exactly `N` of them.
fn unpacked<const N: usize>(reply: &[u8]) -> Option<[i64; N]> {
    if reply.len() != 8 * N {
        return None;
    }
    let mut out = [0; N];
    for (o, c) in out.iter_mut().zip(reply.chunks_exact(8)) {
        *o = f64::from_le_bytes(c.try_into().ok()?) as i64;
    }
    Some(out)
}

impl RedisStore {
    /// Connects to Redis as `config` says.
    ///
    /// A standalone connection is made lazily and re-made after a drop
    /// (no restart needed); a cluster connection needs a reachable seed now
    /// and follows the cluster's slots after.
    ///
    /// # Errors
    ///
    /// A malformed URL, or a cluster none of whose seeds answer.
    pub async fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        let conn = match &config.target {
            RedisTarget::Standalone(url) => {
                if url.starts_with("rediss://") {
                    install_tls_provider();
                }
                let info = url
                    .as_str()
                    .into_connection_info()
                    .map_err(classify)?
                    .set_tcp_settings(nodelay());
                let client = match &config.tls_ca_pem {
                    Some(pem) => redis::Client::build_with_tls(info, certs(pem)),
                    None => redis::Client::open(info),
                }
                .map_err(classify)?;
                let cfg = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(config.op_timeout))
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(200));
                Conn::Single(
                    ConnectionManager::new_lazy_with_config(client, cfg).map_err(classify)?,
                )
            }
            RedisTarget::Cluster(seeds) => {
                if seeds.iter().any(|s| s.starts_with("rediss://")) {
                    install_tls_provider();
                }
                let mut builder = ClusterClientBuilder::new(seeds.clone());
                if let Some(pem) = &config.tls_ca_pem {
                    builder = builder.certs(certs(pem));
                }
                let client = builder
                    .response_timeout(config.op_timeout)
                    .connection_timeout(config.connect_timeout)
                    .retries(2)
                    .tcp_settings(nodelay())
                    .build()
                    .map_err(classify)?;
                Conn::Cluster(client.get_async_connection().await.map_err(classify)?)
            }
        };
        Ok(Self {
            inner: Arc::new(Inner::new(
                conn,
                Keys::new(&config.key_prefix),
                config.op_timeout,
                config.session_retention_ms,
                config.effective_grace_ms(),
            )),
        })
    }

    /// Drives every script with `clock` instead of Redis `TIME`.
    ///
    /// For tests only (the conformance suite runs Redis on a fake clock). In
    /// production every replica must use Redis time, or they disagree.
    pub fn with_clock_override(self, clock: impl Clock) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| {
            Inner::new(
                shared.conn.clone(),
                shared.keys.clone(),
                shared.op_timeout,
                shared.session_retention_ms,
                shared.session_grace_ms,
            )
        });
        Self {
            inner: Arc::new(Inner {
                clock: Some(Arc::new(clock)),
                ..inner
            }),
        }
    }

    fn now_arg(&self) -> u64 {
        self.inner.clock.as_ref().map_or(0, |c| c.now_ms())
    }

    async fn run<T: FromRedisValue>(
        &self,
        op: &'static str,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.inner.conn.clone();
        match tokio::time::timeout(self.inner.op_timeout, inv.invoke_async(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(classify(e)),
            Err(_) => Err(timed_out(op, self.inner.op_timeout.as_millis())),
        }
    }

    async fn cmd<T: FromRedisValue>(&self, op: &'static str, cmd: &Cmd) -> Result<T, StoreError> {
        let mut conn = self.inner.conn.clone();
        match tokio::time::timeout(self.inner.op_timeout, cmd.query_async(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(classify(e)),
            Err(_) => Err(timed_out(op, self.inner.op_timeout.as_millis())),
        }
    }

    /// Redis's clock (or the override), ms.
    async fn now(&self) -> Result<u64, StoreError> {
        if let Some(c) = &self.inner.clock {
            return Ok(c.now_ms());
        }
        let (secs, micros): (u64, u64) = self.cmd("time", &redis::cmd("TIME")).await?;
        Ok(secs * 1_000 + micros / 1_000)
    }

    /// Adds `tokens` to `user`'s count of the minute of `now` in this
    /// replica's top-users counter: no I/O (the store's task flushes it).
    fn count_top(&self, user: &str, now: u64, tokens: i64) {
        self.inner.top.add(user, now, tokens);
    }

    /// Writes this replica's waiting top-users counts to Redis now (the
    /// store's task does so every 200 ms; `top_users` does before it reads).
    ///
    /// # Errors
    ///
    /// Redis failed or timed out; the counts are kept for the next flush.
    pub async fn flush_top_users(&self) -> Result<(), StoreError> {
        let i = &self.inner;
        top::flush(&i.top, &i.conn, &i.keys, i.op_timeout).await
    }

    fn spec_args<'a, 'b>(
        inv: &'b mut ScriptInvocation<'a>,
        spec: &BucketSpec,
    ) -> &'b mut ScriptInvocation<'a> {
        inv.arg(spec.amount())
            .arg(spec.period_ms())
            .arg(spec.capacity_scaled())
    }

    /// `cost` from the bucket at `key` by take_one.lua, waiting at most
    /// `max_wait` ms; a refused bucket is saved refilled if `save_refused`
    /// (take_many's rule), else only if it existed (take_one's). Answers
    /// outcome (1 granted, 2 refused, 3 exceeds capacity), the wait or
    /// retry hint, and the scaled level after.
    async fn take_single(
        &self,
        op: &'static str,
        key: String,
        spec: &BucketSpec,
        cost: u64,
        max_wait: u64,
        save_refused: bool,
    ) -> Result<[i64; 3], StoreError> {
        let too_big = spec.exceeds(cost, max_wait);
        let mut args = Packed::default();
        args.push(self.now_arg())
            .spec(spec)
            .push(if too_big { 0 } else { cost })
            .push(max_wait)
            .push(u64::from(too_big))
            .push(u64::from(save_refused));
        let mut inv = self.inner.scripts.take_one.prepare_invoke();
        inv.key(key).arg(args.0);
        let r: Vec<u8> = self.run(op, &inv).await?;
        match unpacked::<3>(&r) {
            Some(v @ [1..=3, _, _]) => Ok(v),
            _ => Err(bad_reply(op, format!("{r:?}"))),
        }
    }

    fn session_call<'a>(&'a self, session: &str, op: &str) -> ScriptInvocation<'a> {
        let keys = self.inner.keys.session(session);
        let mut inv = self.inner.scripts.session.prepare_invoke();
        inv.key(keys.lease)
            .key(keys.records)
            .key(keys.ids)
            .arg(self.now_arg())
            .arg(op)
            .arg(self.inner.session_retention_ms)
            .arg(self.inner.session_grace_ms);
        inv
    }
}

impl RedisStore {
    /// A grouped session op (`session.lua`): the session's keys, then the
    /// lease hash and records list of each log, all in the session's slot
    /// ([`check_group`] first).
    fn grouped_call<'a>(
        &'a self,
        session: &str,
        op: &str,
        logs: &[LogWrite<'_>],
    ) -> Result<ScriptInvocation<'a>, StoreError> {
        check_group(session, logs)?;
        let mut inv = self.session_call(session, op);
        for l in logs {
            let keys = self.inner.keys.session(l.log);
            inv.key(keys.lease).key(keys.records);
        }
        Ok(inv)
    }

    /// Each log's write: a flag (append or only refresh) and the record.
    fn log_args(inv: &mut ScriptInvocation<'_>, logs: &[LogWrite<'_>]) {
        for l in logs {
            match l.record {
                Some(record) => inv.arg(1).arg(record),
                None => inv.arg(0).arg(""),
            };
        }
    }
}

/// The version of a permit's configured weights that `take_many.lua` keeps
/// with a key's fair state: FNV-1a over the names and weights, in 52 bits
/// (a double holds it exactly). While it is unchanged the script uses the
/// weights it saved with each tenant instead of looking every name up.
fn weights_version(t: &tollgate_core::fair::FairTake<'_>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for &(name, _) in t.weights {
        eat(&(name.len() as u64).to_le_bytes());
        eat(name.as_bytes());
        eat(&t.weight(name).to_le_bytes());
    }
    h & ((1 << 52) - 1)
}

impl RedisStore {
    /// `take_many.lua`: several buckets, a cooldown, and with `fair` the
    /// key's fair-sharing gate (SPEC §5), in one script.
    pub(crate) async fn take_many_script(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
        fair: Option<FairCheck<'_>>,
    ) -> Result<MultiTake, StoreError> {
        use crate::codes::{TAKE_EXCEEDS, TAKE_GRANTED, TAKE_REFUSED};
        let k = &self.inner.keys;
        let mut inv = self.inner.scripts.take_many.prepare_invoke();
        for t in takes {
            inv.key(k.named_bucket(t.key));
        }
        if let Some(c) = cooldown {
            inv.key(k.named(c.key));
        }
        if let Some(f) = fair {
            inv.key(k.named(f.key));
        }
        let mut args = Packed::default();
        args.push(self.now_arg())
            .push(takes.len() as u64)
            .push(u64::from(cooldown.is_some()))
            .push(cooldown.map_or(0, |c| c.max_wait_ms));
        for t in takes {
            let max_wait = t.max_wait_ms.min(t.spec.max_wait_limit());
            // 1: never grantable; 2: grantable only with a wait (which a
            // fair gate may forbid); 0: fits now.
            let exceeds = if t.spec.exceeds(t.cost, max_wait) {
                1
            } else if t.spec.exceeds(t.cost, 0) {
                2
            } else {
                0
            };
            args.spec(&t.spec)
                .push(if exceeds == 1 { 0 } else { t.cost })
                .push(max_wait)
                .push(exceeds);
        }
        if let Some(c) = cooldown {
            args.push(c.max_ms.min(1 << 50));
        }
        inv.arg(args.0);
        if let Some(f) = fair {
            let t = &f.take;
            let mut fa = Packed::default();
            fa.push(t.amount)
                .push(t.period_ms)
                .push(t.capacity)
                .push(t.window_ms)
                .push(weights_version(t))
                .push(t.weights.len() as u64);
            for &(name, _) in t.weights {
                fa.push(u64::from(t.weight(name)));
            }
            inv.arg(fa.0);
            inv.arg(tollgate_core::fair::held_name(t.tenant));
            for &(name, _) in t.weights {
                inv.arg(name);
            }
        }
        let r: Vec<u8> = self.run("take_many", &inv).await?;
        match unpacked::<3>(&r) {
            Some([TAKE_GRANTED, wait, _]) => Ok(MultiTake::Granted { wait_ms: u(wait) }),
            Some([TAKE_REFUSED, index, hint]) => Ok(MultiTake::Refused {
                index: (index > 0).then(|| (index - 1) as usize),
                retry_after_ms: u(hint),
            }),
            Some([TAKE_EXCEEDS, index, _]) if index > 0 => Ok(MultiTake::ExceedsCapacity {
                index: (index - 1) as usize,
            }),
            _ => Err(bad_reply("take_many", format!("{r:?}"))),
        }
    }
}
