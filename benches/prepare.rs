//! NodePrepareResources through the real DRA socket against `netclaim dev --api-only` on
//! loopback (DESIGN §10): a new claim (GET, validate, reserve an address, durable write) and
//! a repeated prepare of a prepared claim (answered from memory). Besides criterion's
//! estimates, prints the median of the individually timed calls.

#![allow(missing_docs, reason = "criterion macros generate undocumented items")]
#![allow(clippy::unwrap_used, reason = "a failed benchmark step should stop the run")]

#[path = "../tests/claims_support/mod.rs"]
mod claims_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use claims_support::{DevApi, Plugin, claim_ref, dra_client, network_config};
use criterion::{Criterion, criterion_group, criterion_main};
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use serde_json::json;

fn median(samples: &Mutex<Vec<Duration>>) -> Duration {
    let mut samples = samples.lock().unwrap().clone();
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn prepare_benches(c: &mut Criterion) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let api = rt.block_on(DevApi::start());
    let plugin = rt.block_on(Plugin::start(&api, &api.dir.path().join("state"), api.dir.path()));
    let client = rt.block_on(dra_client(&plugin.dra_socket()));
    let config = network_config(json!({"ipam": {"pool": {"subnet": "10.64.0.0/12"}}}));
    let counter = Arc::new(Mutex::new(0u64));

    let mut group = c.benchmark_group("prepare");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1));

    let new_samples = Mutex::new(Vec::new());
    group.bench_function("new_claim", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let mut client = client.clone();
            let counter = Arc::clone(&counter);
            let config = config.clone();
            let api = &api;
            let samples = &new_samples;
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let n = {
                        let mut counter = counter.lock().unwrap();
                        *counter += 1;
                        *counter
                    };
                    let share = format!("3f1c0c3e-0000-4000-8000-{n:012}");
                    // Creating and allocating the claim is the scheduler's work: not timed.
                    let claim = api
                        .allocated_claim(
                            &format!("bench-{n}"),
                            &[("nic", "eth2", Some(&share))],
                            Some(config.clone()),
                        )
                        .await;
                    let started = Instant::now();
                    let response = client
                        .node_prepare_resources(v1::NodePrepareResourcesRequest {
                            claims: vec![claim_ref(&claim)],
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    let elapsed = started.elapsed();
                    assert!(response.claims.values().all(|c| c.error.is_empty()), "{response:?}");
                    samples.lock().unwrap().push(elapsed);
                    total += elapsed;
                }
                total
            }
        });
    });

    let prepared = rt.block_on(api.allocated_claim(
        "repeat",
        &[("nic", "eth2", Some("3f1c0c3e-0000-4000-8000-ffffffffffff"))],
        Some(config.clone()),
    ));
    let repeat_request = v1::NodePrepareResourcesRequest { claims: vec![claim_ref(&prepared)] };
    rt.block_on(client.clone().node_prepare_resources(repeat_request.clone())).unwrap();
    let repeat_samples = Mutex::new(Vec::new());
    group.bench_function("repeated", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let mut client = client.clone();
            let request = repeat_request.clone();
            let samples = &repeat_samples;
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let started = Instant::now();
                    let response =
                        client.node_prepare_resources(request.clone()).await.unwrap().into_inner();
                    let elapsed = started.elapsed();
                    assert!(response.claims.values().all(|c| c.error.is_empty()));
                    samples.lock().unwrap().push(elapsed);
                    total += elapsed;
                }
                total
            }
        });
    });
    group.finish();
    println!(
        "per-call medians: new claim {:?} ({} calls), repeated {:?} ({} calls)",
        median(&new_samples),
        new_samples.lock().unwrap().len(),
        median(&repeat_samples),
        repeat_samples.lock().unwrap().len(),
    );
    rt.block_on(plugin.stop());
}

criterion_group!(benches, prepare_benches);
criterion_main!(benches);
