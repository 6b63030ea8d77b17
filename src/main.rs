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
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if matches!(cli.command, Command::Node(_)) {
        tune_malloc();
    }
    match &cli.command {
        #[cfg(feature = "dev")]
        Command::Dev(args) if args.demo => telemetry::init_with_default(cli.log_format, "warn"),
        _ => telemetry::init(cli.log_format),
    }
    if let Err(e) = netclaim::failpoints::arm_from_env() {
        eprintln!("{e}");
        return ExitCode::from(EXIT_USAGE);
    }
    // A node daemon of `netclaim dev --nodes` ends with the process that started it.
    if matches!(cli.command, Command::Node(_))
        && let Err(e) = netclaim::host::parent_death::exit_with_parent_from_env()
    {
        eprintln!("error: {}", netclaim::model::cause::chain(&e));
        return ExitCode::from(1);
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
        Command::Inventory(args) => {
            let mut usage = false;
            let result = print_with(|out| {
                cli::inventory::run(args, out).map_err(|err| {
                    usage = err.is_usage();
                    anyhow::Error::from(err)
                })
            });
            (result, usage)
        }
        Command::Status(args) => (print_with(|out| Ok(cli::status::run(args, out)?)), false),
        Command::Version(args) => (print_with(|out| Ok(cli::version::run(args, out)?)), false),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line, each cause once: a message that already quotes its cause (an
            // io::Error's text) does not get it appended again, as anyhow's `{:#}` would.
            let err: &(dyn std::error::Error + 'static) = err.as_ref();
            eprintln!("error: {}", netclaim::model::cause::chain(err));
            ExitCode::from(if usage { EXIT_USAGE } else { 1 })
        }
    }
}

/// glibc malloc settings for the node daemon (`GLIBC_TUNABLES`), measured with the scale e2e
/// (250 pods, decision 0010 "Memory"): the live heap stays near 6 MiB (heaptrack), but with
/// glibc's defaults the resident heap grew to ~32 MiB, freed memory kept for reuse.
///
/// - `arena_max=2`: glibc gives each thread that allocates an arena of its own, up to 8 per
///   core, and an arena keeps what its threads freed. The daemon's allocating threads come and
///   go (tokio's blocking pool, one short-lived thread per pod-netns operation), so a dozen
///   arenas each held freed memory. Two match the two tokio workers; the per-thread caches
///   (tcache) take most small allocations without an arena's lock.
/// - `mmap_threshold=131072`, `trim_threshold=131072`: glibc's defaults, but fixed. glibc
///   raises both after a large block is freed (up to 32 MiB), after which buffers of that size
///   come from the heap and freed space stays resident; fixed, they are mapped and returned.
const MALLOC_TUNABLES: &str = "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072";

/// Starts the process again with [`MALLOC_TUNABLES`] in its environment, unless the operator
/// tuned malloc already (`GLIBC_TUNABLES` or any `MALLOC_*` variable is set). glibc reads its
/// tunables only from the environment the process started with, and this workspace denies
/// `unsafe` (so no `mallopt`): `exec` of the same binary (same PID, arguments and
/// descriptors) is the way. Called before any thread exists; returns only when it did not
/// exec (tuned already, or exec failed: the daemon then runs with glibc's defaults).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_malloc() {
    use std::os::unix::process::CommandExt as _;
    let tuned = std::env::vars_os().any(|(name, _)| {
        let name = name.to_string_lossy();
        name == "GLIBC_TUNABLES" || name.starts_with("MALLOC_")
    });
    if tuned {
        return;
    }
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let err = std::process::Command::new("/proc/self/exe")
        .arg0(argv0)
        .args(args)
        .env("GLIBC_TUNABLES", MALLOC_TUNABLES)
        .exec();
    eprintln!("netclaim: not restarted with GLIBC_TUNABLES={MALLOC_TUNABLES}: {err}");
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
