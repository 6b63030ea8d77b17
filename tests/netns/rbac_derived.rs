//! RBAC derived from what the code calls (issue 17): a real `netclaim node` and a real
//! `netclaim controller`, each with an identity of its own (the service accounts of
//! deploy/base, as bearer tokens the dev API server maps to user names), run against the dev
//! API server with its request log on, through every kind of call they make: slices published
//! (and a surplus one deleted), claims prepared and unprepared over `dra.sock` (claim and pod
//! GET, status applies, dynamic IPBlocks, a static reservation made and released, one that
//! collides with another claim's), Events on the Node (a repeated one is patched), the Node
//! and PodNetwork watches; the controller's Lease election (create, renew, release),
//! PodNetwork status and finalizer, DeviceClass apply and delete, and the IPBlock sweep of a
//! deleted node; both serve their metrics in the secure mode (as deploy/base runs them) and
//! are scraped once, so each reviews the scraper's token (TokenReview) and its right to
//! `/metrics` (SubjectAccessReview). Every recorded request of the two identities is then evaluated against the
//! ClusterRoles, Roles and bindings `kubectl kustomize` renders from deploy/base and from
//! deploy/overlays/k8s-1.34: the test fails listing each request no rule grants, and each
//! (rule, verb, resource) grant no request used.
//!
//! Two checks the real server makes beyond the request's own attributes are emulated:
//! - A PUT or PATCH that creates the object (201) is also authorised as `create` (the real
//!   server's `withAuthorization` on create-on-update; server-side apply creates this way).
//! - From Kubernetes 1.36 (deploy/base) a write of `resourceclaims/status` also needs
//!   `associated-node:<verb>` on `resourceclaims/driver` with the driver's name as resource
//!   name. The real server asks it only when the write changes that driver's
//!   `status.devices` entries, and `associated-node:` only counts for a service-account token
//!   bound to a pod on the claim's node; every status write of the daemon writes its own
//!   entries of a claim allocated on its own node (the test allocates every claim on the
//!   daemon's node), so the test requires it for every status write. The k8s-1.34 overlay
//!   has no such check and no such grant.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]
#![allow(clippy::too_many_lines, reason = "one scenario told step by step")]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_inmemory::apiserver::ServerOptions;
use kube_inmemory::apiserver::request_log::{RequestLog, RequestRecord};
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use netclaim::model::pod_network::{
    IpBlock, IpBlockClaim, IpBlockSpec, PodNetwork, device_class_name, ip_block_name,
    shared_device_name,
};
use nri_rs::{NriRuntime, PodSandbox, RuntimeOptions};
use serde_json::{Value, json};

use crate::kit;
use crate::kit::netns::{Netns, node_daemon_args, require_root};
use crate::kit::rbac::Check;

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
const DRIVER: &str = "netclaim.dev";
const NODE: &str = "node-a";
const NAMESPACE: &str = "netclaim-system";
const NODE_USER: &str = "system:serviceaccount:netclaim-system:netclaim-node";
const CONTROLLER_USER: &str = "system:serviceaccount:netclaim-system:netclaim-controller";
/// Who scrapes both components' metrics once.
const SCRAPER_USER: &str = "system:serviceaccount:netclaim-system:netclaim-metrics-scraper";
/// The controller's metrics address in the test's netns.
const CONTROLLER_METRICS: &str = "127.0.0.1:19179";
/// Bound for "eventually"; only keeps a broken build from hanging.
const PATIENCE: Duration = Duration::from_secs(30);

/// `netclaim dev --api-only`'s server (our CRDs installed) on a thread inside the test's
/// netns, with a token per identity and the request log on; stops when dropped.
struct ApiServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    url: String,
}

impl ApiServer {
    fn start(netns: &Netns, options: ServerOptions, kubeconfig: &Path) -> Self {
        let path = format!("/run/netns/{}", netns.name);
        let kubeconfig = kubeconfig.to_owned();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, url) = std::sync::mpsc::channel::<String>();
        let thread = std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap();
            #[allow(
                clippy::disallowed_methods,
                reason = "test support: a throwaway thread of the test's own namespace"
            )]
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime
                .block_on(netclaim::dev::api_only::run(
                    kit::netns::NETNS_API_LISTEN.parse().unwrap(),
                    options,
                    Some(&kubeconfig),
                    |url| ready.send(url.to_owned()).unwrap(),
                    async move {
                        let _ = stopped.await;
                    },
                ))
                .unwrap();
        });
        let url = url.recv_timeout(PATIENCE).expect("the API server came up");
        Self { stop: Some(stop), thread: Some(thread), url }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The runtime side of NRI, where the daemon's plugin registers: pod sandboxes are announced
/// there (each pod a throwaway netns), as containerd does. Closed on drop while its tokio
/// runtime still runs (also when the test fails midway).
struct NriSide {
    runtime: tokio::runtime::Runtime,
    nri: Option<NriRuntime>,
}

impl NriSide {
    fn bind(socket: PathBuf) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let nri =
            runtime.block_on(async { NriRuntime::bind(RuntimeOptions::new(socket)).unwrap() });
        Self { runtime, nri: Some(nri) }
    }

    fn nri(&self) -> &NriRuntime {
        self.nri.as_ref().expect("present until dropped")
    }
}

impl Drop for NriSide {
    fn drop(&mut self) {
        let _entered = self.runtime.enter();
        drop(self.nri.take());
    }
}

/// Runs `work` with the client of `kubeconfig` inside `netns`.
fn api<F, Fut, T>(netns: &Netns, kubeconfig: &Path, work: F) -> T
where
    F: FnOnce(kube::Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
    T: Send + 'static,
{
    let kubeconfig = kubeconfig.to_owned();
    netns.block_on(move || async move {
        work(netclaim::k8s::client(Some(&kubeconfig)).await.unwrap()).await
    })
}

/// Polls `probe` (inside the netns, as admin) until it returns true.
fn eventually<F, Fut>(netns: &Netns, kubeconfig: &Path, what: &str, logs: &[&Path], probe: F)
where
    F: Fn(kube::Client) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool>,
{
    let done = api(netns, kubeconfig, move |client| async move {
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if probe(client.clone()).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    });
    if !done {
        let logs: Vec<String> = logs
            .iter()
            .map(|p| {
                format!("--- {}:\n{}", p.display(), std::fs::read_to_string(p).unwrap_or_default())
            })
            .collect();
        panic!("timed out waiting for {what}\n{}", logs.join("\n"));
    }
}

/// An untagged network on `uplink0`; `exclude`, also its static range, holds its static
/// addresses.
fn network(name: &str, subnet: &str, gateway: &str, exclude: &str) -> PodNetwork {
    serde_json::from_value(json!({
        "apiVersion": "netclaim.dev/v1alpha1", "kind": "PodNetwork",
        "metadata": {"name": name},
        "spec": {"parents": ["uplink0"], "ipam": {
            "subnets": [subnet], "gateways": [gateway], "exclude": [exclude],
            "staticRanges": [exclude],
            "blockSize": {"ipv4": 27}}},
    }))
    .unwrap()
}

/// Node, pods, the stale slice, PodNetwork `net-a`, a block of a deleted node, and the claim
/// whose static reservation the third test claim collides with.
async fn set_up(client: kube::Client) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}))
    .unwrap();
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for claim in ["c1", "c2", "c3"] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("pod-{claim}"), "namespace": "default"},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "pause"}],
                     "resourceClaims": [{"name": "net", "resourceClaimName": claim}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    // A slice of this node's pool that the daemon does not want: deleted as surplus.
    let stale: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "node-a-netclaim.dev-stale"},
        "spec": {"driver": DRIVER, "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": []},
    }))
    .unwrap();
    Api::<ResourceSlice>::all(client.clone()).create(&PostParams::default(), &stale).await.unwrap();
    let networks: Api<PodNetwork> = Api::all(client.clone());
    networks
        .create(
            &PostParams::default(),
            &network("net-a", "10.71.0.0/24", "10.71.0.1", "10.71.0.0/27"),
        )
        .await
        .unwrap();
    let blocks: Api<IpBlock> = Api::all(client.clone());
    // A block of a node that is gone: the controller's sweep collects it.
    let gone = IpBlock::new(IpBlockSpec {
        pod_network: "net-a".into(),
        cidr: "10.71.0.224/27".into(),
        node_name: "node-gone".into(),
        claim: None,
    });
    blocks.create(&PostParams::default(), &gone).await.unwrap();
    // Another live claim's static reservation of 10.71.0.30.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let holder: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "holder", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "net",
            "exactly": {"deviceClassName": device_class_name("net-a")}}]}},
    }))
    .unwrap();
    let holder = claims.create(&PostParams::default(), &holder).await.unwrap();
    // Its object holds the name net-a's reservation of that address derives, but names
    // another network: the node's list of net-a's blocks does not show it, so c3's create
    // collides on the name (409) and the node reads the holder with a GET, the path two nodes
    // racing for one block take (a reservation listed first is refused without a create).
    let mut reserved = IpBlock::new(IpBlockSpec {
        pod_network: "net-a-previous".into(),
        cidr: "10.71.0.30/32".into(),
        node_name: "node-b".into(),
        claim: Some(IpBlockClaim {
            namespace: "default".into(),
            name: "holder".into(),
            uid: holder.metadata.uid.unwrap(),
        }),
    });
    reserved.metadata.name = Some(ip_block_name("net-a", "10.71.0.30/32"));
    blocks.create(&PostParams::default(), &reserved).await.unwrap();
    // node-b exists, so its reservation is not a deleted node's.
    let node_b: Node = serde_json::from_value(json!({"metadata": {"name": "node-b"}})).unwrap();
    Api::<Node>::all(client).create(&PostParams::default(), &node_b).await.unwrap();
}

/// Creates claim `name` allocated on this node's `net-a` device as the scheduler writes it,
/// with `claim_config` as the claim's own NetworkConfig; returns kubelet's reference.
async fn allocated_claim(
    client: kube::Client,
    name: &str,
    claim_config: Option<Value>,
) -> v1::Claim {
    let claims: Api<ResourceClaim> = Api::namespaced(client, "default");
    let class = device_class_name("net-a");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "net", "exactly": {"deviceClassName": class}}]}},
    }))
    .unwrap();
    let uid = claims.create(&PostParams::default(), &claim).await.unwrap().metadata.uid.unwrap();
    let network = kit::claims::network_config(json!({"podNetwork": "net-a"}));
    let mut config =
        vec![json!({"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": network}})];
    if let Some(own) = claim_config {
        config.push(json!({"source": "FromClaim", "opaque": {"driver": DRIVER,
            "parameters": kit::claims::network_config(own)}}));
    }
    let status = json!({"status": {
        "allocation": {
            "devices": {"results": [{"request": "net", "driver": DRIVER, "pool": NODE,
                "device": shared_device_name("net-a", "uplink0"), "shareID": uid.clone()}],
                "config": config},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"),
                         "uid": format!("pod-uid-{name}")}],
    }});
    claims.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    v1::Claim { namespace: "default".into(), name: name.into(), uid }
}

/// Each claim's error text (empty on success) from one prepare or unprepare call.
async fn dra_call(
    socket: PathBuf,
    claims: Vec<v1::Claim>,
    prepare: bool,
) -> BTreeMap<String, String> {
    let mut dra = kit::claims::dra_client_when_listening(&socket, PATIENCE).await;
    let names: HashMap<String, String> =
        claims.iter().map(|c| (c.uid.clone(), c.name.clone())).collect();
    let answers: Vec<(String, String)> = if prepare {
        let request = v1::NodePrepareResourcesRequest { claims };
        let answer = dra.node_prepare_resources(request).await.unwrap().into_inner();
        answer.claims.into_iter().map(|(uid, r)| (uid, r.error)).collect()
    } else {
        let request = v1::NodeUnprepareResourcesRequest { claims };
        let answer = dra.node_unprepare_resources(request).await.unwrap().into_inner();
        answer.claims.into_iter().map(|(uid, r)| (uid, r.error)).collect()
    };
    answers.into_iter().map(|(uid, error)| (names[&uid].clone(), error)).collect()
}

/// The authorization checks the real server would make for the requests of the daemon and
/// the controller (see the module doc for the two emulated ones), and the non-resource
/// requests among them.
fn checks(records: &[RequestRecord], granular_status: bool) -> (BTreeSet<Check>, BTreeSet<String>) {
    let mut checks = BTreeSet::new();
    let mut non_resource = BTreeSet::new();
    for record in records {
        // Refused before authorisation (no such token): never reached RBAC.
        if ![NODE_USER, CONTROLLER_USER].contains(&record.user.as_str()) || record.code == 401 {
            continue;
        }
        let a = &record.attributes;
        if !a.resource_request {
            non_resource.insert(format!("{} {} {}", record.user, a.verb, a.path));
            continue;
        }
        let check = Check {
            user: record.user.clone(),
            verb: a.verb.clone(),
            api_group: a.api_group.clone(),
            resource: a.resource.clone(),
            subresource: a.subresource.clone(),
            namespace: a.namespace.clone(),
            name: a.name.clone(),
        };
        let writes = matches!(a.verb.as_str(), "update" | "patch");
        if writes && record.code == 201 {
            checks.insert(Check { verb: "create".into(), ..check.clone() });
        }
        if granular_status
            && writes
            && a.api_group == "resource.k8s.io"
            && a.resource == "resourceclaims"
            && a.subresource == "status"
        {
            checks.insert(Check {
                verb: format!("associated-node:{}", a.verb),
                subresource: "driver".into(),
                name: DRIVER.into(),
                ..check.clone()
            });
        }
        checks.insert(check);
    }
    (checks, non_resource)
}

/// Fails listing the denied checks and the unused grants of `dir`'s rendering.
fn assert_exact(dir: &str, checks: &BTreeSet<Check>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let objects = kit::kustomize::kustomize(&root.join(dir));
    let grants = kit::rbac::grants(&objects);
    assert!(
        grants.iter().any(|g| g.user == NODE_USER)
            && grants.iter().any(|g| g.user == CONTROLLER_USER),
        "{dir}: no grants for the two service accounts"
    );
    let verdict = kit::rbac::evaluate(&grants, checks);
    let denied: Vec<String> = verdict.denied.iter().map(ToString::to_string).collect();
    let unused: Vec<String> = verdict.unused.iter().map(ToString::to_string).collect();
    assert!(
        denied.is_empty() && unused.is_empty(),
        "{dir}: requests no rule grants:\n  {}\ngrants no request used:\n  {}",
        denied.join("\n  "),
        unused.join("\n  ")
    );
}

#[test]
#[ignore = "root: a node daemon and the controller in a throwaway netns; needs kubectl (scripts/setup/kubectl.sh)"]
fn every_request_of_the_daemon_and_the_controller_is_granted_and_every_grant_is_used() {
    require_root(
        "every_request_of_the_daemon_and_the_controller_is_granted_and_every_grant_is_used",
    );
    let netns = Netns::new();
    let peer = netns.ifname("u1");
    netns.ip(&["link", "add", "uplink0", "type", "veth", "peer", "name", &peer]);
    netns.ip(&["link", "set", "uplink0", "up"]);
    netns.ip(&["link", "set", &peer, "up"]);
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);

    let log = RequestLog::in_memory();
    let tokens = [
        ("node-token", NODE_USER),
        ("controller-token", CONTROLLER_USER),
        ("scraper-token", SCRAPER_USER),
    ];
    let options = ServerOptions {
        bearer_token: Some("admin-token".into()),
        user_tokens: tokens.iter().map(|(t, u)| ((*t).to_owned(), (*u).to_owned())).collect(),
        request_log: Some(log.clone()),
        ..ServerOptions::default()
    };
    let admin = path("kubeconfig");
    let server = ApiServer::start(&netns, options, &admin);
    for (token, file) in
        [("node-token", "node.kubeconfig"), ("controller-token", "controller.kubeconfig")]
    {
        kube_inmemory::kubeconfig::write(&path(file), &server.url, Some(token)).unwrap();
    }
    api(&netns, &admin, set_up);

    // The controller: Lease in netclaim-system, a sweep every second.
    let controller_log = path("controller.log");
    let mut controller = netns.spawn(
        NETCLAIM,
        &[
            "controller",
            "--kubeconfig",
            path("controller.kubeconfig").to_str().unwrap(),
            "--metrics-address",
            CONTROLLER_METRICS,
            "--metrics-secure",
            "--leader-election-namespace",
            NAMESPACE,
            "--block-release-grace",
            "1s",
            "--gc-interval",
            "1s",
        ],
        &controller_log,
    );
    // The daemon of node-a, publishing uplink0 as a shared parent.
    let mut args = node_daemon_args(dir.path());
    let at = args.iter().position(|a| a == "--node-name").unwrap() + 1;
    NODE.clone_into(&mut args[at]);
    let at = args.iter().position(|a| a == "--kubeconfig").unwrap() + 1;
    path("node.kubeconfig").to_str().unwrap().clone_into(&mut args[at]);
    args.extend([
        "--nri-socket".to_owned(),
        path("nri.sock").to_str().unwrap().to_owned(),
        "--include-interfaces=uplink0".to_owned(),
        "--shared-parents=uplink0".to_owned(),
        "--metrics-secure".to_owned(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let nri = NriSide::bind(path("nri.sock"));
    let node_log = path("node.log");
    let mut daemon = netns.spawn(NETCLAIM, &args, &node_log);
    let registered = nri.runtime.block_on(nri.nri().wait_for_plugins(1, PATIENCE));
    assert!(registered.is_ok(), "the daemon's NRI plugin did not register");
    let logs = [node_log.as_path(), controller_log.as_path()];

    eventually(
        &netns,
        &admin,
        "net-a's DeviceClass, the sweep, the device, the stale slice gone",
        &logs,
        |client| async move {
            let class = Api::<DeviceClass>::all(client.clone())
                .get_opt(&device_class_name("net-a"))
                .await
                .unwrap();
            let blocks = Api::<IpBlock>::all(client.clone())
                .list(&ListParams::default())
                .await
                .unwrap()
                .items;
            let slices =
                Api::<ResourceSlice>::all(client).list(&ListParams::default()).await.unwrap().items;
            let device = shared_device_name("net-a", "uplink0");
            class.is_some()
                && !blocks.iter().any(|b| b.spec.node_name == "node-gone")
                && slices.iter().any(|s| s.spec.devices.iter().flatten().any(|d| d.name == device))
                && !slices
                    .iter()
                    .any(|s| s.metadata.name.as_deref() == Some("node-a-netclaim.dev-stale"))
        },
    );

    // One scrape of each component's secure metrics endpoint: the scraper's token is known
    // (TokenReview) but the dev server holds no binding for it (SubjectAccessReview: 403).
    let scraped = netns.block_on(|| async {
        let mut codes = Vec::new();
        for address in [kit::netns::NETNS_METRICS_LISTEN, CONTROLLER_METRICS] {
            let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
            codes.push(kit::https::get(port, "/metrics", Some("scraper-token")).await);
        }
        codes
    });
    for answer in &scraped {
        assert!(matches!(answer, Ok((403, _))), "scrapes: {scraped:?}");
    }

    // Prepare: a dynamic address (an IPBlock created), a static one (a reservation created),
    // and a static one another claim holds (the create collides, the holder is read).
    let (c1, c2, c3) = api(&netns, &admin, |client| async move {
        (
            allocated_claim(client.clone(), "c1", None).await,
            allocated_claim(
                client.clone(),
                "c2",
                Some(json!({"ipam": {"addresses": ["10.71.0.20/24"]}})),
            )
            .await,
            allocated_claim(client, "c3", Some(json!({"ipam": {"addresses": ["10.71.0.30/24"]}})))
                .await,
        )
    });
    let socket = path("plugin").join("dra.sock");
    let (s, claims) = (socket.clone(), vec![c1.clone(), c2.clone()]);
    let prepared = netns.block_on(move || dra_call(s, claims, true));
    assert!(
        prepared.values().all(String::is_empty),
        "prepares failed: {prepared:?}\n{}",
        std::fs::read_to_string(&node_log).unwrap_or_default()
    );
    let (s, claims) = (socket.clone(), vec![c3.clone()]);
    let refused = netns.block_on(move || dra_call(s, claims, true));
    assert!(refused["c3"].contains("ipam.addresses[0]"), "c3: {refused:?}");
    // The pods start: the interfaces are attached and the statuses written.
    let pod_netns = [Netns::new(), Netns::new()];
    let sandboxes: Vec<PodSandbox> = ["c1", "c2"]
        .iter()
        .zip(&pod_netns)
        .map(|(claim, ns)| PodSandbox {
            uid: format!("pod-uid-{claim}"),
            ..kit::daemon::pod(ns, &format!("pod-{claim}"))
        })
        .collect();
    for sandbox in &sandboxes {
        let ran = nri.runtime.block_on(nri.nri().run_pod_sandbox(sandbox));
        assert!(ran.is_ok(), "{ran:?}\n{}", std::fs::read_to_string(&node_log).unwrap_or_default());
    }
    eventually(&netns, &admin, "the status of c1 and c2", &logs, |client| async move {
        let claims: Api<ResourceClaim> = Api::namespaced(client, "default");
        let mut written = true;
        for name in ["c1", "c2"] {
            let claim = claims.get(name).await.unwrap();
            written &= claim.status.and_then(|s| s.devices).is_some_and(|d| !d.is_empty());
        }
        written
    });
    for sandbox in &sandboxes {
        nri.runtime.block_on(nri.nri().stop_pod_sandbox(sandbox)).unwrap();
        nri.runtime.block_on(nri.nri().remove_pod_sandbox(sandbox)).unwrap();
    }
    let (s, claims) = (socket.clone(), vec![c1, c2]);
    let unprepared = netns.block_on(move || dra_call(s, claims, false));
    assert!(unprepared.values().all(String::is_empty), "unprepares failed: {unprepared:?}");
    eventually(&netns, &admin, "c2's reservation released", &logs, |client| async move {
        let blocks = Api::<IpBlock>::all(client).list(&ListParams::default()).await.unwrap().items;
        !blocks.iter().any(|b| b.spec.cidr == "10.71.0.20/32")
    });

    // Two more networks untagged on uplink0: two conflicts, one Event on the Node, created
    // then patched (kube's Recorder counts a repeat in the event's series).
    api(&netns, &admin, |client| async move {
        let networks: Api<PodNetwork> = Api::all(client);
        for (name, subnet, gateway, exclude) in [
            ("net-b", "10.72.0.0/24", "10.72.0.1", "10.72.0.0/27"),
            ("net-c", "10.73.0.0/24", "10.73.0.1", "10.73.0.0/27"),
        ] {
            let object = network(name, subnet, gateway, exclude);
            networks.create(&PostParams::default(), &object).await.unwrap();
            // One at a time: each is a conflict of its own publication round.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    eventually(
        &netns,
        &admin,
        "a repeated PodNetworkConflict Event on the Node",
        &logs,
        |client| async move {
            let events = Api::<Event>::namespaced(client, "default")
                .list(&ListParams::default())
                .await
                .unwrap()
                .items;
            events
                .iter()
                .any(|e| e.reason.as_deref() == Some("PodNetworkConflict") && e.series.is_some())
        },
    );
    // Deleting a network: its DeviceClass is deleted and the finalizer removed.
    api(&netns, &admin, |client| async move {
        Api::<PodNetwork>::all(client).delete("net-c", &DeleteParams::default()).await.unwrap();
    });
    eventually(&netns, &admin, "net-c and its DeviceClass gone", &logs, |client| async move {
        let class = Api::<DeviceClass>::all(client.clone())
            .get_opt(&device_class_name("net-c"))
            .await
            .unwrap();
        let network = Api::<PodNetwork>::all(client).get_opt("net-c").await.unwrap();
        class.is_none() && network.is_none()
    });

    // SIGTERM: the daemon drains, the controller releases its Lease.
    assert!(daemon.terminate(PATIENCE).is_some(), "the daemon did not stop");
    assert!(controller.terminate(PATIENCE).is_some(), "the controller did not stop");
    drop(nri);
    drop(server);
    let records = log.records();

    let (granular, non_resource) = checks(&records, true);
    // What the two identities asked for (with the two emulated checks), for the record.
    let mut seen: BTreeMap<(String, String, &str), BTreeSet<String>> = BTreeMap::new();
    for check in &granular {
        let group = if check.api_group.is_empty() { "core" } else { &check.api_group };
        let scope = if check.namespace.is_empty() { "cluster" } else { "namespaced" };
        seen.entry((check.user.clone(), format!("{group}/{}", check.resource_path()), scope))
            .or_default()
            .insert(check.verb.clone());
    }
    eprintln!("authorization checks of the daemon's and the controller's {} requests:", {
        let ours = [NODE_USER, CONTROLLER_USER];
        records.iter().filter(|r| ours.contains(&r.user.as_str())).count()
    });
    for ((user, resource, scope), verbs) in &seen {
        let verbs: Vec<&str> = verbs.iter().map(String::as_str).collect();
        eprintln!("  {user}  {resource} ({scope}): {}", verbs.join(", "));
    }
    assert!(non_resource.is_empty(), "non-resource requests (not modelled): {non_resource:?}");
    assert!(
        granular.iter().any(|c| c.verb == "associated-node:patch"),
        "the daemon wrote no claim status: the scenario is broken"
    );
    assert_exact("deploy/base", &granular);
    let (plain, _) = checks(&records, false);
    assert_exact("deploy/overlays/k8s-1.34", &plain);
}
