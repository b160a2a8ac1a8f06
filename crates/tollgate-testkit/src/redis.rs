//! Real `redis-server` processes for store tests: a single node and a
//! 3-master Redis Cluster on free ports, torn down when the test process
//! ends, however it ends.
//!
//! Each server runs under a tiny `sh` watchdog that reads its stdin, which
//! the test process holds open: when the process exits (a failed test, a
//! panic, even SIGKILL) the pipe closes and the watchdog kills the server.
//!
//! `./scripts/test` starts its own servers and passes them in through
//! `TOLLGATE_TEST_REDIS_URL` and `TOLLGATE_TEST_REDIS_CLUSTER`; when those
//! are unset (plain `cargo test`), the shared servers are started here.
//! No test uses the machine's Redis on port 6379.

#![allow(clippy::disallowed_methods)] // waiting on a real process: real sleeps

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A `redis-server` this process started; stopped when dropped.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    watchdog: Option<Child>,
}

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
    // "+PONG" when open, "-NOAUTH…" behind a password: either way it is up.
    let mut buf = [0u8; 7];
    matches!(s.read(&mut buf), Ok(n) if n > 0 && (buf[0] == b'+' || buf[0] == b'-'))
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

fn unique_dir() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "tollgate-redis-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    ///
    /// # Errors
    ///
    /// `redis-server` is not installed, or it did not come up in 10 s.
    pub fn start() -> io::Result<Self> {
        Self::start_with(Vec::new(), false)
    }

    /// Starts a server with extra `redis-server` arguments (e.g.
    /// `["--requirepass", "secret"]`).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with_args(args: &[&str]) -> io::Result<Self> {
        Self::start_with(args.iter().map(|a| (*a).to_owned()).collect(), false)
    }

    fn start_with(extra: Vec<String>, cluster: bool) -> io::Result<Self> {
        let port = free_port(cluster)?;
        let dir = unique_dir();
        let mut s = Self {
            port,
            dir,
            extra,
            watchdog: None,
        };
        s.spawn()?;
        Ok(s)
    }

    fn spawn(&mut self) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(concat!(
                r#"redis-server "$@" & pid=$!; read _; kill $pid 2>/dev/null; "#,
                r#"wait $pid; rm -rf "$TOLLGATE_REDIS_DIR""#
            ))
            .env("TOLLGATE_REDIS_DIR", &self.dir)
            .arg("sh")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .args(&self.extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.watchdog = Some(cmd.spawn()?);
        for _ in 0..200 {
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        Err(io::Error::other(format!(
            "redis-server on port {} did not start: {log}",
            self.port
        )))
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server (a crash, as far as clients can tell) and waits
    /// until it is gone.
    pub fn stop(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            drop(w.stdin.take());
            let _ = w.wait();
        }
        for _ in 0..200 {
            if !ping(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same port (empty: it keeps nothing).
    ///
    /// # Errors
    ///
    /// It did not come up in 10 s.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        self.spawn()
    }

    /// Whether the server answers PING now.
    pub fn is_up(&self) -> bool {
        ping(self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A 3-master Redis Cluster of servers this process started.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three `redis-server --cluster-enabled yes` and joins them with
    /// `redis-cli --cluster create`, then waits for `cluster_state:ok`.
    ///
    /// # Errors
    ///
    /// A server did not start, or the cluster did not form in 20 s.
    pub fn start() -> io::Result<Self> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let extra = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-node-timeout".into(),
                "2000".into(),
                // Relative to --dir, the server's own directory.
                "--cluster-config-file".into(),
                "nodes.conf".into(),
            ];
            nodes.push(RedisServer::start_with(extra, true)?);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        for n in &nodes {
            let mut ok = false;
            for _ in 0..400 {
                let info = Command::new("redis-cli")
                    .args(["-p", &n.port.to_string(), "cluster", "info"])
                    .output()?;
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    ok = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if !ok {
                return Err(io::Error::other("cluster did not reach cluster_state:ok"));
            }
        }
        Ok(Self { nodes })
    }

    /// The seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
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
