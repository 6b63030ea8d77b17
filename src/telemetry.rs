//! Log setup: `tracing` to stderr as text or JSON lines, level from `RUST_LOG` (default info).

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the global subscriber. Logs go to stderr so stdout stays machine-readable
/// (`netclaim inventory -o json | jq`).
pub fn init(format: LogFormat) {
    init_with_default(format, "info");
}

/// As [`init`], with `default_level` when `RUST_LOG` is unset (`netclaim dev --demo` prints
/// its own progress and keeps the components' info lines out of it).
pub fn init_with_default(format: LogFormat, default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second init (tests calling twice) keeps the first subscriber; nothing to report.
    let _already_set = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
