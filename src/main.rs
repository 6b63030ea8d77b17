//! The `netclaim` binary: parse the command line, set up logging, run one subcommand.

// `unused_crate_dependencies` is checked at the library root (src/lib.rs): this binary
// shares the package's dependency list with the library, so here every library dependency
// would count as unused.

use std::io::Write;
use std::process::ExitCode;

use netclaim::cli::{self, Command, Parsed};
use netclaim::telemetry;

/// Exit code for an invalid command line or configuration (as `clap` and most CLIs use).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = match cli::parse(std::env::args_os()) {
        Parsed::Run(cli) => *cli,
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
    match &cli.command {
        #[cfg(feature = "dev")]
        Command::Dev(args) if args.demo => telemetry::init_with_default(cli.log_format, "warn"),
        _ => telemetry::init(cli.log_format),
    }
    if let Err(e) = netclaim::failpoints::arm_from_env() {
        eprintln!("{e}");
        return ExitCode::from(EXIT_USAGE);
    }
    let (result, usage) = match &cli.command {
        Command::Node(args) => {
            let result = cli::node::run(args);
            let usage = result.as_ref().err().is_some_and(cli::node::NodeCommandError::is_usage);
            (result.map_err(anyhow::Error::from), usage)
        }
        Command::Controller(args) => {
            let result = cli::controller::run(args);
            let usage = result
                .as_ref()
                .err()
                .is_some_and(cli::controller::ControllerCommandError::is_usage);
            (result.map_err(anyhow::Error::from), usage)
        }
        #[cfg(feature = "dev")]
        Command::Dev(args) => {
            let result = cli::dev::run(args);
            let usage = result.as_ref().err().is_some_and(cli::dev::DevCommandError::is_usage);
            (result.map_err(anyhow::Error::from), usage)
        }
        Command::Inventory(args) => (print_with(|out| Ok(cli::inventory::run(args, out)?)), false),
        Command::Status(args) => (print_with(|out| Ok(cli::status::run(args, out)?)), false),
        Command::Version => (print_with(version), false),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(if usage { EXIT_USAGE } else { 1 })
        }
    }
}

/// Runs `write` against a locked stdout and flushes it.
fn print_with(
    write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    write(&mut out)?;
    out.flush()?;
    Ok(())
}

fn version(out: &mut std::io::StdoutLock<'static>) -> anyhow::Result<()> {
    writeln!(out, "netclaim {}", env!("CARGO_PKG_VERSION"))?;
    writeln!(out, "resource API: resource.k8s.io/v1 (Kubernetes 1.34+)")?;
    writeln!(out, "kubelet plugin API: v1.DRAPlugin, v1beta1.DRAPlugin")?;
    writeln!(out, "device health API: v1.DRAResourceHealth, v1alpha1.DRAResourceHealth")?;
    Ok(())
}
