//! A Redis Cluster of servers this process started, and failing its
//! masters over.

use std::io;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{RedisOptions, RedisServer, poll};

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
