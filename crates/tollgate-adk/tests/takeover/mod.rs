//! A takeover across processes (docs/spec.md §4, *Sessions in
//! PostgreSQL*): two replica processes share a real `redis-server` for
//! their leases and PostgreSQL for their sessions, and the database, not
//! the lease store, refuses a paused turn's late write.
//!
//! A replica is this test binary run again as a child process: the ignored
//! test [`replica_process`], its role and servers in its environment. It
//! runs one turn of a real adk runner through a `TurnExecutor` on a
//! `RedisStore` (wall clock, leases of [`SESSION_TTL_MS`]) and a
//! `PgSessionService`; it tells the parent what it holds in lines of JSON
//! on stdout starting with [`SAYS`]; a *held* replica's model waits, once
//! reached, for a line on its stdin before it answers.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use adk_agent::LlmAgentBuilder;
use adk_core::{Content, SessionId, UserId};
use adk_plugin::PluginManager;
use adk_runner::Runner;
use adk_session::SessionService;
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};
use tollgate_adk::postgres::{PgSessionService, PoolBounds};
use tollgate_adk::{FenceError, TurnError, TurnExecutor};
use tollgate_core::{Clock, Limiter, PlansConfig, ReplicaGate, SystemClock};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::scenarios::support as support_plan;

use super::support::{self, APP, FakeLlm, REPLY, Reply, Step};
use super::{TestDb, get};

/// The prefix of a replica's reports on stdout.
const SAYS: &str = "replica says: ";
/// A replica's session lease, renewed every third of it while its turn
/// runs: short, so the paused replica's lease runs out in a second.
const SESSION_TTL_MS: u64 = 1_000;
/// The longest the parent waits for a replica's next report.
const PATIENCE: Duration = Duration::from_secs(60);

/// [`replica_process`]'s name in this test binary.
const REPLICA_TEST: &str = "takeover::replica_process";

const ROLE: &str = "TOLLGATE_REPLICA_ROLE";
const REDIS: &str = "TOLLGATE_REPLICA_REDIS";
const PG: &str = "TOLLGATE_REPLICA_PG";
const TEXT: &str = "TOLLGATE_REPLICA_TEXT";

/// One replica: connects to Redis and PostgreSQL (migrating, as a replica
/// starting does), runs one turn of `u1` in `s1`, retrying while another
/// turn holds the session (by the refusal's hint, at most 30 s), and
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "one replica of the cross-process takeover test, which runs it as a child process"]
async fn replica_process() {
    let env = |key: &str| {
        std::env::var(key).unwrap_or_else(|_| {
            panic!("{key} is not set: this test is a child process of the takeover test")
        })
    };
    let held = match env(ROLE).as_str() {
        "held" => true,
        "free" => false,
        other => panic!("{ROLE}={other}: `held` or `free`"),
    };
    let store = RedisStore::connect(
        RedisConfig::standalone(env(REDIS)).with_op_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("connect to redis");
    let limiter = Arc::new(Limiter::new(store, SystemClock, plans()));
    let sessions = Arc::new(
        PgSessionService::connect(&env(PG), PoolBounds::default(), SystemClock)
            .expect("a PostgreSQL URL"),
    );
    sessions.migrate().await.expect("migrate");

    let model = Arc::new(FakeLlm::replying());
    let reached = Arc::new(Notify::new());
    if held {
        let gate = Arc::new(Semaphore::new(0));
        model.push(Reply::Stream(vec![
            Step::Signal(Arc::clone(&reached)),
            Step::Gate(Arc::clone(&gate)),
            Step::Chunk(support::chunk(REPLY, false, Some((100, 100)))),
        ]));
        std::thread::spawn(move || {
            let mut line = String::new();
            if std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
                gate.add_permits(1);
            }
        });
    }
    let executor = TurnExecutor::new(
        runner(
            Arc::clone(&model),
            Arc::clone(&sessions) as Arc<dyn SessionService>,
        ),
        Arc::clone(&limiter),
        ReplicaGate::new(4),
    )
    .with_session_ttl_ms(SESSION_TTL_MS)
    .with_postgres_sessions(sessions);

    let mut attempts = 0u32;
    let stream = loop {
        attempts += 1;
        let started = executor
            .execute(
                UserId::new("u1").expect("user"),
                SessionId::new("s1").expect("session"),
                Content::new("user").with_text(env(TEXT)),
            )
            .await;
        match started {
            Ok(stream) => break stream,
            // Another turn holds the session: retry when its lease may
            // have run out, as a client told `session_busy` would.
            Err(TurnError::SessionBusy { retry_after_ms }) if attempts < 300 => {
                let clock = SystemClock;
                clock
                    .sleep_until(clock.now_ms() + retry_after_ms.clamp(10, 200))
                    .await;
            }
            Err(e) => panic!("the turn did not start: {e}"),
        }
    };
    let holds = json!({
        "invocation": stream.invocation_id().expect("an invocation id"),
        "lease_fence": stream.fence().fence,
        "db_fence": stream.fence().db.expect("a database fence").number,
        "attempts": attempts,
    });
    let mut turn = tokio::spawn(support::outcome(stream));
    let ended = if held {
        tokio::select! {
            () = reached.notified() => {
                say(json!({ "event": "in_model", "holds": holds }));
                None
            }
            ended = &mut turn => Some(ended),
        }
    } else {
        None
    };
    let (texts, error) = match ended {
        Some(ended) => ended,
        None => turn.await,
    }
    .expect("the turn's task");
    let stale = error
        .as_ref()
        .and_then(|e| FenceError::find_in(e))
        .map(|f| match f {
            FenceError::Stale { fence, latest } => json!([fence, latest]),
            other => json!(other.to_string()),
        });
    say(json!({
        "event": "done",
        "holds": holds,
        "texts": texts,
        "error": error.map(|e| e.code.to_string()),
        "stale": stale,
    }));
}

/// Writes one report line (straight to stdout, past the test harness's
/// capture).
fn say(report: Value) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{SAYS}{report}").expect("stdout");
    out.flush().expect("stdout");
}

/// Generous rates (nothing here is about them) and four concurrent runs:
/// a paused replica's run lease outlives its session lease.
fn plans() -> tollgate_core::PlanBook {
    let mut plan = support_plan();
    plan.turns.burst = Some(1_000);
    plan.concurrent_runs = 4;
    let mut config = PlansConfig {
        default_plan: Some("p".into()),
        ..PlansConfig::default()
    };
    config.plans.insert("p".into(), plan);
    config.validate().expect("valid plans")
}

/// A real adk runner: one LlmAgent on `model`, sessions in `sessions`.
fn runner(model: Arc<FakeLlm>, sessions: Arc<dyn SessionService>) -> Arc<Runner> {
    let agent = LlmAgentBuilder::new("assistant")
        .model(Arc::new(support::Shared(model)))
        .build()
        .expect("agent");
    Arc::new(
        Runner::builder()
            .app_name(APP)
            .agent(Arc::new(agent))
            .session_service(sessions)
            .plugin_manager(Arc::new(PluginManager::new(Vec::new())))
            .build()
            .expect("runner"),
    )
}

/// A replica process the parent drives; killed if the test ends first.
struct Replica {
    name: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    reports: Receiver<Value>,
}

impl Replica {
    fn spawn(name: &'static str, role: &str, redis: &str, pg: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args([REPLICA_TEST, "--exact", "--ignored", "--nocapture"])
            .env(ROLE, role)
            .env(REDIS, redis)
            .env(PG, pg)
            .env(TEXT, format!("from {name}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn a replica");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, reports) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                // The harness may have begun the line ("test … ... ").
                if let Some((_, report)) = line.split_once(SAYS) {
                    let report = serde_json::from_str(report).expect("a JSON report");
                    if tx.send(report).is_err() {
                        return;
                    }
                }
            }
        });
        Self {
            name,
            stdin: child.stdin.take(),
            child,
            reports,
        }
    }

    /// The replica's next report, which must be `event`.
    fn next(&mut self, event: &str) -> Value {
        let report = self.reports.recv_timeout(PATIENCE).unwrap_or_else(|_| {
            panic!(
                "replica {} did not report `{event}` within {PATIENCE:?} (exited: {:?})",
                self.name,
                self.child.try_wait()
            )
        });
        assert_eq!(report["event"], event, "replica {}: {report}", self.name);
        report
    }

    /// SIGSTOP or SIGCONT.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} replica {}", self.name);
    }

    /// Lets a held replica's model answer (read when it runs).
    fn release(&mut self) {
        let mut stdin = self.stdin.take().expect("a held replica's stdin");
        writeln!(stdin, "answer").expect("write to the replica");
    }

    /// Waits for the replica to exit, which it must do successfully.
    fn finish(mut self) {
        let status = self.child.wait().expect("wait for the replica");
        assert!(status.success(), "replica {} exited {status}", self.name);
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn holds(report: &Value, what: &str) -> i64 {
    report["holds"][what]
        .as_i64()
        .unwrap_or_else(|| panic!("{what} in {report}"))
}

/// A completed turn's report: no error, the model's reply.
fn assert_whole(report: &Value) {
    assert_eq!(report["error"], Value::Null, "{report}");
    assert!(
        report["texts"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t == REPLY)),
        "{report}"
    );
}

/// A refused late append's report: the typed stale-fence error naming
/// the fence it carried and the latest.
fn assert_refused(report: &Value, fence: i64, latest: i64) {
    assert_eq!(report["error"], "session.fence_stale", "{report}");
    assert_eq!(report["stale"], json!([fence, latest]), "{report}");
}

/// Replica A takes s1, reaches its model and is SIGSTOPped past its lease;
/// replica B (another process) waits out A's lease, takes the session and
/// completes a turn; A resumes and its append is refused by PostgreSQL.
/// Then the lease store loses its data twice: after restart, replica C's
/// turn starts with the lease fence again at A's number, yet with a
/// higher database fence, and its user message lands; Redis restarts
/// empty again under C's turn, so replica D takes the session at once
/// with the very lease fence C holds — and only the database's fence
/// tells them apart: D completes, C's late append is refused. The stored
/// history is each turn whole or cut after its user message, in order,
/// nothing interleaved and nothing of B or D lost.
#[test]
fn a_paused_replica_process_is_refused_after_another_takes_over() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let db = rt.block_on(TestDb::new());
    let pg = db.url();
    let mut redis = RedisServer::start().expect("start redis-server");
    let sessions = PgSessionService::new(db.pool.clone(), SystemClock);
    rt.block_on(async {
        sessions.migrate().await.expect("migrate");
        sessions
            .create(adk_session::CreateRequest {
                app_name: APP.into(),
                user_id: "u1".into(),
                session_id: Some("s1".into()),
                state: Default::default(),
            })
            .await
            .expect("create s1");
    });

    let mut a = Replica::spawn("A", "held", &redis.url(), &pg);
    let a_in = a.next("in_model");
    a.signal("STOP");
    let mut b = Replica::spawn("B", "free", &redis.url(), &pg);
    let b_done = b.next("done");
    b.finish();
    assert_whole(&b_done);
    assert!(holds(&b_done, "lease_fence") > holds(&a_in, "lease_fence"));
    assert_eq!(holds(&b_done, "db_fence"), holds(&a_in, "db_fence") + 1);
    a.release();
    a.signal("CONT");
    let a_done = a.next("done");
    a.finish();
    assert_refused(
        &a_done,
        holds(&a_in, "db_fence"),
        holds(&b_done, "db_fence"),
    );

    redis.restart().expect("restart redis-server empty");
    let mut c = Replica::spawn("C", "held", &redis.url(), &pg);
    let c_in = c.next("in_model");
    assert_eq!(
        holds(&c_in, "lease_fence"),
        holds(&a_in, "lease_fence"),
        "the lease store forgot: its fence starts again"
    );
    assert_eq!(holds(&c_in, "db_fence"), holds(&b_done, "db_fence") + 1);
    redis.restart().expect("restart redis-server empty");
    let mut d = Replica::spawn("D", "free", &redis.url(), &pg);
    let d_done = d.next("done");
    d.finish();
    assert_whole(&d_done);
    assert_eq!(
        holds(&d_done, "attempts"),
        1,
        "C's lease is gone with the data: nothing held D back"
    );
    assert_eq!(
        holds(&d_done, "lease_fence"),
        holds(&c_in, "lease_fence"),
        "the lease store issued C's number again"
    );
    assert_eq!(holds(&d_done, "db_fence"), holds(&c_in, "db_fence") + 1);
    c.release();
    let c_done = c.next("done");
    c.finish();
    assert_refused(
        &c_done,
        holds(&c_in, "db_fence"),
        holds(&d_done, "db_fence"),
    );

    let turn_of = |report: &Value| report["holds"]["invocation"].as_str().map(str::to_owned);
    let names = [
        (turn_of(&a_in), "A"),
        (turn_of(&b_done), "B"),
        (turn_of(&c_in), "C"),
        (turn_of(&d_done), "D"),
    ];
    let history: Vec<(&str, String)> = rt.block_on(async {
        sessions
            .get(get("u1", "s1"))
            .await
            .expect("s1")
            .events()
            .all()
            .into_iter()
            .map(|e| {
                let turn = names
                    .iter()
                    .find(|(id, _)| id.as_deref() == Some(e.invocation_id.as_str()))
                    .map_or("?", |(_, name)| *name);
                (turn, e.author)
            })
            .collect()
    });
    let expected: Vec<(&str, String)> = [
        ("A", "user"),
        ("B", "user"),
        ("B", "assistant"),
        ("C", "user"),
        ("D", "user"),
        ("D", "assistant"),
    ]
    .into_iter()
    .map(|(turn, author)| (turn, author.to_owned()))
    .collect();
    assert_eq!(history, expected);
    rt.block_on(db.drop_db());
}
