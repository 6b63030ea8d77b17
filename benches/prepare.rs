//! NodePrepareResources through the real DRA socket against `netclaim dev --api-only` on
//! loopback (DESIGN §10): a new claim (GET, validate, reserve an address, durable write), a
//! repeated prepare of a prepared claim (answered from memory) and 100 new claims in one call.
//! After criterion's groups, interleaved rounds put them next to their floors, timed in the
//! same rounds: one durable append (write + fdatasync of a journal-sized line in the state
//! dir), a call without claims (the gRPC round trip) and the API reads the prepare cannot
//! avoid (the claim and its pod; for 100 claims as many at a time as the service reads them).
//! A burst of 100 single-claim calls sent at once (kubelet prepares each pod in its own call,
//! its pod workers concurrently) is timed next to the same 100 claims' reads, all at once,
//! with the `fdatasync`s it cost (the store's own count).
//! Without `--bench` every benchmark runs once and the rounds shrink.

#![allow(missing_docs, reason = "criterion macros generate undocumented items")]
#![allow(clippy::unwrap_used, reason = "a failed benchmark step should stop the run")]

use netclaim_testkit as kit;

use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt as _;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kit::claims::{DevApi, Plugin, claim_ref, dra_client, network_config};
use netclaim::claims::{ClaimSource, MAX_CONCURRENT_CLAIMS};
use netclaim::k8s::claims::KubeClaims;
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use serde_json::{Value, json};

type DraClient = v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;

fn median(samples: &[Duration]) -> Duration {
    let mut samples = samples.to_vec();
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// Claims allocated the way the scheduler writes them, each with its own share of `eth2`.
struct Claims {
    api: DevApi,
    config: Value,
    counter: Mutex<u64>,
}

impl Claims {
    /// Untimed: creates and allocates `count` new claims (the scheduler's work).
    async fn allocate(&self, count: usize) -> Vec<ResourceClaim> {
        let mut claims = Vec::with_capacity(count);
        for _ in 0..count {
            let n = {
                let mut counter = self.counter.lock().unwrap();
                *counter += 1;
                *counter
            };
            let share = format!("3f1c0c3e-0000-4000-8000-{n:012}");
            claims.push(
                self.api
                    .allocated_claim(
                        &format!("bench-{n}"),
                        &[("nic", "eth2", Some(&share))],
                        Some(self.config.clone()),
                    )
                    .await,
            );
        }
        claims
    }
}

/// One NodePrepareResources call for `claims`, timed; every claim must succeed.
async fn prepare(client: &DraClient, claims: &[ResourceClaim]) -> Duration {
    let request =
        v1::NodePrepareResourcesRequest { claims: claims.iter().map(claim_ref).collect() };
    let started = Instant::now();
    let response = client.clone().node_prepare_resources(request).await.unwrap().into_inner();
    let elapsed = started.elapsed();
    assert_eq!(response.claims.len(), claims.len());
    assert!(response.claims.values().all(|c| c.error.is_empty()), "{response:?}");
    elapsed
}

/// Untimed: unprepares and deletes `claims`, so the pool and the API stay small.
async fn release(client: &DraClient, claims: &Claims, prepared: &[ResourceClaim]) {
    let request =
        v1::NodeUnprepareResourcesRequest { claims: prepared.iter().map(claim_ref).collect() };
    let response = client.clone().node_unprepare_resources(request).await.unwrap().into_inner();
    assert!(response.claims.values().all(|c| c.error.is_empty()), "{response:?}");
    for claim in prepared {
        claims.api.delete_claim(claim.metadata.name.as_deref().unwrap()).await;
    }
}

/// The API reads a prepare of `claims` cannot avoid, as many claims at a time as the claim
/// service reads them: the claim, then the pod it is reserved for (a template claim's
/// `podClaimName` is the pod's name for it).
async fn reads(reader: &KubeClaims, claims: &[ResourceClaim]) -> Duration {
    let started = Instant::now();
    futures::stream::iter(claims)
        .map(|claim| async move {
            let read = reader.get("default", claim.metadata.name.as_deref().unwrap()).await;
            let pod = &read.unwrap().status.unwrap().reserved_for.unwrap()[0].name;
            reader.pod_claim_names("default", pod).await.unwrap();
        })
        .buffer_unordered(MAX_CONCURRENT_CLAIMS)
        .collect::<Vec<()>>()
        .await;
    started.elapsed()
}

/// A burst: one single-claim NodePrepareResources call per claim, all sent at once on the one
/// connection (as kubelet's pod workers do). The wall time of the whole burst and each call's.
async fn burst(client: &DraClient, claims: &[ResourceClaim]) -> (Duration, Vec<Duration>) {
    let started = Instant::now();
    let calls = claims.iter().map(|claim| prepare(client, std::slice::from_ref(claim)));
    let each = futures::future::join_all(calls).await;
    (started.elapsed(), each)
}

/// The floor of [`burst`]: the reads of its claims (claim, then pod), all at once.
async fn burst_reads(reader: &KubeClaims, claims: &[ResourceClaim]) -> Duration {
    let started = Instant::now();
    let reads = claims.iter().map(|claim| async move {
        let read = reader.get("default", claim.metadata.name.as_deref().unwrap()).await;
        let pod = &read.unwrap().status.unwrap().reserved_for.unwrap()[0].name;
        reader.pod_claim_names("default", pod).await.unwrap();
    });
    futures::future::join_all(reads).await;
    started.elapsed()
}

/// The floor of a durable write: one journal-sized line appended to a file in the state dir
/// and fdatasync'ed.
fn durable_append(file: &mut std::fs::File) -> Duration {
    let line = [b'x'; 400];
    let started = Instant::now();
    file.write_all(&line).unwrap();
    file.sync_data().unwrap();
    started.elapsed()
}

fn smoke() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test")
}

fn prepare_benches(c: &mut Criterion) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let api = rt.block_on(DevApi::start());
    let state_dir = api.dir().join("state");
    let plugin = rt.block_on(Plugin::start(&api, &state_dir, api.dir()));
    // kubelet's side: its own single-threaded runtime on this thread, as kubelet is its own
    // process; the plugin runs on `rt`'s two workers, as in the daemon on this machine.
    let kubelet = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = kubelet.block_on(dra_client(&plugin.dra_socket()));
    let reader = KubeClaims::new(api.client.clone());
    let config = network_config(json!({"ipam": {"pool": {"subnet": "10.64.0.0/12"}}}));
    let claims = Claims { api, config, counter: Mutex::new(0) };
    // The async benchmark bodies take these by reference.
    let (client, claims) = (&client, &claims);

    let mut group = c.benchmark_group("prepare");
    group
        .sample_size(10)
        .sampling_mode(criterion::SamplingMode::Flat)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));

    group.bench_function("new_claim", |b| {
        b.to_async(&kubelet).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let claim = claims.allocate(1).await;
                total += prepare(client, &claim).await;
                release(client, claims, &claim).await;
            }
            total
        });
    });

    // On kubelet's runtime, as every API call here (see `Sides`).
    let repeated = kubelet.block_on(claims.allocate(1));
    kubelet.block_on(prepare(client, &repeated));
    let repeated = &repeated;
    group.bench_function("repeated", |b| {
        b.to_async(&kubelet).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += prepare(client, repeated).await;
            }
            total
        });
    });

    // The floor of `repeated` back to back: the gRPC round trip of a call without claims.
    group.bench_function("empty_call", |b| {
        b.to_async(&kubelet).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += prepare(client, &[]).await;
            }
            total
        });
    });

    group.bench_function("100_claims_one_call", |b| {
        b.to_async(&kubelet).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let batch = claims.allocate(100).await;
                total += prepare(client, &batch).await;
                release(client, claims, &batch).await;
            }
            total
        });
    });
    group.finish();

    // Interleaved rounds: each sequence next to its floor, the order rotating.
    // Smoke: three rounds, so the burst runs once too.
    let rounds = if smoke() {
        3
    } else {
        std::env::var("NETCLAIM_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(60)
    };
    let sides = Sides { kubelet: &kubelet, client, claims, reader: &reader, store: &plugin.store };
    report(state_dir.as_path(), &sides.rounds(rounds, repeated, &state_dir));
    rt.block_on(plugin.stop());
}

/// The runtimes, clients and claims the interleaved rounds use. Every API call runs on
/// `kubelet`, as criterion's groups ran them: the API client's pooled connections are tasks
/// of the runtime that opened them, and a current-thread runtime drives its tasks only inside
/// its own `block_on` (a call from `rt` on such a connection waited forever).
struct Sides<'a> {
    kubelet: &'a tokio::runtime::Runtime,
    client: &'a DraClient,
    claims: &'a Claims,
    reader: &'a KubeClaims,
    /// The plugin's store, whose sync count says what a burst cost.
    store: &'a netclaim::store::Store,
}

impl Sides<'_> {
    /// Each sequence next to its floors, the order rotating every round.
    fn rounds(&self, rounds: usize, repeated: &[ResourceClaim], state_dir: &Path) -> Medians {
        let mut floor_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(state_dir.join("fdatasync-floor"))
            .unwrap();
        let (mut fsync, mut read, mut new, mut repeat) = (vec![], vec![], vec![], vec![]);
        let mut empty = vec![];
        let (mut read100, mut new100) = (vec![], vec![]);
        let mut bursts = Bursts::default();
        for round in 0..rounds {
            // The repeated prepare and the call without claims each take a turn of their
            // own: a call right after another finds the runtimes' threads awake, one after
            // other work does not, and in one turn the second always had the first's help.
            for turn in 0..5 {
                match (round + turn) % 5 {
                    0 => fsync.push(durable_append(&mut floor_file)),
                    1 => {
                        let claim = self.kubelet.block_on(self.claims.allocate(1));
                        read.push(self.kubelet.block_on(reads(self.reader, &claim)));
                        new.push(self.kubelet.block_on(prepare(self.client, &claim)));
                        self.kubelet.block_on(release(self.client, self.claims, &claim));
                    }
                    2 => repeat.push(self.kubelet.block_on(prepare(self.client, repeated))),
                    3 => empty.push(self.kubelet.block_on(prepare(self.client, &[]))),
                    // A 100-claim call every fourth round and a burst of 100 calls two rounds
                    // later: each allocates 200 API objects.
                    _ if round % 4 == 0 => {
                        let batch = self.kubelet.block_on(self.claims.allocate(100));
                        read100.push(self.kubelet.block_on(reads(self.reader, &batch)));
                        new100.push(self.kubelet.block_on(prepare(self.client, &batch)));
                        self.kubelet.block_on(release(self.client, self.claims, &batch));
                    }
                    _ if round % 4 == 2 => self.burst_round(round, &mut bursts),
                    _ => {}
                }
            }
        }
        Medians {
            fsync: median(&fsync),
            read: median(&read),
            new: median(&new),
            repeat: median(&repeat),
            empty: median(&empty),
            read100: median(&read100),
            new100: median(&new100),
            bursts,
            rounds,
        }
    }

    /// One burst of 100 single-claim calls and its floor, the reads of the same claims, in
    /// an order alternating from one burst to the next.
    fn burst_round(&self, round: usize, bursts: &mut Bursts) {
        let batch = self.kubelet.block_on(self.claims.allocate(100));
        let reads_first = round % 8 == 2;
        let mut read = Duration::ZERO;
        if reads_first {
            read = self.kubelet.block_on(burst_reads(self.reader, &batch));
        }
        let syncs = self.store.syncs();
        let (wall, each) = self.kubelet.block_on(burst(self.client, &batch));
        let syncs = self.store.syncs() - syncs;
        if !reads_first {
            read = self.kubelet.block_on(burst_reads(self.reader, &batch));
        }
        self.kubelet.block_on(release(self.client, self.claims, &batch));
        bursts.ratios.push(wall.as_secs_f64() / read.as_secs_f64());
        bursts.walls.push(wall);
        bursts.reads.push(read);
        bursts.syncs.push(syncs);
        bursts.calls.extend(each);
    }
}

/// What the bursts of 100 single-claim calls measured, one entry per burst (`calls`: every
/// call of every burst).
#[derive(Default)]
struct Bursts {
    walls: Vec<Duration>,
    reads: Vec<Duration>,
    /// Per burst: its wall time over its reads' (timed next to each other).
    ratios: Vec<f64>,
    syncs: Vec<u64>,
    calls: Vec<Duration>,
}

/// Medians of the interleaved rounds.
struct Medians {
    fsync: Duration,
    read: Duration,
    new: Duration,
    repeat: Duration,
    /// A call without claims: the gRPC round trip and the adapter, the floor of `repeat`.
    empty: Duration,
    read100: Duration,
    new100: Duration,
    bursts: Bursts,
    rounds: usize,
}

fn report(state_dir: &Path, m: &Medians) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("rounds ({} rounds, order rotating; state dir {}):", m.rounds, state_dir.display());
    println!(
        "  floors: fdatasync of one line {:.3} ms, API reads of one claim {:.3} ms, of 100 claims \
         {} at a time {:.3} ms",
        ms(m.fsync),
        ms(m.read),
        MAX_CONCURRENT_CLAIMS,
        ms(m.read100)
    );
    println!(
        "  new claim {:.3} ms = fdatasync + {:.3} ms (target: + <= 1 ms); repeated {:.3} ms \
         (target < 0.2 ms), of which the round trip of a call without claims {:.3} ms",
        ms(m.new),
        ms(m.new) - ms(m.fsync),
        ms(m.repeat),
        ms(m.empty)
    );
    println!(
        "  100 claims in one call {:.3} ms, beyond the reads {:.3} ms = {:.2} fdatasyncs \
         (target < 3)",
        ms(m.new100),
        ms(m.new100) - ms(m.read100),
        (ms(m.new100) - ms(m.read100)) / ms(m.fsync)
    );
    let b = &m.bursts;
    if b.walls.is_empty() {
        return;
    }
    let mut ratios = b.ratios.clone();
    ratios.sort_unstable_by(f64::total_cmp);
    let mut syncs = b.syncs.clone();
    syncs.sort_unstable();
    let mut calls = b.calls.clone();
    calls.sort_unstable();
    let p99 = calls[(calls.len() * 99 / 100).min(calls.len() - 1)];
    println!(
        "  burst of 100 single-claim calls ({} bursts): wall {:.3} ms, its reads alone {:.3} ms, \
         wall/reads per burst median {:.2} (min {:.2}, max {:.2}; target <= 1.2); fdatasyncs \
         per burst median {} (min {}, max {}; target <= 10); a call's p50 {:.3} ms, p99 {:.3} \
         ms (a lone new claim {:.3} ms)",
        b.walls.len(),
        ms(median(&b.walls)),
        ms(median(&b.reads)),
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1],
        syncs[syncs.len() / 2],
        syncs[0],
        syncs[syncs.len() - 1],
        ms(median(&calls)),
        ms(p99),
        ms(m.new),
    );
}

criterion_group!(benches, prepare_benches);
criterion_main!(benches);
