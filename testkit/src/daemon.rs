//! The real node daemon in a throwaway netns, as the root tests and the VM tests drive it:
//! `netclaim dev --api-only` and `netclaim node` (the binary cargo built) in a "node" netns
//! with a veth parent; claims allocated by the dev allocator as the scheduler would, prepared
//! over kubelet's DRA socket; pod sandboxes announced by our in-process NRI runtime on a temp
//! socket, each pod being another throwaway netns.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimConsumerReference};
use kube::Api;
use kube::api::PostParams;
use kube_inmemory::allocator::{AllocatorController, reserve_for};
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use nri_rs::{NriRuntime, PodSandbox, RuntimeOptions};
use serde_json::json;

use super::claims;
use super::netns::{Child, Netns, node_daemon_args, scrape_metric, start_api_server};

/// The binary `netclaim node` runs from: the one cargo built ([`super::netclaim_bin`]; the
/// VM's guest sees it at the same path), or in the VM the release build `make test` made just
/// before (`NETCLAIM_VM_DAEMON_BIN`, which `vmtests/run.sh` passes into the guest from
/// `NETCLAIM_RELEASE_BIN`): the daemon the image ships, and under TCG the debug build takes
/// ~20 s to start. That build has no `dev` subcommand (the image's `--no-default-features`),
/// so the API server always runs from the one cargo built. Host tests always run the debug
/// build (their crash points need `--features failpoints`).
pub fn netclaim() -> String {
    match std::env::var("NETCLAIM_VM_DAEMON_BIN") {
        Ok(path) if !path.is_empty() && std::env::var("NETCLAIM_VM").as_deref() == Ok("1") => path,
        _ => super::netclaim_bin().to_owned(),
    }
}
/// Bound for "eventually": the daemon reacts within milliseconds (but its debug build takes
/// 10–20 s to start under the VM tests' TCG); the bound only keeps a broken build from hanging.
pub const PATIENCE: Duration = Duration::from_mins(1);

/// The node: API server, veth parent, NRI runtime socket, state and kubelet dirs.
pub struct Node {
    pub netns: Netns,
    pub dir: tempfile::TempDir,
    pub parent: String,
    pub runtime: tokio::runtime::Runtime,
    nri: Option<NriRuntime>,
    _api: Option<Child>,
}

impl Node {
    pub fn start() -> Self {
        Self::start_in(Netns::new(), tempfile::tempdir().unwrap(), true)
    }

    /// The node in `netns` with its files under `dir`. Without `api`, no API server is
    /// started and `dir/kubeconfig` is whatever the caller put there (the VM's reboot suite,
    /// after its reboot: the first boot's, whose server died with that boot).
    pub fn start_in(netns: Netns, dir: tempfile::TempDir, api: bool) -> Self {
        let api = api.then(|| start_api_server(&netns, super::netclaim_bin(), dir.path(), &[]));
        let (parent, peer) = (netns.ifname("p0"), netns.ifname("p1"));
        netns.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer]);
        netns.ip(&["link", "set", &parent, "up"]);
        netns.ip(&["link", "set", &peer, "up"]);
        // The runtime side of NRI only needs a Unix socket: it runs on the test's own runtime.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let socket = dir.path().join("nri.sock");
        let mut options = RuntimeOptions::new(socket);
        if std::env::var("NETCLAIM_VM").as_deref() == Ok("1") {
            // Under the VM tests' TCG one attach can take seconds (2.2 s measured for the
            // first sandbox after vm_reboot's reboot, two guests sharing the host's two
            // cores): no fact about the driver, so the guest gets the longer request timeout
            // an operator of such slow hardware configures (containerd's
            // `plugin_request_timeout`; the plugin learns it in `Configure`). Host tests keep
            // containerd's default.
            options.request_timeout = Duration::from_secs(10);
        }
        let nri = runtime.block_on(async { NriRuntime::bind(options).unwrap() });
        Self { netns, dir, parent, runtime, nri: Some(nri), _api: api }
    }

    pub fn nri(&self) -> &NriRuntime {
        self.nri.as_ref().unwrap()
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub fn start_daemon(&self, log: &str) -> Child {
        self.start_daemon_with(log, &[])
    }

    pub fn start_daemon_with(&self, log: &str, extra: &[&str]) -> Child {
        self.start_daemon_env(log, extra, &[])
    }

    pub fn start_daemon_env(&self, log: &str, extra: &[&str], env: &[(&str, &str)]) -> Child {
        let mut args = node_daemon_args(self.dir.path());
        args.extend([
            "--nri-socket".to_owned(),
            self.dir.path().join("nri.sock").to_str().unwrap().to_owned(),
            "--nri-plugin-index".to_owned(),
            "10".to_owned(),
            "--shared-parents".to_owned(),
            self.parent.clone(),
        ]);
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        // A test that gives the daemon a bpffs of its own (counters and ceilings) replaces the
        // default that turns them off (the flag may be given once).
        if extra.iter().any(|arg| arg.starts_with("--bpffs")) {
            args.retain(|arg| !arg.starts_with("--bpffs"));
        }
        args.extend_from_slice(extra);
        // A daemon killed just before may still be listed until the runtime side reads the
        // end of its connection; counting it as the new one's registration raced with that.
        let deadline = std::time::Instant::now() + PATIENCE;
        while !self.nri().plugins().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the previous daemon's plugin is still listed"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let binary = netclaim();
        let child = self.netns.spawn_with_env(&binary, &args, env, &self.dir.path().join(log));
        let registered = self.runtime.block_on(self.nri().wait_for_plugins(1, PATIENCE));
        assert!(registered.is_ok(), "the daemon's NRI plugin did not register:\n{}", self.log(log));
        assert_eq!(self.nri().plugins()[0].full_name(), "10-netclaim");
        child
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// Runs `work` with an API client, inside the node netns.
    pub fn api<F, Fut, T>(&self, work: F) -> T
    where
        F: FnOnce(kube::Client) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
        T: Send + 'static,
    {
        let kubeconfig = self.kubeconfig();
        self.netns.block_on(move || async move {
            let client = netclaim::k8s::client(Some(&kubeconfig)).await.unwrap();
            work(client).await
        })
    }

    /// A macvlan claim on the parent with a pool, allocated and reserved for `pod` as the
    /// scheduler does; returns its UID once the daemon published the parent.
    pub fn allocated_claim(&self, name: &str, pod: &PodSandbox, subnet: &str) -> String {
        let config = json!({"mode": "macvlan", "ipam": {"pool": {"subnet": subnet}}});
        self.allocated_claim_on(name, pod, &self.parent.clone(), config)
    }

    /// A claim of the device with interface `if_name` and `config` (a `NetworkConfig`
    /// without apiVersion/kind), allocated and reserved for `pod`; returns its UID.
    pub fn allocated_claim_on(
        &self,
        name: &str,
        pod: &PodSandbox,
        if_name: &str,
        config: serde_json::Value,
    ) -> String {
        let (name, parent) = (name.to_owned(), if_name.to_owned());
        let mut parameters = config;
        parameters["apiVersion"] = json!("netclaim.dev/v1alpha1");
        parameters["kind"] = json!("NetworkConfig");
        let consumer = ResourceClaimConsumerReference {
            api_group: None,
            resource: "pods".to_owned(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        };
        let deadline = Instant::now() + PATIENCE;
        self.api(move |client| async move {
            let classes: Api<DeviceClass> = Api::all(client.clone());
            if classes.get_opt(&parent).await.unwrap().is_none() {
                let class: DeviceClass = serde_json::from_value(json!({
                    "metadata": {"name": parent},
                    "spec": {"selectors": [{"cel": {"expression":
                        format!("device.attributes['netclaim.dev'].ifName == '{parent}'")}}]},
                }))
                .unwrap();
                classes.create(&PostParams::default(), &class).await.unwrap();
            }
            let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
            let claim: ResourceClaim = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"devices": {
                    "requests": [{"name": "nic", "exactly": {"deviceClassName": parent}}],
                    "config": [{"opaque": {"driver": "netclaim.dev", "parameters": parameters}}],
                }},
            }))
            .unwrap();
            claims.create(&PostParams::default(), &claim).await.unwrap();
            let allocator = AllocatorController::new(client.clone(), "test-node");
            // The daemon publishes its slice shortly after start: allocate once it is there.
            loop {
                allocator.reconcile().await.unwrap();
                let found = claims.get(&name).await.unwrap();
                if found.status.as_ref().and_then(|s| s.allocation.as_ref()).is_some() {
                    break;
                }
                assert!(Instant::now() < deadline, "the claim was never allocated");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let reserved = reserve_for(&client, "default", &name, &consumer).await.unwrap();
            reserved.metadata.uid.unwrap()
        })
    }

    /// NodePrepareResources for one claim, as kubelet calls it.
    pub fn prepare(&self, name: &str, uid: &str) -> v1::NodePrepareResourceResponse {
        let socket = self.dir.path().join("plugin").join("dra.sock");
        let (name, uid) = (name.to_owned(), uid.to_owned());
        self.netns.block_on(move || async move {
            let mut dra = claims::dra_client_when_listening(&socket, PATIENCE).await;
            let request = v1::NodePrepareResourcesRequest {
                claims: vec![v1::Claim { namespace: "default".into(), name, uid: uid.clone() }],
            };
            dra.node_prepare_resources(request).await.unwrap().into_inner().claims[&uid].clone()
        })
    }

    /// NodePrepareResources and NodeUnprepareResources for one claim that may meet a daemon
    /// dying mid-call: `Err` with the transport error, else the per-claim error text.
    pub fn try_dra(&self, prepare: bool, name: &str, uid: &str) -> Result<String, String> {
        let socket = self.dir.path().join("plugin").join("dra.sock");
        let (name, uid) = (name.to_owned(), uid.to_owned());
        self.netns.block_on(move || async move {
            let mut dra = claims::dra_client_when_listening(&socket, PATIENCE).await;
            let claims = vec![v1::Claim { namespace: "default".into(), name, uid: uid.clone() }];
            if prepare {
                let request = v1::NodePrepareResourcesRequest { claims };
                let answer =
                    dra.node_prepare_resources(request).await.map_err(|e| e.to_string())?;
                Ok(answer.into_inner().claims[&uid].error.clone())
            } else {
                let request = v1::NodeUnprepareResourcesRequest { claims };
                let answer =
                    dra.node_unprepare_resources(request).await.map_err(|e| e.to_string())?;
                Ok(answer.into_inner().claims[&uid].error.clone())
            }
        })
    }

    /// NodeUnprepareResources for one claim; returns the per-claim error text.
    pub fn unprepare(&self, name: &str, uid: &str) -> String {
        let socket = self.dir.path().join("plugin").join("dra.sock");
        let (name, uid) = (name.to_owned(), uid.to_owned());
        self.netns.block_on(move || async move {
            let mut dra = claims::dra_client_when_listening(&socket, PATIENCE).await;
            let request = v1::NodeUnprepareResourcesRequest {
                claims: vec![v1::Claim { namespace: "default".into(), name, uid: uid.clone() }],
            };
            dra.node_unprepare_resources(request).await.unwrap().into_inner().claims[&uid]
                .error
                .clone()
        })
    }

    pub fn claim(&self, name: &str) -> ResourceClaim {
        let name = name.to_owned();
        self.api(move |client| async move {
            Api::<ResourceClaim>::namespaced(client, "default").get(&name).await.unwrap()
        })
    }

    /// Waits until the claim's status entry has condition Ready with `status`/`reason`.
    pub fn wait_for_status(
        &self,
        name: &str,
        status: &str,
        reason: &str,
        log: &str,
    ) -> ResourceClaim {
        let started = Instant::now();
        loop {
            let claim = self.claim(name);
            let ready = claim
                .status
                .as_ref()
                .and_then(|s| s.devices.as_ref())
                .and_then(|d| d.first())
                .and_then(|d| d.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .map(|c| (c.status.clone(), c.reason.clone()));
            if ready.as_ref().is_some_and(|(s, r)| s == status && r == reason) {
                return claim;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "claim {name}: Ready is {ready:?}, want {status}/{reason}\n{}",
                self.log(log)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One metric's value from the daemon's /metrics.
    pub fn metric(&self, name: &str) -> f64 {
        let name = name.to_owned();
        self.netns.block_on(move || async move { scrape_metric(&name).await })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Close the runtime side (socket, connections) while its tokio runtime still runs.
        let _entered = self.runtime.enter();
        drop(self.nri.take());
    }
}

/// A pod: a throwaway netns announced as a sandbox.
pub fn pod(netns: &Netns, name: &str) -> PodSandbox {
    PodSandbox {
        id: format!("sandbox-{}", netns.prefix),
        uid: format!("uid-{}-{name}", netns.prefix),
        name: name.to_owned(),
        namespace: "default".to_owned(),
        netns_path: Some(Path::new("/run/netns").join(&netns.name)),
        ..PodSandbox::default()
    }
}

/// `ip -j addr show dev net1` in the pod: the IPv4 address with prefix, or `None` when
/// there is no net1 or it is administratively down.
pub fn pod_ipv4(pod_netns: &Netns, name: &str) -> Option<String> {
    let output = std::process::Command::new("ip")
        .args(["-n", &pod_netns.name, "-j", "addr", "show", "dev", name])
        .output()
        .unwrap();
    if !output.status.success() {
        return None;
    }
    let parsed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let link = &parsed[0];
    // Not (yet) attached: a half-done attach that reconcile is about to redo leaves the link
    // administratively down. Not the operstate: that follows the carrier, and a VF loses it
    // for a moment whenever its PF resets (igbvf logs "PF still resetting": the VF test
    // failed here on 6.1 at such a moment).
    let admin_up = link["flags"].as_array().is_some_and(|flags| flags.iter().any(|f| f == "UP"));
    if !admin_up {
        return None;
    }
    // An empty answer: the link went away between the lookup and the listing.
    link["addr_info"]
        .as_array()?
        .iter()
        .find(|a| a["family"] == "inet")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
}

/// `ip -j link show` in the pod.
pub fn pod_links(pod_netns: &Netns) -> Vec<serde_json::Value> {
    let output = std::process::Command::new("ip")
        .args(["-n", &pod_netns.name, "-j", "link", "show"])
        .output()
        .unwrap();
    serde_json::from_slice(&output.stdout).unwrap()
}

pub fn network_ips(claim: &ResourceClaim) -> Vec<String> {
    claim.status.as_ref().unwrap().devices.as_ref().unwrap()[0]
        .network_data
        .as_ref()
        .and_then(|d| d.ips.clone())
        .unwrap_or_default()
}

/// The published device names of interface `if_name`.
pub fn published(node: &Node, if_name: &str) -> bool {
    let if_name = if_name.to_owned();
    node.api(move |client| async move {
        let api: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(client);
        let slices = api.list(&kube::api::ListParams::default()).await.unwrap().items;
        slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).any(|d| {
            d.attributes.as_ref().and_then(|a| a.get("ifName")).and_then(|a| a.string.as_deref())
                == Some(if_name.as_str())
        })
    })
}

pub fn host_link(netns: &Netns, name: &str) -> Option<serde_json::Value> {
    let output = std::process::Command::new("ip")
        .args(["-n", &netns.name, "-j", "-d", "link", "show", "dev", name])
        .output()
        .unwrap();
    output
        .status
        .success()
        .then(|| serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()[0].clone())
}
