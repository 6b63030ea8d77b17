//! Many pods on `netclaim dev --nodes N` (issue 36 item 5, DESIGN §10), root only: the same
//! in-process cluster the command runs (API server, allocator, PodNetwork controller, per node
//! a netns, a dev kubelet and a node daemon as a process of its own), one macvlan PodNetwork
//! with cluster IPAM in /26 blocks, and one claim per pod (`kit::cluster_scale`). Prints the
//! time from the first pod's creation to every pod Ready (and `PodReadyToStartContainers`),
//! the API requests per pod by caller and verb, each daemon's and the whole cluster's peak
//! memory, and the blocks per node; beside the published Spiderpool figures for 1,000 macvlan
//! pods on 10 nodes.
//!
//! `cargo test --benches` (smoke): 2 nodes × 10 pods. Full run: `--bench` with
//! `NETCLAIM_BENCH_NODES=10 NETCLAIM_BENCH_PODS=1000`; `NETCLAIM_BENCH_IPS=exact` gives the
//! network exactly as many addresses as pods would need with 1,000 pods (a /22 less
//! excludes, `plenty` by default: a /16), `both` runs the two one after the other. The
//! daemons run `NETCLAIM_RELEASE_BIN` when set (`cargo build --release --no-default-features
//! --bin netclaim`), else the binary cargo built beside this bench. Under CI a bench that
//! cannot run (no root) fails instead of skipping.

#![allow(clippy::unwrap_used, reason = "a failed benchmark step should stop the run")]
#![allow(clippy::cast_precision_loss, reason = "counts far below 2^52 turned into printed ratios")]

use std::path::PathBuf;
use std::time::Duration;

use netclaim_testkit as kit;

use kit::cluster_scale::{Addressing, ScaleConfig, ScaleReport, run};

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(2) == Some("0"))
}

fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !value.is_empty() && value != "false")
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test");
    if !is_root() {
        assert!(!under_ci(), "benches/cluster_scale needs root, and CI runs every bench");
        println!("SKIPPED: benches/cluster_scale needs root (it builds network namespaces)");
        return;
    }
    let (nodes, pods) = if smoke { (2, 10) } else { (10, 1000) };
    let nodes = env_or("NETCLAIM_BENCH_NODES", nodes);
    let pods = env_or("NETCLAIM_BENCH_PODS", pods);
    let daemon_program = std::env::var_os("NETCLAIM_RELEASE_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_netclaim")), PathBuf::from);
    let cases: Vec<(&str, Addressing)> =
        match std::env::var("NETCLAIM_BENCH_IPS").as_deref().unwrap_or("plenty") {
            "exact" => vec![("as many IPs as pods", Addressing::as_many_as_pods())],
            "both" => vec![
                ("plenty of IPs", Addressing::plenty()),
                ("as many IPs as pods", Addressing::as_many_as_pods()),
            ],
            _ => vec![("plenty of IPs", Addressing::plenty())],
        };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for (label, addressing) in cases {
        let config = ScaleConfig {
            nodes,
            pods,
            daemon_program: daemon_program.clone(),
            addressing: addressing.clone(),
            ready_limit: Duration::from_secs(if smoke { 60 } else { 900 }),
        };
        let report = runtime.block_on(run(&config));
        print(label, &addressing, &config, &report);
        if smoke {
            check(&report);
        }
    }
}

/// The smoke run's expectations: every pod Ready, no address twice, every node used.
fn check(report: &ScaleReport) {
    assert_eq!(report.ready, report.pods, "not every pod became Ready: {report:#?}");
    assert!(report.duplicate_addresses.is_empty(), "addresses handed out twice: {report:#?}");
    assert_eq!(report.addresses, report.pods, "one address per pod: {report:#?}");
    assert_eq!(report.pods_per_node.len(), report.nodes, "every node runs pods: {report:#?}");
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// The `permille`-th per-mille value of `sorted` (nearest rank).
fn percentile(sorted: &[Duration], permille: usize) -> Option<Duration> {
    let last = sorted.len().checked_sub(1)?;
    sorted.get((last * permille + 500) / 1000).copied()
}

fn print(label: &str, addressing: &Addressing, config: &ScaleConfig, r: &ScaleReport) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "cluster_scale/{label}: {} nodes x {} pods, subnet {} (/{} blocks, excludes {:?}), \
         daemons {}",
        r.nodes,
        r.pods,
        addressing.subnet,
        addressing.block_prefix,
        addressing.exclude,
        config.daemon_program.display()
    );
    println!("  load average at the end     {}", load.trim());
    println!("  cluster start               {:.1} s", r.cluster_start.as_secs_f64());
    println!("  network Ready + published   {:.1} s", r.network_ready.as_secs_f64());
    println!("  all pods created            {:.1} s", r.all_created.as_secs_f64());
    println!("  all PodReadyToStartContainers {}", secs(r.all_sandbox_ready));
    println!("  all Ready                   {}", secs(r.all_ready));
    println!(
        "  per pod to Ready            p50 {} p90 {} p99 {}",
        secs(percentile(&r.ready_at, 500)),
        secs(percentile(&r.ready_at, 900)),
        secs(percentile(&r.ready_at, 990))
    );
    println!("  Ready / Failed / of         {} / {} / {}", r.ready, r.failed, r.pods);
    if !r.not_ready_reasons.is_empty() {
        println!("  not Ready, by reason        {:?}", r.not_ready_reasons);
    }
    println!("  pods per node               {:?}", r.pods_per_node.values().collect::<Vec<_>>());
    let blocks: Vec<usize> = r.blocks_per_node.values().map(Vec::len).collect();
    println!("  blocks per node             {blocks:?} ({} in all)", blocks.iter().sum::<usize>());
    println!(
        "  addresses                   {} ({} twice)",
        r.addresses,
        r.duplicate_addresses.len()
    );
    let hwm: Vec<u64> = r.daemon_hwm_kib.values().map(|k| k / 1024).collect();
    println!("  daemon VmHWM (MiB)          {hwm:?}");
    println!("  dev process VmHWM           {} MiB", r.dev_process_hwm_kib / 1024);
    println!("  cluster peak RSS (summed)   {} MiB", r.cluster_peak_rss_kib / 1024);
    println!("  cluster stop                {:.1} s", r.stop.as_secs_f64());
    let pods = r.pods.max(1) as f64;
    let total: usize = r.requests.values().sum();
    println!("  API requests per pod        {:.2} in all", total as f64 / pods);
    for caller in ["daemons", "dev", "bench"] {
        let mut by_verb: std::collections::BTreeMap<&str, usize> =
            std::collections::BTreeMap::new();
        for (key, count) in r.requests.iter().filter(|(k, _)| k.caller == caller) {
            *by_verb.entry(key.verb.as_str()).or_default() += count;
        }
        let text: Vec<String> =
            by_verb.iter().map(|(verb, n)| format!("{verb} {:.2}", *n as f64 / pods)).collect();
        println!("    {caller:<8} {}", text.join(", "));
    }
    println!("  API requests by caller, verb, resource (per pod):");
    for (key, count) in &r.requests {
        println!(
            "    {:<8} {:<7} {:<40} {:.3}",
            key.caller,
            key.verb,
            key.resource,
            *count as f64 / pods
        );
    }
    println!(
        "  published (Spiderpool benchmark, 1,000 macvlan pods on 10 nodes of 3 CPUs, real \
         kubelet, scheduler and image pulls): Spiderpool 207 s (as many IPs as pods) / 182 s \
         (plenty), Cilium 215 s, Calico 322 s, Kube-OVN 405 s / 343 s, Whereabouts stalled \
         near 845 pods / 2,529 s"
    );
}
