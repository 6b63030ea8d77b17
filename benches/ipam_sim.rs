//! The IPAM simulation at scale (issue 30 item 8, decision 0017): 1,000 nodes each preparing
//! 100 dynamic claims of one network (a /14 cut into /26 blocks) through the real claim
//! service on simulated disks, every API call released in a seeded order; then a long run of
//! the random simulation (`kit::ipam_sim`, the CI scenario with many more seeds). Prints API
//! writes per claim, blocks per node, conflicts per block created, and the peak memory of
//! the process (VmHWM).
//!
//! Without `--bench` (`cargo test --benches` in CI) it runs a smoke version: 20 nodes × 10
//! claims and two seeds.

#![allow(clippy::unwrap_used, reason = "a failed benchmark step should stop the run")]
#![allow(clippy::cast_precision_loss, reason = "counts far below 2^52 turned into printed ratios")]

use std::time::Instant;

use netclaim_testkit as kit;

use kit::ipam_sim::{SimConfig, run, run_scale};

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (nodes, per_node, seeds) = if full { (1000, 100, 200) } else { (20, 10, 2) };
    let nodes = env_or("IPAM_SIM_NODES", nodes);
    let per_node = env_or("IPAM_SIM_CLAIMS", per_node);
    let seeds = env_or("IPAM_SIM_SEEDS", seeds);

    let started = Instant::now();
    let scale = run_scale(1, nodes, per_node, "10.0.0.0/14", 26, 4).unwrap();
    let elapsed = started.elapsed();
    assert!(scale.broken.is_empty(), "the scale run broke invariants: {:#?}", scale.broken);
    let claims = scale.claims as f64;
    let created = scale.counts.creates.max(1) as f64;
    println!("ipam_sim/scale: {nodes} nodes x {per_node} claims, one /14 network, /26 blocks");
    println!("  claims prepared            {}", scale.claims);
    println!(
        "  API writes per claim       {:.4} ({} creates, {} lost races, {} deletes)",
        scale.counts.writes() as f64 / claims,
        scale.counts.creates,
        scale.counts.conflicts,
        scale.counts.deletes
    );
    println!(
        "  API requests per claim     {:.4} (writes + {} lists; claim GETs not counted: {})",
        (scale.counts.writes() + scale.counts.lists) as f64 / claims,
        scale.counts.lists,
        scale.counts.claim_gets
    );
    println!(
        "  blocks per node            {:.2} (max {})",
        scale.blocks as f64 / nodes as f64,
        scale.max_blocks_per_node
    );
    println!("  conflicts per block created {:.4}", scale.counts.conflicts as f64 / created);
    println!("  peak memory (VmHWM)        {} MiB", scale.vm_hwm_kib / 1024);
    println!("  wall time                  {:.1} s", elapsed.as_secs_f64());

    let started = Instant::now();
    let mut steps = 0;
    for seed in 0..seeds {
        let report =
            run(&SimConfig::small(100_000 + seed as u64)).unwrap_or_else(|f| panic!("{f}"));
        steps += report.steps;
    }
    println!(
        "ipam_sim/seeds: {seeds} seeds, {steps} steps, {:.1} s, every invariant held",
        started.elapsed().as_secs_f64()
    );
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
