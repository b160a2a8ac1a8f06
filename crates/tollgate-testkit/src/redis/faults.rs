//! The faults a [`RedisServer`] can be put through: a crash and a
//! restart, SIGSTOP and SIGCONT, `DEBUG SLEEP` and `CLIENT PAUSE`.

use std::io::{self, BufReader, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::Duration;

use super::resp::{encode, read_reply};
use super::{RedisServer, ping, poll, signal};

impl RedisServer {
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
    /// [`durable`](super::RedisOptions::durable) (it answers PING, perhaps
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

    /// Sends `DEBUG SLEEP <secs>` (needs [`debug`](super::RedisOptions::debug)):
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
}
