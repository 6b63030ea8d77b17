//! Log setup: `tracing` to stderr as text or JSON lines, level from `RUST_LOG` (default info).

use std::io::IsTerminal as _;

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
    let ansi = colours(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    // A second init (tests calling twice) keeps the first subscriber; nothing to report.
    let _already_set = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Whether text logs carry ANSI colours: only on a terminal (a pipe, a file or the
/// container runtime's log would keep the escape codes), and not when `NO_COLOR` is set to
/// anything but the empty string (no-color.org).
fn colours(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        assert!(colours(true, None));
        assert!(colours(true, Some("".as_ref())));
        assert!(!colours(true, Some("1".as_ref())));
        assert!(!colours(false, None));
    }
}
