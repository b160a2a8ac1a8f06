//! Chaos: nothing is lost when Redis fails. Real `tollgate serve` processes built from this tree, on a real
//! Redis that the harness breaks while client tasks drive the API over
//! loopback HTTP; afterwards the store itself is read to check that what
//! the clients were told holds there.
//!
//! Two servers run side by side on the same store, one `fail_open`
//! (`fallback_share = 0.1`) and one `fail_closed`, each with its own users
//! (one per client: a user's expected state is the sum of one client's
//! record):
//!
//! * three workers, each keeping up to [`OPEN_RUNS`] runs open: every tick
//!   admit (`POST /v1/runs`) and reserve (`POST /v1/tokens/reserve`) a new
//!   run, and close the oldest (`POST /v1/tokens/settle`, then
//!   `DELETE /v1/runs/{id}`) when more than [`OPEN_RUNS`] are open or the
//!   new one failed; so under `fail_closed` the closes of the runs opened
//!   before the fault meet the failing store;
//! * a straddle client per server that opens [`STRADDLE`] runs in steady
//!   state and closes them all at once the moment the fault is applied
//!   (right after the SIGKILL, the SIGSTOP, the `DEBUG SLEEP`, or the
//!   master's SIGKILL): closes that meet the store exactly as it breaks;
//! * a probe acquiring a session lease (`POST /v1/sessions/{id}/lease`),
//!   which always fails closed, so its 2xx proves the store answered under
//!   either policy.
//!
//! The plan's buckets refill one unit per 10^9 ms (11.6 days): over the test
//! no bucket gains a whole token, so each user's level in Redis is exactly
//! what its client's record implies (see [`check_scenario`]).
//!
//! Faults, each for about 3 s after 1 s of steady state:
//!
//! * `kill+restart`: SIGKILL of `redis-server`, restarted on the same port
//!   3 s later (appendonly, `appendfsync always`: it keeps what it
//!   acknowledged);
//! * `sigstop`: SIGSTOP, SIGCONT 3 s later (a hung server: connections stay
//!   open, nothing answers, and every command sent meanwhile, the
//!   straddle's settles among them, runs once it wakes: after the server
//!   gave up on it and journalled it);
//! * `debug-sleep`: `DEBUG SLEEP 3` (the event loop blocked; the same
//!   queued commands);
//! * `cluster-failover`: on a 3-master, 3-replica cluster (node timeout
//!   1 s), SIGKILL of the master serving every client's user, until its
//!   replica is promoted.
//!
//! What each row asserts is in [`check_scenario`] and [`check_server`];
//! one table row per fault × policy (run with `--nocapture`, or set
//! `TOLLGATE_CHAOS_TABLE=<file>`), then a line of detail per row.
//!
//! Bounded: well under two minutes in all, loopback only, every loop stops
//! by itself.

// A chaos test measures real processes in real time: wall-clock instants
// and real sleeps while a fault lasts.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde_json::{Value, json};
use tollgate_testkit::redis::{RedisCluster, RedisServer, key_slot, unique_prefix};

use common::TempDir;

mod common;

const ADMIN: &str = "chaos-admin-token-0123456789abcdef";
/// How long each fault lasts (the cluster's: until the failover is done).
const FAULT: Duration = Duration::from_secs(3);
/// Steady state before a fault.
const WARMUP: Duration = Duration::from_secs(1);
/// The longest recovery asserted (within 2 s of the store answering, SPEC §6).
const RECOVERY_BOUND: Duration = Duration::from_secs(2);
/// The same after a cluster failover: a newly promoted master (six
/// appendfsync-always nodes on one disk) can time out a few calls while the
/// journal is replayed, which reopens the breaker for one more `open_ms`
/// (1 s); seen in 2 of 9 runs at 2.3 and 2.5 s. Stated in the closing note
/// of #17 as a deviation.
const CLUSTER_RECOVERY_BOUND: Duration = Duration::from_secs(3);
/// How long to wait for recovery after the store is back before giving up.
const RECOVERY_WAIT: Duration = Duration::from_secs(4);
/// How long, after the clients stopped, the journal may take to empty and
/// the owed charges to be reconciled before that is a failure.
const DRAIN_WAIT: Duration = Duration::from_secs(5);
/// One client's pace: one step, then wait for the next tick.
const TICK: Duration = Duration::from_millis(25);
const WORKERS: usize = 3;
/// Runs a worker keeps open.
const OPEN_RUNS: usize = 6;
/// Runs the straddle client closes as the fault begins.
const STRADDLE: usize = 8;
/// Every reservation's estimate; settles charge [`actual`].
const ESTIMATE: u64 = 100;
/// The servers' Redis operation timeout.
const OP_TIMEOUT: Duration = Duration::from_millis(200);
/// The plan's token burst (the bucket's capacity).
const TOKEN_BURST: u64 = 20_000;
/// The plan's turn burst.
const TURN_BURST: u64 = 1_000_000;
/// Both buckets refill 1 unit per this period: negligible over the test.
const SLOW_PERIOD_MS: u64 = 1_000_000_000;
/// The `fail_open` server's share of each limit while the store fails.
const FALLBACK_SHARE: f64 = 0.1;
/// Replicas deciding for one user while the store fails: each user is
/// served by one server, and the `fail_closed` one grants nothing.
const REPLICAS_PER_USER: f64 = 1.0;
/// A cluster failover may lose what the dead master acknowledged this long
/// before it died and had not replicated (SPEC §6: "typically under a
/// second"); on one durable node nothing is lost.
const LOSS_WINDOW: Duration = Duration::from_secs(1);

/// The tokens a settle of call `n` charges: 60 to 120, so settles both
/// give back and charge more than the estimate.
fn actual(n: u64) -> u64 {
    60 + (n * 7) % 61
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    FailOpen,
    FailClosed,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
        }
    }
}

/// A `tollgate serve` process, under a watchdog that ends it when this test
/// process ends however it ends (as the Redis servers' do).
struct Tollgate {
    policy: Policy,
    watchdog: Option<Child>,
    pid: u32,
    url: String,
    /// The store's key prefix (`[store] key_prefix`).
    prefix: String,
    dir: TempDir,
}

impl Tollgate {
    /// Serves `store` (a `[store]` table without `failure`) under `policy`.
    fn start(policy: Policy, store: &str) -> Self {
        let dir = TempDir::new();
        let cfg = dir.path().join("tollgate.toml");
        let prefix = unique_prefix();
        let share = match policy {
            Policy::FailOpen => format!("fallback_share = {FALLBACK_SHARE}\n"),
            Policy::FailClosed => String::new(),
        };
        std::fs::write(
            &cfg,
            format!(
                r#"listen = "127.0.0.1:0"
admin_token = "{ADMIN}"
default_plan = "chaos"

{store}
failure = "{}"
{share}op_timeout_ms = {}
connect_timeout_ms = 500
key_prefix = "{prefix}"

[identity]
mode = "dev"

[plans.chaos]
turns = {{ amount = 1, period_ms = {SLOW_PERIOD_MS}, burst = {TURN_BURST} }}
tokens = {{ amount = 1, period_ms = {SLOW_PERIOD_MS}, burst = {TOKEN_BURST} }}
concurrent_runs = 1000
max_wait_ms = 0
max_sessions = 1000
"#,
                policy.name(),
                OP_TIMEOUT.as_millis(),
            ),
        )
        .expect("write config");
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(concat!(
                r#"bin="$1"; shift; "$bin" "$@" >"$TG_OUT" 2>"$TG_ERR" & pid=$!; "#,
                r#"echo $pid; read _; kill $pid 2>/dev/null; wait $pid"#
            ))
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_tollgate"))
            .arg("serve")
            .arg("--config")
            .arg(&cfg)
            .env("TG_OUT", dir.path().join("stdout"))
            .env("TG_ERR", dir.path().join("stderr"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tollgate serve");
        let mut line = String::new();
        BufReader::new(watchdog.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid = line.trim().parse().expect("the server's pid");
        let mut s = Self {
            policy,
            watchdog: Some(watchdog),
            pid,
            url: String::new(),
            prefix,
            dir,
        };
        let start = Instant::now();
        while s.url.is_empty() {
            if let Some(l) = s
                .stdout()
                .lines()
                .find(|l| l.starts_with("tollgate listening on "))
            {
                s.url = l.trim_start_matches("tollgate listening on ").to_owned();
            } else {
                assert!(
                    start.elapsed() < Duration::from_secs(20) && s.alive(),
                    "tollgate serve did not start:\n{}\n{}",
                    s.stdout(),
                    s.stderr()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        s
    }

    fn stdout(&self) -> String {
        read(&self.dir.path().join("stdout"))
    }

    fn stderr(&self) -> String {
        read(&self.dir.path().join("stderr"))
    }

    /// The process started first still runs (not a zombie).
    fn alive(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).is_ok_and(|st| {
            st.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            drop(w.stdin.take());
            let _ = w.wait();
        }
        // `TOLLGATE_CHAOS_LOGS=<dir>`: keep the server's output there.
        if let Some(d) = std::env::var_os("TOLLGATE_CHAOS_LOGS") {
            let d = PathBuf::from(d);
            let _ = std::fs::create_dir_all(&d);
            for f in ["stdout", "stderr"] {
                let _ = std::fs::copy(
                    self.dir.path().join(f),
                    d.join(format!("{}-{}.{f}", self.pid, self.policy.name())),
                );
            }
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// A dev-mode token for `user` (HS256 with the well-known secret), valid
/// for an hour of real time: what `tollgate token --user` prints.
fn token(user: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &json!({"sub": user, "exp": now + 3_600}),
        &jsonwebtoken::EncodingKey::from_secret(tollgate_server::identity::DEV_SECRET.as_bytes()),
    )
    .unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Admit,
    Reserve,
    Settle,
    Release,
    /// The session-lease probe: its 2xx needs the store.
    Probe,
}

/// One request: when it went and came back, and its status (`None`: no
/// answer, a transport error or the client's timeout).
#[derive(Clone, Debug)]
struct Rec {
    op: Op,
    user: String,
    done: Instant,
    status: Option<u16>,
    /// The refusal's `error` code, if any.
    error: Option<String>,
}

/// A granted reservation.
#[derive(Clone, Debug)]
struct Grant {
    user: String,
    id: String,
    /// The run's invocation id and the call number (the store's record).
    inv: String,
    call: u64,
    estimate: u64,
    done: Instant,
    /// Issued by the replica's fallback (`f{tag}.{call}.{inv}`).
    fallback: bool,
}

/// A settle the clients sent.
#[derive(Clone, Debug)]
struct Settled {
    user: String,
    id: String,
    actual: u64,
    sent: Instant,
    done: Instant,
    status: Option<u16>,
    /// `pending: true`: journalled, to be applied when the store answers.
    pending: bool,
    straddle: bool,
}

/// A release the clients sent.
#[derive(Clone, Debug)]
struct Released {
    user: String,
    inv: String,
    done: Instant,
    status: Option<u16>,
    pending: bool,
}

/// An admission the clients asked for.
#[derive(Clone, Debug)]
struct Admitted {
    user: String,
    inv: String,
    sent: Instant,
    done: Instant,
    status: Option<u16>,
}

/// One scrape of `/metrics`.
#[derive(Clone, Debug)]
struct Sample {
    at: Instant,
    depth: f64,
    oldest_age_s: f64,
    owed: f64,
    closed: bool,
    expired: f64,
    in_flight: f64,
}

impl Sample {
    fn parse(at: Instant, text: &str) -> Option<Self> {
        let m = |p: &str| common::metric(text, p);
        Some(Self {
            at,
            depth: m("tollgate_store_journal_depth ")?,
            oldest_age_s: m("tollgate_store_journal_oldest_age_seconds ")?,
            owed: m("tollgate_store_owed_users ")?,
            closed: m("tollgate_store_breaker_state{state=\"closed\"} ")? == 1.0,
            expired: m("tollgate_store_journal_expired_total ")?,
            in_flight: m("tollgate_turns_in_flight ")?,
        })
    }

    /// Nothing waits for the store: the journal applied, the fallback's
    /// charges reconciled, the breaker closed.
    fn quiet(&self) -> bool {
        self.depth == 0.0 && self.owed == 0.0 && self.closed
    }
}

#[derive(Default)]
struct Log {
    recs: Vec<Rec>,
    grants: Vec<Grant>,
    settled: Vec<Settled>,
    released: Vec<Released>,
    admitted: Vec<Admitted>,
    samples: Vec<Sample>,
    /// The straddle's reserves: status and latency.
    straddle_reserves: Vec<(Option<u16>, Duration)>,
}

/// A run a client holds: its invocation, number and reservation.
#[derive(Clone, Debug)]
struct Open {
    inv: String,
    n: u64,
    reservation: Option<String>,
}

/// One client's connection to one server.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
    user: String,
    auth: String,
    straddle: bool,
    log: Arc<Mutex<Log>>,
}

impl Client {
    async fn send(&self, op: Op, req: reqwest::RequestBuilder) -> (Option<u16>, Value, Instant) {
        let sent = Instant::now();
        let (status, body) = match req.bearer_auth(&self.auth).send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                (Some(status), r.json().await.unwrap_or(Value::Null))
            }
            Err(_) => (None, Value::Null),
        };
        self.log.lock().recs.push(Rec {
            op,
            user: self.user.clone(),
            done: Instant::now(),
            status,
            error: body["error"].as_str().map(str::to_owned),
        });
        (status, body, sent)
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.post(format!("{}{path}", self.base))
    }

    /// Admits run `n` and reserves for it; `None` if the admission failed.
    async fn open(&self, n: u64) -> Option<Open> {
        let inv = format!("{}-{n}", self.user);
        let (status, _, sent) = self
            .send(
                Op::Admit,
                self.post("/v1/runs").json(&json!({"invocation_id": inv})),
            )
            .await;
        self.log.lock().admitted.push(Admitted {
            user: self.user.clone(),
            inv: inv.clone(),
            sent,
            done: Instant::now(),
            status,
        });
        if !ok(status) {
            return None;
        }
        let (reservation, _) = self.reserve(&inv).await;
        Some(Open {
            inv,
            n,
            reservation,
        })
    }

    /// Reserves [`ESTIMATE`] for run `inv`: the reservation id if granted,
    /// and the status and latency of the answer.
    async fn reserve(&self, inv: &str) -> (Option<String>, (Option<u16>, Duration)) {
        let (status, body, sent) = self
            .send(
                Op::Reserve,
                self.post("/v1/tokens/reserve")
                    .json(&json!({"invocation_id": inv, "estimate": ESTIMATE})),
            )
            .await;
        let answer = (status, Instant::now() - sent);
        let Some(id) = body["reservation_id"].as_str().filter(|_| ok(status)) else {
            return (None, answer);
        };
        let (call, fallback) = parse_reservation(id, inv)
            .unwrap_or_else(|| panic!("a reservation id of an unknown form: {id}"));
        self.log.lock().grants.push(Grant {
            user: self.user.clone(),
            id: id.to_owned(),
            inv: inv.to_owned(),
            call,
            estimate: ESTIMATE,
            done: Instant::now(),
            fallback,
        });
        (Some(id.to_owned()), answer)
    }

    async fn settle(&self, id: &str, actual: u64) {
        let (status, body, sent) = self
            .send(
                Op::Settle,
                self.post("/v1/tokens/settle")
                    .json(&json!({"reservation_id": id, "actual": actual})),
            )
            .await;
        self.log.lock().settled.push(Settled {
            user: self.user.clone(),
            id: id.to_owned(),
            actual,
            sent,
            done: Instant::now(),
            status,
            pending: body["pending"] == json!(true),
            straddle: self.straddle,
        });
    }

    async fn release(&self, inv: String) {
        let del = self.http.delete(format!("{}/v1/runs/{inv}", self.base));
        let (status, body, _) = self.send(Op::Release, del).await;
        self.log.lock().released.push(Released {
            user: self.user.clone(),
            inv,
            done: Instant::now(),
            status,
            pending: body["pending"] == json!(true),
        });
    }

    /// Settles the run's reservation (if any), then releases the run.
    async fn close(&self, o: Open) {
        if let Some(id) = &o.reservation {
            self.settle(id, actual(o.n)).await;
        }
        self.release(o.inv).await;
    }

    /// The straddle's close, sent as the fault strikes: the settle of the
    /// run's reservation and a second reserve for the run at once (both
    /// meet the breaking store; after a SIGSTOP or a DEBUG SLEEP both are
    /// queued there and run later), then the settle of that second
    /// reservation if one was granted (by the fallback), then the release.
    async fn close_straddle(&self, o: Open) {
        let settle = async {
            if let Some(id) = &o.reservation {
                self.settle(id, actual(o.n)).await;
            }
        };
        let ((), (second, answer)) = tokio::join!(settle, self.reserve(&o.inv));
        self.log.lock().straddle_reserves.push(answer);
        if let Some(id) = second {
            self.settle(&id, actual(o.n + 1)).await;
        }
        self.release(o.inv).await;
    }

    /// Opens a run each tick and closes the oldest when more than
    /// [`OPEN_RUNS`] are open or the new one failed; after `stop`, closes
    /// what is left (the store answers again by then).
    async fn work(&self, stop: &AtomicBool) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut open = VecDeque::new();
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let opened = self.open(n).await;
            n += 1;
            let failed = opened.is_none();
            open.extend(opened);
            if (open.len() > OPEN_RUNS || failed)
                && let Some(o) = open.pop_front()
            {
                self.close(o).await;
            }
        }
        while let Some(o) = open.pop_front() {
            self.close(o).await;
        }
    }

    async fn probe(&self, stop: &AtomicBool) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let req = self
                .post("/v1/sessions/probe/lease")
                .json(&json!({"holder": "probe", "ttl_ms": 10_000}));
            self.send(Op::Probe, req).await;
        }
    }
}

/// `(call, issued by a fallback)` of reservation `id` of run `inv`: the
/// store's `{call}.{inv}` or a fallback's `f{tag}.{call}.{inv}` (SPEC §2).
fn parse_reservation(id: &str, inv: &str) -> Option<(u64, bool)> {
    let head = id.strip_suffix(inv)?.strip_suffix('.')?;
    match head.strip_prefix('f') {
        Some(rest) => {
            let (tag, call) = rest.split_once('.')?;
            (tag.len() == 8).then_some(())?;
            Some((call.parse().ok()?, true))
        }
        None => Some((head.parse().ok()?, false)),
    }
}

fn ok(status: Option<u16>) -> bool {
    status.is_some_and(|s| (200..300).contains(&s))
}

/// When the fault began, when it had struck (the server killed or
/// stopped, the sleep sent), and when the store answered again.
#[derive(Clone, Copy, Debug)]
struct Window {
    start: Instant,
    struck: Instant,
    back: Instant,
}

/// What the store holds for one user after recovery, read from Redis.
#[derive(Debug, Default)]
struct InStore {
    /// Whole tokens and turns in the user's buckets.
    tokens: i64,
    turns: i64,
    /// Invocation ids in the user's run lease set, live by Redis `TIME`.
    leases: Vec<String>,
    /// Store-issued reservations still open (`o<call>` in the run's hash).
    open: HashSet<String>,
    /// Store-issued reservations whose run record is gone.
    missing: HashSet<String>,
    /// Run records with a reservation open (see [`Direct::open_records`]).
    open_records: Vec<String>,
}

/// The store's answers to settles repeated after recovery.
#[derive(Debug, Default)]
struct Repeats {
    sent: usize,
    /// Answered 200 with `balance` equal to the level before it.
    unchanged: usize,
    /// Anything else, described (a token level they moved included).
    odd: Vec<String>,
}

/// Reads the store's keys, on the node that serves them.
enum Direct<'a> {
    Single(&'a RedisServer),
    Cluster(&'a RedisCluster),
}

impl Direct<'_> {
    /// The node serving `user`'s keys (tag `{user}`).
    fn node(&self, user: &str) -> Result<&RedisServer, String> {
        match self {
            Direct::Single(r) => Ok(r),
            Direct::Cluster(c) => {
                let port = c
                    .master_of(key_slot(&format!("{{{user}}}")))
                    .map_err(|e| e.to_string())?;
                c.nodes()
                    .iter()
                    .find(|n| n.port() == port)
                    .ok_or_else(|| format!("no node on port {port}"))
            }
        }
    }

    /// A bucket's whole units from its packed string (the turn bucket and
    /// the token bucket: `bucket_load` and `tok_load` in
    /// scripts/prelude.lua, the level and its period first), unpacked by a
    /// script that answers the scaled level and period as integers.
    fn level(node: &RedisServer, key: &str, full: u64) -> Result<i64, String> {
        const UNPACK: &str = "local v = redis.call('GET', KEYS[1]) \
            if not v then return {} end \
            local l, _, _, p = struct.unpack('<dddd', v) return {l, p}";
        let v = node
            .command(&["EVAL", UNPACK, "1", key])
            .map_err(|e| format!("GET {key}: {e}"))?;
        let mut it = v.lines().filter(|l| !l.is_empty());
        Self::units(key, it.next(), it.next(), full)
    }

    /// `floor(l / p)` of a bucket's scaled level and period as Redis
    /// answered them, or `full` when there is no level (a missing bucket).
    fn units(key: &str, l: Option<&str>, p: Option<&str>, full: u64) -> Result<i64, String> {
        let (l, p) = (l.unwrap_or(""), p.unwrap_or(""));
        if l.is_empty() {
            return Ok(full as i64);
        }
        let num = |s: &str| -> Result<i64, String> {
            s.parse::<i64>()
                .or_else(|_| s.parse::<f64>().map(|f| f as i64))
                .map_err(|_| format!("{key}: not a number: {s:?}"))
        };
        Ok(num(l)?.div_euclid(num(p)?))
    }

    /// Every run record of `user` holding an open reservation: `inv:
    /// o<call>=<charged> …, r<request>=<call:ready> …`.
    fn open_records(&self, prefix: &str, user: &str) -> Result<Vec<String>, String> {
        let node = self.node(user)?;
        let pattern = format!("{prefix}:inv:{{{user}}}:*");
        let mut cursor = "0".to_owned();
        let mut keys = Vec::new();
        loop {
            let page = node
                .command(&["SCAN", &cursor, "MATCH", &pattern, "COUNT", "1000"])
                .map_err(|e| e.to_string())?;
            let mut lines = page.lines();
            cursor = lines.next().unwrap_or("0").to_owned();
            keys.extend(lines.filter(|l| !l.is_empty()).map(str::to_owned));
            if cursor == "0" {
                break;
            }
        }
        let mut out = Vec::new();
        for k in keys {
            let all = node.command(&["HGETALL", &k]).map_err(|e| e.to_string())?;
            let fields: Vec<&str> = all.lines().collect();
            let pairs: Vec<String> = fields
                .chunks(2)
                .filter(|c| c.len() == 2)
                .map(|c| format!("{}={}", c[0], c[1]))
                .collect();
            if pairs.iter().any(|p| p.starts_with('o')) {
                let inv = k.rsplit(':').next().unwrap_or(&k).to_owned();
                out.push(format!("{inv}: {}", pairs.join(" ")));
            }
        }
        Ok(out)
    }

    fn tokens(&self, prefix: &str, user: &str) -> Result<i64, String> {
        Self::level(
            self.node(user)?,
            &format!("{prefix}:tok2:{{{user}}}"),
            TOKEN_BURST,
        )
    }

    /// Everything [`InStore`] holds for `user`, whose store-issued
    /// reservations are `grants`.
    fn read(&self, prefix: &str, user: &str, grants: &[&Grant]) -> Result<InStore, String> {
        assert!(
            !user.contains(['%', '{', '}', ':']),
            "ids are used unescaped"
        );
        let node = self.node(user)?;
        let time = node.command(&["TIME"]).map_err(|e| e.to_string())?;
        let mut t = time.lines().map(|x| x.parse::<u64>().unwrap_or(0));
        let now_ms = t.next().unwrap_or(0) * 1_000 + t.next().unwrap_or(0) / 1_000;
        let lease_key = format!("{prefix}:lease:{{{user}}}");
        let listed = node
            .command(&["ZRANGE", &lease_key, "0", "-1", "WITHSCORES"])
            .map_err(|e| e.to_string())?;
        let lines: Vec<&str> = listed.lines().filter(|l| !l.is_empty()).collect();
        let leases = lines
            .chunks(2)
            .filter(|c| c.len() == 2 && c[1].parse::<f64>().is_ok_and(|s| s > now_ms as f64))
            .map(|c| c[0].to_owned())
            .collect();
        let mut s = InStore {
            tokens: Self::level(node, &format!("{prefix}:tok2:{{{user}}}"), TOKEN_BURST)?,
            turns: Self::level(node, &format!("{prefix}:turn2:{{{user}}}"), TURN_BURST)?,
            leases,
            ..InStore::default()
        };
        for g in grants {
            let key = format!("{prefix}:inv:{{{user}}}:{}", g.inv);
            let v = node
                .command(&["HMGET", &key, "c", &format!("o{}", g.call)])
                .map_err(|e| e.to_string())?;
            let mut it = v.lines();
            let (calls, open) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            if calls.is_empty() {
                s.missing.insert(g.id.clone());
            } else if !open.is_empty() {
                s.open.insert(g.id.clone());
            }
        }
        Ok(s)
    }
}

/// Everything one fault × policy saw: what a check needs.
struct ScenarioRun {
    fault: &'static str,
    policy: Policy,
    prefix: String,
    url: String,
    window: Window,
    /// From the clients' start to the store's state checked.
    wall: Duration,
    /// The workers' users, then the straddle's.
    users: Vec<String>,
    log: Log,
    /// From the store answering again to the replica quiet (journal empty,
    /// nothing owed, breaker closed), if it got there.
    drained: Option<Duration>,
    /// The last scrape, once quiet (or when the wait gave up).
    after: Option<Sample>,
    /// `GET /admin/users/{user}` of every user, after recovery.
    store_after: Vec<(String, Value)>,
    /// Filled by [`verify`]: the store's state of each user, and the
    /// repeated settles.
    in_store: BTreeMap<String, Result<InStore, String>>,
    repeats: Repeats,
}

impl ScenarioRun {
    /// The first 2xx that needed the store, completed after it was back.
    fn recovery(&self) -> Option<Duration> {
        self.log
            .recs
            .iter()
            .filter(|r| r.done >= self.window.back && ok(r.status))
            .filter(|r| r.op == Op::Probe || self.policy == Policy::FailClosed)
            .map(|r| r.done - self.window.back)
            .min()
    }

    fn in_fault(&self, t: Instant) -> bool {
        t >= self.window.start && t < self.window.back
    }

    /// Whether `t` is when a cluster's dead master may have acknowledged a
    /// write it never replicated.
    fn lossy(&self, t: Instant) -> bool {
        self.fault == "cluster-failover"
            && t + LOSS_WINDOW >= self.window.start
            && t <= self.window.start + Duration::from_millis(100)
    }

    fn settle_of(&self) -> HashMap<&str, &Settled> {
        self.log
            .settled
            .iter()
            .map(|s| (s.id.as_str(), s))
            .collect()
    }

    /// The tokens a grant cost its user: `actual` once settled (2xx,
    /// pending included), else its estimate (open).
    fn cost(g: &Grant, settles: &HashMap<&str, &Settled>) -> u64 {
        settles
            .get(g.id.as_str())
            .filter(|s| ok(s.status))
            .map_or(g.estimate, |s| s.actual)
    }

    /// The tokens the fallback granted `user`: each fallback reservation's
    /// estimate, less what its settle gave back (`min(actual, estimate)`
    /// once settled). A settle above the estimate is not a grant: the
    /// bucket charges the excess as debt (as the store's would), so the
    /// user's total use can pass the bound by that debt, which
    /// reconciliation carries into Redis (see [`Self::fallback_debt`]).
    fn fallback_granted(&self, user: &str) -> u64 {
        let settles = self.settle_of();
        self.log
            .grants
            .iter()
            .filter(|g| g.fallback && g.user == user)
            .map(|g| Self::cost(g, &settles).min(g.estimate))
            .sum()
    }

    /// What settles above the estimate charged `user` beyond its fallback
    /// grants.
    fn fallback_debt(&self, user: &str) -> u64 {
        let settles = self.settle_of();
        self.log
            .grants
            .iter()
            .filter(|g| g.fallback && g.user == user)
            .map(|g| Self::cost(g, &settles).saturating_sub(g.estimate))
            .sum()
    }

    /// SPEC §6's bound on one user's tokens from the fleet while the store
    /// fails: N × fallback_share × (burst + rate × T), T at most the whole
    /// scenario (the rate is 1 token per 10^9 ms: T adds nothing whole).
    fn overshoot_bound(&self) -> f64 {
        match self.policy {
            Policy::FailClosed => 0.0,
            Policy::FailOpen => {
                let t_ms = self.wall.as_millis() as f64;
                REPLICAS_PER_USER
                    * FALLBACK_SHARE
                    * (TOKEN_BURST as f64 + t_ms / SLOW_PERIOD_MS as f64)
            }
        }
    }

    fn count(&self, f: impl Fn(&Rec) -> bool) -> usize {
        self.log
            .recs
            .iter()
            .filter(|r| r.op != Op::Probe && f(r))
            .count()
    }

    /// Closes answered `pending: true`, and of those how many the store
    /// shows applied: a settle's reservation closed in Redis (and its
    /// repeat answered `balance`, unchanged: counted in `repeats`), a
    /// release's run holding no lease in Redis.
    fn journalled(&self) -> (usize, usize) {
        let mut pending = 0;
        let mut applied = 0;
        for s in self.log.settled.iter().filter(|s| s.pending) {
            pending += 1;
            if let Some(Ok(st)) = self.in_store.get(&s.user)
                && !st.open.contains(&s.id)
                && !st.missing.contains(&s.id)
            {
                applied += 1;
            }
        }
        for r in self.log.released.iter().filter(|r| r.pending) {
            pending += 1;
            if let Some(Ok(st)) = self.in_store.get(&r.user)
                && !st.leases.contains(&r.inv)
            {
                applied += 1;
            }
        }
        (pending, applied)
    }

    /// Per user: (tokens used in Redis, tokens the record implies), and
    /// the same for turns, with the ghosts (leases of runs no client was
    /// admitted).
    fn accounting(&self, user: &str, st: &InStore) -> Accounting {
        let settles = self.settle_of();
        let expected_tokens: u64 = self
            .log
            .grants
            .iter()
            .filter(|g| g.user == user)
            .map(|g| Self::cost(g, &settles))
            .sum();
        let admitted: HashSet<&str> = self
            .log
            .admitted
            .iter()
            .filter(|a| a.user == user && ok(a.status))
            .map(|a| a.inv.as_str())
            .collect();
        let ghosts = st
            .leases
            .iter()
            .filter(|l| !admitted.contains(l.as_str()))
            .count();
        // An admission whose store call failed after it was sent (it
        // timed out, or was in flight when the fault struck) may have run
        // there: refused to its client, its turn stays taken and the
        // replica releases its lease when the store answers (no ghost);
        // under fail_open, decided by the fallback too, it is charged once
        // unless its run was released in the store before reconciliation.
        let ambiguous = |granted: bool| {
            self.log
                .admitted
                .iter()
                .filter(|a| a.user == user && ok(a.status) == granted)
                .filter(|a| {
                    a.done - a.sent >= OP_TIMEOUT
                        || (a.sent <= self.window.struck && a.done >= self.window.start)
                })
                .count()
        };
        Accounting {
            tokens_used: TOKEN_BURST as i64 - st.tokens,
            tokens_expected: expected_tokens as i64,
            turns_used: TURN_BURST as i64 - st.turns,
            turns_expected: (admitted.len() + ghosts) as i64,
            ghosts,
            ambiguous_refused: ambiguous(false),
            ambiguous_granted: ambiguous(true),
        }
    }

    /// The tokens a cluster failover may have lost for `user`: what the
    /// dead master acknowledged in [`LOSS_WINDOW`] (a reserve's estimate,
    /// a settle's adjustment, at most the estimate).
    fn loss_allowance(&self, user: &str) -> (i64, i64) {
        let tokens = self
            .log
            .grants
            .iter()
            .filter(|g| g.user == user && !g.fallback && self.lossy(g.done))
            .count()
            + self
                .log
                .settled
                .iter()
                .filter(|s| s.user == user && self.lossy(s.done))
                .count();
        let turns = self
            .log
            .admitted
            .iter()
            .filter(|a| a.user == user && ok(a.status) && self.lossy(a.done))
            .count();
        (tokens as i64 * ESTIMATE as i64, turns as i64)
    }

    fn row(&self) -> String {
        let c = |f: &dyn Fn(u16) -> bool| self.count(|r| r.status.is_some_and(f));
        let other = self.count(|r| {
            !r.status
                .is_some_and(|s| (200..300).contains(&s) || s == 429 || s == 503)
        });
        let (pending, applied) = self.journalled();
        let max_fallback = self.users[..WORKERS]
            .iter()
            .map(|u| self.fallback_granted(u))
            .max()
            .unwrap_or(0);
        let mut d_tokens = 0;
        let mut d_turns = 0;
        let mut leases = 0;
        let mut ghosts = 0;
        for (u, st) in &self.in_store {
            if let Ok(st) = st {
                let a = self.accounting(u, st);
                d_tokens += a.tokens_used - a.tokens_expected;
                d_turns += a.turns_used - a.turns_expected;
                leases += st.leases.len();
                ghosts += a.ghosts;
            }
        }
        let ms = |d: Option<Duration>| {
            d.map_or_else(|| "none".to_owned(), |d| format!("{} ms", d.as_millis()))
        };
        format!(
            "| {:<16} | {:<11} | {:>5} | {:>5} | {:>4} | {:>4} | {:>3} | {:>3} / {:>3} | {:>3} / {:>3} | {:>4} / {:>4.0} | {:>+4} | {:>+3} | {:>2} ({}) | {:>7} | {:>7} | {:>4.1} s |",
            self.fault,
            self.policy.name(),
            self.count(|_| true),
            c(&|s| (200..300).contains(&s)),
            c(&|s| s == 429),
            c(&|s| s == 503),
            other,
            pending,
            applied,
            self.repeats.unchanged,
            self.repeats.sent,
            max_fallback,
            self.overshoot_bound(),
            d_tokens,
            d_turns,
            leases,
            ghosts,
            ms(self.recovery()),
            ms(self.drained),
            self.wall.as_secs_f64(),
        )
    }

    /// A line of detail: where the numbers of the row come from.
    fn detail(&self) -> String {
        let settles = self.settle_of();
        let redis_settled: u64 = self
            .log
            .grants
            .iter()
            .filter(|g| !g.fallback)
            .filter_map(|g| settles.get(g.id.as_str()).filter(|s| ok(s.status)))
            .map(|s| s.actual)
            .sum();
        let fallback: u64 = self.users.iter().map(|u| self.fallback_granted(u)).sum();
        let debt: u64 = self.users.iter().map(|u| self.fallback_debt(u)).sum();
        let straddle: Vec<&Settled> = self
            .log
            .settled
            .iter()
            .filter(|s| s.straddle && !s.id.starts_with('f'))
            .collect();
        let max_wait = straddle
            .iter()
            .map(|s| (s.done - s.sent).as_millis())
            .max()
            .unwrap_or(0);
        let reserves = &self.log.straddle_reserves;
        let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
        for (s, _) in reserves {
            *statuses
                .entry(s.map_or_else(|| "none".to_owned(), |s| s.to_string()))
                .or_default() += 1;
        }
        let reserve_wait = reserves
            .iter()
            .map(|(_, d)| d.as_millis())
            .max()
            .unwrap_or(0);
        let during: Vec<&Sample> = self
            .log
            .samples
            .iter()
            .filter(|s| self.in_fault(s.at))
            .collect();
        let max_depth = during.iter().map(|s| s.depth).fold(0.0, f64::max);
        let max_age = during.iter().map(|s| s.oldest_age_s).fold(0.0, f64::max);
        let max_owed = self.log.samples.iter().map(|s| s.owed).fold(0.0, f64::max);
        let odd = odd_answers(self);
        format!(
            "{} / {}: Redis-issued settled Σactual {redis_settled}, fallback granted {fallback} + debt of settles over estimate {debt} (all users); straddle: {} settles, {} pending, slowest {max_wait} ms, second reserves {statuses:?}, slowest {reserve_wait} ms; journal depth during the fault max {max_depth} (oldest {max_age:.1} s), owed users max {max_owed}; after: {}{}",
            self.fault,
            self.policy.name(),
            straddle.len(),
            straddle.iter().filter(|s| s.pending).count(),
            self.after.as_ref().map_or_else(
                || "no scrape".to_owned(),
                |s| format!(
                    "depth {}, owed {}, breaker closed {}, expired {}, turns in flight {}",
                    s.depth, s.owed, s.closed, s.expired, s.in_flight
                )
            ),
            if odd.is_empty() {
                String::new()
            } else {
                format!("; other answers: {odd}")
            }
        )
    }
}

#[derive(Debug)]
struct Accounting {
    tokens_used: i64,
    tokens_expected: i64,
    turns_used: i64,
    turns_expected: i64,
    ghosts: usize,
    ambiguous_refused: usize,
    ambiguous_granted: usize,
}

/// The answers other than 2xx, 429 and 503, by operation, status and error
/// code and when it was answered, e.g. `Settle 404 unknown_reservation
/// during the fault ×2`.
fn odd_answers(run: &ScenarioRun) -> String {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for r in &run.log.recs {
        if !r
            .status
            .is_some_and(|s| (200..300).contains(&s) || s == 429 || s == 503)
        {
            let status = r
                .status
                .map_or_else(|| "no answer".to_owned(), |s| s.to_string());
            let when = if r.done < run.window.start {
                "before the fault"
            } else if r.done < run.window.back {
                "during the fault"
            } else {
                "after the fault"
            };
            let error = r.error.as_deref().unwrap_or("-");
            *seen
                .entry(format!("{:?} {status} {error} {when}", r.op))
                .or_default() += 1;
        }
    }
    seen.iter()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The table's columns: the clients' requests (the probe's apart) and
/// their statuses (`other`: anything but 2xx, 429, 503, no answer
/// included); the closes answered `pending: true` and of those the ones
/// the store shows applied; the pending settles repeated after recovery
/// that answered `balance`, unchanged; the most tokens the fallback
/// granted one user against SPEC §6's bound; the tokens and turns the store
/// holds less what the clients' record implies (0: exact); the live run
/// leases left in the store (in parentheses, those of runs no client was
/// admitted); the recovery (store back → first 2xx that needed it); the
/// drain (store back → journal empty, nothing owed, breaker closed); the
/// scenario's wall time.
const HEADER: &str = "| fault | policy | reqs | 2xx | 429 | 503 | other | closes pending / applied | repeats unchanged | fallback granted / bound | Δtokens | Δturns | leases left (ghost) | recovery | drained | wall |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

/// Reads each user's state from Redis, then repeats every pending settle
/// of a store-issued reservation (actual 1) and reads the tokens again.
async fn verify(run: &mut ScenarioRun, direct: &Direct<'_>, http: &reqwest::Client) {
    for u in &run.users {
        let grants: Vec<&Grant> = run
            .log
            .grants
            .iter()
            .filter(|g| &g.user == u && !g.fallback)
            .collect();
        let st = tokio::task::block_in_place(|| {
            let mut st = direct.read(&run.prefix, u, &grants)?;
            st.open_records = direct.open_records(&run.prefix, u)?;
            Ok(st)
        });
        run.in_store.insert(u.clone(), st);
    }
    let pending: Vec<Settled> = run
        .log
        .settled
        .iter()
        .filter(|s| s.pending)
        .cloned()
        .collect();
    let mut repeats = Repeats::default();
    let mut touched = Vec::new();
    for s in &pending {
        let Some(Ok(before)) = run.in_store.get(&s.user) else {
            continue;
        };
        repeats.sent += 1;
        let r = http
            .post(format!("{}/v1/tokens/settle", run.url))
            .bearer_auth(token(&s.user))
            .json(&json!({"reservation_id": s.id, "actual": 1}))
            .send()
            .await;
        let (status, body) = match r {
            Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
            Err(e) => (0, json!(e.to_string())),
        };
        if status == 200
            && body["balance"].as_i64() == Some(before.tokens)
            && body.get("pending").is_none_or(|p| p == false)
        {
            repeats.unchanged += 1;
        } else {
            repeats.odd.push(format!(
                "{} of {}: {status} {body} (level before {})",
                s.id, s.user, before.tokens
            ));
        }
        if !touched.contains(&s.user) {
            touched.push(s.user.clone());
        }
    }
    // The tokens of every user whose settles were repeated, again.
    let mut changed = Vec::new();
    for u in &touched {
        let after = tokio::task::block_in_place(|| direct.tokens(&run.prefix, u));
        if let Some(Ok(before)) = run.in_store.get(u)
            && after.as_ref().ok() != Some(&before.tokens)
        {
            changed.push(format!("{u}: {} then {after:?}", before.tokens));
        }
    }
    repeats.odd.extend(
        changed
            .into_iter()
            .map(|c| format!("tokens moved by repeats: {c}")),
    );
    run.repeats = repeats;
}

/// The checks of one fault × policy; answers what failed.
///
/// 1. No 5xx but the policy's 503s (`store_unavailable` under
///    fail_closed, `store_full` under either), no request left without an
///    answer; under fail_open no worker request is 503 at all (every
///    decision is local or journalled). On one node no other refusal at
///    all (no `unknown_reservation`: nothing was lost); on the cluster a
///    404 only for a reservation the dead master acknowledged in
///    [`LOSS_WINDOW`].
/// 2. Every close accepted (2xx, `pending` included) is applied in Redis
///    after recovery: each settled store-issued reservation is closed in
///    its run's hash; its settle repeated answers `balance` equal to the
///    level and moves nothing; and each user's token level is exactly
///    `burst − Σ actual (settled) − Σ estimate (still open) − Σ fallback
///    net (actual of the fallback's settled reservations, estimate of
///    its open ones: reconciled)`; the turns used exactly the admissions
///    granted plus the ghost leases (none), and at most one more per
///    refused admission whose store call timed out (it ran late: its turn
///    stays taken). Exact on one durable node (a reserve
///    or settle the store ran late, after a SIGSTOP or a DEBUG SLEEP, is
///    found by its request id or is idempotent, so nothing counts twice);
///    turns may count once more per fail_open admission that timed out in
///    the store and was then decided locally (SPEC §6: its lease decides
///    whether it is charged). On the cluster, a bound: the difference is
///    at most what the dead master acknowledged in [`LOSS_WINDOW`] (async
///    replication, SPEC §6).
/// 3. No lease of a run the client released (`released` or `pending`)
///    is live in Redis; no lease at all of a run the client was admitted
///    (every run is closed by the end); no ghost lease (of an admission
///    the client was refused whose store call timed out and ran late: the
///    replica released it once the store answered), so the table's
///    "leases left" is 0 in every row; and `tollgate_turns_in_flight` is
///    back to 0, the runs really live.
/// 4. Each user's tokens granted by the fallback (estimates less what
///    settles gave back) within N × fallback_share × (burst + rate × T),
///    N = 1 (T: the whole scenario; the rate adds nothing whole); 0 under
///    fail_closed; under fail_open the bound is reached (a reserve refused
///    `token_rate` during the outage). A settle above its estimate charges
///    the excess as debt, beyond the grants (reconciled into Redis: the
///    exact accounting of 2 includes it).
/// 5. Recovery within [`RECOVERY_BOUND`] of the store answering.
/// 6. `/metrics`: the journal held closes during the fault (the straddle's
///    at least); after recovery depth 0, owed users 0, breaker closed,
///    nothing expired.
///
///    And the straddle: every one of its settles answered `pending`;
///    after a SIGSTOP or DEBUG SLEEP at least one waited out the operation
///    timeout (sent to the stopped server, so it ran there later, before
///    its replay): the accounting above being exact is the proof that
///    neither applied it twice.
fn check_scenario(run: &ScenarioRun) -> Vec<String> {
    let mut f = Vec::new();
    let cluster = run.fault == "cluster-failover";
    // 1. Answers.
    for r in &run.log.recs {
        let bad = match (r.status, r.error.as_deref()) {
            (None, _) => Some("no answer".to_owned()),
            (Some(503), Some("store_full")) => None,
            (Some(503), Some("store_unavailable"))
                if run.policy == Policy::FailClosed || r.op == Op::Probe =>
            {
                None
            }
            (Some(s), e) if s >= 500 => Some(format!("{s} {e:?}")),
            _ => None,
        };
        if let Some(b) = bad {
            f.push(format!("{:?} of {}: {b}", r.op, r.user));
        }
    }
    let grant_of: HashMap<&str, &Grant> =
        run.log.grants.iter().map(|g| (g.id.as_str(), g)).collect();
    for r in &run.log.recs {
        if let Some(s) = r.status
            && (400..500).contains(&s)
            && s != 429
        {
            f.push(format!("{:?} of {}: {s} {:?}", r.op, r.user, r.error));
        }
    }
    if cluster {
        // A lost reservation's settle is 404: allowed when the dead master
        // acknowledged it in the loss window.
        f.retain(|m| !m.contains("unknown_reservation"));
        for s in &run.log.settled {
            if s.status == Some(404)
                && !grant_of
                    .get(s.id.as_str())
                    .is_some_and(|g| run.lossy(g.done))
            {
                f.push(format!(
                    "settle {} of {}: 404 outside the loss window",
                    s.id, s.user
                ));
            }
        }
    }
    // 2 and 3. The store's state.
    let settles = run.settle_of();
    for (u, st) in &run.in_store {
        let st = match st {
            Ok(st) => st,
            Err(e) => {
                f.push(format!("{u}: cannot read the store: {e}"));
                continue;
            }
        };
        let a = run.accounting(u, st);
        let (tok_allow, turn_allow) = if cluster {
            run.loss_allowance(u)
        } else {
            (0, 0)
        };
        let d = a.tokens_used - a.tokens_expected;
        if d.abs() > tok_allow {
            f.push(format!(
                "{u}: Redis used {} tokens, the record implies {} (Δ {d}, allowed ±{tok_allow})",
                a.tokens_used, a.tokens_expected
            ));
        }
        // A refused admission that ran late in the store keeps its turn.
        let turn_extra = a.ambiguous_refused as i64
            + if run.policy == Policy::FailOpen {
                a.ambiguous_granted as i64
            } else {
                0
            };
        let dt = a.turns_used - a.turns_expected;
        if dt < -turn_allow || dt > turn_allow + turn_extra {
            f.push(format!(
                "{u}: Redis used {} turns, admissions granted and ghosts make {} (Δ {dt}, allowed -{turn_allow}..+{})",
                a.turns_used,
                a.turns_expected,
                turn_allow + turn_extra
            ));
        }
        if a.ghosts > 0 {
            f.push(format!(
                "{u}: {} ghost leases (runs no client was admitted; {} refused admissions timed out in the store)",
                a.ghosts, a.ambiguous_refused
            ));
        }
        for g in run
            .log
            .grants
            .iter()
            .filter(|g| &g.user == u && !g.fallback)
        {
            let settled = settles.get(g.id.as_str()).is_some_and(|s| ok(s.status));
            let lossy = run.lossy(g.done)
                || settles
                    .get(g.id.as_str())
                    .is_some_and(|s| run.lossy(s.done));
            if st.missing.contains(&g.id) {
                if !lossy {
                    f.push(format!("{u}: the run record of {} is gone", g.id));
                }
            } else if settled == st.open.contains(&g.id) && !lossy {
                f.push(format!(
                    "{u}: {} is {} in Redis but the client's settle {}",
                    g.id,
                    if settled { "open" } else { "closed" },
                    if settled { "was accepted" } else { "was not" }
                ));
            }
        }
        // Every client closed what it held: a reservation still open in
        // Redis is one no client holds (a late copy of a refused or
        // locally decided reserve that reconciliation missed).
        if !cluster && !st.open_records.is_empty() {
            f.push(format!(
                "{u}: reservations open in Redis that no client holds: {:?}",
                st.open_records
            ));
        }
        let released: HashMap<&str, &Released> = run
            .log
            .released
            .iter()
            .filter(|r| &r.user == u && ok(r.status))
            .map(|r| (r.inv.as_str(), r))
            .collect();
        let admitted: HashSet<&str> = run
            .log
            .admitted
            .iter()
            .filter(|a| &a.user == u && ok(a.status))
            .map(|a| a.inv.as_str())
            .collect();
        for l in &st.leases {
            match released.get(l.as_str()) {
                Some(r) if cluster && run.lossy(r.done) => {}
                Some(r) => f.push(format!(
                    "{u}: run {l} released ({}) still holds a lease in Redis",
                    if r.pending { "pending" } else { "released" }
                )),
                None if admitted.contains(l.as_str()) => {
                    f.push(format!("{u}: run {l} admitted and never released"));
                }
                None => {}
            }
        }
    }
    for (u, v) in &run.store_after {
        if let Some(Ok(st)) = run.in_store.get(u)
            && v["tokens_available"].as_i64() != Some(st.tokens)
        {
            f.push(format!(
                "{u}: GET /admin/users answers tokens_available {}, Redis holds {}",
                v["tokens_available"], st.tokens
            ));
        }
    }
    if run.repeats.sent == 0 {
        f.push("no pending settle to repeat: the closes never met the failing store".to_owned());
    }
    for o in &run.repeats.odd {
        if !(cluster && o.contains("unknown_reservation")) {
            f.push(format!("repeated settle: {o}"));
        }
    }
    // 4. The overshoot bound.
    let bound = run.overshoot_bound();
    for u in &run.users {
        let got = run.fallback_granted(u);
        if got as f64 > bound {
            f.push(format!(
                "{u}: {got} tokens granted by the fallback, over the bound {bound}"
            ));
        }
    }
    if run.policy == Policy::FailOpen
        && !run.log.recs.iter().any(|r| {
            r.op == Op::Reserve
                && r.status == Some(429)
                && r.error.as_deref() == Some("token_rate")
                && run.in_fault(r.done)
        })
    {
        f.push("no reserve refused token_rate during the outage: the fallback's share was never used up".to_owned());
    }
    // 5. Recovery.
    let recovery = run.recovery();
    let bound = if run.fault == "cluster-failover" {
        CLUSTER_RECOVERY_BOUND
    } else {
        RECOVERY_BOUND
    };
    if recovery.is_none_or(|d| d > bound) {
        f.push(format!("recovery {recovery:?}, more than {bound:?}"));
    }
    // 6. Metrics.
    let during = run
        .log
        .samples
        .iter()
        .filter(|s| run.in_fault(s.at))
        .map(|s| s.depth)
        .fold(0.0, f64::max);
    if during <= 0.0 {
        f.push("the journal held nothing during the fault".to_owned());
    }
    match &run.after {
        Some(s) if s.quiet() && s.expired == 0.0 && s.in_flight == 0.0 => {}
        s => f.push(format!(
            "after recovery, not quiet within {DRAIN_WAIT:?} of the clients' stop: {s:?}"
        )),
    }
    // The straddle: its settles of the store's reservations journalled,
    // its second reserves refused (fail_closed) or granted by the
    // fallback (fail_open); after a SIGSTOP or a DEBUG SLEEP, some of
    // each sent to the stopped server (they waited out the timeout), so
    // that it ran them later: the exact accounting is the proof that the
    // settle replayed was applied once, and that the refused reserve the
    // store ran was refunded by reconciliation.
    let queued = matches!(run.fault, "sigstop" | "debug-sleep");
    let straddle: Vec<&Settled> = run
        .log
        .settled
        .iter()
        .filter(|s| s.straddle && !s.id.starts_with('f'))
        .collect();
    if straddle.len() != STRADDLE {
        f.push(format!(
            "the straddle settled {} of {STRADDLE}",
            straddle.len()
        ));
    }
    if let Some(s) = straddle.iter().find(|s| !s.pending) {
        f.push(format!("a straddle settle was not journalled: {s:?}"));
    }
    if queued && !straddle.iter().any(|s| s.done - s.sent >= OP_TIMEOUT) {
        f.push("no straddle settle reached the stopped server".to_owned());
    }
    let reserves = &run.log.straddle_reserves;
    let expected = match run.policy {
        Policy::FailOpen => 200,
        Policy::FailClosed => 503,
    };
    if reserves.len() != STRADDLE || reserves.iter().any(|(s, _)| *s != Some(expected)) {
        f.push(format!(
            "the straddle's reserves, expected {STRADDLE} × {expected}: {reserves:?}"
        ));
    }
    if queued && !reserves.iter().any(|(_, d)| *d >= OP_TIMEOUT) {
        f.push("no straddle reserve reached the stopped server".to_owned());
    }
    if queued
        && run.policy == Policy::FailClosed
        && !run
            .log
            .samples
            .iter()
            .any(|s| run.in_fault(s.at) && s.owed > 0.0)
    {
        f.push(
            "no refused reserve waited to be checked (owed users 0 throughout the fault)"
                .to_owned(),
        );
    }
    if !run
        .log
        .recs
        .iter()
        .any(|r| r.done < run.window.start && ok(r.status))
    {
        f.push("no 2xx before the fault: the setup is broken".to_owned());
    }
    f
}

/// The checks of a server over the whole run: it never died, restarted or
/// panicked.
fn check_server(t: &Tollgate) -> Vec<String> {
    let (out, err) = (t.stdout(), t.stderr());
    let policy = t.policy.name();
    let mut f = Vec::new();
    if !t.alive() {
        f.push(format!("{policy}: the server process is gone"));
    }
    for (name, text) in [("stdout", &out), ("stderr", &err)] {
        if text.contains("panicked") {
            f.push(format!("{policy}: a panic in the server's {name}"));
        }
    }
    if out.matches("tollgate listening on ").count() != 1 {
        f.push(format!("{policy}: the server started more than once"));
    }
    f
}

/// A server and the users its clients are for, in one scenario.
struct Target<'a> {
    server: &'a Tollgate,
    /// `WORKERS` workers' users, the straddle's, then the probe's.
    users: Vec<String>,
}

fn client(http: &reqwest::Client, t: &Target<'_>, user: &str, log: &Arc<Mutex<Log>>) -> Client {
    Client {
        http: http.clone(),
        base: t.server.url.clone(),
        user: user.to_owned(),
        auth: token(user),
        straddle: false,
        log: Arc::clone(log),
    }
}

/// Scrapes `/metrics` every 100 ms until `stop`.
async fn scrape(http: reqwest::Client, url: String, log: Arc<Mutex<Log>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        if let Some(s) = sample(&http, &url).await {
            log.lock().samples.push(s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sample(http: &reqwest::Client, url: &str) -> Option<Sample> {
    let r = http
        .get(format!("{url}/metrics"))
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .ok()?;
    let text = r.text().await.ok()?;
    Sample::parse(Instant::now(), &text)
}

/// Runs the clients of every target, opens the straddles, applies `fault`
/// (blocking: it runs on this worker thread in `block_in_place` while the
/// clients go on; it calls the function it is given the moment the store
/// is broken, which sends the straddles' closes), waits for recovery,
/// stops the clients (they close what they hold), waits until each
/// replica is quiet, and answers one run per target.
async fn scenario(
    fault_name: &'static str,
    targets: &[Target<'_>],
    fault: impl FnOnce(&dyn Fn()) -> Window,
) -> Vec<ScenarioRun> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let scraping = Arc::new(AtomicBool::new(false));
    let mut logs = Vec::new();
    let mut tasks = Vec::new();
    let mut scrapers = Vec::new();
    let began = Instant::now();
    for t in targets {
        let log = Arc::new(Mutex::new(Log::default()));
        logs.push(Arc::clone(&log));
        for (i, user) in t.users.iter().enumerate() {
            if i == WORKERS {
                continue; // the straddle's: below
            }
            let c = client(&http, t, user, &log);
            let stop = Arc::clone(&stop);
            let probe = i == WORKERS + 1;
            tasks.push(tokio::spawn(async move {
                if probe {
                    c.probe(&stop).await;
                } else {
                    c.work(&stop).await;
                }
            }));
        }
        scrapers.push(tokio::spawn(scrape(
            http.clone(),
            t.server.url.clone(),
            Arc::clone(&log),
            Arc::clone(&scraping),
        )));
    }
    tokio::time::sleep(WARMUP).await;
    let mut straddles = Vec::new();
    for (t, log) in targets.iter().zip(&logs) {
        let c = Client {
            straddle: true,
            ..client(&http, t, &t.users[WORKERS], log)
        };
        // Runs whose reservations the store issued: a slow moment of the
        // store (its fsync on a shared disk) may open a breaker before
        // the fault; a run opened then is closed and another tried.
        let mut opens = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut n = 0;
        while opens.len() < STRADDLE && Instant::now() < deadline {
            match c.open(n).await {
                Some(o)
                    if o.reservation
                        .as_deref()
                        .is_some_and(|id| !id.starts_with('f')) =>
                {
                    opens.push(o);
                }
                Some(o) => c.close(o).await,
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
            n += 1;
        }
        straddles.push((c, opens));
    }
    let straddles = Mutex::new(Some(straddles));
    let handle = tokio::runtime::Handle::current();
    let closing = Mutex::new(Vec::new());
    let send_straddles = || {
        for (c, opens) in straddles.lock().take().into_iter().flatten() {
            for o in opens {
                let c = c.clone();
                closing
                    .lock()
                    .push(handle.spawn(async move { c.close_straddle(o).await }));
            }
        }
    };
    let window = tokio::task::block_in_place(|| fault(&send_straddles));
    send_straddles(); // if the fault did not
    for j in closing.into_inner() {
        j.await.expect("straddle task");
    }
    // Until every target recovered (or the wait is up), then a little more.
    let recovered = |log: &Arc<Mutex<Log>>, policy: Policy| {
        log.lock().recs.iter().any(|r| {
            r.done >= window.back
                && ok(r.status)
                && (r.op == Op::Probe || policy == Policy::FailClosed)
        })
    };
    while window.back.elapsed() < RECOVERY_WAIT
        && !targets
            .iter()
            .zip(&logs)
            .all(|(t, l)| recovered(l, t.server.policy))
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("client task");
    }
    // Each replica quiet: journal applied, charges reconciled.
    let stopped = Instant::now();
    let mut quiet = Vec::new();
    for t in targets {
        let mut last = None;
        let mut at = None;
        while stopped.elapsed() < DRAIN_WAIT {
            if let Some(s) = sample(&http, &t.server.url).await {
                let q = s.quiet();
                last = Some(s);
                if q {
                    at = Some(Instant::now() - window.back);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        quiet.push((at, last));
    }
    scraping.store(true, Ordering::Relaxed);
    for s in scrapers {
        s.await.expect("scraper");
    }
    let mut runs = Vec::new();
    for ((t, log), (drained, after)) in targets.iter().zip(logs).zip(quiet) {
        let mut store_after = Vec::new();
        for u in &t.users {
            let v = http
                .get(format!("{}/admin/users/{u}", t.server.url))
                .bearer_auth(ADMIN)
                .send()
                .await
                .expect("admin view");
            store_after.push((u.clone(), v.json().await.unwrap_or(Value::Null)));
        }
        let log = std::mem::take(&mut *log.lock());
        runs.push(ScenarioRun {
            fault: fault_name,
            policy: t.server.policy,
            prefix: t.server.prefix.clone(),
            url: t.server.url.clone(),
            window,
            wall: began.elapsed(),
            users: t.users[..=WORKERS].to_vec(),
            log,
            drained,
            after,
            store_after,
            in_store: BTreeMap::new(),
            repeats: Repeats::default(),
        });
    }
    runs
}

fn users(prefix: &str, policy: Policy) -> Vec<String> {
    (0..WORKERS + 2)
        .map(|i| format!("{prefix}-{}-{i}", policy.name()))
        .collect()
}

/// The single-node faults (one appendonly Redis, both policies at once),
/// then a master's failover on a replicated cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_of_the_store_under_both_policies() {
    let started = Instant::now();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut failures = Vec::new();
    let mut redis = RedisServer::start_durable().expect("redis-server");
    let single = format!("[store]\nkind = \"redis\"\nurl = \"{}\"", redis.url());
    let servers = [
        Tollgate::start(Policy::FailOpen, &single),
        Tollgate::start(Policy::FailClosed, &single),
    ];
    let targets = |prefix: &str| -> Vec<Target<'_>> {
        servers
            .iter()
            .map(|s| Target {
                server: s,
                users: users(prefix, s.policy),
            })
            .collect()
    };
    let mut runs = Vec::new();

    let r = &mut redis;
    let mut batch = scenario("kill+restart", &targets("kill"), |straddle| {
        let start = Instant::now();
        r.kill();
        let struck = Instant::now();
        straddle();
        std::thread::sleep(FAULT);
        r.restart().expect("restart redis");
        Window {
            start,
            struck,
            back: Instant::now(),
        }
    })
    .await;
    let r = &redis;
    batch.extend(
        scenario("sigstop", &targets("stop"), |straddle| {
            let start = Instant::now();
            r.pause().expect("SIGSTOP");
            let struck = Instant::now();
            straddle();
            std::thread::sleep(FAULT);
            r.resume().expect("SIGCONT");
            Window {
                start,
                struck,
                back: Instant::now(),
            }
        })
        .await,
    );
    batch.extend(
        scenario("debug-sleep", &targets("sleep"), |straddle| {
            let start = Instant::now();
            let sleeping = r.debug_sleep(FAULT.as_secs_f64()).expect("DEBUG SLEEP");
            // Sent is not yet asleep: the server accepts and reads the
            // command on a later turn of its event loop, and may answer
            // others before.
            let asleep = wait_blocked(r.port());
            assert!(asleep, "DEBUG SLEEP did not block the server");
            let struck = Instant::now();
            straddle();
            sleeping.join().unwrap().expect("DEBUG SLEEP answered");
            Window {
                start,
                struck,
                back: Instant::now(),
            }
        })
        .await,
    );
    let direct = Direct::Single(&redis);
    for run in &mut batch {
        verify(run, &direct, &http).await;
    }
    runs.extend(batch);
    for s in &servers {
        failures.extend(check_server(s));
    }
    drop(servers);

    // The cluster: every client's user lives on the master killed.
    let mut cluster = RedisCluster::start_with_replicas().expect("redis cluster");
    let nodes = cluster
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let store = format!("[store]\nkind = \"cluster\"\nnodes = [{nodes}]");
    let servers = [
        Tollgate::start(Policy::FailOpen, &store),
        Tollgate::start(Policy::FailClosed, &store),
    ];
    let victim = cluster.master_of(0).expect("a master");
    let on_victim = |policy: Policy| -> Vec<String> {
        (0..)
            .map(|i| format!("fo-{}-{i}", policy.name()))
            .filter(|u| cluster.master_of(key_slot(&format!("{{{u}}}"))).ok() == Some(victim))
            .take(WORKERS + 2)
            .collect()
    };
    let targets: Vec<Target<'_>> = servers
        .iter()
        .map(|s| Target {
            server: s,
            users: on_victim(s.policy),
        })
        .collect();
    let c = &mut cluster;
    let mut batch = scenario("cluster-failover", &targets, |straddle| {
        let start = Instant::now();
        let struck = std::cell::Cell::new(start);
        let f = c
            .kill_master_of_then(0, || {
                struck.set(Instant::now());
                straddle();
            })
            .expect("failover");
        assert_eq!(f.killed, victim);
        Window {
            start,
            struck: struck.get(),
            back: Instant::now(),
        }
    })
    .await;
    let direct = Direct::Cluster(&cluster);
    for run in &mut batch {
        verify(run, &direct, &http).await;
    }
    runs.extend(batch);
    for s in &servers {
        failures.extend(check_server(s));
    }

    let mut table = String::from(HEADER);
    for run in &runs {
        table.push('\n');
        table.push_str(&run.row());
    }
    for run in &runs {
        table.push('\n');
        table.push_str(&run.detail());
    }
    for run in &runs {
        for m in check_scenario(run) {
            failures.push(format!("{} / {}: {m}", run.fault, run.policy.name()));
        }
    }
    table.push_str(&format!(
        "\nchaos: {:.1} s in all, {} failures",
        started.elapsed().as_secs_f64(),
        failures.len()
    ));
    eprintln!("{table}");
    let _ = std::io::stderr().flush();
    write_table(&table);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Waits (at most 1 s) until the Redis on `port` leaves a PING unanswered
/// for 30 ms: its event loop is blocked.
fn wait_blocked(port: u16) -> bool {
    use std::io::Read;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = c.set_read_timeout(Some(Duration::from_millis(30)));
        if c.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        match c.read(&mut buf) {
            Ok(n) if n > 0 => std::thread::sleep(Duration::from_millis(2)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return true;
            }
            _ => return false,
        }
    }
    false
}

/// Writes the table to `$TOLLGATE_CHAOS_TABLE` when set.
fn write_table(table: &str) {
    if let Some(p) = std::env::var_os("TOLLGATE_CHAOS_TABLE") {
        let _ = std::fs::write(PathBuf::from(p), format!("{table}\n"));
    }
}
