//! Generates a large synthetic trace and replays it, to measure
//! `simulate`'s replay time and memory on a release build:
//!
//! ```sh
//! cargo build --release -p tollgate-planner --example replay
//! target/release/examples/replay gen /tmp/day.jsonl 1000000
//! /usr/bin/time -v target/release/examples/replay run \
//!     examples/traces/spec7.toml /tmp/day.jsonl
//! ```
//!
//! `gen OUT LINES [USERS [DAYS]]` writes `DAYS` days (default 1) of
//! traffic, sorted by time, from `USERS` users (default 2,000): turns with a session, two or three model
//! calls (every third through the `openai:gpt-4o` quota), an end, one in a
//! hundred abandoned, and a few users in bursts that hit their limits.
//! `run CONFIG TRACE [--shadow] [--chart OUT.svg]` replays it and prints
//! the report.
#![allow(clippy::print_stdout)] // an example prints

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use tollgate_planner::simulate::{SimulateOptions, simulate};

const DAY_MS: u64 = 86_400_000;

/// SplitMix64: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn generate(out: &PathBuf, lines: u64, users: u64, days: u64) -> std::io::Result<()> {
    let mut w = BufWriter::new(std::fs::File::create(out)?);
    let mut rng = Rng(42);
    // About 4.5 lines per turn: spread that many over the day, and go on
    // until exactly `lines` are written.
    let gap = (days * DAY_MS / (lines * 2 / 9).max(1)).max(1);
    let turns = lines;
    // (time, sequence, line): lines of overlapping turns, emitted in order.
    let mut pending: BinaryHeap<Reverse<(u64, u64, String)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut written = 0u64;
    let mut t = 0u64;
    let mut turn = 0u64;
    while written < lines {
        if turn < turns {
            // Most turns come from anyone; one in twenty from the 10 bursty
            // users, who then go past their turn rate.
            let user = if rng.below(20) == 0 {
                rng.below(10)
            } else {
                rng.below(users)
            };
            let inv = format!("i{turn}");
            let session = format!("s{user}-{}", rng.below(3));
            let mut push = |at: u64, line: String| {
                seq += 1;
                pending.push(Reverse((at, seq, line)));
            };
            push(
                t,
                format!(
                    r#"{{"t_ms": {t}, "event": "turn_start", "user": "u{user}", "session": "{session}", "invocation": "{inv}"}}"#
                ),
            );
            let calls = 2 + rng.below(2);
            let mut at = t;
            for c in 0..calls {
                at += 500 + rng.below(3_000);
                let estimate = 2_000 + rng.below(8_000);
                let actual = estimate / 2 + rng.below(estimate);
                let provider = if c % 3 == 2 || rng.below(3) == 0 {
                    r#", "provider": "openai", "model": "gpt-4o""#
                } else {
                    ""
                };
                push(
                    at,
                    format!(
                        r#"{{"t_ms": {at}, "event": "model_call", "user": "u{user}", "invocation": "{inv}", "estimate": {estimate}, "actual": {actual}, "duration_ms": {}{provider}}}"#,
                        500 + rng.below(2_000)
                    ),
                );
            }
            at += 3_000;
            let end = if rng.below(100) == 0 {
                "turn_abandon"
            } else {
                "turn_end"
            };
            push(
                at,
                format!(
                    r#"{{"t_ms": {at}, "event": "{end}", "user": "u{user}", "invocation": "{inv}"}}"#
                ),
            );
            turn += 1;
            t += gap;
        }
        // Emit what can no longer be preceded by a later turn's lines.
        while let Some(Reverse((at, _, _))) = pending.peek() {
            if *at > t && turn < turns {
                break;
            }
            let Some(Reverse((_, _, line))) = pending.pop() else {
                break;
            };
            writeln!(w, "{line}")?;
            written += 1;
            if written == lines {
                break;
            }
        }
        if turn >= turns && pending.is_empty() {
            break;
        }
    }
    w.flush()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: replay gen OUT LINES [USERS [DAYS]] | replay run CONFIG TRACE [--shadow] [--chart OUT.svg]";
    match args.first().map(String::as_str) {
        Some("gen") if args.len() >= 3 => {
            let lines = args[2].parse().unwrap_or(1_000_000);
            let users = args.get(3).and_then(|u| u.parse().ok()).unwrap_or(2_000);
            let days = args.get(4).and_then(|d| d.parse().ok()).unwrap_or(1);
            match generate(&PathBuf::from(&args[1]), lines, users, days) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("run") if args.len() >= 3 => {
            let shadow = args.iter().any(|a| a == "--shadow");
            let chart = args
                .iter()
                .position(|a| a == "--chart")
                .and_then(|i| args.get(i + 1))
                .map(PathBuf::from);
            let opts = SimulateOptions::new(&args[1], &args[2])
                .with_shadow(shadow)
                .with_chart(chart);
            match simulate(&opts) {
                Ok(report) => {
                    print!("{}", report.to_table());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }
        _ => {
            eprintln!("{usage}");
            ExitCode::from(64)
        }
    }
}
