//! Chaos: real `tollgate serve` processes built from this tree, on a real
//! Redis that the harness breaks while client tasks drive the API over
//! loopback HTTP (issue #17, item 7).
//!
//! Two servers run side by side on the same store, one `fail_open` and one
//! `fail_closed`, each with its own clients: three workers looping admit
//! (`POST /v1/runs`) → reserve (`POST /v1/tokens/reserve`) → settle
//! (`POST /v1/tokens/settle`) → release (`DELETE /v1/runs/{id}`), and one
//! probe acquiring a session lease (`POST /v1/sessions/{id}/lease`), which
//! always fails closed, so its 2xx proves the store answered under either
//! policy. Each fault is applied for about 3 s, after 1 s of steady state:
//!
//! * `kill+restart`: SIGKILL of `redis-server`, restarted on the same port
//!   3 s later (appendonly, `appendfsync always`: it keeps what it
//!   acknowledged);
//! * `sigstop`: SIGSTOP, SIGCONT 3 s later (a hung server: connections stay
//!   open and nothing answers);
//! * `debug-sleep`: `DEBUG SLEEP 3` (the event loop blocked);
//! * `cluster-failover`: on a 3-master, 3-replica cluster (`kind =
//!   "cluster"`, node timeout 1 s), SIGKILL of the master serving the
//!   clients' users, until its replica is promoted.
//!
//! One table row per fault × policy: requests and status counts, the time
//! the store was down, and the recovery: from the store answering again to
//! the first 2xx that needed it (any 2xx under `fail_closed`; the probe's
//! under `fail_open`, whose other answers may be local). What holds today
//! is asserted for every row: no panic in the server's output, no 5xx other
//! than 503, the server process never restarted, recovery within 2 s. See
//! [`check_scenario`] for where the checks that wait on other work plug in.
//!
//! Bounded: about a minute in all, loopback only, every loop stops by
//! itself. Run it with `--nocapture` to see the table.

// A chaos test measures real processes in real time: wall-clock instants
// and real sleeps while a fault lasts.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

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
/// The longest recovery asserted.
const RECOVERY_BOUND: Duration = Duration::from_secs(2);
/// How long to wait for recovery after the store is back before giving up.
const RECOVERY_WAIT: Duration = Duration::from_secs(4);
/// One client's pace: one request, then wait for the next tick.
const TICK: Duration = Duration::from_millis(25);
const WORKERS: usize = 3;

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
    dir: TempDir,
}

impl Tollgate {
    /// Serves `store` (a `[store]` table without `failure`) under `policy`.
    fn start(policy: Policy, store: &str) -> Self {
        let dir = TempDir::new();
        let cfg = dir.path().join("tollgate.toml");
        std::fs::write(
            &cfg,
            format!(
                r#"listen = "127.0.0.1:0"
admin_token = "{ADMIN}"
default_plan = "chaos"

{store}
failure = "{}"
op_timeout_ms = 200
connect_timeout_ms = 500
key_prefix = "{}"

[identity]
mode = "dev"

[plans.chaos]
turns = {{ amount = 100000, period_ms = 1000, burst = 100000 }}
tokens = {{ amount = 10000000, period_ms = 1000, burst = 10000000 }}
concurrent_runs = 1000
max_wait_ms = 0
max_sessions = 1000
"#,
                policy.name(),
                unique_prefix()
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
    done: Instant,
    status: Option<u16>,
    /// The refusal's `error` code, if any.
    error: Option<String>,
}

/// A settle the clients sent, for the checks of journalled closes (see
/// [`check_scenario`]; until they land only `sent` and `status` are read).
#[derive(Clone, Debug)]
#[allow(dead_code)]
struct Settled {
    user: String,
    reservation_id: String,
    actual: u64,
    sent: Instant,
    status: Option<u16>,
    /// The answer's body (`balance` on 2xx).
    body: Value,
}

#[derive(Default)]
struct Log {
    recs: Vec<Rec>,
    settled: Vec<Settled>,
}

/// One client's connection to one server.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
    user: String,
    auth: String,
    log: Arc<Mutex<Log>>,
}

impl Client {
    async fn send(&self, op: Op, req: reqwest::RequestBuilder) -> (Option<u16>, Value) {
        let out = match req.bearer_auth(&self.auth).send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                (Some(status), r.json().await.unwrap_or(Value::Null))
            }
            Err(_) => (None, Value::Null),
        };
        self.log.lock().recs.push(Rec {
            op,
            done: Instant::now(),
            status: out.0,
            error: out.1["error"].as_str().map(str::to_owned),
        });
        out
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.post(format!("{}{path}", self.base))
    }

    /// admit → reserve → settle → release, each step only after the one
    /// before succeeded (release whenever admit did).
    async fn cycle(&self, n: u64) {
        let inv = format!("{}-{n}", self.user);
        let (st, _) = self
            .send(
                Op::Admit,
                self.post("/v1/runs").json(&json!({"invocation_id": inv})),
            )
            .await;
        if !ok(st) {
            return;
        }
        let (st, body) = self
            .send(
                Op::Reserve,
                self.post("/v1/tokens/reserve")
                    .json(&json!({"invocation_id": inv, "estimate": 100})),
            )
            .await;
        if ok(st)
            && let Some(id) = body["reservation_id"].as_str()
        {
            let actual = 80;
            let sent = Instant::now();
            let (status, body) = self
                .send(
                    Op::Settle,
                    self.post("/v1/tokens/settle")
                        .json(&json!({"reservation_id": id, "actual": actual})),
                )
                .await;
            self.log.lock().settled.push(Settled {
                user: self.user.clone(),
                reservation_id: id.to_owned(),
                actual,
                sent,
                status,
                body,
            });
        }
        let del = self.http.delete(format!("{}/v1/runs/{inv}", self.base));
        self.send(Op::Release, del).await;
    }

    async fn probe(&self) {
        let req = self
            .post("/v1/sessions/probe/lease")
            .json(&json!({"holder": "probe", "ttl_ms": 10_000}));
        self.send(Op::Probe, req).await;
    }
}

fn ok(status: Option<u16>) -> bool {
    status.is_some_and(|s| (200..300).contains(&s))
}

/// When the fault began and when the store answered again.
#[derive(Clone, Copy, Debug)]
struct Window {
    start: Instant,
    back: Instant,
}

/// Everything one fault × policy saw: what a check needs.
struct ScenarioRun {
    fault: &'static str,
    policy: Policy,
    window: Window,
    /// From the clients' start to their stop.
    wall: Duration,
    recs: Vec<Rec>,
    settled: Vec<Settled>,
    /// The store's answers after recovery: `GET /admin/users/{user}` of
    /// every user of the scenario.
    store_after: Vec<(String, Value)>,
}

impl ScenarioRun {
    /// The first 2xx that needed the store, completed after it was back.
    fn recovery(&self) -> Option<Duration> {
        self.recs
            .iter()
            .filter(|r| r.done >= self.window.back && ok(r.status))
            .filter(|r| r.op == Op::Probe || self.policy == Policy::FailClosed)
            .map(|r| r.done - self.window.back)
            .min()
    }

    /// Run leases the store still holds after the clients stopped (each
    /// client released every run it was admitted: what is left is a
    /// release the store never saw).
    fn leases_left(&self) -> usize {
        self.store_after
            .iter()
            .map(|(_, v)| v["leases"].as_array().map_or(0, Vec::len))
            .sum()
    }

    /// The answers other than 2xx and 503, by operation, status and error
    /// code and when it was answered, e.g. `Settle 404 unknown_reservation
    /// during the fault ×2`.
    fn odd_answers(&self) -> String {
        let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
        for r in &self.recs {
            if !ok(r.status) && r.status != Some(503) {
                let status = r
                    .status
                    .map_or_else(|| "no answer".to_owned(), |s| s.to_string());
                let when = if r.done < self.window.start {
                    "before the fault"
                } else if r.done < self.window.back {
                    "during the fault"
                } else {
                    "after the fault"
                };
                let error = r.error.as_deref().unwrap_or("-");
                let key = format!("{:?} {status} {error} {when}", r.op);
                *seen.entry(key).or_default() += 1;
            }
        }
        seen.iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn count(&self, probe: bool, f: impl Fn(Option<u16>) -> bool) -> usize {
        self.recs
            .iter()
            .filter(|r| (r.op == Op::Probe) == probe && f(r.status))
            .count()
    }

    fn row(&self) -> String {
        let w = |f: &dyn Fn(u16) -> bool| self.count(false, |s| s.is_some_and(f));
        let in_fault = self
            .settled
            .iter()
            .filter(|s| s.sent >= self.window.start && s.sent < self.window.back);
        format!(
            "| {:<16} | {:<11} | {:>4.1} s | {:>6.2} s | {:>5} | {:>5} | {:>3} | {:>4} | {:>3} | {:>3} | {:>3} | {:>3} / {:>3} | {:>3} / {:>3} | {:>3} | {:>8} |",
            self.fault,
            self.policy.name(),
            self.wall.as_secs_f64(),
            (self.window.back - self.window.start).as_secs_f64(),
            self.count(false, |_| true),
            w(&|s| (200..300).contains(&s)),
            w(&|s| s == 429),
            w(&|s| s == 503),
            w(&|s| s >= 500 && s != 503),
            w(&|s| (300..500).contains(&s) && s != 429),
            self.count(false, |s| s.is_none()),
            in_fault.clone().filter(|s| ok(s.status)).count(),
            in_fault.count(),
            self.count(true, ok),
            self.count(true, |_| true),
            self.leases_left(),
            self.recovery()
                .map_or_else(|| "none".to_owned(), |d| format!("{} ms", d.as_millis())),
        )
    }
}

/// The table's columns: the workers' requests and their statuses (`4xx`:
/// other than 429; `none`: no answer within the client's 5 s), the settles
/// sent while the store was down that were answered 2xx, the probe's, and
/// the run leases left in the store after the clients stopped.
const HEADER: &str = "| fault | policy | wall | store down | reqs | 2xx | 429 | 503 | 5xx | 4xx | none | settles in fault 2xx/all | probe 2xx/all | leases left | recovery |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

/// The checks of one fault × policy: what holds today is asserted here.
///
/// Where the checks that wait on other work plug in (issue #17 item 7):
/// * closes journalled during the fault applied after recovery: for each
///   `run.settled` with `sent` inside `run.window` and a 2xx (under
///   `fail_open`, answered by the local store), the store's view after
///   recovery (`run.store_after`, each user's `tokens_available` and
///   `leases`, or a read of the reservation) must show it settled at
///   `actual`, once;
/// * tokens within the overshoot bound: from `run.settled` (the tokens
///   granted per user during the fault) and `run.store_after`, each user's
///   spend over the window stays within the plan's limit plus the
///   `fallback_share` overshoot the spec allows.
///
/// Both read only what `ScenarioRun` already collects.
fn check_scenario(run: &ScenarioRun) {
    let label = format!("{} / {}", run.fault, run.policy.name());
    let other_5xx: Vec<&Rec> = run
        .recs
        .iter()
        .filter(|r| r.status.is_some_and(|s| s >= 500 && s != 503))
        .collect();
    assert!(
        other_5xx.is_empty(),
        "{label}: 5xx other than 503: {other_5xx:?}"
    );
    let recovery = run.recovery();
    assert!(
        recovery.is_some_and(|d| d <= RECOVERY_BOUND),
        "{label}: recovery {recovery:?}, more than {RECOVERY_BOUND:?}"
    );
    assert!(
        run.recs
            .iter()
            .any(|r| r.done < run.window.start && ok(r.status)),
        "{label}: no 2xx before the fault: the setup is broken"
    );
    assert_eq!(run.store_after.len(), WORKERS + 1, "{label}");
}

/// The checks of a server over the whole run.
fn check_server(t: &Tollgate) {
    let (out, err) = (t.stdout(), t.stderr());
    let policy = t.policy.name();
    assert!(t.alive(), "{policy}: the server process is gone:\n{err}");
    for (name, text) in [("stdout", &out), ("stderr", &err)] {
        assert!(
            !text.contains("panicked"),
            "{policy}: a panic in the server's {name}:\n{text}"
        );
    }
    assert_eq!(
        out.matches("tollgate listening on ").count(),
        1,
        "{policy}: the server started more than once"
    );
}

/// A server and the users its clients are for, in one scenario.
struct Target<'a> {
    server: &'a Tollgate,
    /// `WORKERS` workers' users, then the probe's.
    users: Vec<String>,
}

/// Runs the clients of every target, applies `fault` (blocking: it runs on
/// this worker thread in `block_in_place` while the clients go on), waits
/// for recovery and answers one run per target.
async fn scenario(
    fault_name: &'static str,
    targets: &[Target<'_>],
    fault: impl FnOnce() -> Window,
) -> Vec<ScenarioRun> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut logs = Vec::new();
    let mut tasks = Vec::new();
    let began = Instant::now();
    for t in targets {
        let log = Arc::new(Mutex::new(Log::default()));
        logs.push(Arc::clone(&log));
        for (i, user) in t.users.iter().enumerate() {
            let c = Client {
                http: http.clone(),
                base: t.server.url.clone(),
                user: user.clone(),
                auth: token(user),
                log: Arc::clone(&log),
            };
            let stop = Arc::clone(&stop);
            let probe = i == WORKERS;
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(TICK);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    if probe {
                        c.probe().await;
                    } else {
                        c.cycle(n).await;
                    }
                    n += 1;
                }
            }));
        }
    }
    tokio::time::sleep(WARMUP).await;
    let window = tokio::task::block_in_place(fault);
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
    let wall = began.elapsed();
    let mut runs = Vec::new();
    for (t, log) in targets.iter().zip(logs) {
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
            window,
            wall,
            recs: log.recs,
            settled: log.settled,
            store_after,
        });
    }
    runs
}

fn users(prefix: &str, policy: Policy) -> Vec<String> {
    (0..=WORKERS)
        .map(|i| format!("{prefix}-{}-{i}", policy.name()))
        .collect()
}

/// The single-node faults (one appendonly Redis, both policies at once),
/// then a master's failover on a replicated cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_of_the_store_under_both_policies() {
    let started = Instant::now();
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
    runs.extend(
        scenario("kill+restart", &targets("kill"), || {
            let start = Instant::now();
            r.kill();
            std::thread::sleep(FAULT);
            r.restart().expect("restart redis");
            Window {
                start,
                back: Instant::now(),
            }
        })
        .await,
    );
    let r = &redis;
    runs.extend(
        scenario("sigstop", &targets("stop"), || {
            let start = Instant::now();
            r.pause().expect("SIGSTOP");
            std::thread::sleep(FAULT);
            r.resume().expect("SIGCONT");
            Window {
                start,
                back: Instant::now(),
            }
        })
        .await,
    );
    runs.extend(
        scenario("debug-sleep", &targets("sleep"), || {
            let start = Instant::now();
            let sleeping = r.debug_sleep(FAULT.as_secs_f64()).expect("DEBUG SLEEP");
            sleeping.join().unwrap().expect("DEBUG SLEEP answered");
            Window {
                start,
                back: Instant::now(),
            }
        })
        .await,
    );
    for s in &servers {
        check_server(s);
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
            .take(WORKERS + 1)
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
    runs.extend(
        scenario("cluster-failover", &targets, || {
            let start = Instant::now();
            let f = c.kill_master_of(0).expect("failover");
            assert_eq!(f.killed, victim);
            Window {
                start,
                back: Instant::now(),
            }
        })
        .await,
    );
    for s in &servers {
        check_server(s);
    }

    let mut table = String::from(HEADER);
    for run in &runs {
        table.push('\n');
        table.push_str(&run.row());
    }
    for run in &runs {
        let odd = run.odd_answers();
        if !odd.is_empty() {
            table.push_str(&format!("\n{} / {}: {odd}", run.fault, run.policy.name()));
        }
    }
    eprintln!(
        "{table}\nchaos: {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
    // Keep the table next to the test's other output for a later look.
    let _ = std::io::stderr().flush();
    write_table(&table);
    for run in &runs {
        check_scenario(run);
    }
}

/// Writes the table to `$TOLLGATE_CHAOS_TABLE` when set.
fn write_table(table: &str) {
    if let Some(p) = std::env::var_os("TOLLGATE_CHAOS_TABLE") {
        let _ = std::fs::write(PathBuf::from(p), format!("{table}\n"));
    }
}
