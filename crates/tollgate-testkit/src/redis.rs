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

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// One command in RESP, e.g. `["DEBUG", "SLEEP", "3"]`.
fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one RESP reply: a simple string, integer or bulk string as its
/// text, an array as its elements one per line, nil as ""; an error reply
/// is an `Err` with its text.
fn read_reply(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at(line.len().min(1));
    let bad = || io::Error::other(format!("bad reply: {line}"));
    match kind {
        "+" | ":" => Ok(rest.to_owned()),
        "-" => Err(io::Error::other(rest.to_owned())),
        "$" => {
            let Ok(n) = rest.parse::<i64>() else {
                return Err(bad());
            };
            let Ok(n) = usize::try_from(n) else {
                return Ok(String::new()); // $-1: nil
            };
            let mut buf = vec![0; n + 2];
            r.read_exact(&mut buf)?;
            buf.truncate(n);
            Ok(String::from_utf8_lossy(&buf).into_owned())
        }
        "*" => {
            let n = rest.parse::<i64>().map_err(|_| bad())?;
            let mut items = Vec::new();
            for _ in 0..n.max(0) {
                items.push(read_reply(r)?);
            }
            Ok(items.join("\n"))
        }
        _ => Err(bad()),
    }
}

/// Sends one command to the server on `port` and reads its reply, waiting
/// at most `timeout` for it.
fn command_on(port: u16, args: &[&str], timeout: Duration) -> io::Result<String> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    (&s).write_all(&encode(args))?;
    read_reply(&mut BufReader::new(s))
}

/// How a [`RedisServer`] runs: built with [`RedisServer::options`], started
/// with [`start`](Self::start).
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    durable: bool,
    debug: bool,
    cluster: bool,
    args: Vec<String>,
}

impl RedisOptions {
    /// `appendonly yes` with `appendfsync always`: every write the server
    /// acknowledged is on disk before the reply, so it survives
    /// [`RedisServer::kill`]; and the data directory (append-only file,
    /// `nodes.conf` of a cluster node) is kept across
    /// [`kill`](RedisServer::kill), [`stop`](RedisServer::stop) and
    /// [`restart`](RedisServer::restart) until the server is dropped.
    /// Without it a restarted server comes back empty.
    #[must_use]
    pub fn durable(mut self) -> Self {
        self.durable = true;
        self
    }

    /// `enable-debug-command yes`, for [`RedisServer::debug_sleep`]
    /// (Redis 7 refuses `DEBUG` otherwise).
    #[must_use]
    pub fn debug(mut self) -> Self {
        self.debug = true;
        self
    }

    /// Extra `redis-server` arguments (e.g. `["--requirepass", "secret"]`).
    #[must_use]
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// A port whose bus port (+10000) is free too, for a cluster node.
    fn cluster(mut self) -> Self {
        self.cluster = true;
        self
    }

    /// Starts the server on a free port and waits until it answers PING.
    ///
    /// # Errors
    ///
    /// `redis-server` is not installed, or it did not come up in 10 s.
    pub fn start(self) -> io::Result<RedisServer> {
        let port = free_port(self.cluster)?;
        let mut s = RedisServer {
            port,
            dir: unique_dir(),
            options: self,
            watchdog: None,
            pid: None,
        };
        s.spawn()?;
        Ok(s)
    }
}

/// A `redis-server` this process started; stopped when dropped, its
/// directory removed.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    options: RedisOptions,
    watchdog: Option<Child>,
    /// The `redis-server` process (the watchdog's child), while it runs.
    pid: Option<u32>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    ///
    /// # Errors
    ///
    /// `redis-server` is not installed, or it did not come up in 10 s.
    pub fn start() -> io::Result<Self> {
        RedisOptions::default().start()
    }

    /// Starts a server with extra `redis-server` arguments (e.g.
    /// `["--requirepass", "secret"]`).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with_args(args: &[&str]) -> io::Result<Self> {
        RedisOptions::default().args(args).start()
    }

    /// A server for fault tests: [`durable`](RedisOptions::durable) and
    /// with [`debug`](RedisOptions::debug) on.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_durable() -> io::Result<Self> {
        RedisOptions::default().durable().debug().start()
    }

    /// Options to start a server with.
    pub fn options() -> RedisOptions {
        RedisOptions::default()
    }

    fn spawn(&mut self) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let o = &self.options;
        let mut cmd = Command::new("sh");
        // The watchdog prints the server's pid, then waits on its stdin: a
        // line `keep` (a deliberate stop) keeps the directory for a restart;
        // end of file (this process is gone) removes it. SIGCONT after the
        // SIGTERM: a paused server must wake to die.
        cmd.arg("-c")
            .arg(concat!(
                r#"redis-server "$@" >/dev/null 2>&1 & pid=$!; echo $pid; read cmd; "#,
                r#"kill $pid 2>/dev/null; kill -CONT $pid 2>/dev/null; wait $pid; "#,
                r#"[ "$cmd" = keep ] || rm -rf "$TOLLGATE_REDIS_DIR""#
            ))
            .env("TOLLGATE_REDIS_DIR", &self.dir)
            .arg("sh")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args(if o.durable {
                ["--appendonly", "yes", "--appendfsync", "always"].as_slice()
            } else {
                ["--appendonly", "no"].as_slice()
            })
            .args(if o.debug {
                ["--enable-debug-command", "yes"].as_slice()
            } else {
                [].as_slice()
            })
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .args(&o.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut watchdog = cmd.spawn()?;
        let mut line = String::new();
        if let Some(out) = watchdog.stdout.take() {
            BufReader::new(out).read_line(&mut line)?;
        }
        self.pid = line.trim().parse().ok();
        self.watchdog = Some(watchdog);
        if poll(Duration::from_secs(10), || ping(self.port).then_some(())).is_some() {
            return Ok(());
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

    /// The `redis-server` process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Ends the watchdog, which ends the server (SIGTERM; a no-op after a
    /// SIGKILL) and reaps it; keeps the directory of a durable server.
    fn end_watchdog(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            if let Some(mut stdin) = w.stdin.take()
                && self.options.durable
            {
                let _ = stdin.write_all(b"keep\n");
            }
            let _ = w.wait();
        }
        self.pid = None;
    }

    /// Stops the server (SIGTERM: a durable one syncs its append-only
    /// file) and waits until it is gone.
    pub fn stop(&mut self) {
        self.end_watchdog();
        let _ = poll(Duration::from_secs(4), || (!ping(self.port)).then_some(()));
    }

    /// SIGKILLs `redis-server` (a crash: no shutdown, no last fsync) and
    /// waits until it is gone. A durable server keeps what it acknowledged;
    /// [`restart`](Self::restart) brings it back on the same port.
    pub fn kill(&mut self) {
        if let Some(pid) = self.pid {
            let _ = signal(pid, "KILL");
        }
        self.end_watchdog();
        let _ = poll(Duration::from_secs(4), || (!ping(self.port)).then_some(()));
    }

    /// Starts the server again on the same port (stopping it first if it
    /// runs) and waits until it answers: with what it persisted if
    /// [`durable`](RedisOptions::durable) (it answers PING, perhaps
    /// `-LOADING`, while it reads its append-only file), else empty.
    ///
    /// # Errors
    ///
    /// It did not come up in 10 s.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        self.spawn()
    }

    /// SIGSTOPs `redis-server`: connections stay open, commands are
    /// accepted by the kernel and nothing answers, until
    /// [`resume`](Self::resume) (or the server is dropped).
    ///
    /// # Errors
    ///
    /// It does not run.
    pub fn pause(&self) -> io::Result<()> {
        signal(self.running()?, "STOP")
    }

    /// SIGCONTs a [`pause`](Self::pause)d server: it answers what queued up.
    ///
    /// # Errors
    ///
    /// It does not run.
    pub fn resume(&self) -> io::Result<()> {
        signal(self.running()?, "CONT")
    }

    fn running(&self) -> io::Result<u32> {
        self.pid
            .ok_or_else(|| io::Error::other("redis-server is not running"))
    }

    /// Sends `DEBUG SLEEP <secs>` (needs [`debug`](RedisOptions::debug)):
    /// the server blocks its event loop for `secs` seconds, reachable but
    /// answering nothing. Returns once the command is sent, without waiting
    /// for the sleep: the handle's thread ends with the server's `+OK`,
    /// after the sleep (an error if the server refused the command).
    ///
    /// # Errors
    ///
    /// The server cannot be reached.
    pub fn debug_sleep(&self, secs: f64) -> io::Result<JoinHandle<io::Result<()>>> {
        let s = TcpStream::connect(("127.0.0.1", self.port))?;
        let secs = format!("{secs}");
        (&s).write_all(&encode(&["DEBUG", "SLEEP", &secs]))?;
        Ok(std::thread::spawn(move || {
            s.set_read_timeout(Some(Duration::from_secs(600)))?;
            read_reply(&mut BufReader::new(s)).map(drop)
        }))
    }

    /// `CLIENT PAUSE <ms> ALL`: the server holds every client's commands
    /// for `ms` (its replication and its own timers go on). Does not wait.
    ///
    /// # Errors
    ///
    /// The server cannot be reached or refused.
    pub fn client_pause(&self, ms: u64) -> io::Result<()> {
        self.command(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"])
            .map(drop)
    }

    /// Sends one command and reads its reply (a string; an array's
    /// elements one per line; an error reply is an `Err`), waiting at most
    /// 2 s: for tests to inspect or seed the server without a client crate.
    ///
    /// # Errors
    ///
    /// The server cannot be reached, did not answer in 2 s, or answered an
    /// error.
    pub fn command(&self, args: &[&str]) -> io::Result<String> {
        command_on(self.port, args, Duration::from_secs(2))
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

/// Redis Cluster's hash slot of `key`: CRC16 (XMODEM) of the key, or of its
/// hash tag (the part between the first `{` and the next `}`, if not
/// empty), mod 16,384.
pub fn key_slot(key: &str) -> u16 {
    let k = key.as_bytes();
    let k = match k.iter().position(|&b| b == b'{') {
        Some(open) => match k[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &k[open + 1..open + 1 + len],
            _ => k,
        },
        None => k,
    };
    let mut crc: u16 = 0;
    for &b in k {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    /// The master's id, for a replica.
    of: Option<String>,
    slots: Vec<(u16, u16)>,
}

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            // ip:port@cport[,hostname]
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(NodeLine {
                id: f[0].to_owned(),
                port,
                master: flags.contains(&"master"),
                failed: flags.contains(&"fail") || flags.contains(&"fail?"),
                of: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// What [`RedisCluster::kill_master_of`] did.
#[derive(Debug, Clone)]
pub struct FailedOver {
    /// The port of the master it killed.
    pub killed: u16,
    /// The port of the replica now master of the slot.
    pub promoted: u16,
    /// From the kill until every live node answered `cluster_state:ok`
    /// with the replica promoted (real time).
    pub took: Duration,
}

/// A Redis Cluster of servers this process started: 3 masters
/// ([`start`](Self::start)), or 3 masters each with a replica
/// ([`start_with_replicas`](Self::start_with_replicas)).
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
        Self::form(3, 0, 2_000, RedisOptions::default())
    }

    /// Six durable nodes (`appendonly yes`, `appendfsync always`, debug
    /// on): 3 masters, each with a replica that has synced, and a
    /// `cluster-node-timeout` of 1,000 ms (a replica may take over however
    /// stale it is: `cluster-replica-validity-factor 0`), so that
    /// [`kill_master_of`](Self::kill_master_of) fails over within seconds.
    ///
    /// # Errors
    ///
    /// A server did not start, or the cluster did not form in 30 s.
    pub fn start_with_replicas() -> io::Result<Self> {
        let c = Self::form(
            6,
            1,
            1_000,
            RedisOptions::default()
                .durable()
                .debug()
                .args(&["--cluster-replica-validity-factor", "0"]),
        )?;
        c.wait_healthy(Duration::from_secs(30))?;
        Ok(c)
    }

    fn form(
        n: usize,
        replicas: u32,
        node_timeout_ms: u32,
        options: RedisOptions,
    ) -> io::Result<Self> {
        let mut nodes = Vec::new();
        for _ in 0..n {
            let o = options.clone().cluster().args(&[
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                &node_timeout_ms.to_string(),
                // Relative to --dir, the server's own directory.
                "--cluster-config-file",
                "nodes.conf",
            ]);
            nodes.push(o.start()?);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        let c = Self { nodes };
        c.wait_ok(Duration::from_secs(20))?;
        Ok(c)
    }

    /// Waits until every running node answers `cluster_state:ok`.
    fn wait_ok(&self, limit: Duration) -> io::Result<()> {
        poll(limit, || {
            self.running()
                .all(|n| {
                    n.command(&["CLUSTER", "INFO"])
                        .is_ok_and(|i| i.contains("cluster_state:ok"))
                })
                .then_some(())
        })
        .ok_or_else(|| io::Error::other("cluster did not reach cluster_state:ok"))
    }

    /// Waits until the cluster is ok and every master has a replica whose
    /// link to it is up (`master_link_status:up`, it has synced).
    fn wait_healthy(&self, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        self.wait_ok(limit)?;
        let synced = |n: &RedisServer| {
            n.command(&["INFO", "replication"])
                .is_ok_and(|i| i.contains("master_link_status:up"))
        };
        poll(limit.saturating_sub(start.elapsed()), || {
            let view = self.view().ok()?;
            view.iter()
                .filter(|m| m.master && !m.failed && !m.slots.is_empty())
                .all(|m| {
                    view.iter().any(|r| {
                        r.of.as_deref() == Some(m.id.as_str())
                            && !r.failed
                            && self.node(r.port).is_some_and(synced)
                    })
                })
                .then_some(())
        })
        .ok_or_else(|| io::Error::other("a master has no synced replica"))
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| n.pid.is_some())
    }

    fn node(&self, port: u16) -> Option<&RedisServer> {
        self.nodes.iter().find(|n| n.port == port)
    }

    /// `CLUSTER NODES` as a running node sees it.
    fn view(&self) -> io::Result<Vec<NodeLine>> {
        let mut last = io::Error::other("no node runs");
        for n in self.running() {
            match n.command(&["CLUSTER", "NODES"]) {
                Ok(text) => return Ok(parse_nodes(&text)),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The seed URLs of every node (those killed too: a client must cope).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Every node, masters and replicas, running or killed.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The port of the master serving `slot` now (see [`key_slot`]).
    ///
    /// # Errors
    ///
    /// No running node answers, or none serves the slot.
    pub fn master_of(&self, slot: u16) -> io::Result<u16> {
        self.view()?
            .into_iter()
            .find(|n| {
                n.master && !n.failed && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
            })
            .map(|n| n.port)
            .ok_or_else(|| io::Error::other(format!("no master serves slot {slot}")))
    }

    /// SIGKILLs the master of `slot` and waits (real time, at most 15 s)
    /// until a replica is master of the slot and every running node answers
    /// `cluster_state:ok`. The killed node stays down until
    /// [`restart_node`](Self::restart_node).
    ///
    /// # Errors
    ///
    /// No master serves the slot, or no replica took over within 15 s.
    pub fn kill_master_of(&mut self, slot: u16) -> io::Result<FailedOver> {
        self.kill_master_of_then(slot, || {})
    }

    /// [`kill_master_of`](Self::kill_master_of), calling `killed` once the
    /// master is gone and before waiting for its replica (a chaos test
    /// sends what must meet the dead master then).
    ///
    /// # Errors
    ///
    /// As [`kill_master_of`](Self::kill_master_of).
    pub fn kill_master_of_then(
        &mut self,
        slot: u16,
        killed: impl FnOnce(),
    ) -> io::Result<FailedOver> {
        let on_killed = killed;
        let killed = self.master_of(slot)?;
        let start = Instant::now();
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port == killed) {
            n.kill();
        }
        on_killed();
        let limit = Duration::from_secs(15);
        let promoted = poll(limit, || {
            let now = self.master_of(slot).ok().filter(|&p| p != killed)?;
            // Every running node must agree, or a client may be sent back.
            self.running()
                .all(|n| {
                    n.command(&["CLUSTER", "INFO"])
                        .is_ok_and(|i| i.contains("cluster_state:ok"))
                        && n.command(&["CLUSTER", "NODES"]).is_ok_and(|t| {
                            parse_nodes(&t).iter().any(|l| {
                                l.port == now
                                    && l.master
                                    && l.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
                            })
                        })
                })
                .then_some(now)
        })
        .ok_or_else(|| {
            io::Error::other(format!(
                "no replica took over slot {slot} from port {killed} within {limit:?}"
            ))
        })?;
        Ok(FailedOver {
            killed,
            promoted,
            took: start.elapsed(),
        })
    }

    /// Starts a killed node again on its port with its data and
    /// `nodes.conf`: it rejoins as a replica of whoever took its slots.
    /// Waits (at most 30 s) until the cluster is ok and every master has a
    /// synced replica again, so the next failover can happen.
    ///
    /// # Errors
    ///
    /// No such node, it did not start, or the cluster did not heal.
    pub fn restart_node(&mut self, port: u16) -> io::Result<()> {
        let n = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .ok_or_else(|| io::Error::other(format!("no node on port {port}")))?;
        n.restart()?;
        self.wait_healthy(Duration::from_secs(30))
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
