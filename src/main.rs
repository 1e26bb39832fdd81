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
}

#[derive(Subcommand)]
enum Command {
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

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
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
