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
fn an_invalid_glob_is_a_usage_error_naming_the_flag() {
    let output = netclaim(&["inventory", "--include-interfaces", "eth["], &[]);
    assert_usage_error(&output, &["--include-interfaces", "eth["]);
    let output = netclaim(&["inventory"], &[("NETCLAIM_EXCLUDE_INTERFACES", "[")]);
    assert_usage_error(&output, &["--exclude-interfaces", "\"[\""]);
}

#[test]
fn each_command_reads_its_own_output_variable() {
    // One vocabulary: a value one command takes, every command takes.
    for command in ["inventory", "status", "version", "dev"] {
        let variable = format!("NETCLAIM_{}_OUTPUT", command.to_uppercase());
        assert_usage_error(
            &netclaim(&[command], &[(variable.as_str(), "xml")]),
            &["xml", "--output", "table, json, yaml"],
        );
        let help = netclaim(&[command, "--help"], &[]);
        assert!(String::from_utf8_lossy(&help.stdout).contains(&variable), "{command} --help");
    }
    // A format set for one command does not reach another (the old shared NETCLAIM_OUTPUT
    // made `NETCLAIM_OUTPUT=yaml netclaim status` a usage error).
    let output = netclaim(&["version"], &[("NETCLAIM_STATUS_OUTPUT", "yaml")]);
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("netclaim "));
    let output = netclaim(&["version"], &[("NETCLAIM_VERSION_OUTPUT", "yaml")]);
    let parsed: serde_json::Value = yaml_serde::from_slice(&output.stdout).unwrap();
    assert_eq!(parsed["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn version_and_inventory_print_table_json_and_yaml() {
    let json: serde_json::Value =
        serde_json::from_slice(&netclaim(&["version", "-o", "json"], &[]).stdout).unwrap();
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(json["resourceApi"], "resource.k8s.io/v1");
    let yaml: serde_json::Value =
        yaml_serde::from_slice(&netclaim(&["version", "-o", "yaml"], &[]).stdout).unwrap();
    assert_eq!(yaml, json);

    // inventory: the host's interfaces (loopback at least, each listed or left out).
    let table = netclaim(&["inventory", "-o", "table"], &[]);
    assert!(table.status.success(), "{}", String::from_utf8_lossy(&table.stderr));
    assert!(String::from_utf8_lossy(&table.stdout).starts_with("NAME "));
    let json = netclaim(&["inventory", "-o", "json"], &[]);
    let list: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    let yaml = netclaim(&["inventory"], &[("NETCLAIM_INVENTORY_OUTPUT", "yaml")]);
    let text = String::from_utf8(yaml.stdout).unwrap();
    let documents: Vec<serde_json::Value> = yaml_serde::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).unwrap())
        .collect();
    assert_eq!(documents.as_slice(), list["items"].as_array().unwrap().as_slice(), "{text}");
}

#[test]
fn a_cause_is_printed_once() {
    // The kernel's refusal (EADDRINUSE) was printed twice: the message quoted it and anyhow's
    // `{:#}` appended the source again.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = busy.local_addr().unwrap().to_string();
    let output = netclaim(&["dev", "--api-only", "--listen", &address], &[]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    let errno = std::io::Error::from_raw_os_error(nix::errno::Errno::EADDRINUSE as i32).to_string();
    assert_eq!(stderr.matches(&errno).count(), 1, "{stderr}");
    assert!(stderr.contains(&address), "{stderr}");
}

#[test]
fn logs_carry_no_colour_codes_when_not_on_a_terminal() {
    // stderr is a pipe here: text logs must be plain (a file or the container log would keep
    // the escape codes).
    let output = netclaim(&["inventory"], &[("RUST_LOG", "trace")]);
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("TRACE"), "some log lines: {stderr}");
    assert!(!stderr.contains('\u{1b}'), "ANSI escape in {stderr}");
}

#[test]
fn help_states_what_the_multi_node_demo_does() {
    let output = netclaim(&["dev", "--help"], &[]);
    let text = String::from_utf8_lossy(&output.stdout);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    // The statements come from the demo's own constants.
    assert!(
        text.contains(&format!("PodNetwork {}", netclaim::dev::demo::nodes::NETWORK)),
        "{text}"
    );
    assert!(text.contains(netclaim::dev::demo::SUBNET), "{text}");
    assert!(!text.contains("static address"), "{text}");
    // The README says the same.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let network = format!("creates PodNetwork `{}`", netclaim::dev::demo::nodes::NETWORK);
    assert!(readme.contains(&network), "README lacks {network:?}");
    assert!(readme.contains(netclaim::dev::demo::SUBNET));
    let output = netclaim(&["--help"], &[]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("NETCLAIM_<COMMAND>_OUTPUT") && text.contains("NO_COLOR"), "{text}");
}
