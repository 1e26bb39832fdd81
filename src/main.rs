#![forbid(unsafe_code)]
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// homelab-autoscaler: powers homelab machines on and off on demand.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines are written: `text` for people, `json` for a log pipeline.
    #[arg(long, global = true, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// What is logged: a level (`info`, `debug`) or tracing directives
    /// (`info,homelab_autoscaler::controller=debug`).
    #[arg(long, global = true, env = "RUST_LOG", default_value = "info")]
    log_level: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator: admission webhooks, controllers (on the elected leader).
    Run(Box<homelab_autoscaler::operator::RunArgs>),
    /// Play every slot's machine with kwok nodes (demo and end-to-end tests).
    Simulate(homelab_autoscaler::simulator::SimulateArgs),
    /// Write a self-signed CA and serving certificate (tls.crt, tls.key, ca.crt) for development.
    Certs {
        /// Where to write them.
        #[arg(long, default_value = "certs/dev")]
        out: PathBuf,
        /// DNS names of the certificate.
        #[arg(long, value_delimiter = ',', default_value = "localhost")]
        dns_names: Vec<String>,
        /// IP addresses of the certificate.
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1")]
        ips: Vec<std::net::IpAddr>,
    },
    /// Power a slot's machine on or off, or read its power state, with its `spec.power` driver
    /// (what the power Jobs run; `--slot NAME` reads the slot with your kubeconfig).
    #[command(subcommand)]
    Power(homelab_autoscaler::power::cli::PowerCommand),
    /// Keep a slot's machine on (a Manual claim, a pin no scaler releases), until released or
    /// for a time: `--for 2h`, `--until 18:00`. On a slot already pinned, moves its end.
    KeepOn(homelab_autoscaler::pin_cli::KeepOnArgs),
    /// Release a slot's pinned machine: delete its live Manual (or Schedule) claim.
    Release(homelab_autoscaler::pin_cli::SlotArgs),
    /// Render or check the manifests generated from the code (crds/).
    Manifests {
        #[command(subcommand)]
        action: ManifestsAction,
    },
}

#[derive(Subcommand)]
enum ManifestsAction {
    /// Write every generated manifest under ROOT.
    Write {
        #[arg(long, default_value = ".")]
        root: PathBuf,
    },
    /// Exit non-zero when a generated manifest under ROOT is missing or stale.
    Check {
        #[arg(long, default_value = ".")]
        root: PathBuf,
    },
}

fn init_tracing(format: LogFormat, level: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(level).with_context(|| {
        format!("--log-level {level:?} is not a level or a tracing directive list")
    })?;
    // Colours only for a person at a terminal: a log file or a container's log stays plain.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    Ok(())
}

/// A command's refusal goes to stderr, with a failing exit code.
fn report(result: Result<(), homelab_autoscaler::pin_cli::PinError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    init_tracing(cli.log_format, &cli.log_level)?;
    match cli.command {
        Command::Run(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(homelab_autoscaler::operator::run(*args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Simulate(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(async {
                let client = kube::Client::try_default().await?;
                let shutdown = tokio_util::sync::CancellationToken::new();
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    let _ = tokio::signal::ctrl_c().await;
                    stop.cancel();
                });
                homelab_autoscaler::simulator::run(client, args, shutdown).await;
                anyhow::Ok(())
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Power(command) => {
            let runtime = tokio::runtime::Runtime::new()?;
            match runtime.block_on(homelab_autoscaler::power::cli::run(command)) {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(error) => {
                    eprintln!("error: {error}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::KeepOn(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            Ok(report(runtime.block_on(homelab_autoscaler::pin_cli::keep_on(args))))
        }
        Command::Release(target) => {
            let runtime = tokio::runtime::Runtime::new()?;
            Ok(report(runtime.block_on(homelab_autoscaler::pin_cli::release(target))))
        }
        Command::Certs { out, dns_names, ips } => {
            let bundle = homelab_autoscaler::tls::issue_self_signed(&dns_names, &ips)?;
            bundle.write_secret_layout(&out)?;
            println!("wrote {}/{{tls.crt,tls.key,ca.crt}}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Manifests { action: ManifestsAction::Write { root } } => {
            for path in homelab_autoscaler::manifests::write_all(&root)? {
                println!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Manifests { action: ManifestsAction::Check { root } } => {
            let stale = homelab_autoscaler::manifests::stale(&root)?;
            for path in &stale {
                eprintln!("stale: {} (run `homelab-autoscaler manifests write`)", path.display());
            }
            Ok(if stale.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}
