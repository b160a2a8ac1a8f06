//! The planning commands of the `tollgate` binary, run as a user runs them:
//! `capacity` (SPEC §7's capacity example, table and `--json`), `simulate`
//! (the sample trace of SPEC §7's stories, a chart, a malformed trace) and
//! `derive` (a pasteable plan section that `check-config` accepts).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run tollgate")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tollgate-cli-{}-{name}", std::process::id()))
}

const CAPACITY: &[&str] = &[
    "capacity",
    "--arrival-rate",
    "40",
    "--mean-turn-s",
    "5.5",
    "--mean-calls",
    "3.2",
    "--tokens-per-call",
    "6500",
    "--per-replica",
    "60",
    "--spare",
    "2",
    "--quota-rpm",
    "10000",
    "--quota-tpm",
    "40000000",
];

/// SPEC §7: 220 in flight; 4 replicas needed, 6 deployed; 7,680
/// requests/min (77 %); 49,920,000 tokens/min (125 %): tokens bind.
#[test]
fn capacity_reproduces_the_spec_example() {
    let table = tollgate(CAPACITY);
    assert!(table.status.success(), "{table:?}");
    let text = stdout(&table);
    for needle in [
        "turns in flight     220",
        "replicas needed     4",
        "replicas to deploy  6",
        "7,680/min",
        "49,920,000/min",
        "77 %",
        "125 %",
        "tokens bind",
    ] {
        assert!(text.contains(needle), "{needle:?} in\n{text}");
    }
    let mut args = CAPACITY.to_vec();
    args.push("--json");
    let json = tollgate(&args);
    assert!(json.status.success(), "{json:?}");
    let v: Value = serde_json::from_slice(&json.stdout).expect("json");
    let s = v.to_string();
    for needle in ["220", "7680", "49920000", "\"tokens\""] {
        assert!(s.contains(needle), "{needle} in {s}");
    }
}

/// The sample trace replays SPEC §7's stories: five turns denied for the
/// turn rate (retry 2,000), a token refusal with retry 4,000; a chart is
/// written and is SVG.
#[test]
fn simulate_replays_the_sample_trace_and_draws_it() {
    let chart = temp("spec7.svg");
    let out = tollgate(&[
        "simulate",
        "--config",
        "examples/traces/spec7.toml",
        "--trace",
        "examples/traces/spec7.jsonl",
        "--chart",
        chart.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("turn_rate"), "{text}");
    assert!(text.contains("2,000 ms"), "{text}");
    assert!(text.contains("4,000 ms"), "{text}");
    let svg = std::fs::read_to_string(&chart).expect("chart written");
    let _ = std::fs::remove_file(&chart);
    assert!(svg.starts_with("<svg") || svg.contains("<svg"), "an SVG");
    assert!(
        svg.contains("<polyline") || svg.contains("<path"),
        "series drawn"
    );

    let json = tollgate(&[
        "simulate",
        "--config",
        "examples/traces/spec7.toml",
        "--trace",
        "examples/traces/spec7.jsonl",
        "--json",
    ]);
    assert!(json.status.success(), "{json:?}");
    let _: Value = serde_json::from_slice(&json.stdout).expect("json report");
}

/// A malformed trace names its line and field and exits non-zero; so does
/// a missing file.
#[test]
fn simulate_refuses_malformed_input_clearly() {
    let bad = temp("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"t_ms\": 0, \"user\": \"u1\", \"event\": \"turn_start\", \"invocation\": \"i1\"}\n{\"t_ms\": 1, \"user\": 5}\n",
    )
    .expect("write");
    let out = tollgate(&[
        "simulate",
        "--config",
        "examples/traces/spec7.toml",
        "--trace",
        bad.to_str().expect("path"),
    ]);
    let _ = std::fs::remove_file(&bad);
    assert_eq!(out.status.code(), Some(65), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2"), "{err}");
    assert!(err.contains("\"user\""), "{err}");

    let missing = tollgate(&[
        "simulate",
        "--config",
        "examples/traces/spec7.toml",
        "--trace",
        "no/such/trace.jsonl",
    ]);
    assert!(!missing.status.success(), "{missing:?}");
}

/// `derive` prints a plan section that, pasted into a config, passes
/// `tollgate check-config`.
#[test]
fn derive_prints_a_section_check_config_accepts() {
    let out = tollgate(&["derive", "--usage", "examples/traces/usage.jsonl"]);
    assert!(out.status.success(), "{out:?}");
    let section = stdout(&out);
    assert!(section.contains("[plans."), "{section}");
    let file = temp("derived.toml");
    std::fs::write(
        &file,
        format!("listen = \"127.0.0.1:0\"\n\n[identity]\nmode = \"dev\"\n\n{section}"),
    )
    .expect("write");
    let check = tollgate(&["check-config", file.to_str().expect("path")]);
    let _ = std::fs::remove_file(&file);
    assert!(check.status.success(), "{check:?}\n{section}");
}
