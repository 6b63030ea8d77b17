//! The `netclaim` binary: parse the command line, set up logging, run one subcommand.

use std::io::Write;
use std::process::ExitCode;

use netclaim::cli::{self, Command, Parsed};
use netclaim::telemetry;

/// Exit code for an invalid command line (as `clap` and most CLIs use).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = match cli::parse(std::env::args_os()) {
        Parsed::Run(cli) => cli,
        Parsed::Print(text) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            return ExitCode::SUCCESS;
        }
        Parsed::Invalid(line) => {
            eprintln!("{line}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    telemetry::init(cli.log_format);
    if let Command::Node(args) = &cli.command {
        return match cli::node::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) if err.is_usage() => {
                eprintln!("error: {err}");
                ExitCode::from(EXIT_USAGE)
            }
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::FAILURE
            }
        };
    }
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match command {
        Command::Inventory(args) => cli::inventory::run(&args, &mut out)?,
        Command::Node(args) => cli::node::run(&args)?,
        Command::Version => {
            writeln!(out, "netclaim {}", env!("CARGO_PKG_VERSION"))?;
            writeln!(out, "resource API: resource.k8s.io/v1 (Kubernetes 1.34+)")?;
        }
    }
    out.flush()?;
    Ok(())
}
