//! A `redis-server` under a watchdog: [`RedisOptions`], and a
//! [`RedisServer`]'s start, stop and commands.

use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::resp::command_on;
use super::{free_port, ping, poll, unique_dir};

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
    pub(super) fn cluster(mut self) -> Self {
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
    pub(super) port: u16,
    dir: PathBuf,
    options: RedisOptions,
    watchdog: Option<Child>,
    /// The `redis-server` process (the watchdog's child), while it runs.
    pub(super) pid: Option<u32>,
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

    pub(super) fn spawn(&mut self) -> io::Result<()> {
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
    pub(super) fn end_watchdog(&mut self) {
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
