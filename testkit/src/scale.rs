//! Many pods on one node, on real containerd (DESIGN §10 "Bursts", issue 36 item 4): the
//! scenario both the CI guard (`tests/containerd/e2e_containerd/scale.rs`, 250 pods) and the
//! bench (`benches/scale.rs`, 1,000 pods) run, so the two measure the same thing.
//!
//! [`run`]: `parents` veth pairs published as shared parents, one macvlan claim per pod (pod
//! `i` on parent `i % parents`, a /23 pool per parent), claims allocated and prepared one call
//! per pod as kubelet does; then the burst (`RunPodSandbox` with `in_flight` calls at once),
//! every pod read back (one `net1` with an address of its pool, no address twice), `kill -9`
//! of the daemon with every pod running and a restart on the same state, which must answer
//! `Synchronize` at once, verify every pod in the background and re-create nothing (same MAC,
//! counters' pins adopted), then every sandbox stopped and removed, every claim unprepared,
//! nothing leaked. What it measures comes back as a [`Report`]; what must hold whatever the
//! machine's load is asserted here, the timing bounds are the caller's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use ipnetwork::IpNetwork;

use crate::e2e::{
    Cluster, POD_IFNAME, PodSpec, RunningPod, host_children_of, macvlan_config, run_pod,
    stop_and_remove, wait_pod_link, wait_ready_status, wait_until,
};

/// What a run is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Pods on the node.
    pub pods: usize,
    /// `RunPodSandbox` calls in flight at once (kubelet's parallel pod workers).
    pub in_flight: usize,
    /// Shared parents (veth ends) the pods' macvlans are spread over.
    pub parents: usize,
    /// Traffic counters on (as the daemon ships), the claim statuses refreshed every 300 s.
    pub stats: bool,
}

/// Figures of one run (the sandbox round trips, the daemon's own histogram, its memory and
/// descriptors, the restart).
#[derive(Debug, Clone)]
pub struct Report {
    pub params: Params,
    /// Creating, allocating and preparing every claim.
    pub setup: Duration,
    /// The whole burst, first call to last answer.
    pub burst: Duration,
    /// Each `RunPodSandbox` round trip, sorted.
    pub walls: Vec<Duration>,
    /// `netclaim_attach_duration_seconds{mode="macvlan"}` p50 and p99, interpolated within
    /// their bucket, and the upper bounds of those buckets (seconds).
    pub attach_p50: (f64, f64),
    pub attach_p99: (f64, f64),
    /// The daemon's `VmHWM` after the burst (KiB), and what its resident set is made of then.
    pub peak_rss_burst_kib: u64,
    pub rss_parts_burst: String,
    /// Open descriptors of the daemon: idle before the burst, after it, and the most seen
    /// while sampling every 200 ms; the kinds after the burst (`socket`, `net` (netns),
    /// `anon_inode:[eventfd]`, files…).
    pub fds_idle: usize,
    pub fds_after_burst: usize,
    pub fds_max: usize,
    pub fd_kinds_after_burst: BTreeMap<String, usize>,
    /// When every pod's counters were hooked, from the start of the burst.
    pub counters_hooked: Option<Duration>,
    /// Reading every pod's `net1` back (`ip -j` in each netns).
    pub links_checked: Duration,
    /// The restarted daemon's `answered Synchronize took=` (the runtime's wait).
    pub synchronize: Duration,
    /// The reconcile's own `took=` (every listed pod verified), and from the daemon's start
    /// to the log line (start-up, journal load, registration included).
    pub reconcile: Duration,
    pub restart_to_reconciled: Duration,
    /// The reconcile's `attached=` (interfaces attached again; 0 expected) and the daemon's
    /// `re-attached a missing interface` lines.
    pub reattached: usize,
    pub reattach_lines: usize,
    /// `VmHWM` of the restarted daemon after its reconcile (KiB), and its descriptors then.
    pub peak_rss_restart_kib: u64,
    pub rss_parts_restart: String,
    pub fds_restart: usize,
    /// Stopping and removing every sandbox.
    pub cleanup: Duration,
}

impl Report {
    /// Descriptors per pod held by the daemon: (after the burst − idle) / pods.
    pub fn fds_per_pod(&self) -> f64 {
        #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        let per =
            (self.fds_after_burst.saturating_sub(self.fds_idle)) as f64 / self.params.pods as f64;
        per
    }

    /// Quantile `q` of the sandbox round trips.
    pub fn wall_quantile(&self, q: f64) -> Duration {
        quantile(&self.walls, q)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.params;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        writeln!(
            f,
            "{} pods on {} parents, {} in flight, counters {}",
            p.pods,
            p.parents,
            p.in_flight,
            if p.stats { "on" } else { "off" }
        )?;
        writeln!(
            f,
            "  setup (claims created, allocated, prepared): {:.1} s",
            self.setup.as_secs_f64()
        )?;
        writeln!(
            f,
            "  burst: {:.1} s; RunPodSandbox round trip p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.burst.as_secs_f64(),
            ms(self.wall_quantile(0.5)),
            ms(self.wall_quantile(0.99)),
            ms(self.walls.last().copied().unwrap_or_default())
        )?;
        writeln!(
            f,
            "  daemon attach (histogram, interpolated): p50 {:.2} ms (bucket <= {:.1}), p99 {:.2} ms \
             (bucket <= {:.1})",
            self.attach_p50.0 * 1e3,
            self.attach_p50.1 * 1e3,
            self.attach_p99.0 * 1e3,
            self.attach_p99.1 * 1e3
        )?;
        writeln!(
            f,
            "  daemon VmHWM after the burst {:.1} MiB ({})",
            kib_to_mib(self.peak_rss_burst_kib),
            self.rss_parts_burst
        )?;
        writeln!(
            f,
            "  daemon fds: idle {}, after the burst {} (max sampled {}), {:.2} per pod; kinds {:?}",
            self.fds_idle,
            self.fds_after_burst,
            self.fds_max,
            self.fds_per_pod(),
            self.fd_kinds_after_burst
        )?;
        if let Some(hooked) = self.counters_hooked {
            writeln!(
                f,
                "  counters hooked on every pod {:.1} s after the burst began",
                hooked.as_secs_f64()
            )?;
        }
        writeln!(f, "  every pod's net1 read back in {:.1} s", self.links_checked.as_secs_f64())?;
        writeln!(
            f,
            "  after kill -9: Synchronize answered in {:.2} ms; reconcile (every pod verified) {:.0} \
             ms, {:.2} s from the daemon's start; re-attached {} (log lines {})",
            ms(self.synchronize),
            ms(self.reconcile),
            self.restart_to_reconciled.as_secs_f64(),
            self.reattached,
            self.reattach_lines
        )?;
        writeln!(
            f,
            "  restarted daemon: VmHWM {:.1} MiB ({}), fds {}",
            kib_to_mib(self.peak_rss_restart_kib),
            self.rss_parts_restart,
            self.fds_restart
        )?;
        write!(
            f,
            "  cleanup (every sandbox stopped and removed): {:.1} s",
            self.cleanup.as_secs_f64()
        )
    }
}

#[allow(clippy::cast_precision_loss, reason = "memory sizes far below 2^52")]
fn kib_to_mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Quantile `q` of sorted `values` (nearest rank).
pub fn quantile(values: &[Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a rank within a short list"
    )]
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// The pool of parent `i`: 10.78.(2i).0/23 (room for 250 pods and more per parent).
fn pool_of(parent: usize) -> String {
    format!("10.78.{}.0/23", parent * 2)
}

/// Field `field` (a `kB` figure) of `/proc/<pid>/status`.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// `VmHWM` of process `pid` in KiB (its peak resident set).
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM")
}

/// What the resident set of `pid` is made of now: heap and stacks, and mapped files (the
/// binary's pages that were touched).
pub fn rss_parts(pid: u32) -> String {
    format!(
        "RssAnon {} KiB, RssFile {} KiB",
        status_kib(pid, "RssAnon"),
        status_kib(pid, "RssFile")
    )
}

/// The open descriptors of `pid` by kind: the target of each `/proc/<pid>/fd` link with its
/// inode or path cut off (`socket`, `net` for a network namespace, `anon_inode:[eventfd]`,
/// `file` for anything on a filesystem).
pub fn fd_kinds(pid: u32) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return kinds;
    };
    for entry in entries.flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        let target = target.to_string_lossy();
        let kind = if target.starts_with('/') {
            "file".to_owned()
        } else if let Some(anon) = target.strip_prefix("anon_inode:") {
            format!("anon_inode:{anon}")
        } else {
            target.split(':').next().unwrap_or_default().to_owned()
        };
        *kinds.entry(kind).or_default() += 1;
    }
    kinds
}

/// How many descriptors `pid` has open.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Quantile `q` of the macvlan attach histogram, as Prometheus' `histogram_quantile`
/// estimates it: linear within the bucket the rank falls in. The buckets double (… 25.6,
/// 51.2, 102.4 ms), so the bucket's upper bound alone would read a p99 of 52 ms as 102.4 ms and
/// turn the 2x margin into none. Returns `(estimate, upper bound of its bucket)` in seconds.
pub fn attach_quantile(metrics: &str, q: f64) -> (f64, f64) {
    let buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with("netclaim_attach_duration_seconds_bucket{"))
        .filter(|l| l.contains(r#"mode="macvlan""#))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let count = l.rsplit(' ').next()?.parse().ok()?;
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((bound, count))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |(_, c)| *c);
    let rank = q * total;
    let Some(index) = buckets.iter().position(|(_, c)| *c >= rank) else {
        return (f64::INFINITY, f64::INFINITY);
    };
    let (upper, count) = buckets[index];
    let (lower, below) = if index == 0 { (0.0, 0.0) } else { buckets[index - 1] };
    if upper.is_infinite() || count <= below {
        return (upper, upper);
    }
    (lower + (upper - lower) * (rank - below) / (count - below), upper)
}

/// The daemon log's `answered Synchronize took=…` values, in order.
pub fn synchronize_answers(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("answered Synchronize"))
        .filter_map(|l| l.split("took=").nth(1).map(|t| t.trim().to_owned()))
        .collect()
}

/// The value of `key=` in a log line (up to the next space).
fn log_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(&format!(" {key}=")).nth(1)?.split_whitespace().next()
}

/// A `took=…` Debug duration (`12.3ms`, `456µs`, `1.2s`) in seconds.
pub fn debug_seconds(text: &str) -> f64 {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("µs") {
        (n, 1e-6)
    } else if let Some(n) = text.strip_suffix("ns") {
        (n, 1e-9)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        panic!("not a duration: {text}")
    };
    number.parse::<f64>().unwrap() * scale
}

/// The release build of the daemon, as the image ships it (no default features):
/// `NETCLAIM_RELEASE_BIN`, which `make test` sets after building it once. Timings and memory
/// of the test build (no optimisation) say nothing about the product.
pub fn release_binary() -> PathBuf {
    let path = std::env::var_os("NETCLAIM_RELEASE_BIN")
        .map_or_else(|| crate::repo().join("target/release/netclaim"), PathBuf::from);
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build --release --no-default-features --bin \
         netclaim` (make test does) or point NETCLAIM_RELEASE_BIN at it",
        path.display()
    );
    path
}

/// Samples the daemon's descriptor count every 200 ms until dropped; keeps the largest.
struct FdSampler {
    max: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FdSampler {
    fn start(pid: u32) -> Self {
        let max = Arc::new(AtomicUsize::new(fd_count(pid)));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (max, stop) = (Arc::clone(&max), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    max.fetch_max(fd_count(pid), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        Self { max, stop, thread: Some(thread) }
    }

    fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }
}

impl Drop for FdSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The scenario (see the module's doc); the daemon binary is `cluster.node_binary`.
#[allow(clippy::too_many_lines, reason = "one scenario told step by step, as the e2e tests are")]
pub async fn run(cluster: &mut Cluster, params: Params) -> Report {
    let Params { pods: count, in_flight, parents, stats } = params;
    assert!(parents > 0 && count > 0 && in_flight > 0, "{params:?}");
    if stats {
        // The daemon's default interval: the claim statuses get counters every 5 min,
        // Prometheus every 15 s.
        cluster.enable_stats("300s");
    }
    let started_setup = Instant::now();
    let links: Vec<String> =
        (0..parents).map(|i| cluster.veth(&format!("p{i}"), &format!("q{i}"), 1500)).collect();
    let list = links.join(",");
    cluster.start_node(&list, &list);
    for link in &links {
        cluster.wait_node_ready(link).await;
    }
    let pid = cluster.node_pid();
    let fds_idle = fd_count(pid);
    let pods: Vec<PodSpec> = (0..count).map(|i| PodSpec::new(&cluster.prefix, i)).collect();
    let pools: Vec<IpNetwork> = (0..parents).map(|i| pool_of(i).parse().unwrap()).collect();
    let mut claims = Vec::new();
    let mut dras = Vec::new();
    for (i, link) in links.iter().enumerate() {
        let class = format!("{}-macvlan{i}", cluster.prefix);
        cluster.create_class(&class, link, "macvlan").await;
        let group: Vec<PodSpec> = pods.iter().skip(i).step_by(parents).cloned().collect();
        let (group_claims, dra) =
            cluster.prepared_claims(&group, &class, &macvlan_config(&pool_of(i))).await;
        claims.push(group_claims);
        dras.push(dra);
    }
    let setup = started_setup.elapsed();
    let cri = cluster.cri().await;
    let cluster: &Cluster = cluster;

    // The burst.
    let sampler = FdSampler::start(pid);
    let started = Instant::now();
    let results: Vec<_> = futures::stream::iter(&pods)
        .map(|pod| run_pod(cluster, &cri, pod, 0))
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let burst = started.elapsed();
    let fds_after_burst = fd_count(pid);
    let fd_kinds_after_burst = fd_kinds(pid);
    let mut running: Vec<RunningPod> = Vec::new();
    let mut walls = Vec::new();
    for result in results {
        let (pod, took) = result.unwrap();
        walls.push(took);
        running.push(pod);
    }
    walls.sort_unstable();
    let index: BTreeMap<&str, usize> =
        pods.iter().enumerate().map(|(i, p)| (p.uid.as_str(), i)).collect();
    let checking = Instant::now();
    let mut macs = BTreeMap::new();
    let mut addresses = BTreeSet::new();
    for pod in &running {
        let link = wait_pod_link(cluster, pod).await;
        let pool = &pools[index[pod.spec.uid.as_str()] % parents];
        assert_eq!(link.addresses.len(), 1, "{}: {link:?}", pod.spec.name);
        assert!(
            pool.contains(link.addresses[0].ip()),
            "{}: {link:?} outside {pool}",
            pod.spec.name
        );
        assert!(
            addresses.insert(link.addresses[0].ip()),
            "{} got an address another pod has: {link:?}",
            pod.spec.name
        );
        macs.insert(pod.spec.name.clone(), link.mac);
    }
    let links_checked = checking.elapsed();
    let metrics = cluster.metrics_text().await;
    let attaches =
        cluster.metric(r#"netclaim_attach_duration_seconds_count{mode="macvlan"}"#).await;
    let expected = f64::from(u32::try_from(count).unwrap());
    assert!((attaches - expected).abs() < f64::EPSILON, "{attaches} attaches for {count} pods");
    let (attach_p50, attach_p99) =
        (attach_quantile(&metrics, 0.5), attach_quantile(&metrics, 0.99));
    let peak_rss_burst_kib = peak_rss_kib(pid);
    let rss_parts_burst = rss_parts(pid);

    // Every interface gets its counters after its answer; their pins must survive the
    // kill -9 below and be adopted, not hooked again (same inode).
    let pins = |cluster: &Cluster| -> BTreeMap<String, u64> {
        use std::os::unix::fs::MetadataExt as _;
        let root = cluster.dir().join("bpf/netclaim").join(&cluster.node_name);
        pods.iter()
            .filter_map(|pod| {
                let pin = root.join(&pod.uid).join(POD_IFNAME).join("counters");
                Some((pod.uid.clone(), std::fs::metadata(pin).ok()?.ino()))
            })
            .collect()
    };
    let (hooked_pins, counters_hooked) = if stats {
        wait_until("counters hooked on every pod", cluster, || async {
            pins(cluster).len() == count
        })
        .await;
        (pins(cluster), Some(started.elapsed()))
    } else {
        (BTreeMap::new(), None)
    };
    for pod in running.iter().step_by(25) {
        let pool = &pools[index[pod.spec.uid.as_str()] % parents];
        let (ips, _) = wait_ready_status(cluster, &pod.spec.claim, pool).await;
        assert_eq!(ips.len(), 1, "{}", pod.spec.name);
    }
    let fds_max = sampler.max();
    drop(sampler);

    // kill -9 with every pod running, and a restart on the same state.
    cluster.kill_node();
    let restarted = Instant::now();
    cluster.restart_node();
    wait_until("the restarted daemon reconciled", cluster, || async {
        cluster.node_log().contains("reconciled with the runtime's pods")
    })
    .await;
    let restart_to_reconciled = restarted.elapsed();
    cluster.wait_node_ready(&links[0]).await;
    let log = cluster.node_log();
    let answers = synchronize_answers(&log);
    let reconciled =
        log.lines().find(|l| l.contains("reconciled with the runtime's pods")).unwrap().to_owned();
    assert_eq!(answers.len(), 1, "one Synchronize: {answers:?}");
    let synchronize = Duration::from_secs_f64(debug_seconds(&answers[0]));
    let field = |key: &str| -> &str {
        log_field(&reconciled, key).unwrap_or_else(|| panic!("no {key}= in {reconciled}"))
    };
    assert_eq!(field("pods"), count.to_string(), "every pod listed: {reconciled}");
    assert_eq!(field("verified"), count.to_string(), "every pod verified: {reconciled}");
    let reconcile = Duration::from_secs_f64(debug_seconds(field("took")));
    let reattached: usize = field("attached").parse().unwrap();
    let reattach_lines = log.matches("re-attached a missing interface").count();
    assert_eq!(reattached, 0, "nothing attached again: {reconciled}");
    assert_eq!(reattach_lines, 0, "no interface re-attached");
    // Nothing re-created that was fine: the same link (a new macvlan has a new MAC).
    for pod in &running {
        let link = wait_pod_link(cluster, pod).await;
        assert_eq!(link.mac, macs[&pod.spec.name], "{} re-created", pod.spec.name);
    }
    if stats {
        // The stats service adopts the pins when it starts, which is before any re-hook
        // could happen; give it a collection period.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(pins(cluster), hooked_pins, "counters adopted, none hooked again");
    }
    let containerd_log =
        std::fs::read_to_string(cluster.containerd.path("containerd.log")).unwrap();
    let dropped: Vec<&str> = containerd_log
        .lines()
        .filter(|l| l.contains("netclaim"))
        .filter(|l| l.contains("timeout") || l.contains("deadline") || l.contains("failed"))
        .collect();
    assert!(dropped.is_empty(), "containerd had trouble with the plugin: {dropped:#?}");
    let pid = cluster.node_pid();
    let peak_rss_restart_kib = peak_rss_kib(pid);
    let rss_parts_restart = rss_parts(pid);
    let fds_restart = fd_count(pid);

    let cleaning = Instant::now();
    futures::stream::iter(&running)
        .for_each_concurrent(in_flight, |pod| stop_and_remove(&cri, pod))
        .await;
    let cleanup = cleaning.elapsed();
    drop(running);
    for (claims, dra) in claims.iter().zip(&mut dras) {
        cluster.unprepare(dra, claims).await;
    }
    for link in &links {
        assert!(host_children_of(link).is_empty(), "no leaked link on {link}");
    }
    cluster.assert_state_empty();
    Report {
        params,
        setup,
        burst,
        walls,
        attach_p50,
        attach_p99,
        peak_rss_burst_kib,
        rss_parts_burst,
        fds_idle,
        fds_after_burst,
        fds_max,
        fd_kinds_after_burst,
        counters_hooked,
        links_checked,
        synchronize,
        reconcile,
        restart_to_reconciled,
        reattached,
        reattach_lines,
        peak_rss_restart_kib,
        rss_parts_restart,
        fds_restart,
        cleanup,
    }
}
