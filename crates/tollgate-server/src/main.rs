//! `tollgate`: serve the sidecar, check a config, mint a development token,
//! and the planning tools (simulate, capacity, derive). The command line is
//! in `cli.rs`; this file sets up logging and runs it.

use std::process::ExitCode;

use clap::Parser;

mod cli;

// mimalloc, not the system allocator: a decision allocates a few small
// buffers (HTTP/2 frames, JSON, headers), and glibc's malloc/free took about
// 10 % of the server's CPU in a profile of `loadgen` runs (docs/architecture.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Structured logs (they carry user ids; metrics never do). JSON lines
    // with TOLLGATE_LOG_FORMAT=json; the level from RUST_LOG (default info).
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    if std::env::var("TOLLGATE_LOG_FORMAT").is_ok_and(|f| f == "json") {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    cli::Cli::parse().run()
}
