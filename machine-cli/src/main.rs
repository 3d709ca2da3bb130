//! `machines`: plan, apply, status and destroy a fleet file. See the crate README.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use machine_cli::ui::{Stop, Ui};
use machine_cli::{Exit, Fleet, FleetFile, Output, commands};

/// Plan, apply, inspect and destroy a fleet of machines described by a fleet file
/// (provider, layers, and a set of N machines); on the built-in simulator by default.
///
/// Exit codes: 0 done (plan: no changes), 1 error, 2 plan: changes planned,
/// 3 apply/destroy stopped short (a rollout paused, the timeout), 130 interrupted.
#[derive(Parser)]
#[command(name = "machines", version)]
struct Cli {
    /// The fleet file.
    #[arg(
        short,
        long,
        global = true,
        env = "MACHINES_FILE",
        default_value = "fleet.yaml"
    )]
    file: PathBuf,
    /// Output: text for people, or one JSON document for programs.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// No progress bars, even on a terminal.
    #[arg(long, global = true)]
    no_progress: bool,
    /// Log what the reconciler decides, and why, on stderr (RUST_LOG refines it).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what apply would change, and why. Exit 0: nothing to do; 2: changes.
    Plan,
    /// Make the fleet as the file says, step by step (Ctrl-C stops between steps).
    Apply {
        /// Give up (exit 3) when not converged within this long.
        #[arg(long, default_value = "30m")]
        timeout: humantime::Duration,
    },
    /// Show the set and each machine.
    Status,
    /// Delete every machine of the set (scale to zero), until none is left.
    Destroy {
        /// Give up (exit 3) when machines are left after this long.
        #[arg(long, default_value = "30m")]
        timeout: humantime::Duration,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap exits 2 on a usage error; 2 means "changes planned" here.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    if cli.verbose || std::env::var_os("RUST_LOG").is_some() {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("machine_core=info"));
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(Exit::Error as u8);
        }
    };
    let code = runtime.block_on(run(cli));
    ExitCode::from(code as u8)
}

async fn run(cli: Cli) -> Exit {
    let json = cli.output == Output::Json;
    let ui = Ui::new(!cli.no_progress && !json, !json);
    let path = cli.file.clone();
    let result = async {
        let file = FleetFile::read(&path)?;
        let replicas = matches!(cli.command, Command::Destroy { .. }).then_some(0);
        let fleet = Fleet::open(file, replicas)?;
        match cli.command {
            Command::Plan => commands::plan(&fleet, cli.output).await,
            Command::Status => commands::status(&fleet, cli.output).await,
            // Ctrl-C is caught only where it must stop between steps; plan and status
            // end at once, as a reader should.
            Command::Apply { timeout } => {
                let stop = Stop::install(ui.clone());
                commands::apply(&fleet, &ui, &stop, Duration::from(timeout), cli.output).await
            }
            Command::Destroy { timeout } => {
                let stop = Stop::install(ui.clone());
                commands::destroy(&fleet, &ui, &stop, Duration::from(timeout), cli.output).await
            }
        }
    }
    .await;
    match result {
        Ok(exit) => exit,
        Err(e) => {
            eprintln!("error: {}: {e}", path.display());
            Exit::Error
        }
    }
}
