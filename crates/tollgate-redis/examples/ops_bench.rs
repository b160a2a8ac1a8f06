//! Reserve+settle pairs (and admissions) through one `RedisStore`: the
//! rate, the Redis commands each call costs, and each script's server time.
//!
//! ```sh
//! cargo run --release -p tollgate-redis --example ops_bench -- \
//!     --url redis://127.0.0.1:6420 --mode pairs --concurrency 16 --duration 5
//! ```
//!
//! `--url` is required and must be a server of its own: the benchmark
//! resets its statistics (`CONFIG RESETSTAT`) and, with `--slowlog`, sets
//! `slowlog-log-slower-than 0` for the measured window (restored after).
//!
//! **Modes.** `pairs`: each task loops `reserve_tokens` then `settle` of the
//! same reservation (actual = estimate / 2), for a random one of `--users`
//! users; a task's run (invocation id) changes every `--calls-per-run`
//! pairs, as an agent makes several model calls per run. `admit`: each task
//! loops `admit_turn` with a fresh invocation id. `reserve`: reserves only.
//! `permit`: a provider permit with tenants as today (SPEC §5): the pool's
//! requests bucket, the tenant's share bucket and the cooldown in one
//! `take_many`, for a random one of four tenants. `permit-fair`: the same
//! permit with the tenants weighted 1 to 4 instead (fair sharing:
//! `take_many_fair`, the pool's bucket, the cooldown and the key's fair
//! state). The plan is huge, so every call is granted (any other answer is
//! counted and printed).
//!
//! **Printed per run:** calls per second (pairs per second in `pairs`), Redis
//! commands per store call (`INFO stats total_commands_processed` delta,
//! minus the benchmark's own INFO calls, over store calls), the command mix
//! (`INFO commandstats` deltas per store call), EVALSHA µs per call (server
//! time, no I/O), redis-server's CPU per store call (`INFO cpu`, all its
//! threads, I/O included) and this process's, and with `--slowlog` the
//! server µs per call of each script and of each command scripts run (SLOWLOG
//! entries grouped by SHA or command, mean and median: on a busy machine the
//! median is the one a preempted server does not inflate; the slowlog keeps
//! at most `--slowlog-len` entries, the last ones of the window, and logging
//! every command a script runs adds to the script's own time).

// A benchmark measures wall time and prints its results.
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::print_stdout
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::Script;
use tollgate_core::fair::FairTake;
use tollgate_core::lease::TurnParams;
use tollgate_core::store::TurnRequest;
use tollgate_core::store::{
    BucketTake, CooldownCheck, FairCheck, MultiTake, ReserveOutcome, ReserveRequest, SettleOutcome,
    SettleRequest,
};
use tollgate_core::{BucketSpec, Store};
use tollgate_redis::{RedisConfig, RedisStore};

const SCRIPTS: [&str; 4] = ["admit_turn", "reserve_tokens", "settle", "take_many"];

const TENANTS: [&str; 4] = ["t0", "t1", "t2", "t3"];
const WEIGHTS: [(&str, u32); 4] = [("t0", 1), ("t1", 2), ("t2", 3), ("t3", 4)];
const TENANT_KEYS: [&str; 4] = [
    "{b:m}:t:t0:rpm",
    "{b:m}:t:t1:rpm",
    "{b:m}:t:t2:rpm",
    "{b:m}:t:t3:rpm",
];

/// 10,000 requests a second with a huge burst: every permit is granted,
/// and fair sharing's clock moves as under real contention (tenants stay
/// ahead of it; a rate so large that a permit costs under one unit of
/// virtual time would reset the state at every call instead).
fn pool() -> BucketSpec {
    BucketSpec::new(600_000, 60_000, 1_000_000_000).expect("spec")
}

/// A provider permit of `tenant` (an index in `TENANTS`): `fair`, with
/// weights; else with its share bucket, as today.
async fn permit(store: &RedisStore, tenant: usize, fair: bool) -> bool {
    let take = |key| BucketTake {
        key,
        spec: pool(),
        cost: 1,
        max_wait_ms: 4_000,
    };
    let cooldown = Some(CooldownCheck {
        key: "{b:m}:cooldown",
        max_wait_ms: 4_000,
        max_ms: 300_000,
    });
    let r = if fair {
        let takes = [take("{b:m}:rpm")];
        let spec = pool();
        store
            .take_many_fair(
                &takes,
                cooldown,
                FairCheck {
                    key: "{b:m}:fair",
                    take: FairTake {
                        tenant: TENANTS[tenant],
                        weights: &WEIGHTS,
                        amount: spec.amount(),
                        period_ms: spec.period_ms(),
                        capacity: spec.capacity(),
                        window_ms: 4_000,
                    },
                },
            )
            .await
    } else {
        let takes = [take("{b:m}:rpm"), take(TENANT_KEYS[tenant])];
        store.take_many(&takes, cooldown).await
    };
    matches!(r, Ok(MultiTake::Granted { .. }))
}

struct Args {
    url: String,
    mode: String,
    users: u64,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    calls_per_run: u64,
    slowlog: bool,
    slowlog_len: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        url: String::new(),
        mode: "pairs".to_owned(),
        users: 10_000,
        concurrency: 16,
        warmup: Duration::from_secs(1),
        duration: Duration::from_secs(5),
        calls_per_run: 8,
        slowlog: false,
        slowlog_len: 20_000,
    };
    let mut it = std::env::args().skip(1);
    let num = |v: Option<String>| -> f64 { v.and_then(|s| s.parse().ok()).expect("a number") };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--url" => a.url = it.next().expect("--url URL"),
            "--mode" => {
                a.mode = it
                    .next()
                    .expect("--mode pairs|admit|reserve|permit|permit-fair")
            }
            "--users" => a.users = num(it.next()) as u64,
            "--concurrency" => a.concurrency = num(it.next()) as usize,
            "--warmup" => a.warmup = Duration::from_secs_f64(num(it.next())),
            "--duration" => a.duration = Duration::from_secs_f64(num(it.next())),
            "--calls-per-run" => a.calls_per_run = (num(it.next()) as u64).max(1),
            "--slowlog" => a.slowlog = true,
            "--slowlog-len" => a.slowlog_len = num(it.next()) as u64,
            other => panic!("unknown flag {other} (see the doc comment at the top)"),
        }
    }
    assert!(!a.url.is_empty(), "--url is required");
    a
}

fn tokens() -> BucketSpec {
    BucketSpec::new(1_000_000_000, 1_000, 1_000_000_000).expect("spec")
}

fn turn_params() -> TurnParams {
    TurnParams {
        turns: BucketSpec::new(1_000_000, 1_000, 1_000_000).expect("spec"),
        max_runs: 1_000_000,
        lease_ttl_ms: 1_000,
        concurrency_retry_ms: 1_000,
    }
}

/// One task's loop body: store calls made, and whether all went as planned.
async fn step(store: &RedisStore, mode: &str, user: &str, inv: &str, calls: &AtomicU64) -> bool {
    match mode {
        "permit" | "permit-fair" => {
            let tenant = user
                .bytes()
                .fold(0usize, |h, b| h.wrapping_mul(31) + usize::from(b))
                % 4;
            let ok = permit(store, tenant, mode == "permit-fair").await;
            calls.fetch_add(1, Ordering::Relaxed);
            ok
        }
        "admit" => {
            let r = store
                .admit_turn(TurnRequest {
                    user,
                    invocation_id: inv,
                    params: turn_params(),
                    budgets: &[],
                })
                .await;
            calls.fetch_add(1, Ordering::Relaxed);
            matches!(r, Ok(o) if matches!(o.admit, tollgate_core::lease::Admit::Admitted { .. }))
        }
        _ => {
            let r = store
                .reserve_tokens(ReserveRequest {
                    user,
                    invocation_id: inv,
                    tokens: tokens(),
                    estimate: 1_000,
                    max_wait_ms: 0,
                    max_llm_calls: 1_000_000,
                    shadow: false,
                    request_id: None,
                    budget: None,
                })
                .await;
            calls.fetch_add(1, Ordering::Relaxed);
            let Ok(ReserveOutcome::Granted { reservation, .. }) = r else {
                return false;
            };
            if mode == "reserve" {
                return true;
            }
            let s = store
                .settle(SettleRequest {
                    user,
                    tokens: tokens(),
                    reservation: &reservation,
                    actual: Some(500),
                    budget: None,
                })
                .await;
            calls.fetch_add(1, Ordering::Relaxed);
            matches!(s, Ok(SettleOutcome::Applied { .. }))
        }
    }
}

fn info(conn: &mut redis::Connection, section: &str) -> BTreeMap<String, String> {
    let text: String = redis::cmd("INFO").arg(section).query(conn).expect("INFO");
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// `cmdstat_<name>` → (calls, usec).
fn cmdstats(conn: &mut redis::Connection) -> BTreeMap<String, (f64, f64)> {
    info(conn, "commandstats")
        .into_iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("cmdstat_")?.to_owned();
            let field = |f: &str| -> Option<f64> {
                v.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            Some((name, (field("calls")?, field("usec")?)))
        })
        .collect()
}

/// redis-server's CPU so far (user + system, all threads), seconds.
fn server_cpu(conn: &mut redis::Connection) -> f64 {
    let i = info(conn, "cpu");
    let get = |k: &str| -> f64 { i.get(k).and_then(|v| v.parse().ok()).unwrap_or(0.0) };
    get("used_cpu_sys") + get("used_cpu_user")
}

/// This process's CPU so far (user + system), seconds, from /proc/self/stat.
fn self_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rfind(')').map_or("", |i| &stat[i + 2..]);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime; 100 ticks a second on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

fn total_commands(conn: &mut redis::Connection) -> f64 {
    info(conn, "stats")
        .get("total_commands_processed")
        .and_then(|v| v.parse().ok())
        .expect("total_commands_processed")
}

fn main() {
    let args = parse_args();
    let client = redis::Client::open(args.url.as_str()).expect("url");
    let mut admin = client.get_connection().expect("connect (admin)");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = rt.block_on(async {
        RedisStore::connect(
            RedisConfig::standalone(args.url.clone())
                .with_key_prefix("obench")
                .with_op_timeout(Duration::from_secs(5)),
        )
        .await
        .expect("connect")
    });
    let users: Arc<Vec<String>> = Arc::new((0..args.users).map(|i| format!("u{i:08}")).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let units = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let mode: &'static str = Box::leak(args.mode.clone().into_boxed_str());
    let _rt = rt.enter();
    let mut tasks = Vec::new();
    for t in 0..args.concurrency {
        let (store, users, stop, calls, units, bad) = (
            store.clone(),
            users.clone(),
            stop.clone(),
            calls.clone(),
            units.clone(),
            bad.clone(),
        );
        let per_run = args.calls_per_run;
        tasks.push(rt.spawn(async move {
            let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ (t as u64 + 1).wrapping_mul(0xBF58_476D);
            let mut user = 0usize;
            for n in 0u64.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let single = mode != "pairs" && mode != "reserve";
                let run = if single { n } else { n / per_run };
                if single || n % per_run == 0 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    user = (rng % users.len() as u64) as usize;
                }
                let inv = format!("t{t}-r{run}");
                if step(&store, mode, &users[user], &inv, &calls).await {
                    units.fetch_add(1, Ordering::Relaxed);
                } else {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    std::thread::sleep(args.warmup);
    if args.slowlog {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-max-len")
            .arg(args.slowlog_len)
            .query(&mut admin)
            .expect("slowlog-max-len");
        let _: () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query(&mut admin)
            .expect("reset");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0)
            .query(&mut admin)
            .expect("slowlog 0");
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut admin)
        .expect("resetstat");
    let c0 = calls.load(Ordering::Relaxed);
    let u0 = units.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let total0 = total_commands(&mut admin);
    let (srv0, me0) = (server_cpu(&mut admin), self_cpu());
    std::thread::sleep(args.duration);
    let (srv1, me1) = (server_cpu(&mut admin), self_cpu());
    let total1 = total_commands(&mut admin);
    let stats = cmdstats(&mut admin);
    let wall = t0.elapsed().as_secs_f64();
    let c1 = calls.load(Ordering::Relaxed);
    let u1 = units.load(Ordering::Relaxed);
    if args.slowlog {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(10_000)
            .query(&mut admin)
            .expect("slowlog back");
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        rt.block_on(t).expect("task");
    }
    let n = (c1 - c0) as f64;
    // The benchmark's own commands in the window: the second INFO stats, the
    // INFO commandstats is after it. (RESETSTAT zeroes the counter first.)
    let own = 1.0;
    println!(
        "mode {mode} c={} users {} calls/run {}: {:.0} {}/s, {:.0} store calls/s, \
         not as planned {}",
        args.concurrency,
        args.users,
        args.calls_per_run,
        (u1 - u0) as f64 / wall,
        if mode == "pairs" { "pairs" } else { "calls" },
        n / wall,
        bad.load(Ordering::Relaxed)
    );
    println!(
        "  cpu per store call: redis-server {:.2} µs, client {:.2} µs",
        (srv1 - srv0) * 1e6 / n,
        (me1 - me0) * 1e6 / n
    );
    println!(
        "  redis commands per store call: {:.3} (total_commands_processed {} → {})",
        (total1 - total0 - own) / n,
        total0,
        total1
    );
    let mut mix: Vec<String> = stats
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "config" | "slowlog"))
        .map(|(name, (c, _))| format!("{name} {:.3}", c / n))
        .collect();
    mix.sort();
    println!("  per store call: {}", mix.join(", "));
    if let Some((c, us)) = stats.get("evalsha") {
        println!("  evalsha: {:.2} µs per call (server)", us / c);
    }
    if args.slowlog {
        let shas: BTreeMap<String, &str> = SCRIPTS
            .iter()
            .map(|name| {
                let text = tollgate_redis::lua_source(name).expect("a script");
                (Script::new(&text).get_hash().to_owned(), *name)
            })
            .collect();
        let log: Vec<redis::Value> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(args.slowlog_len)
            .query(&mut admin)
            .expect("slowlog get");
        let mut per: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for e in log {
            let redis::Value::Array(f) = e else { continue };
            let (Some(redis::Value::Int(us)), Some(redis::Value::Array(argv))) =
                (f.get(2), f.get(3))
            else {
                continue;
            };
            let word = |i: usize| match argv.get(i) {
                Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).to_lowercase(),
                _ => String::new(),
            };
            let cmd = word(0);
            let name = if cmd == "evalsha" {
                shas.get(&word(1))
                    .map_or_else(|| format!("evalsha {}", word(1)), |s| (*s).to_owned())
            } else {
                cmd
            };
            per.entry(name)
                .or_default()
                .push(u64::try_from(*us).unwrap_or(0));
        }
        for (name, mut us) in per {
            if matches!(name.as_str(), "info" | "config" | "slowlog") {
                continue;
            }
            us.sort_unstable();
            let mean = us.iter().sum::<u64>() as f64 / us.len() as f64;
            println!(
                "  slowlog {name}: {} calls, {mean:.2} µs mean, {} µs median",
                us.len(),
                us[us.len() / 2]
            );
        }
    }
    drop(store);
    rt.shutdown_timeout(Duration::from_secs(1));
}
