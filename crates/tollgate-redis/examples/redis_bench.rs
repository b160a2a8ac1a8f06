//! Turn admissions through one `RedisStore`, beside the ceiling
//! `redis-benchmark` reaches on the same server.
//!
//! ```sh
//! cargo run --release -p tollgate-redis --example redis_bench
//! cargo run --release -p tollgate-redis --example redis_bench -- \
//!     --url redis://127.0.0.1:6379 --concurrency 1,16,64 --duration 5 --warmup 1
//! ```
//!
//! Without `--url` it starts a fresh `redis-server` on a free port (stopped
//! at exit). Needs `redis-server`, `redis-cli` and `redis-benchmark` on the
//! `PATH`. Other flags: `--users N` (10000), `--workers N` (tokio worker
//! threads; default one per core), `--lease-ttl-ms N` (1000), `--no-raw`
//! (skip the redis-rs floor), `--no-ceiling` (skip `redis-benchmark`).
//! With `--url` the keys go under the prefix `bench`; nothing is flushed.
//!
//! **What is measured.** Each tokio task loops `Store::admit_turn` and
//! nothing else, for a random one of `--users` users and a fresh invocation
//! id, through ONE `RedisStore` (one multiplexed connection, Redis `TIME`, no
//! clock override, op timeout 5 s). The turn rate and `max_runs` are huge, so
//! every admission is granted (checked: any denial or error is reported). No
//! lease is released: leases live `--lease-ttl-ms` and later admissions of the
//! same user reclaim them, so a user's lease set stays at a steady few members
//! whatever ran before. After the warm-up, every admission that starts and
//! ends within the measured window is counted and its latency recorded.
//!
//! **The redis-rs floor** (`raw`): the same EVALSHA, same keys and ARGV,
//! through a bare redis-rs `ConnectionManager` configured as `RedisStore`'s,
//! keys formatted in advance and no timeout around the call: what is left
//! when `RedisStore`'s own work is taken away.
//!
//! **The ceiling.** `redis-benchmark -c C -n N -r USERS --csv EVALSHA …`
//! against the same server with the same key and ARGV shape: (a) a minimal
//! script (TIME, a GET of the turn bucket, a ZCARD of the lease set, a small
//! array back) and (b) the real admit_turn script, the exact text `RedisStore`
//! loads (`tollgate_redis::lua_source`; its SHA is checked against `redis::Script`'s).
//! `__rand_int__` gives random users and invocation ids, as the tasks use.
//! redis-benchmark's `-c C` is C TCP connections, each with one request in
//! flight (no pipelining, `-P 1`); ours is C tasks sharing ONE multiplexed
//! connection, so up to C requests are in flight on one socket. The extra
//! `-c1 -P C` column is `redis-benchmark -c 1 -P C` (one connection, C
//! requests written back to back), the closest thing to what the
//! multiplexer puts on the wire.
//!
//! **CPU split**, in % of one core over each measured window: `redis-server`
//! (from `/proc/<pid>/stat`, its pid from `INFO server`; local servers only),
//! the client (this process from `/proc/self/stat`, or `redis-benchmark` from
//! the shell's `times`), and `other`: everything else the machine ran
//! (`/proc/stat`), i.e. how quiet it was. `srv µs` is the server's own time
//! per EVALSHA (`INFO commandstats`), without I/O.

// A benchmark measures wall time and prints its results: real clocks, real
// sleeps and stdout are its job.
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::print_stdout
)]

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use tollgate_core::lease::{Admit, TurnParams};
use tollgate_core::store::TurnRequest;
use tollgate_core::{BucketSpec, Store};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::redis::RedisServer;

/// A script of the admission script's shape doing almost nothing.
const MINIMAL: &str = "\
local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
local n = redis.call('ZCARD', KEYS[2])
return {1, tonumber(t[1]) * 1000, 0, n}
";

const PREFIX: &str = "bench";
const TURN_AMOUNT: u64 = 1_000;
const TURN_PERIOD_MS: u64 = 1;
const TURN_CAPACITY: u64 = 1_000_000_000;
const MAX_RUNS: u32 = u32::MAX;
const RETRY_MS: u64 = 1_000;
const OP_TIMEOUT: Duration = Duration::from_secs(5);

struct Args {
    url: Option<String>,
    warmup: Duration,
    duration: Duration,
    users: u32,
    concurrency: Vec<usize>,
    workers: Option<usize>,
    lease_ttl_ms: u64,
    raw: bool,
    ceiling: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        url: None,
        warmup: Duration::from_secs(1),
        duration: Duration::from_secs(5),
        users: 10_000,
        concurrency: vec![1, 16, 64],
        workers: None,
        lease_ttl_ms: 1_000,
        raw: true,
        ceiling: true,
    };
    let mut it = std::env::args().skip(1);
    let secs = |v: Option<String>| {
        Duration::from_secs_f64(v.and_then(|s| s.parse().ok()).expect("seconds"))
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--url" => a.url = it.next(),
            "--warmup" => a.warmup = secs(it.next()),
            "--duration" => a.duration = secs(it.next()),
            "--users" => {
                a.users = it.next().and_then(|s| s.parse().ok()).expect("--users N");
                assert!(a.users > 0, "--users must be at least 1");
            }
            "--concurrency" => {
                a.concurrency = it
                    .next()
                    .expect("--concurrency 1,16,64")
                    .split(',')
                    .map(|s| s.trim().parse().expect("a number"))
                    .collect();
            }
            "--workers" => a.workers = it.next().and_then(|s| s.parse().ok()),
            "--lease-ttl-ms" => {
                a.lease_ttl_ms = it.next().and_then(|s| s.parse().ok()).expect("ms");
            }
            "--no-raw" => a.raw = false,
            "--no-ceiling" => a.ceiling = false,
            other => panic!("unknown flag {other} (see the doc comment at the top)"),
        }
    }
    a
}

/// CPU accounting from /proc, in seconds.
#[derive(Clone, Copy)]
struct Cpu {
    tick: f64,
}

impl Cpu {
    fn new() -> Self {
        let tick = Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0);
        Self { tick }
    }

    /// User+system CPU of a process (`self` or a pid), from `/proc/<pid>/stat`.
    fn process(self, pid: &str) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name: state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        Some(ticks as f64 / self.tick)
    }

    /// Busy CPU of the whole machine (all but idle and iowait), `/proc/stat`.
    fn machine(self) -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().next()?.strip_prefix("cpu ")?;
        let f: Vec<u64> = line
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        // user nice system idle iowait irq softirq steal
        let busy = f.iter().take(8).sum::<u64>() - f.get(3)? - f.get(4)?;
        Some(busy as f64 / self.tick)
    }
}

/// A before/after snapshot of redis-server's, the machine's and the
/// server's EVALSHA counters.
struct Snap {
    redis: Option<f64>,
    machine: Option<f64>,
    evalsha: Option<(f64, f64)>,
    at: Instant,
}

impl Snap {
    fn take(url: &str, pid: Option<&str>, cpu: Cpu) -> Self {
        Self {
            evalsha: evalsha_stats(url),
            redis: pid.and_then(|p| cpu.process(p)),
            machine: cpu.machine(),
            at: Instant::now(),
        }
    }
}

/// The CPU split of one window, in % of one core, and the server's µs per
/// EVALSHA.
#[derive(Default)]
struct Split {
    redis: Option<f64>,
    client: Option<f64>,
    other: Option<f64>,
    server_us: Option<f64>,
}

impl Split {
    fn of(a: &Snap, b: &Snap, client_secs: Option<f64>) -> Self {
        let wall = b.at.duration_since(a.at).as_secs_f64();
        let redis = a.redis.zip(b.redis).map(|(x, y)| y - x);
        let machine = a.machine.zip(b.machine).map(|(x, y)| y - x);
        let other = machine.map(|m| m - redis.unwrap_or(0.0) - client_secs.unwrap_or(0.0));
        let pct = |s: Option<f64>| s.map(|s| (s / wall * 100.0).max(0.0));
        let server_us = a
            .evalsha
            .zip(b.evalsha)
            .and_then(|((c0, u0), (c1, u1))| (c1 > c0).then(|| (u1 - u0) / (c1 - c0)));
        Self {
            redis: pct(redis),
            client: pct(client_secs),
            other: pct(other),
            server_us,
        }
    }

    fn show(&self) -> String {
        format!(
            "cpu redis {} client {} other {}, srv {} µs",
            pct(self.redis),
            pct(self.client),
            pct(self.other),
            num1(self.server_us)
        )
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.0}%"))
}

fn num1(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1}"))
}

fn redis_cli(url: &str, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-u", url]);
    if stdin.is_some() {
        cmd.arg("-x");
    }
    let mut child = cmd
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write to redis-cli");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// EVALSHA calls and their total execution time (µs) so far, from
/// `INFO commandstats`: the server's own cost of a script call, without I/O.
fn evalsha_stats(url: &str) -> Option<(f64, f64)> {
    let info = redis_cli(url, &["INFO", "commandstats"], None);
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))?;
    let field = |name: &str| -> Option<f64> {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    Some((field("calls")?, field("usec")?))
}

/// The server's pid, if it runs on this machine.
fn redis_pid(url: &str) -> Option<String> {
    let info = redis_cli(url, &["INFO", "server"], None);
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))?
        .trim()
        .to_owned();
    std::path::Path::new(&format!("/proc/{pid}/stat"))
        .exists()
        .then_some(pid)
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1_000.0
}

fn params(lease_ttl_ms: u64) -> TurnParams {
    TurnParams {
        turns: BucketSpec::new(TURN_AMOUNT, TURN_PERIOD_MS, TURN_CAPACITY).expect("spec"),
        max_runs: MAX_RUNS,
        lease_ttl_ms,
        concurrency_retry_ms: RETRY_MS,
    }
}

/// What the tasks drive.
#[derive(Clone)]
enum Driver {
    /// `RedisStore::admit_turn`.
    Store(RedisStore),
    /// The same EVALSHA through a bare redis-rs connection manager; the
    /// users' (turn, lease) keys formatted in advance.
    Raw {
        conn: ConnectionManager,
        script: Arc<Script>,
        keys: Arc<Vec<(String, String)>>,
    },
}

impl Driver {
    /// One admission; `Ok(true)` when granted fresh.
    async fn admit(
        &self,
        user: usize,
        users: &[String],
        inv: &str,
        params: TurnParams,
    ) -> Result<bool, String> {
        match self {
            Driver::Store(store) => {
                let o = store
                    .admit_turn(TurnRequest {
                        user: &users[user],
                        invocation_id: inv,
                        params,
                        budgets: &[],
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(matches!(
                    o.admit,
                    Admit::Admitted {
                        refreshed: false,
                        ..
                    }
                ))
            }
            Driver::Raw { conn, script, keys } => {
                let (turn, lease) = &keys[user];
                let spec = params.turns;
                let mut call = script.prepare_invoke();
                call.key(turn)
                    .key(lease)
                    .arg(0)
                    .arg(spec.amount())
                    .arg(spec.period_ms())
                    .arg(spec.capacity_scaled())
                    .arg(inv)
                    .arg(params.lease_ttl_ms)
                    .arg(params.max_runs)
                    .arg(params.concurrency_retry_ms);
                // Four little-endian doubles: ok, expiry, refreshed, reclaimed.
                let r: Vec<u8> = call
                    .invoke_async(&mut conn.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                let at = |i: usize| {
                    r.get(8 * i..8 * i + 8)
                        .and_then(|b| b.try_into().ok())
                        .map(f64::from_le_bytes)
                };
                Ok(r.len() == 32 && at(0) == Some(1.0) && at(2) == Some(0.0))
            }
        }
    }
}

/// One measurement through `Driver`.
struct Run {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
    not_granted: u64,
    errors: u64,
    split: Split,
}

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

struct Env<'a> {
    url: &'a str,
    pid: Option<&'a str>,
    cpu: Cpu,
    args: &'a Args,
    users: Arc<Vec<String>>,
}

async fn drive(env: &Env<'_>, driver: &Driver, c: usize) -> Run {
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let params = params(env.args.lease_ttl_ms);
    let mut tasks = Vec::with_capacity(c);
    for task in 0..c {
        let (driver, users, phase) = (driver.clone(), env.users.clone(), phase.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 16);
            let (mut not_granted, mut errors) = (0u64, 0u64);
            let mut inv = String::with_capacity(32);
            // xorshift64: a random user per admission, as redis-benchmark -r.
            let mut rng =
                0x9E37_79B9_7F4A_7C15_u64 ^ (task as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            for n in 0u64.. {
                let p = phase.load(Ordering::Relaxed);
                if p == STOP {
                    break;
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let user = (rng % users.len() as u64) as usize;
                inv.clear();
                let _ = write!(inv, "i{task}-{n}");
                let t0 = Instant::now();
                let r = driver.admit(user, &users, &inv, params).await;
                let dt = t0.elapsed();
                match r {
                    Ok(true) => {}
                    Ok(false) => not_granted += 1,
                    Err(_) => errors += 1,
                }
                if p == MEASURE && phase.load(Ordering::Relaxed) == MEASURE {
                    lat.push(u64::try_from(dt.as_nanos()).unwrap_or(u64::MAX));
                }
            }
            (lat, not_granted, errors)
        }));
    }
    tokio::time::sleep(env.args.warmup).await;
    let self0 = env.cpu.process("self");
    let a = Snap::take(env.url, env.pid, env.cpu);
    phase.store(MEASURE, Ordering::Relaxed);
    tokio::time::sleep(env.args.duration).await;
    phase.store(STOP, Ordering::Relaxed);
    let wall = a.at.elapsed().as_secs_f64();
    let self1 = env.cpu.process("self");
    let b = Snap::take(env.url, env.pid, env.cpu);
    let mut all = Vec::new();
    let (mut not_granted, mut errors) = (0, 0);
    for t in tasks {
        let (lat, d, e) = t.await.expect("task");
        all.extend(lat);
        not_granted += d;
        errors += e;
    }
    all.sort_unstable();
    Run {
        rate: all.len() as f64 / wall,
        p50_us: percentile(&all, 0.50),
        p99_us: percentile(&all, 0.99),
        not_granted,
        errors,
        split: Split::of(&a, &b, self0.zip(self1).map(|(x, y)| y - x)),
    }
}

/// One redis-benchmark measurement.
struct Ceiling {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    split: Split,
}

/// Parses `times`' children line: `0m1.230000s 0m0.450000s`.
fn parse_times(line: &str) -> Option<f64> {
    let mut total = 0.0;
    for part in line.split_whitespace() {
        let (m, s) = part.strip_suffix('s')?.split_once('m')?;
        total += m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?;
    }
    Some(total)
}

fn redis_benchmark(
    env: &Env<'_>,
    clients: usize,
    pipeline: usize,
    n: u64,
    command: &[String],
) -> Option<Ceiling> {
    let a = Snap::take(env.url, env.pid, env.cpu);
    let out = Command::new("sh")
        .args(["-c", r#"redis-benchmark "$@" && times"#, "sh"])
        .args(["-u", env.url, "--csv"])
        .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
        .args(["-n", &n.to_string(), "-r", &env.args.users.to_string()])
        .args(command)
        .output()
        .ok()?;
    let b = Snap::take(env.url, env.pid, env.cpu);
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().find(|l| l.starts_with("\"EVALSHA"))?;
    // The last seven columns: rps, avg, min, p50, p95, p99, max (ms).
    let cols: Vec<f64> = row
        .rsplit("\",\"")
        .take(7)
        .map(|s| s.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    let (rps, p50, p99) = (cols[6], cols[3], cols[1]);
    // `times` prints the shell's line, then its children's.
    let client = text.lines().last().and_then(parse_times);
    Some(Ceiling {
        rps,
        p50_us: p50 * 1_000.0,
        p99_us: p99 * 1_000.0,
        split: Split::of(&a, &b, client),
    })
}

/// Calibrates N on a short run, then measures for about `--duration`.
fn ceiling(env: &Env<'_>, clients: usize, pipeline: usize, command: &[String]) -> Option<Ceiling> {
    let probe = redis_benchmark(env, clients, pipeline, 20_000, command)?;
    let n = ((probe.rps * env.args.duration.as_secs_f64()) as u64).max(20_000);
    redis_benchmark(env, clients, pipeline, n, command)
}

fn rate(c: Option<&Ceiling>) -> String {
    c.map_or_else(|| "n/a".to_owned(), |c| format!("{:.0}", c.rps))
}

fn main() {
    let args = parse_args();
    let cpu = Cpu::new();
    let server;
    let url = if let Some(u) = &args.url {
        u.clone()
    } else {
        server = RedisServer::start().expect("start redis-server (is it installed?)");
        server.url()
    };
    let pid = redis_pid(&url);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(w) = args.workers {
        rt.worker_threads(w);
    }
    let rt = rt.enable_all().build().expect("tokio runtime");
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let workers = args.workers.unwrap_or(cores);
    let users: Arc<Vec<String>> = Arc::new((0..args.users).map(|i| format!("u{i:012}")).collect());

    // The same text `RedisStore` loads (the prelude helpers it uses + body).
    let real = tollgate_redis::lua_source("admit_turn").expect("admit_turn");
    let store = rt.block_on(async {
        RedisStore::connect(
            RedisConfig::standalone(url.clone())
                .with_key_prefix(PREFIX)
                .with_op_timeout(OP_TIMEOUT),
        )
        .await
        .expect("connect")
    });
    let raw = args.raw.then(|| {
        // As RedisStore::connect configures its ConnectionManager.
        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .expect("url")
            .set_tcp_settings(TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(info).expect("client");
        let cfg = ConnectionManagerConfig::new()
            .set_response_timeout(Some(OP_TIMEOUT))
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let _rt = rt.enter();
        let conn = ConnectionManager::new_lazy_with_config(client, cfg).expect("manager");
        let keys = users
            .iter()
            .map(|u| {
                (
                    format!("{PREFIX}:turn2:{{{u}}}"),
                    format!("{PREFIX}:lease:{{{u}}}"),
                )
            })
            .collect();
        Driver::Raw {
            conn,
            script: Arc::new(Script::new(&real)),
            keys: Arc::new(keys),
        }
    });
    let store = Driver::Store(store);

    // The two ceiling scripts, loaded as redis-cli would.
    let store_sha = Script::new(&real).get_hash().to_owned();
    let (real_sha, min_sha) = if args.ceiling {
        let real_sha = redis_cli(&url, &["SCRIPT", "LOAD"], Some(&real));
        let min_sha = redis_cli(&url, &["SCRIPT", "LOAD"], Some(MINIMAL));
        assert_eq!(
            real_sha, store_sha,
            "redis-cli loaded another text than RedisStore"
        );
        (real_sha, min_sha)
    } else {
        (String::new(), String::new())
    };
    // The keys and ARGV RedisStore::admit_turn sends (users u000000000000..).
    let evalsha = |sha: &str| -> Vec<String> {
        let spec = params(args.lease_ttl_ms).turns;
        [
            "EVALSHA",
            sha,
            "2",
            &format!("{PREFIX}:turn2:{{u__rand_int__}}"),
            &format!("{PREFIX}:lease:{{u__rand_int__}}"),
            "0",
            &spec.amount().to_string(),
            &spec.period_ms().to_string(),
            &spec.capacity_scaled().to_string(),
            "i__rand_int__",
            &args.lease_ttl_ms.to_string(),
            &MAX_RUNS.to_string(),
            &RETRY_MS.to_string(),
        ]
        .map(str::to_owned)
        .to_vec()
    };

    println!(
        "redis_bench: {url} (redis-server pid {}), {} users, warm-up {:?}, measured {:?}, \
         {workers} tokio worker thread(s), {cores} cores",
        pid.as_deref().unwrap_or("n/a"),
        args.users,
        args.warmup,
        args.duration,
    );
    println!(
        "workload: admit_turn only (no release), every admission granted; \
         lease TTL {} ms, reclaimed by later admissions",
        args.lease_ttl_ms
    );

    let env = Env {
        url: &url,
        pid: pid.as_deref(),
        cpu,
        args: &args,
        users,
    };
    let mut rows = Vec::new();
    for &c in &args.concurrency {
        let mut runs = vec![("tollgate", rt.block_on(drive(&env, &store, c)))];
        if let Some(raw) = &raw {
            runs.push(("redis-rs", rt.block_on(drive(&env, raw, c))));
        }
        for (name, r) in &runs {
            println!(
                "  c={c:<3} {name:<12} {:>7.0}/s  p50 {:>7.1} µs  p99 {:>7.1} µs  {}  \
                 (not granted {}, errors {})",
                r.rate,
                r.p50_us,
                r.p99_us,
                r.split.show(),
                r.not_granted,
                r.errors,
            );
        }
        let mut ceil: [Option<Ceiling>; 3] = [None, None, None];
        if args.ceiling {
            ceil[0] = ceiling(&env, c, 1, &evalsha(&min_sha));
            ceil[1] = ceiling(&env, c, 1, &evalsha(&real_sha));
            ceil[2] = ceiling(&env, 1, c, &evalsha(&real_sha));
            let names = ["minimal", "real", "real -c1 -P"];
            for (name, r) in names.iter().zip(&ceil) {
                if let Some(r) = r {
                    println!(
                        "  c={c:<3} {name:<12} {:>7.0}/s  p50 {:>7.1} µs  p99 {:>7.1} µs  {}",
                        r.rps,
                        r.p50_us,
                        r.p99_us,
                        r.split.show(),
                    );
                }
            }
        }
        rows.push((c, runs, ceil));
    }

    println!();
    println!(
        "| conc | tollgate adm/s | p50 µs | p99 µs | redis-rs raw /s | ceiling minimal req/s \
         | ceiling real req/s | real -c1 -P conc | tollgate/real | tollgate/minimal \
         | CPU redis / bench / other |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for (c, runs, ceil) in &rows {
        let t = &runs[0].1;
        let ratio = |x: Option<&Ceiling>| {
            x.map_or_else(|| "n/a".to_owned(), |x| format!("{:.2}", t.rate / x.rps))
        };
        println!(
            "| {c} | {:.0} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} | {} / {} / {} |",
            t.rate,
            t.p50_us,
            t.p99_us,
            runs.get(1)
                .map_or_else(|| "n/a".to_owned(), |r| format!("{:.0}", r.1.rate)),
            rate(ceil[0].as_ref()),
            rate(ceil[1].as_ref()),
            rate(ceil[2].as_ref()),
            ratio(ceil[1].as_ref()),
            ratio(ceil[0].as_ref()),
            pct(t.split.redis),
            pct(t.split.client),
            pct(t.split.other),
        );
    }
    println!(
        "\nredis-benchmark -c C: C connections, one request in flight each (-P 1). \
         tollgate and redis-rs at C: C tokio tasks on ONE multiplexed connection. \
         'real -c1 -P C': one connection, C requests pipelined. CPU in % of one core."
    );
    drop(store);
    drop(raw);
    rt.shutdown_timeout(Duration::from_secs(1));
}
