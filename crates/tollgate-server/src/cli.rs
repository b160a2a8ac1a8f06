//! The `tollgate` command line: `serve`, `check-config` and `token` are
//! the sidecar's; `simulate`, `capacity` and `derive` are the planner's
//! [`clap::Args`] (`tollgate_planner::cli`), embedded here.
#![allow(clippy::print_stdout)] // a CLI prints

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use tollgate_core::{Clock, SystemClock};
use tollgate_planner::cli::{CapacityArgs, DeriveArgs, SimulateArgs};

/// `EX_USAGE` (sysexits.h): a config that does not load, or cannot mint.
const EX_USAGE: u8 = 64;

/// Admission control for LLM agent platforms.
#[derive(Parser)]
#[command(name = "tollgate", version, about)]
pub(crate) struct Cli {
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
    // The planning tools: their arguments, help and exit codes are the
    // planner's (`tollgate_planner::cli`).
    Simulate(SimulateArgs),
    Capacity(CapacityArgs),
    Derive(DeriveArgs),
}

impl Cli {
    /// Runs the subcommand; its exit status.
    pub(crate) fn run(self) -> ExitCode {
        match self.command {
            Command::Serve { config } => serve(config),
            Command::CheckConfig { file } => check_config(&file),
            Command::Token {
                user,
                config,
                ttl,
                scopes,
                tenant,
            } => token(&user, config, ttl, &scopes, tenant.as_deref()),
            Command::Simulate(args) => args.run(),
            Command::Capacity(args) => args.run(),
            Command::Derive(args) => args.run(),
        }
    }
}

/// `tollgate check-config`: loads the file and says `ok` or every error.
fn check_config(file: &Path) -> ExitCode {
    match tollgate_server::config::Config::load(file) {
        Ok(_) => {
            println!("{}: ok", file.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(EX_USAGE)
        }
    }
}

/// `tollgate token`: mints a token with the config's HS256 identity.
fn token(
    user: &str,
    config: Option<PathBuf>,
    ttl: u64,
    scopes: &[String],
    tenant: Option<&str>,
) -> ExitCode {
    let cfg = match tollgate_server::load_config(config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    match tollgate_server::verifier(&cfg, clock).map(|v| v.mint_with(user, ttl, scopes, tenant)) {
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

/// `tollgate serve`: runs the sidecar until a shutdown signal.
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
