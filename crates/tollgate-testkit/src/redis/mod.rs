//! Real `redis-server` processes for store tests: a single node and a
//! 3-master Redis Cluster on free ports, torn down when the test process
//! ends, however it ends; and for chaos tests, the faults to apply to them.
//!
//! Each server runs under a tiny `sh` watchdog that reads its stdin, which
//! the test process holds open: when the process exits (a failed test, a
//! panic, even SIGKILL) the pipe closes and the watchdog kills the server
//! (waking it first if it was paused) and removes its directory.
//!
//! # Faults
//!
//! A [`RedisServer`] started [`durable`](RedisOptions::durable)
//! (`appendonly yes`, `appendfsync always`: whatever it acknowledged is on
//! disk before the reply) keeps its data directory across
//! [`kill`](RedisServer::kill) (SIGKILL of `redis-server` itself: a crash)
//! and [`restart`](RedisServer::restart) on the same port, so it comes back
//! with everything it acknowledged. [`pause`](RedisServer::pause) and
//! [`resume`](RedisServer::resume) SIGSTOP and SIGCONT it (connections stay
//! open and nothing answers: a hung server, or a long GC pause of a proxy);
//! [`debug_sleep`](RedisServer::debug_sleep) (`DEBUG SLEEP`, with
//! [`debug`](RedisOptions::debug)) blocks its event loop while it stays
//! reachable, and [`client_pause`](RedisServer::client_pause) holds its
//! clients' commands. [`RedisCluster::start_with_replicas`] is a 3-master,
//! 3-replica cluster whose [`kill_master_of`](RedisCluster::kill_master_of)
//! kills a slot's master and waits until its replica took over.
//!
//! These calls block the calling thread for as long as they wait on the
//! process (`kill` and `pause` for milliseconds, `restart` until the server
//! answers, a cluster failover for seconds, bounded); from an async test on
//! the multi-threaded runtime call them inside
//! `tokio::task::block_in_place`, so the runtime's other tasks (the
//! clients under test) keep running meanwhile. `debug_sleep` and
//! `client_pause` never block the caller.
//!
//! `./scripts/test` starts its own servers and passes them in through
//! `TOLLGATE_TEST_REDIS_URL` and `TOLLGATE_TEST_REDIS_CLUSTER`; when those
//! are unset (plain `cargo test`), the shared servers are started here.
//! No test uses the machine's Redis on port 6379.

// Waiting on a real process: real sleeps, and real time for the bounds.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod cluster;
mod faults;
mod resp;
mod server;

pub use cluster::{FailedOver, RedisCluster, key_slot};
pub use server::{RedisOptions, RedisServer};

/// A free local port (never 6379); with `also_plus_10000`, port + 10000
/// is free too (a cluster node's bus port).
///
/// # Errors
///
/// No free port found in 100 tries.
pub fn free_port(also_plus_10000: bool) -> io::Result<u16> {
    // Below the kernel's ephemeral range (32768+), so no outgoing connection
    // can take the port between this check and the server's bind: 20000 to
    // 22767, whose bus ports (+10000) stay below 32768 too.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id()).wrapping_mul(7_919);
    for _ in 0..2_768 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + ((seed + n * 104_729) % 2_768) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        if also_plus_10000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_err() {
            continue;
        }
        return Ok(port);
    }
    Err(io::Error::other("no free port in 20000..22767"))
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    // "+PONG" when open, "-NOAUTH…" behind a password: either way it is up;
    // not while it answers "-LOADING" (still reading its append-only file).
    let mut buf = [0u8; 8];
    matches!(s.read(&mut buf), Ok(n) if n > 0 && (buf[0] == b'+' || buf[0] == b'-') && &buf[..n] != b"-LOADING")
}

/// Polls `cond` every 20 ms of real time until it holds or `secs` pass: for
/// waiting on a real process (a restarted server, a reconnection), never for
/// logic that a fake clock can drive. Answers whether it held.
pub async fn wait_until<F, Fut>(secs: u64, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..secs * 50 {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// [`wait_until`] for a blocking caller: polls `cond` every 20 ms until it
/// answers `Some`, for at most `limit`.
fn poll<T>(limit: Duration, mut cond: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = cond() {
            return Some(v);
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn unique_dir() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "tollgate-redis-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Sends `signal` (`KILL`, `STOP`, `CONT`, …) to process `pid`.
fn signal(pid: u32, signal: &str) -> io::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("kill -{signal} {pid} failed")))
    }
}

/// The URL of a single Redis node shared by the tests of this process:
/// `TOLLGATE_TEST_REDIS_URL` if set, else a server started on first use.
///
/// # Panics
///
/// If no server could be started (is `redis-server` installed?).
pub fn shared_url() -> String {
    static SERVER: OnceLock<(String, Option<RedisServer>)> = OnceLock::new();
    SERVER
        .get_or_init(|| match std::env::var("TOLLGATE_TEST_REDIS_URL") {
            Ok(url) if !url.is_empty() => (url, None),
            _ => {
                let s = RedisServer::start().expect("start redis-server");
                (s.url(), Some(s))
            }
        })
        .0
        .clone()
}

/// The seed URLs of a Redis Cluster shared by the tests of this process:
/// `TOLLGATE_TEST_REDIS_CLUSTER` (comma-separated) if set, else a cluster
/// started on first use.
///
/// # Panics
///
/// If no cluster could be started.
pub fn shared_cluster() -> Vec<String> {
    static CLUSTER: OnceLock<(Vec<String>, Option<RedisCluster>)> = OnceLock::new();
    CLUSTER
        .get_or_init(|| match std::env::var("TOLLGATE_TEST_REDIS_CLUSTER") {
            Ok(seeds) if !seeds.is_empty() => (seeds.split(',').map(str::to_owned).collect(), None),
            _ => {
                let c = RedisCluster::start().expect("start redis cluster");
                (c.urls(), Some(c))
            }
        })
        .0
        .clone()
}

/// A key prefix no other store of any test process uses, so tests can share
/// one server without flushing it.
pub fn unique_prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "t{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
