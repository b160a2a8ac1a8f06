//! `tollgate`: serve the sidecar, check a config, mint a development token.
#![allow(clippy::print_stdout)] // a CLI prints

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use tollgate_core::{Clock, MonotonicClock};

/// Admission control for LLM agent platforms.
#[derive(Parser)]
#[command(name = "tollgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the sidecar (HTTP/JSON API).
    Serve {
        /// Config file (TOML); without it, the embedded development default.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Validate a config file and explain every error.
    CheckConfig {
        /// Config file (TOML).
        file: PathBuf,
    },
    /// Mint a token for a user (HS256 identity modes: dev, or jwt with a secret).
    Token {
        /// The user id to put in the token.
        #[arg(long)]
        user: String,
        /// Config file; without it, the embedded default (dev mode).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Validity, seconds.
        #[arg(long, default_value_t = 3600)]
        ttl: u64,
    },
}

const EX_USAGE: u8 = 64;

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
    match Cli::parse().command {
        Command::CheckConfig { file } => match tollgate_server::config::Config::load(&file) {
            Ok(_) => {
                println!("{}: ok", file.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EX_USAGE)
            }
        },
        Command::Token { user, config, ttl } => {
            let cfg = match tollgate_server::load_config(config.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(EX_USAGE);
                }
            };
            let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
            match tollgate_server::verifier(&cfg, clock).map(|v| v.mint(&user, ttl)) {
                Ok(Ok(token)) => {
                    println!("{token}");
                    ExitCode::SUCCESS
                }
                Ok(Err(e)) => {
                    eprintln!("cannot mint a token with this identity config: {e}");
                    ExitCode::from(EX_USAGE)
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(EX_USAGE)
                }
            }
        }
        Command::Serve { config } => serve(config),
    }
}

fn serve(config: Option<PathBuf>) -> ExitCode {
    let cfg = match tollgate_server::load_config(config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dev = config.is_none();
    let result = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
        tollgate_server::serve(
            cfg,
            listener,
            None,
            |r| {
                println!("tollgate listening on http://{}", r.addr);
                println!("  store:    {}", r.store);
                println!("  identity: {}", r.identity);
                if dev {
                    println!(
                        "  mint a development token: cargo run -p tollgate-server -- token --user alice"
                    );
                }
            },
            tollgate_server::shutdown::signal(),
        )
        .await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e}");
            ExitCode::FAILURE
        }
    }
}
