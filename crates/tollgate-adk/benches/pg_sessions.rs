//! The fence's cost on PostgreSQL: `PgSessionService` (fenced) beside
//! adk-session's `PostgresSessionService` (unfenced) on the same database,
//! measured alternately (A B A B) in one run.
//!
//! For each: append latency of 1 KiB events to sessions of 10 and 1,000
//! events, read latency (`get`, whole session) of those sessions, and
//! appends per second with 32 sessions appended to concurrently.
//!
//! Run (a load harness, not part of `./scripts/test`):
//!
//! ```text
//! TOLLGATE_BENCH_PG_URL=postgres://user@127.0.0.1:5432/db \
//!   cargo bench -p tollgate-adk --features postgres --bench pg_sessions
//! ```
//!
//! It creates and drops a database of its own in that cluster.

// A load harness measures wall time and prints its table: the rules that core
// logic reads time through `tollgate_core::Clock` and never prints serve
// testability and libraries, which a measurement is neither.
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_core::identity::{AdkIdentity, AppName, SessionId, UserId};
use adk_core::{Content, LlmResponse};
use adk_session::{
    AppendEventRequest, CreateRequest, Event, GetRequest, PostgresSessionService, SessionService,
};
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use tollgate_adk::postgres::PgSessionService;
use tollgate_adk::{TurnFence, session_key, with_fence};
use tollgate_core::SystemClock;

const APP: &str = "bench";
const ROUNDS: usize = 2;
const APPENDS: usize = 200;
const READS: usize = 50;
const CONCURRENT: usize = 32;
const THROUGHPUT_FOR: Duration = Duration::from_secs(5);

fn event(n: usize) -> Event {
    let mut e = Event::new(format!("inv-{n}"));
    e.id = format!("e-{n}-{}", uuid::Uuid::new_v4());
    e.author = "user".into();
    e.llm_response = LlmResponse::new(Content::new("user").with_text("x".repeat(1024)));
    e
}

fn identity(user: &str, session: &str) -> AdkIdentity {
    AdkIdentity::new(
        AppName::try_from(APP).expect("app"),
        UserId::try_from(user).expect("user"),
        SessionId::try_from(session).expect("session"),
    )
}

/// One service under test: ours needs a fence per turn, theirs none.
#[derive(Clone)]
enum Svc {
    Fenced(Arc<PgSessionService>),
    Plain(Arc<PostgresSessionService>),
}

impl Svc {
    fn name(&self) -> &'static str {
        match self {
            Svc::Fenced(_) => "PgSessionService (fenced)",
            Svc::Plain(_) => "adk PostgresSessionService",
        }
    }

    /// Prefix of this service's user ids (both share one database).
    fn tag(&self) -> &'static str {
        match self {
            Svc::Fenced(_) => "f",
            Svc::Plain(_) => "p",
        }
    }

    fn service(&self) -> &dyn SessionService {
        match self {
            Svc::Fenced(s) => s.as_ref(),
            Svc::Plain(s) => s.as_ref(),
        }
    }

    /// The turn fence for appends to (user, session) (none for theirs).
    async fn fence(&self, user: &str, session: &str) -> Option<TurnFence> {
        match self {
            Svc::Fenced(s) => Some(TurnFence {
                session_key: session_key(APP, user, session),
                fence: 1,
                db: Some(s.take_fence(APP, user, session).await.expect("fence")),
            }),
            Svc::Plain(_) => None,
        }
    }

    async fn create(&self, user: &str, session: &str) {
        self.service()
            .create(CreateRequest {
                app_name: APP.into(),
                user_id: user.into(),
                session_id: Some(session.into()),
                state: HashMap::new(),
            })
            .await
            .expect("create");
    }

    async fn append(&self, fence: &Option<TurnFence>, user: &str, session: &str, n: usize) {
        let req = AppendEventRequest {
            identity: identity(user, session),
            event: event(n),
        };
        let svc = self.service();
        let r = match fence {
            Some(f) => with_fence(f.clone(), svc.append_event_for_identity(req)).await,
            None => svc.append_event_for_identity(req).await,
        };
        r.expect("append");
    }

    async fn read(&self, user: &str, session: &str) -> usize {
        self.service()
            .get(GetRequest {
                app_name: APP.into(),
                user_id: user.into(),
                session_id: session.into(),
                num_recent_events: None,
                after: None,
            })
            .await
            .expect("get")
            .events()
            .len()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[derive(Default)]
struct Samples(HashMap<(&'static str, String), Vec<Duration>>);

impl Samples {
    fn add(&mut self, svc: &'static str, what: String, d: Duration) {
        self.0.entry((svc, what)).or_default().push(d);
    }
}

/// A session of `size` events of `user` (created and filled).
async fn filled(svc: &Svc, user: &str, session: &str, size: usize) {
    svc.create(user, session).await;
    let fence = svc.fence(user, session).await;
    for n in 0..size {
        svc.append(&fence, user, session, n).await;
    }
}

async fn latency_round(svc: &Svc, round: usize, samples: &mut Samples) {
    for size in [10usize, 1_000] {
        let user = format!("{}-u-{round}-{size}", svc.tag());
        let session = "s";
        filled(svc, &user, session, size).await;
        let fence = svc.fence(&user, session).await;
        // Appends to a session of about `size` events (it grows by
        // APPENDS; reads are measured on a session of exactly `size`).
        let reader = format!("{}-r-{round}-{size}", svc.tag());
        filled(svc, &reader, session, size).await;
        for n in 0..READS {
            let t = Instant::now();
            let got = svc.read(&reader, session).await;
            samples.add(svc.name(), format!("read, {size} events"), t.elapsed());
            assert_eq!(got, size, "read {n}");
        }
        for n in 0..APPENDS {
            let t = Instant::now();
            svc.append(&fence, &user, session, size + n).await;
            samples.add(
                svc.name(),
                format!("append, {size}-event session"),
                t.elapsed(),
            );
        }
    }
}

async fn throughput(svc: &Svc, round: usize) -> f64 {
    let mut tasks = Vec::new();
    let start = Instant::now();
    for i in 0..CONCURRENT {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let user = format!("{}-t-{round}-{i}", svc.tag());
            svc.create(&user, "s").await;
            let fence = svc.fence(&user, "s").await;
            let mut n = 0usize;
            while start.elapsed() < THROUGHPUT_FOR {
                svc.append(&fence, &user, "s", n).await;
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Ok(url) = std::env::var("TOLLGATE_BENCH_PG_URL") else {
        eprintln!("pg_sessions: set TOLLGATE_BENCH_PG_URL to a PostgreSQL to measure on");
        return;
    };
    let name = format!("tg_bench_{}", std::process::id());
    let mut admin = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .expect("create database");
    let (base, _) = url.rsplit_once('/').expect("a database in the URL");
    let db_url = format!("{base}/{name}");
    let pool = PgPoolOptions::new()
        .max_connections(CONCURRENT as u32 + 4)
        .connect(&db_url)
        .await
        .expect("pool");
    let fenced = PgSessionService::new(pool.clone(), SystemClock);
    fenced.migrate().await.expect("migrate");
    let services = [
        Svc::Fenced(Arc::new(fenced)),
        Svc::Plain(Arc::new(PostgresSessionService::from_pool(pool.clone()))),
    ];

    let mut samples = Samples::default();
    let mut rates: HashMap<&'static str, Vec<f64>> = HashMap::new();
    for round in 0..ROUNDS {
        // A B, then B A: neither always goes first.
        let order: Vec<&Svc> = if round % 2 == 0 {
            services.iter().collect()
        } else {
            services.iter().rev().collect()
        };
        for svc in order {
            latency_round(svc, round, &mut samples).await;
            rates
                .entry(svc.name())
                .or_default()
                .push(throughput(svc, round).await);
        }
    }

    println!("| service | operation | n | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    let mut keys: Vec<_> = samples.0.keys().cloned().collect();
    keys.sort();
    for key in keys {
        let mut v = samples.0[&key].clone();
        v.sort();
        println!(
            "| {} | {} | {} | {:.2} | {:.2} |",
            key.0,
            key.1,
            v.len(),
            percentile(&v, 0.5).as_secs_f64() * 1e3,
            percentile(&v, 0.99).as_secs_f64() * 1e3
        );
    }
    println!();
    println!("| service | appends/s, {CONCURRENT} sessions concurrently (per round) |");
    println!("|---|---|");
    for svc in &services {
        let r: Vec<String> = rates[svc.name()]
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect();
        println!("| {} | {} |", svc.name(), r.join(", "));
    }

    pool.close().await;
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .expect("drop database");
}
