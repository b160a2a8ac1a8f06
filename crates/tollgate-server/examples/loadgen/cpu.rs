//! CPU accounting of the load generator (`loadgen.rs`): `/proc` ticks of
//! this process, the server, `redis-server` and the whole machine, and the
//! process listening on a TCP port.

use std::collections::HashSet;

/// utime + stime of a process, clock ticks.
fn proc_ticks(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start with the
    // state, field 3; utime and stime are fields 14 and 15.
    let rest = s.get(s.rfind(')')? + 1..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The machine's busy ticks (all CPUs) from `/proc/stat`.
fn machine_busy_ticks() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is in user).
    let total: u64 = v.iter().take(8).sum();
    Some(total - v.get(3)? - v.get(4)?)
}

pub(crate) fn clock_ticks_per_s() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The process listening on TCP `port` (this network namespace).
pub(crate) fn pid_listening_on(port: u16) -> Option<u32> {
    let mut sockets = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let c: Vec<&str> = line.split_whitespace().collect();
            let local_port = c
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if c.len() > 9 && c[3] == "0A" && local_port == Some(port) {
                sockets.insert(format!("socket:[{}]", c[9]));
            }
        }
    }
    if sockets.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path())
                && sockets.contains(link.to_string_lossy().as_ref())
            {
                return Some(pid);
            }
        }
    }
    None
}

pub(crate) fn url_port(url: &str) -> Option<u16> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    match authority.rsplit_once(':') {
        Some((_, p)) => p.parse().ok(),
        None if url.starts_with("https://") => Some(443),
        None => Some(80),
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuSnap {
    pub(crate) me: Option<u64>,
    pub(crate) server: Option<u64>,
    pub(crate) redis: Option<u64>,
    pub(crate) machine: Option<u64>,
}

pub(crate) fn cpu_snap(server: Option<u32>, redis: Option<u32>) -> CpuSnap {
    CpuSnap {
        me: proc_ticks("self"),
        server: server.and_then(|p| proc_ticks(&p.to_string())),
        redis: redis.and_then(|p| proc_ticks(&p.to_string())),
        machine: machine_busy_ticks(),
    }
}
