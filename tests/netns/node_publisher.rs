//! Root integration tests of `netclaim node` against `netclaim dev --api-only`, both running
//! inside a throwaway network namespace (the API server listens on that namespace's
//! loopback; the test's own client runs on a thread that entered the namespace).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use crate::kit::netns::{
    Child, Netns, node_daemon_args, require_root, scrape_metric, start_api_server,
};

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
/// Generous bound for "eventually" (the daemon reacts within a few hundred milliseconds; the
/// bound only keeps a broken build from hanging).
const PATIENCE: Duration = Duration::from_secs(20);

struct Cluster {
    netns: Netns,
    dir: tempfile::TempDir,
    api: Child,
}

impl Cluster {
    fn start() -> Self {
        Self::start_with(&[])
    }

    fn start_with(api_flags: &[&str]) -> Self {
        let netns = Netns::new();
        let dir = tempfile::tempdir().unwrap();
        let api = start_api_server(&netns, NETCLAIM, dir.path(), api_flags);
        Self { netns, dir, api }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn start_node(&self, extra: &[&str], log_name: &str) -> Child {
        // The daemon also serves kubelet's sockets and keeps state: all inside the test's dir.
        let args = node_daemon_args(self.dir.path());
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        self.netns.spawn(NETCLAIM, &args, &self.dir.path().join(log_name))
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// Lists the slices, from inside the namespace.
    fn slices(&self) -> Vec<ResourceSlice> {
        let kubeconfig = self.kubeconfig();
        self.netns.block_on(move || async move {
            let client = netclaim::k8s::client(Some(&kubeconfig)).await.unwrap();
            let api: Api<ResourceSlice> = Api::all(client);
            api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
        })
    }

    fn delete_slice(&self, name: &str) {
        let kubeconfig = self.kubeconfig();
        let name = name.to_owned();
        self.netns.block_on(move || async move {
            let client = netclaim::k8s::client(Some(&kubeconfig)).await.unwrap();
            let api: Api<ResourceSlice> = Api::all(client);
            api.delete(&name, &DeleteParams::default()).await.unwrap();
        });
    }

    /// Waits until `check` holds for the current slices; returns how long it took.
    fn wait_for(
        &self,
        what: &str,
        node_log: &str,
        check: impl Fn(&[ResourceSlice]) -> bool,
    ) -> Duration {
        let started = Instant::now();
        loop {
            if check(&self.slices()) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < PATIENCE,
                "timed out waiting for {what}\nslices: {:#?}\nnode log:\n{}\napi log:\n{}",
                self.slices()
                    .iter()
                    .map(|s| (&s.metadata.name, s.spec.pool.generation))
                    .collect::<Vec<_>>(),
                self.log(node_log),
                self.log("api.log"),
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One metric's value from the daemon's /metrics.
    fn metric(&self, name: &str) -> f64 {
        let name = name.to_owned();
        self.netns.block_on(move || async move { scrape_metric(&name).await })
    }
}

fn device<'a>(
    slices: &'a [ResourceSlice],
    if_name: &str,
) -> Option<&'a k8s_openapi::api::resource::v1::Device> {
    slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).find(|d| {
        d.attributes.as_ref().and_then(|a| a.get("ifName")).and_then(|a| a.string.as_deref())
            == Some(if_name)
    })
}

fn mtu(slices: &[ResourceSlice], if_name: &str) -> Option<i64> {
    device(slices, if_name)?.attributes.as_ref()?.get("mtu")?.int
}

fn generations(slices: &[ResourceSlice]) -> Vec<i64> {
    slices.iter().map(|s| s.spec.pool.generation).collect()
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

fn veth(netns: &Netns, a: &str, b: &str) {
    netns.ip(&["link", "add", a, "type", "veth", "peer", "name", b]);
    netns.ip(&["link", "set", a, "up"]);
    netns.ip(&["link", "set", b, "up"]);
}

fn write_batch(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn devices_appear_change_and_disappear() {
    if !require_root("devices_appear_change_and_disappear") {
        return;
    }
    let cluster = Cluster::start();
    let netns = &cluster.netns;
    let (parent, peer) = (netns.ifname("p0"), netns.ifname("p1"));
    veth(netns, &parent, &peer);
    let include = format!("{}*", netns.prefix);
    let _node = cluster
        .start_node(&["--shared-parents", &parent, "--include-interfaces", &include], "node.log");

    let took = cluster.wait_for("the shared parent", "node.log", |s| device(s, &parent).is_some());
    println!("published in {took:?}");
    let slices = cluster.slices();
    let published = device(&slices, &parent).unwrap();
    assert_eq!(published.allow_multiple_allocations, Some(true));
    assert_eq!(published.capacity.as_ref().unwrap()["netclaim.dev/interfaces"].value.0, "256");
    assert_eq!(slices[0].spec.node_name.as_deref(), Some("test-node"));
    let first_generation = slices[0].spec.pool.generation;

    netns.ip(&["link", "set", &parent, "mtu", "9000"]);
    let took = cluster.wait_for("the new MTU", "node.log", |s| mtu(s, &parent) == Some(9000));
    println!("MTU change published in {took:?}");
    assert!(generations(&cluster.slices()).iter().all(|g| *g > first_generation));

    // An included veth end appears as an exclusive device, and goes when deleted.
    let (extra, extra_peer) = (netns.ifname("x0"), netns.ifname("x1"));
    veth(netns, &extra, &extra_peer);
    cluster.wait_for("the new veth", "node.log", |s| device(s, &extra).is_some());
    netns.ip(&["link", "del", &extra]);
    let took = cluster.wait_for("the veth to go", "node.log", |s| device(s, &extra).is_none());
    println!("removal published in {took:?}");
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_restart_continues_the_generation_and_a_deleted_slice_comes_back() {
    if !require_root("a_restart_continues_the_generation_and_a_deleted_slice_comes_back") {
        return;
    }
    let cluster = Cluster::start();
    let netns = &cluster.netns;
    let (parent, peer) = (netns.ifname("p0"), netns.ifname("p1"));
    veth(netns, &parent, &peer);
    let mut node = cluster.start_node(&["--shared-parents", &parent], "node1.log");
    cluster.wait_for("first publication", "node1.log", |s| device(s, &parent).is_some());
    let before = generations(&cluster.slices())[0];

    let exit = node.terminate(Duration::from_secs(10)).expect("SIGTERM stops the daemon");
    println!("SIGTERM exit took {exit:?}");
    assert!(cluster.log("node1.log").contains("stopped"), "{}", cluster.log("node1.log"));

    let _node = cluster.start_node(&["--shared-parents", &parent], "node2.log");
    cluster.wait_for("the next generation", "node2.log", |s| {
        !s.is_empty() && generations(s).iter().all(|g| *g == before + 1)
    });

    let name = cluster.slices()[0].metadata.name.clone().unwrap();
    cluster.delete_slice(&name);
    let took = cluster.wait_for("the deleted slice to return", "node2.log", |s| {
        s.iter().any(|slice| slice.metadata.name.as_deref() == Some(name.as_str()))
    });
    println!("deleted slice restored in {took:?}");
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_burst_of_link_changes_gives_a_handful_of_writes() {
    if !require_root("a_burst_of_link_changes_gives_a_handful_of_writes") {
        return;
    }
    let cluster = Cluster::start();
    let netns = &cluster.netns;
    let (parent, peer) = (netns.ifname("p0"), netns.ifname("p1"));
    veth(netns, &parent, &peer);
    let node = cluster.start_node(&["--shared-parents", &parent], "node.log");
    cluster.wait_for("first publication", "node.log", |s| device(s, &parent).is_some());
    // Let the first round settle, then sample.
    std::thread::sleep(Duration::from_millis(500));
    let writes_before = cluster.metric("netclaim_slice_writes_total{result=\"success\"}");
    println!("daemon RSS idle: {} KiB", rss_kib(node.pid()));

    // 50 link changes in one `ip -batch` process: 50 MTU changes on the parent.
    let batch = cluster.dir.path().join("burst.batch");
    let lines: Vec<String> =
        (0..50).map(|i| format!("link set {parent} mtu {}", 1400 + i)).collect();
    write_batch(&batch, &lines);
    netns.ip(&["-batch", batch.to_str().unwrap()]);
    cluster.wait_for("the last MTU", "node.log", |s| mtu(s, &parent) == Some(1449));
    std::thread::sleep(Duration::from_millis(500));
    let writes = cluster.metric("netclaim_slice_writes_total{result=\"success\"}") - writes_before;
    println!("slice writes for a burst of 50 link changes: {writes}");
    assert!((1.0..=5.0).contains(&writes), "{writes} writes for one burst");
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn kubectl_shows_the_published_slices() {
    if !require_root("kubectl_shows_the_published_slices") {
        return;
    }
    let cluster = Cluster::start();
    let netns = &cluster.netns;
    let (parent, peer) = (netns.ifname("p0"), netns.ifname("p1"));
    veth(netns, &parent, &peer);
    let _node = cluster.start_node(&["--shared-parents", &parent], "node.log");
    cluster.wait_for("first publication", "node.log", |s| device(s, &parent).is_some());
    let kubeconfig = cluster.kubeconfig();
    let output = netns.exec(
        "kubectl",
        &["--kubeconfig", kubeconfig.to_str().unwrap(), "get", "resourceslices", "-o", "yaml"],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains(&parent) && text.contains("allowMultipleAllocations: true"), "{text}");
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_server_without_consumable_capacity_gets_slots_and_a_node_event() {
    if !require_root("a_server_without_consumable_capacity_gets_slots_and_a_node_event") {
        return;
    }
    let cluster = Cluster::start_with(&["--drop-consumable-capacity"]);
    let netns = &cluster.netns;
    let (parent, peer) = (netns.ifname("p0"), netns.ifname("p1"));
    veth(netns, &parent, &peer);
    let _node = cluster.start_node(&["--shared-parents", &parent], "node.log");
    cluster.wait_for("slot devices", "node.log", |s| {
        s.iter().flat_map(|slice| slice.spec.devices.iter().flatten()).count() == 32
    });
    let slices = cluster.slices();
    let devices: Vec<_> = slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
    assert!(devices.iter().all(|d| d.allow_multiple_allocations.is_none()));
    assert!(devices.iter().any(|d| d.name == format!("{parent}-s31")));
    let log = cluster.log("node.log");
    assert_eq!(log.matches("dropped allowMultipleAllocations").count(), 1, "said once:\n{log}");
    assert!((cluster.metric("netclaim_consumable_capacity_dropped") - 1.0).abs() < f64::EPSILON);

    let kubeconfig = cluster.kubeconfig();
    let reasons = netns.block_on(move || async move {
        let client = netclaim::k8s::client(Some(&kubeconfig)).await.unwrap();
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client);
        let events = api.list(&ListParams::default()).await.unwrap().items;
        events.into_iter().map(|e| (e.reason, e.regarding.and_then(|r| r.kind))).collect::<Vec<_>>()
    });
    assert!(
        reasons
            .contains(&(Some("ConsumableCapacityUnsupported".to_owned()), Some("Node".to_owned()))),
        "{reasons:?}"
    );
}

/// The whole daemon: kubelet's DRA socket prepares a claim allocated on a device the daemon
/// published, looking the device up in a fresh discovery of the namespace's links.
#[test]
#[ignore = "needs root: run `make test` as root"]
fn the_daemon_prepares_a_claim_on_its_published_device() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use kube::api::{Patch, PatchParams, PostParams};
    use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;

    if !require_root("the_daemon_prepares_a_claim_on_its_published_device") {
        return;
    }
    let cluster = Cluster::start();
    let netns = &cluster.netns;
    let (parent, peer) = (netns.ifname("p0"), netns.ifname("p1"));
    veth(netns, &parent, &peer);
    let _node = cluster.start_node(&["--shared-parents", &parent], "node.log");
    cluster.wait_for("first publication", "node.log", |s| device(s, &parent).is_some());
    let device_name = device(&cluster.slices(), &parent).unwrap().name.clone();
    let socket = cluster.dir.path().join("plugin").join("dra.sock");
    assert!(socket.exists(), "no DRA socket; node log:\n{}", cluster.log("node.log"));
    assert!(cluster.dir.path().join("registry/netclaim.dev-reg.sock").exists());
    let kubeconfig = cluster.kubeconfig();
    let response = netns.block_on(move || async move {
        let client = netclaim::k8s::client(Some(&kubeconfig)).await.unwrap();
        let api: Api<ResourceClaim> = Api::namespaced(client, "default");
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "net", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "netclaim"}}]}},
        }))
        .unwrap();
        let created = api.create(&PostParams::default(), &claim).await.unwrap();
        let status = serde_json::json!({"status": {
            "allocation": {"devices": {
                "results": [{"request": "nic", "driver": "netclaim.dev", "pool": "test-node",
                             "device": device_name, "shareID": "3f1c0c3e-0000-4000-8000-000000000009"}],
                "config": [{"source": "FromClaim", "opaque": {"driver": "netclaim.dev", "parameters": {
                    "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig", "mode": "macvlan",
                    "ipam": {"pool": {"subnet": "10.77.0.0/24"}}}}}],
            }},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
        }});
        api.patch_status("net", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
        let channel = tonic::transport::Endpoint::try_from("http://localhost")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }))
            .await
            .unwrap();
        let mut dra = v1::dra_plugin_client::DraPluginClient::new(channel);
        let uid = created.metadata.uid.unwrap();
        let request = v1::NodePrepareResourcesRequest {
            claims: vec![v1::Claim { namespace: "default".into(), name: "net".into(), uid: uid.clone() }],
        };
        let answer = dra.node_prepare_resources(request).await.unwrap().into_inner();
        answer.claims[&uid].clone()
    });
    assert_eq!(response.error, "", "node log:\n{}", cluster.log("node.log"));
    assert_eq!(response.devices.len(), 1);
    assert_eq!(response.devices[0].pool_name, "test-node");
    assert_eq!(
        response.devices[0].share_id.as_deref(),
        Some("3f1c0c3e-0000-4000-8000-000000000009")
    );
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn kubelet_registration_comes_after_the_first_publication() {
    if !require_root("kubelet_registration_comes_after_the_first_publication") {
        return;
    }
    let mut cluster = Cluster::start();
    let (parent, peer) = (cluster.netns.ifname("p0"), cluster.netns.ifname("p1"));
    veth(&cluster.netns, &parent, &peer);
    let registration = cluster.dir.path().join("registry").join("netclaim.dev-reg.sock");
    // DESIGN §6: load state, put host-side leftovers right, publish, then register. With the
    // API server down nothing can be published, so registration waits (10 s), then goes
    // ahead so that claims prepared before a restart stay reachable.
    cluster.api.child.kill().unwrap();
    cluster.api.child.wait().unwrap();
    let _node = cluster.start_node(&["--shared-parents", &parent], "node.log");
    std::thread::sleep(Duration::from_secs(3));
    assert!(!registration.exists(), "registered before publishing:\n{}", cluster.log("node.log"));
    let started = Instant::now();
    while !registration.exists() {
        assert!(started.elapsed() < PATIENCE, "never registered:\n{}", cluster.log("node.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        cluster.log("node.log").contains("no publication yet; registering with kubelet anyway")
    );
}
