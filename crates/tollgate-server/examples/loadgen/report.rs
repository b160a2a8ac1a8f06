//! What the load generator (`loadgen.rs`) prints at the end of a run, and
//! its `--json FILE` report: one JSON object with the same figures,
//! unrounded, for scripts such as `benches/compare`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::{Args, CallStats, Mode};

/// CPU over the measured window, % of one core.
pub(crate) struct Cpu {
    pub(crate) loadgen: Option<f64>,
    pub(crate) server: Option<f64>,
    pub(crate) redis: Option<f64>,
    /// The rest of the machine's busy time.
    pub(crate) other: Option<f64>,
    pub(crate) machine: Option<f64>,
}

/// What one run measured.
pub(crate) struct Report<'a> {
    args: &'a Args,
    server_pid: Option<u32>,
    /// Per kind of call, latencies sorted.
    calls: [CallStats; 2],
    /// Every counted call's latency, µs, sorted.
    all: Vec<u32>,
    /// Operations whose calls all counted and answered 2xx.
    pairs: u64,
    cpu: Cpu,
}

/// Nearest-rank percentile of sorted values (NaN when there are none).
fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    f64::from(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1_000.0)
}

fn show(v: Option<f64>) -> String {
    v.map_or("n/a".to_owned(), |v| format!("{v:.0} %"))
}

/// A finite number, or `null` (JSON has no NaN).
fn num(v: Option<f64>) -> Value {
    v.filter(|v| v.is_finite()).map_or(Value::Null, Value::from)
}

impl<'a> Report<'a> {
    pub(crate) fn new(
        args: &'a Args,
        server_pid: Option<u32>,
        mut calls: [CallStats; 2],
        pairs: u64,
        cpu: Cpu,
    ) -> Self {
        let mut all = Vec::with_capacity(calls[0].lat_us.len() + calls[1].lat_us.len());
        for c in &mut calls {
            c.lat_us.sort_unstable();
            all.extend_from_slice(&c.lat_us);
        }
        all.sort_unstable();
        Report {
            args,
            server_pid,
            calls,
            all,
            pairs,
            cpu,
        }
    }

    fn secs(&self) -> f64 {
        self.args.duration.as_secs_f64()
    }

    fn total_calls(&self) -> u64 {
        self.calls.iter().map(CallStats::total).sum()
    }

    /// 2xx, 429 and other answers over both kinds of call.
    fn classes(&self) -> (u64, u64, u64) {
        self.calls.iter().fold((0, 0, 0), |(o, d, x), c| {
            (o + c.ok, d + c.denied, x + c.other)
        })
    }

    /// CPU µs spent per call by a process at `pct` % of one core.
    fn us_per_call(&self, pct: Option<f64>) -> Option<f64> {
        let calls = self.total_calls();
        if calls == 0 {
            return None;
        }
        Some(pct? / 100.0 * self.secs() * 1e6 / calls as f64)
    }

    /// The human report, on stdout.
    pub(crate) fn print(
        &self,
        tokens: usize,
        mint_time: Duration,
        refusals: &BTreeMap<String, (u64, String)>,
    ) {
        let a = self.args;
        let secs = self.secs();
        let total_calls = self.total_calls();
        println!(
            "loadgen: {} mode against {} (server pid {}), concurrency {}, {} users, warm-up {:.1} s, measured {:.1} s; {} tokens minted in {:.2} s before the run",
            match a.mode {
                Mode::Admit => "admit+release",
                Mode::Reserve => "reserve+settle",
                Mode::Rls => "ShouldRateLimit",
                Mode::LimitadorHttp => "check_and_report",
                Mode::Permit => "provider permit",
            },
            a.url,
            self.server_pid
                .map_or("unknown".to_owned(), |p| p.to_string()),
            a.concurrency,
            a.users,
            a.warmup.as_secs_f64(),
            secs,
            tokens,
            mint_time.as_secs_f64(),
        );
        println!(
            "decisions/s {:.0}   pairs/s {:.0}   ({} calls, {} complete pairs in the window)",
            total_calls as f64 / secs,
            self.pairs as f64 / secs,
            total_calls,
            self.pairs
        );
        println!(
            "{:<26} {:>9} {:>7} {:>7} {:>10} {:>10} {:>10} {:>10}",
            "call", "2xx", "429", "other", "p50", "p99", "p99.9", "max"
        );
        let (ok, denied, other) = self.classes();
        let rows = a.mode.calls().into_iter().zip(&self.calls);
        let every = ("every call", ok, denied, other, &self.all);
        for (name, ok, denied, other, lat) in rows
            .map(|(name, c)| (name, c.ok, c.denied, c.other, &c.lat_us))
            .chain([every])
        {
            println!(
                "{:<26} {:>9} {:>7} {:>7} {:>10} {:>10} {:>10} {:>10}",
                name,
                ok,
                denied,
                other,
                ms(percentile(lat, 50.0)),
                ms(percentile(lat, 99.0)),
                ms(percentile(lat, 99.9)),
                ms(percentile(lat, 100.0)),
            );
        }

        let cpu = &self.cpu;
        let cores = std::thread::available_parallelism().map_or(0, usize::from);
        println!(
            "CPU (% of one core; {cores} cores = {} %): loadgen {}, server {}, redis-server {}, other {}, machine busy {}",
            cores * 100,
            show(cpu.loadgen),
            show(cpu.server),
            show(cpu.redis),
            show(cpu.other),
            show(cpu.machine),
        );
        if refusals.is_empty() {
            println!("non-2xx answers (whole run, warm-up included): none");
        } else {
            println!("non-2xx answers (whole run, warm-up included):");
            for (what, (n, example)) in refusals {
                println!("  {n:>9} × {what}: {example}");
            }
        }
        println!(
            "RESULT\tmode={}\tdecisions_per_s={:.0}\tpairs_per_s={:.0}\tp50_ms={:.3}\tp99_ms={:.3}\tcpu_loadgen={}\tcpu_server={}\tcpu_redis={}\tcpu_other={}\t2xx={ok}\t429={denied}\tother={other}",
            a.mode.name(),
            total_calls as f64 / secs,
            self.pairs as f64 / secs,
            percentile(&self.all, 50.0) / 1_000.0,
            percentile(&self.all, 99.0) / 1_000.0,
            show(cpu.loadgen),
            show(cpu.server),
            show(cpu.redis),
            show(cpu.other),
        );
    }

    fn to_json(&self, refusals: &BTreeMap<String, (u64, String)>) -> Value {
        let a = self.args;
        let secs = self.secs();
        let (ok, denied, other) = self.classes();
        let cpu = &self.cpu;
        json!({
            "mode": a.mode.name(),
            "server_pid": self.server_pid,
            "concurrency": a.concurrency,
            "users": a.users,
            "warmup_s": a.warmup.as_secs_f64(),
            "duration_s": secs,
            "calls": self.total_calls(),
            "decisions_per_s": self.total_calls() as f64 / secs,
            "pairs_per_s": self.pairs as f64 / secs,
            "ok": ok,
            "denied": denied,
            "other": other,
            "p50_ms": num(Some(percentile(&self.all, 50.0) / 1_000.0)),
            "p99_ms": num(Some(percentile(&self.all, 99.0) / 1_000.0)),
            "p999_ms": num(Some(percentile(&self.all, 99.9) / 1_000.0)),
            "cpu_pct": {
                "loadgen": num(cpu.loadgen),
                "server": num(cpu.server),
                "redis": num(cpu.redis),
                "other": num(cpu.other),
                "machine": num(cpu.machine),
            },
            "server_us_per_decision": num(self.us_per_call(cpu.server)),
            "redis_us_per_decision": num(self.us_per_call(cpu.redis)),
            // Non-2xx answers of the whole run (warm-up included), by kind.
            "refusals": refusals
                .iter()
                .map(|(what, (n, _))| (what.clone(), Value::from(*n)))
                .collect::<serde_json::Map<_, _>>(),
        })
    }

    /// Writes the report, with the non-2xx answers by kind, to `path` as
    /// one line of JSON.
    pub(crate) fn write(
        &self,
        path: &Path,
        refusals: &BTreeMap<String, (u64, String)>,
    ) -> Result<(), String> {
        std::fs::write(path, format!("{}\n", self.to_json(refusals)))
            .map_err(|e| format!("--json {}: {e}", path.display()))
    }
}
