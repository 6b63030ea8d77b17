//! The binary's command-line contract: help, version, exit code 2 with one line for bad
//! input, environment variables.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::process::{Command, Output};

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");

fn netclaim(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(NETCLAIM);
    command.args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the binary runs")
}

fn assert_usage_error(output: &Output, must_name: &[&str]) {
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line, got: {stderr}");
    for name in must_name {
        assert!(stderr.contains(name), "{stderr} should name {name}");
    }
    assert!(output.stdout.is_empty());
}

#[test]
fn help_lists_the_subcommands_and_flags() {
    let output = netclaim(&["--help"], &[]);
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("inventory") && text.contains("version"), "{text}");
    let output = netclaim(&["inventory", "--help"], &[]);
    let text = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--include-interfaces",
        "--exclude-interfaces",
        "--shared-parents",
        "--sharing-mode",
        "--output",
        "NETCLAIM_SHARED_PARENTS",
    ] {
        assert!(text.contains(flag), "inventory --help lacks {flag}");
    }
}

#[test]
fn version_prints_the_crate_version() {
    let output = netclaim(&["version"], &[]);
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn unknown_flags_and_bad_values_exit_2_with_one_line() {
    assert_usage_error(&netclaim(&["inventory", "--no-such-flag"], &[]), &["--no-such-flag"]);
    assert_usage_error(&netclaim(&["frobnicate"], &[]), &["frobnicate"]);
    assert_usage_error(&netclaim(&["inventory", "--output", "xml"], &[]), &["xml", "--output"]);
    assert_usage_error(
        &netclaim(&["inventory", "--driver-name", "Bad_Driver"], &[]),
        &["Bad_Driver", "--driver-name"],
    );
    for bad in ["5 minutes", "10d", "1.5s", "s"] {
        assert_usage_error(
            &netclaim(&["node", "--node-name", "n1", "--stats-interval", bad], &[]),
            &[bad, "--stats-interval"],
        );
    }
    assert_usage_error(
        &netclaim(&["node", "--node-name", "n1", "--stats-hook", "xdp"], &[]),
        &["xdp", "--stats-hook"],
    );
}

#[test]
fn environment_variables_are_read_and_validated() {
    assert_usage_error(
        &netclaim(&["inventory"], &[("NETCLAIM_SHARING_MODE", "sometimes")]),
        &["sometimes", "--sharing-mode"],
    );
    assert_usage_error(
        &netclaim(&["inventory"], &[("NETCLAIM_LOG_FORMAT", "xml")]),
        &["xml", "--log-format"],
    );
}

#[test]
fn an_invalid_glob_is_a_clear_runtime_error() {
    let output = netclaim(&["inventory", "--include-interfaces", "eth["], &[]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--include-interfaces") && stderr.contains("eth["), "{stderr}");
}
