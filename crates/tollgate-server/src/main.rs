//! `tollgate`: serve the sidecar, check a config, mint a development token,
//! and the planning tools (simulate, capacity, derive).
#![allow(clippy::print_stdout)] // a CLI prints

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use tollgate_core::{Clock, SystemClock};
use tollgate_planner::capacity::{CapacityInput, capacity};
use tollgate_planner::derive::derive_file;
use tollgate_planner::simulate::{SimulateOptions, simulate};
use tollgate_planner::{PlanError, Rational};

/// Admission control for LLM agent platforms.
#[derive(Parser)]
#[command(name = "tollgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Command {
    /// Run the sidecar (HTTP/JSON API; gRPC when `grpc_listen` is set; Envoy's
    /// rate-limit service when `rls_listen` is set).
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
        /// A scope to grant (repeatable), e.g. `tollgate:feedback` for a
        /// service that reports provider answers.
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// The tenant claim's value (needs `tenant_claim` in `[identity]`).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Replay a traffic trace (JSON lines) through the real limiter on a
    /// fake clock and report what was allowed, waited or denied
    /// (docs/planning.md).
    Simulate {
        /// The config whose plans, users, overrides and providers to replay
        /// against (the server's TOML; its server-only settings are ignored).
        #[arg(long)]
        config: PathBuf,
        /// The trace, one JSON object per line.
        #[arg(long)]
        trace: PathBuf,
        /// Put every plan in shadow mode: report would-deny only.
        #[arg(long)]
        shadow: bool,
        /// Also draw the replay to this SVG file.
        #[arg(long)]
        chart: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Size a fleet by Little's law against the provider quota.
    Capacity {
        /// Turns arriving per second, fleet-wide.
        #[arg(long)]
        arrival_rate: Rational,
        /// Mean turn time, seconds.
        #[arg(long)]
        mean_turn_s: Rational,
        /// Mean model calls per turn.
        #[arg(long)]
        mean_calls: Rational,
        /// 95th percentile of model calls per turn.
        #[arg(long)]
        p95_calls: Option<Rational>,
        /// Tokens per model call (as the quota counts them).
        #[arg(long)]
        tokens_per_call: Rational,
        /// Safe in-flight turns per replica.
        #[arg(long)]
        per_replica: u64,
        /// Spare replicas on top of those needed (2 for N+2).
        #[arg(long, default_value_t = 0)]
        spare: u64,
        /// The provider's requests-per-minute quota.
        #[arg(long)]
        quota_rpm: Option<Rational>,
        /// The provider's tokens-per-minute quota.
        #[arg(long)]
        quota_tpm: Option<Rational>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Suggest plan limits from per-turn usage records (JSON lines).
    Derive {
        /// The usage records.
        #[arg(long)]
        usage: PathBuf,
        /// Suggested limit = this × the plan's 95th percentile.
        #[arg(long, default_value = "2.5")]
        multiple: Rational,
        /// Print JSON instead of the config section.
        #[arg(long)]
        json: bool,
    },
}

/// Prints a planning command's result: JSON or text, or the error (with
/// its exit code).
fn planned<R>(
    result: Result<R, PlanError>,
    json: bool,
    to_json: impl FnOnce(&R) -> serde_json::Value,
    to_text: impl FnOnce(&R) -> String,
) -> ExitCode {
    match result {
        Ok(r) if json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&to_json(&r)).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Ok(r) => {
            print!("{}", to_text(&r));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
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
        Command::Token {
            user,
            config,
            ttl,
            scopes,
            tenant,
        } => {
            let cfg = match tollgate_server::load_config(config.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(EX_USAGE);
                }
            };
            let clock: Arc<dyn Clock> = Arc::new(SystemClock);
            match tollgate_server::verifier(&cfg, clock)
                .map(|v| v.mint_with(&user, ttl, &scopes, tenant.as_deref()))
            {
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
        Command::Simulate {
            config,
            trace,
            shadow,
            chart,
            json,
        } => planned(
            simulate(
                &SimulateOptions::new(config, trace)
                    .with_shadow(shadow)
                    .with_chart(chart),
            ),
            json,
            |r| r.to_json(),
            |r| r.to_table(),
        ),
        Command::Capacity {
            arrival_rate,
            mean_turn_s,
            mean_calls,
            p95_calls,
            tokens_per_call,
            per_replica,
            spare,
            quota_rpm,
            quota_tpm,
            json,
        } => planned(
            capacity(&CapacityInput {
                arrival_rate,
                mean_turn_s,
                mean_calls,
                p95_calls,
                tokens_per_call,
                per_replica,
                spare,
                quota_rpm,
                quota_tpm,
            }),
            json,
            |r| r.to_json(),
            |r| r.to_table(),
        ),
        Command::Derive {
            usage,
            multiple,
            json,
        } => planned(
            derive_file(&usage, multiple),
            json,
            |r| r.to_json(),
            |r| r.to_toml(),
        ),
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
                if let Some(grpc) = r.grpc_addr {
                    println!("  grpc:     {grpc} (tollgate.v1.Tollgate)");
                }
                if let Some(rls) = r.rls_addr {
                    let key = if r.rls_key {
                        "x-tollgate-rls-key required"
                    } else {
                        "no key: loopback only"
                    };
                    println!("  rls:      {rls} (Envoy rate-limit service v3; {key})");
                }
                if let Some(admin) = r.admin_addr {
                    println!("  operator: http://{admin} (/metrics, /admin/*)");
                }
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
