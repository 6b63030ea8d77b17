//! deploy/monitoring/prometheusrule.yaml (issue 32 item 4): its expressions name only
//! netclaim series the node daemon or the controller serve (a renamed family, or `_total`
//! forgotten, would leave an alert that never fires), each alert has a duration or fires at
//! once on purpose, a severity, a summary, a description and a runbook in docs/operations.md's
//! "Alerts" section, and the kustomization ships the file.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::BTreeSet;

use netclaim::controller::metrics::ControllerMetrics;
use netclaim::metrics::{Format, Metrics, MetricsRegistry, encode_as};

use crate::kit;

/// Every series name `registry` can serve, from its text-format declarations (a family with
/// no series yet is declared all the same): a histogram's `_bucket`, `_sum` and `_count`.
fn series_names(registry: &impl MetricsRegistry, into: &mut BTreeSet<String>) {
    let text = encode_as(registry.registry(), Format::Text);
    for declaration in text.lines().filter_map(|line| line.strip_prefix("# TYPE ")) {
        let (name, kind) = declaration.split_once(' ').unwrap();
        if kind == "histogram" || kind == "summary" {
            for suffix in ["_bucket", "_sum", "_count"] {
                into.insert(format!("{name}{suffix}"));
            }
        } else {
            into.insert(name.to_owned());
        }
    }
}

/// The `netclaim_*` identifiers of a PromQL expression.
fn netclaim_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("netclaim_") {
        // An identifier starts here only if no identifier character precedes it.
        let preceded =
            rest[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_');
        let tail = &rest[at..];
        let end =
            tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        if !preceded {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_alerts_name_served_metrics_and_point_to_their_runbook() {
    let repo = kit::repo();
    let text = std::fs::read_to_string(repo.join("deploy/monitoring/prometheusrule.yaml")).unwrap();
    let rule: serde_json::Value = yaml_serde::from_str(&text).unwrap();
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    let kustomization =
        std::fs::read_to_string(repo.join("deploy/monitoring/kustomization.yaml")).unwrap();
    assert!(kustomization.contains("- prometheusrule.yaml"), "{kustomization}");
    let operations = std::fs::read_to_string(repo.join("docs/operations.md")).unwrap();
    let alerts_section = operations
        .split("\n## ")
        .find(|section| section.starts_with("Alerts\n"))
        .expect("docs/operations.md has an `## Alerts` section");

    let mut served = BTreeSet::new();
    series_names(&Metrics::new(), &mut served);
    series_names(&ControllerMetrics::new(), &mut served);

    let mut alerts = Vec::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            let expr = rule["expr"].as_str().unwrap();
            alerts.push(alert.to_owned());
            let named = netclaim_names(expr);
            let unknown: Vec<_> = named.difference(&served).collect();
            assert!(unknown.is_empty(), "{alert} names {unknown:?}, not served:\n{served:#?}");
            assert!(
                ["warning", "critical"].contains(&rule["labels"]["severity"].as_str().unwrap()),
                "{alert}"
            );
            for annotation in ["summary", "description", "runbook"] {
                let value = rule["annotations"][annotation].as_str().unwrap_or_default();
                assert!(!value.is_empty(), "{alert} has no {annotation}");
            }
            let runbook = rule["annotations"]["runbook"].as_str().unwrap();
            assert!(runbook.starts_with("docs/operations.md#alerts"), "{alert}: {runbook}");
            assert!(
                alerts_section.contains(&format!("`{alert}`")),
                "{alert} not in the Alerts section"
            );
            // Only an alert that fires at once by design has no duration: every rule with a
            // rate or a gauge waits; a loss of addresses or a rejected status is news at once.
            if rule["for"].is_null() {
                assert!(expr.contains("increase("), "{alert} fires on one evaluation");
            }
        }
    }
    // The list: prepare and attach errors, status-write failures, capacity dropped,
    // daemon not ready, IPBlock lost.
    for metric in [
        "netclaim_kubelet_requests_total",
        "netclaim_nri_events_total",
        "netclaim_status_writes_total",
        "netclaim_consumable_capacity_dropped",
        "netclaim_ipblocks_lost_total",
    ] {
        assert!(text.contains(metric), "no alert on {metric}");
    }
    assert!(text.contains("up{job=\"netclaim-system/netclaim\"}"), "no alert on scrape failures");
    assert!(alerts.iter().any(|alert| alert.contains("NotReady")), "{alerts:?}");
}

#[test]
fn identifiers_are_read_whole() {
    assert_eq!(
        netclaim_names("sum(rate(netclaim_a_total{x=\"y\"}[5m])) / my_netclaim_b or netclaim_c"),
        ["netclaim_a_total", "netclaim_c"].into_iter().map(str::to_owned).collect()
    );
}
