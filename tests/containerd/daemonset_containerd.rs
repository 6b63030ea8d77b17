//! The node DaemonSet run as written (issue 17): `kubectl kustomize deploy/base` is rendered,
//! the DaemonSet's pod template is turned into the CRI sandbox and container configs the way
//! kubelet builds them (host network, mounts and their propagation, capabilities, seccomp,
//! read-only root, env with the downward API), and containerd 1.7 runs them from the image
//! `make image` built. The daemon inside finds everything only through its mounts: it
//! registers with a kubelet stand-in on the registration socket, answers the probes on the
//! manifest's port, publishes its ResourceSlice to the API server it reaches through the
//! in-cluster config (service-account token and `KUBERNETES_SERVICE_*`, as kubelet provides
//! them), prepares a claim over dra.sock and attaches a macvlan to a pod sandbox that the same
//! containerd starts (NRI).
//!
//! Every hostPath of the manifest maps to the test's instance of that path (its own state,
//! kubelet and CDI dirs, the test containerd's NRI socket dir, a bpffs of its own; the host's
//! `/var/run/netns`, where containerd puts pod namespaces), from an explicit table: a volume
//! the table lacks fails the test. The device selection (`--include-interfaces`,
//! `--shared-parents`: the test's veth) is the only argument added to the manifest's.
//!
//! The process itself is checked against the manifest: its effective, permitted and bounding
//! capability sets are exactly the `add` list, seccomp is in filter mode, `/` is read-only and
//! the netns mount is a slave of the host's.
//!
//! Mutations show that the test notices a broken manifest, each failing at the step that
//! needs what was removed: without the NRI socket mount (with or without NET_ADMIN, the
//! issue's mutation) the daemon registers and publishes but never connects to NRI; without
//! NET_ADMIN the macvlan's RTM_NEWLINK is refused; without SYS_ADMIN the setns into the pod's
//! netns is refused; without HostToContainer on the netns mount the pod's netns is an empty
//! file in the container.
//!
//! Two node properties this machine lacks are given to it as a systemd node has them: the
//! bpffs and `/run/netns` are shared mounts (containerd refuses HostToContainer from a private
//! one), and `/var/run/netns` is mapped with its `/var/run` symlink resolved (containerd looks
//! up the unresolved path's mount, which here is the private `/`).
//!
//! Needs root, scripts/setup/containerd.sh, kubectl and the image archive (`make image`):
//! `#[ignore]`d, run by `make test` as root, failing when any is missing. The scenarios of
//! one process run one at a time (the manifest's metrics port is a fixed host port).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]
#![allow(clippy::too_many_lines, reason = "the flow is one scenario told step by step")]

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimConsumerReference, ResourceSlice,
};
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube_inmemory::allocator::{AllocatorController, reserve_for};
use netclaim::dev::cri::CriClient;
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use serde_json::{Value, json};

use crate::kit;
use crate::kit::claims::{DevApi, dra_client};
use crate::kit::containerd::{Containerd, sandbox_config_with_attempt};
use crate::kit::daemonset::{HostPathMap, KubeletContext, Mutation};

const DRIVER: &str = "netclaim.dev";
/// Bound for each step of the flow that works (generous: builds share two cores).
const PATIENCE: Duration = Duration::from_mins(1);
/// Bound for each step when a mutation is expected to break one: the working daemon takes
/// about a second for any of them.
const MUTATION_PATIENCE: Duration = Duration::from_secs(20);
/// containerd's per-call bound for NRI plugins (see tests/containerd/e2e_containerd.rs).
const NRI_TIMEOUT: Duration = Duration::from_secs(5);
/// The capability numbers of `linux/capability.h` this manifest may name.
const CAPABILITIES: &[(&str, u32)] = &[
    ("NET_BIND_SERVICE", 10),
    ("NET_ADMIN", 12),
    ("NET_RAW", 13),
    ("SYS_PTRACE", 19),
    ("SYS_ADMIN", 21),
    ("SYS_RESOURCE", 24),
    ("PERFMON", 38),
    ("BPF", 39),
];

/// One scenario at a time in this process: the manifest binds a fixed host port.
static SERIAL: Mutex<()> = Mutex::new(());

/// The steps of the flow, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// The daemon's container created and started from the rendered template.
    Started,
    /// kubelet's plugin watcher found the registration socket; GetInfo and the status call.
    Registered,
    /// The liveness probe answers 200.
    Live,
    /// The readiness probe answers 200.
    Ready,
    /// The test's veth is in a ResourceSlice of the node.
    Published,
    /// The daemon's NRI plugin is synchronized with containerd.
    NriSynchronized,
    /// `NodePrepareResources` over dra.sock succeeded.
    Prepared,
    /// The pod sandbox has the macvlan `net1` and the claim is Ready.
    Attached,
}

/// Where and why the flow stopped.
struct Failure {
    step: Step,
    detail: String,
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failed at {:?}: {}", self.step, self.detail)
    }
}

/// A veth pair in the host netns with generated names, deleted on drop.
struct HostVeth {
    a: String,
    b: String,
}

impl HostVeth {
    fn new(prefix: &str) -> Self {
        let veth = Self { a: format!("{prefix}p0"), b: format!("{prefix}p1") };
        kit::netns::run("ip", &["link", "add", &veth.a, "type", "veth", "peer", "name", &veth.b]);
        for end in [&veth.a, &veth.b] {
            kit::netns::run("ip", &["link", "set", end, "up"]);
        }
        veth
    }
}

impl Drop for HostVeth {
    fn drop(&mut self) {
        for end in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["link", "del", end]).stderr(Stdio::null()).status();
        }
    }
}

/// A bpffs of the test's own (the node's boot-time /sys/fs/bpf), unmounted on drop.
struct PrivateBpffs(PathBuf);

impl PrivateBpffs {
    fn mount(path: PathBuf) -> Self {
        std::fs::create_dir_all(&path).unwrap();
        kit::netns::run("mount", &["-t", "bpf", "bpf", path.to_str().unwrap()]);
        // Shared, as systemd mounts /sys/fs/bpf (its `/` is shared): HostToContainer needs
        // a shared or slave source.
        kit::netns::run("mount", &["--make-shared", path.to_str().unwrap()]);
        Self(path)
    }
}

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// What the test sets up around the daemon. Fields drop in order: containerd (sandboxes,
/// shims, namespaces) first, then the bpffs, the links, the API server and the dirs.
struct Node {
    containerd: Containerd,
    bpffs: PrivateBpffs,
    veth: HostVeth,
    api: DevApi,
    /// Short (socket paths): state, kubelet dirs, service account, pod files.
    dir: tempfile::TempDir,
    prefix: String,
    /// The node's name (`NODE_NAME` of the daemon, its pool and slices).
    name: String,
}

impl Node {
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

/// The host's `/var/run/netns` as a node has it: a shared mount (systemd makes `/` shared;
/// iproute2 makes the dir its own shared mount the same way), so that the pod namespaces
/// containerd mounts there later reach a container that mounted it with HostToContainer.
fn netns_dir_is_shared() {
    let dir = Path::new("/run/netns");
    std::fs::create_dir_all(dir).unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let shared = info.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        fields.get(4) == Some(&"/run/netns") && fields[6..].iter().any(|f| f.starts_with("shared:"))
    });
    if !shared {
        kit::netns::run("mount", &["--bind", "/run/netns", "/run/netns"]);
        kit::netns::run("mount", &["--make-shared", "/run/netns"]);
    }
}

/// Imports the image archive into containerd's `k8s.io` namespace (IfNotPresent: no pull).
fn import_image(ctr: &Path, containerd: &Containerd) {
    let output = Command::new(ctr)
        .arg("--address")
        .arg(containerd.cri_socket())
        .args(["-n", "k8s.io", "images", "import", "--platform", "linux/amd64"])
        .arg(kit::image::archive())
        .output()
        .unwrap();
    assert!(output.status.success(), "ctr import: {}", String::from_utf8_lossy(&output.stderr));
}

/// Polls `check` until it gives a value, for at most `patience`; on timeout the last reason.
async fn wait_for<T, E, F, Fut>(step: Step, patience: Duration, mut check: F) -> Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<Wait>,
{
    let started = Instant::now();
    loop {
        match check().await.map_err(Into::into) {
            Ok(value) => return Ok(value),
            Err(Wait::Failed(reason)) => return Err(Failure { step, detail: reason }),
            Err(Wait::Retry(reason)) if started.elapsed() >= patience => {
                return Err(Failure { step, detail: format!("after {patience:?}: {reason}") });
            }
            Err(Wait::Retry(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Why a check of [`wait_for`] has no value yet.
enum Wait {
    /// Not yet: look again (the reason is reported when patience runs out).
    Retry(String),
    /// Never: the step failed.
    Failed(String),
}

impl From<String> for Wait {
    fn from(reason: String) -> Self {
        Self::Retry(reason)
    }
}

/// The daemon's process on the host: `/usr/bin/netclaim node` with our node's name in its
/// environment.
fn daemon_pid(node_name: &str) -> Option<u32> {
    let needle = format!("NODE_NAME={node_name}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        if !cmdline.starts_with(b"/usr/bin/netclaim\0node\0") {
            return None;
        }
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        environ.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()).then_some(pid)
    })
}

/// A `Status:` field of `/proc/<pid>/status`.
fn status_field(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.trim().to_owned()))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The capability mask of `names`.
fn capability_mask(names: &[String]) -> u64 {
    names.iter().fold(0, |mask, name| {
        let bit = CAPABILITIES
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("capability {name} is not in the test's table"))
            .1;
        mask | (1 << bit)
    })
}

/// Links of the netns at `path` (`ip -j -d link`), by name, with their kind.
fn links_in(netns: &Path) -> BTreeMap<String, Option<String>> {
    let output = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "-j", "-d", "link", "show"])
        .output()
        .unwrap();
    let links: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap_or_default();
    links
        .into_iter()
        .map(|l| {
            (
                l["ifname"].as_str().unwrap_or_default().to_owned(),
                l["linkinfo"]["info_kind"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// Runs the rendered DaemonSet, changed by `mutations`, through the whole flow; prints the
/// daemon's and containerd's logs when a step fails.
fn run_daemonset(mutations: &[Mutation], patience: Duration) -> Result<(), Failure> {
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    kit::netns::require_root("daemonset_containerd");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let tools = kit::containerd::find_tools().unwrap();
        let ctr = tools.ctr.clone();
        let mut containerd = Containerd::new(tools, NRI_TIMEOUT);
        containerd.start();
        let cri = containerd.cri(PATIENCE).await;
        containerd.import_image();
        import_image(&ctr, &containerd);
        let dir = tempfile::Builder::new().prefix("ncds").tempdir_in("/tmp").unwrap();
        let prefix = kit::netns::unique_prefix();
        let node = Node {
            bpffs: PrivateBpffs::mount(dir.path().join("bpffs")),
            veth: HostVeth::new(&prefix),
            api: DevApi::start().await,
            name: format!("ds-{prefix}"),
            containerd,
            dir,
            prefix,
        };
        let result = flow(&node, &cri, mutations, patience).await;
        if let Err(failure) = &result {
            println!("{failure:?}");
            node.containerd.print_logs(&[]);
            for log in glob_logs(&node.path("pods")) {
                println!("--- {} ---\n{}", log.display(), kit::daemonset::cri_log_messages(&log));
            }
        }
        node.containerd.remove_all_sandboxes().await;
        result
    })
}

/// The container logs under kubelet's pod log dirs.
fn glob_logs(dir: &Path) -> Vec<PathBuf> {
    let pattern = format!("{}/*/*/*.log", dir.display());
    glob::glob(&pattern).unwrap().flatten().collect()
}

async fn flow(
    node: &Node,
    cri: &CriClient,
    mutations: &[Mutation],
    patience: Duration,
) -> Result<(), Failure> {
    // --- The manifest, rendered and (for the mutation tests) broken. ---
    let mut daemonset = kit::daemonset::rendered_node_daemonset();
    for mutation in mutations {
        kit::daemonset::mutate(&mut daemonset, *mutation);
    }
    let template = daemonset["spec"]["template"].clone();
    let container = template["spec"]["containers"][0].clone();
    assert_eq!(
        container["image"].as_str(),
        Some(kit::image::image_ref().as_str()),
        "the manifest runs the image `make image` builds"
    );
    assert_eq!(container["imagePullPolicy"], "IfNotPresent", "an imported image is used as is");
    let arg = |flag: &str| -> String {
        container["args"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|a| a.as_str().unwrap().strip_prefix(&format!("{flag}=")))
            .unwrap_or_else(|| panic!("the manifest passes {flag}"))
            .to_owned()
    };

    // --- What kubelet and the node provide. ---
    let daemon_uid = uuid::Uuid::new_v4().to_string();
    let pod_name = format!("netclaim-node-{}", &node.prefix[2..]);
    let service_account = node.path("serviceaccount");
    std::fs::create_dir_all(&service_account).unwrap();
    let (ca, cert, key) = kit::daemonset::serving_certificate(node.dir.path());
    std::fs::copy(&ca, service_account.join("ca.crt")).unwrap();
    std::fs::write(service_account.join("token"), "netclaim-node-token").unwrap();
    std::fs::write(service_account.join("namespace"), "netclaim-system").unwrap();
    let api_backend = kubeconfig_server(&node.api.dir().join("kubeconfig"));
    let api_port = kit::daemonset::tls_front(&cert, &key, api_backend).await;
    let ctx = KubeletContext {
        pod_name: pod_name.clone(),
        pod_namespace: daemonset["metadata"]["namespace"].as_str().unwrap().to_owned(),
        pod_uid: daemon_uid.clone(),
        node_name: node.name.clone(),
        api_host: "127.0.0.1".to_owned(),
        api_port,
        service_account_dir: service_account,
        pod_dir: node.path(&format!("kubelet/pods/{daemon_uid}")),
        log_dir: node.path(&format!("pods/netclaim-system_{pod_name}_{daemon_uid}")),
    };
    // kubelet creates its plugin registry dir; the manifest mounts it with type Directory.
    std::fs::create_dir_all(node.path("registry")).unwrap();
    let paths = HostPathMap::new([
        // Test instances of the node's dirs: state, kubelet's plugin dirs, CDI specs.
        ("/var/lib/netclaim", node.path("state")),
        ("/var/lib/kubelet/plugins/netclaim.dev", node.path("plugin")),
        ("/var/lib/kubelet/plugins_registry", node.path("registry")),
        ("/var/run/cdi", node.containerd.cdi_dir()),
        // The test containerd's NRI socket lives in its run dir (as nri.sock).
        ("/var/run/nri", node.containerd.nri_socket().parent().unwrap().to_owned()),
        // Where containerd 1.7 creates pod network namespaces: the host's own, with the
        // /var/run symlink resolved. containerd checks that a HostToContainer source is on a
        // shared or slave mount by looking the unresolved path up in mountinfo, which finds
        // `/`; a systemd node's `/` is shared, this machine's is private, and only
        // /run/netns itself is a shared mount here (see `netns_dir_is_shared`).
        ("/var/run/netns", std::fs::canonicalize("/var/run/netns").unwrap()),
        // The node's bpffs: one of the test's own.
        ("/sys/fs/bpf", node.bpffs.0.clone()),
        // Mode vfio's writable sysfs trees: the host's own (the daemon writes nothing there
        // without a vfio claim; the check below only looks at how they are mounted).
        ("/sys/bus/pci", PathBuf::from("/sys/bus/pci")),
        ("/sys/devices", PathBuf::from("/sys/devices")),
    ]);
    assert_eq!(
        node.containerd.nri_socket().file_name().unwrap(),
        Path::new(&arg("--nri-socket")).file_name().unwrap(),
        "the NRI socket has the name the manifest gives it"
    );
    netns_dir_is_shared();
    let site_args = vec![
        format!("--include-interfaces={}", node.veth.a),
        format!("--shared-parents={}", node.veth.a),
    ];
    // The manifest binds its metrics port on the host: it must be free.
    let (live_path, live_port) = kit::daemonset::probe_port(&container, "livenessProbe");
    let (ready_path, ready_port) = kit::daemonset::probe_port(&container, "readinessProbe");
    assert!(
        std::net::TcpListener::bind(("0.0.0.0", live_port)).is_ok(),
        "host port {live_port} (the manifest's metrics port) is taken"
    );

    // --- The sandbox and the container, from the template. ---
    let sandbox = kit::daemonset::sandbox_config(&template, &ctx);
    let (config, mounts) = kit::daemonset::container_config(&template, &ctx, &paths, &site_args);
    let template_mounts: Vec<&str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    for name in &template_mounts {
        assert!(mounts.iter().any(|m| m.source == *name), "volumeMount {name} is in the config");
    }
    println!("mounts of the daemon's container:");
    for m in &mounts {
        println!(
            "  {:<24} {} <- {} (propagation {}, ro {})",
            m.source,
            m.mount.container_path,
            m.mount.host_path,
            m.mount.propagation,
            m.mount.readonly
        );
    }
    let started: Result<String, Failure> = async {
        let fail = |e: netclaim::dev::cri::CriError| Failure {
            step: Step::Started,
            detail: e.to_string(),
        };
        let sandbox_id = cri.run_pod_sandbox(sandbox.clone(), "").await.map_err(fail)?;
        let id = cri.create_container(&sandbox_id, config, sandbox).await.map_err(fail)?;
        cri.start_container(&id).await.map_err(fail)?;
        Ok(id)
    }
    .await;
    let container_id = started?;
    let daemon_log = ctx.log_dir.join(format!("{}/0.log", container["name"].as_str().unwrap()));

    // The process runs with exactly the manifest's capabilities, the runtime's seccomp
    // filter and the netns dir as a slave of the host's.
    let pid = wait_for(Step::Started, patience, || async {
        daemon_pid(&node.name).ok_or_else(|| "no daemon process".to_owned())
    })
    .await?;
    let added = strings(&container["securityContext"]["capabilities"]["add"]);
    let expected = capability_mask(&added);
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        let mask = u64::from_str_radix(&status_field(pid, set), 16).unwrap();
        assert_eq!(mask, expected, "{set} of the daemon is the manifest's {added:?}");
    }
    if container["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault" {
        assert_eq!(status_field(pid, "Seccomp"), "2", "the runtime's seccomp filter is on");
    }
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    if container["securityContext"]["readOnlyRootFilesystem"] == true {
        let root = mountinfo.lines().find(|l| l.split(' ').nth(4) == Some("/"));
        let options = root.and_then(|l| l.split(' ').nth(5)).unwrap_or_default();
        assert!(options.split(',').any(|o| o == "ro"), "the root is read-only: {root:?}");
    }
    // /sys is read-only but for the two trees mode vfio writes (the manifest's sysfs mounts).
    let sys_options = |point: &str| {
        mountinfo
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(point))
            .and_then(|l| l.split(' ').nth(5))
            .map(|o| o.split(',').any(|o| o == "rw"))
    };
    assert_eq!(sys_options("/sys"), Some(false), "/sys is read-only in the container");
    for point in ["/sys/bus/pci", "/sys/devices"] {
        assert_eq!(sys_options(point), Some(true), "{point} is mounted writable");
    }
    println!(
        "daemon pid {pid}: CapEff {}, netns mount: {:?}",
        status_field(pid, "CapEff"),
        mountinfo.lines().find(|l| l.split(' ').nth(4) == Some("/var/run/netns"))
    );

    // --- kubelet's plugin watcher: the registration socket in the registry dir. ---
    let registration = node.path(&format!("registry/{DRIVER}-reg.sock"));
    let info = wait_for(Step::Registered, patience, || async {
        if !registration.exists() {
            return Err(format!("no {}", registration.display()));
        }
        kit::daemonset::register(&registration).await
    })
    .await?;
    assert_eq!((info.r#type.as_str(), info.name.as_str()), ("DRAPlugin", DRIVER), "{info:?}");
    // The endpoint is a path in kubelet's mount namespace; the manifest mounts the plugin
    // dir at the host's path, so it is the container's path too. The test's kubelet finds it
    // through the same table.
    let plugin_dir = arg("--kubelet-plugin-dir");
    assert_eq!(info.endpoint, format!("{plugin_dir}/dra.sock"), "{info:?}");
    let dra_socket = node.path("plugin/dra.sock");

    // --- The probes, as kubelet sends them (HTTPS unverified when the probe says so). ---
    wait_for(Step::Live, patience, || async {
        match probe(&container, "livenessProbe", live_port, &live_path).await {
            Ok(200) => Ok(()),
            other => Err(format!("GET {live_path}: {other:?}")),
        }
    })
    .await?;
    wait_for(Step::Ready, patience, || async {
        match probe(&container, "readinessProbe", ready_port, &ready_path).await {
            Ok(200) => Ok(()),
            other => Err(format!("GET {ready_path}: {other:?}")),
        }
    })
    .await?;
    // --- /metrics on the manifest's port, as the PodMonitor scrapes it. ---
    scrape_as_deploy_monitoring_says(&node.api.client, live_port).await;

    // --- Published: the veth in the node's slice (through the in-cluster config). ---
    let client = node.api.client.clone();
    let device = wait_for(Step::Published, patience, || async {
        let slices = Api::<ResourceSlice>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        slices
            .items
            .iter()
            .filter(|s| s.spec.node_name.as_deref() == Some(node.name.as_str()))
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| {
                d.attributes
                    .as_ref()
                    .and_then(|a| a.get("ifName"))
                    .and_then(|a| a.string.as_deref())
                    == Some(node.veth.a.as_str())
            })
            .map(|d| d.name.clone())
            .ok_or_else(|| format!("{} not published", node.veth.a))
    })
    .await?;
    // The daemon retries its NRI connection with backoff: three failures in a row (the
    // runtime was up before the daemon started) are an answer, not a moment to wait out.
    let connect_failures = "NRI connection failed";
    wait_for(Step::NriSynchronized, patience, || async {
        let log = kit::daemonset::cri_log_messages(&daemon_log);
        if log.contains("synchronizing with NRI runtime") {
            Ok(())
        } else if log.matches(connect_failures).count() >= 3 {
            let last = log.lines().rfind(|l| l.contains(connect_failures)).unwrap_or_default();
            Err(Wait::Failed(last.to_owned()))
        } else {
            Err(Wait::Retry("the daemon's log shows no NRI synchronization".to_owned()))
        }
    })
    .await?;
    println!("published {device}; NRI synchronized");

    // --- A claim on it, allocated as the scheduler would, prepared as kubelet does. ---
    let class = format!("{}-macvlan", node.prefix);
    let device_class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": class},
        "spec": {
            "selectors": [{"cel": {"expression": format!(
                r#"device.driver == "{DRIVER}" && device.attributes["netclaim.dev"].ifName == "{}""#,
                node.veth.a
            )}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig", "mode": "macvlan"}}}],
        },
    }))
    .unwrap();
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &device_class)
        .await
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim_name = format!("{}-claim", node.prefix);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": claim_name, "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "net", "exactly": {"deviceClassName": class}}],
            "config": [{"requests": ["net"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig",
                "ipam": {"pool": {"subnet": "10.77.9.0/24"}}}}}],
        }},
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let allocator = AllocatorController::new(client.clone(), &node.name);
    let started = Instant::now();
    while allocator.reconcile().await.unwrap().pending > 0 {
        assert!(started.elapsed() < PATIENCE, "{:?}", allocator.pending_reasons().lock().unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pod_uid = uuid::Uuid::new_v4().to_string();
    let pod = format!("{}-pod", node.prefix);
    let consumer = ResourceClaimConsumerReference {
        resource: "pods".to_owned(),
        name: pod.clone(),
        uid: pod_uid.clone(),
        api_group: None,
    };
    let claim = reserve_for(&client, "default", &claim_name, &consumer).await.unwrap();
    let claim_ref = kit::claims::claim_ref(&claim);
    let mut dra = dra_client(&dra_socket).await;
    let answer = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![claim_ref.clone()] })
        .await
        .map_err(|e| Failure { step: Step::Prepared, detail: e.to_string() })?
        .into_inner();
    let result = &answer.claims[&claim_ref.uid];
    if !result.error.is_empty() {
        return Err(Failure { step: Step::Prepared, detail: result.error.clone() });
    }
    // The prepared claim is in the state dir, its device-metadata CDI spec in the runtime's
    // CDI dir: both written through the manifest's mounts.
    let listing = |dir: PathBuf| -> Vec<String> {
        std::fs::read_dir(&dir)
            .map(|entries| entries.flatten().map(|e| e.file_name().to_string_lossy().into()))
            .map_or_else(|_| Vec::new(), Iterator::collect)
    };
    let cdi_specs = listing(node.containerd.cdi_dir());
    assert!(
        cdi_specs.iter().any(|f| f.contains(&claim_ref.uid)),
        "a CDI spec for claim {} in the runtime's CDI dir: {cdi_specs:?}",
        claim_ref.uid
    );
    assert!(!listing(node.path("state")).is_empty(), "the daemon's state is in the state dir");

    // --- The pod: containerd runs its sandbox, NRI hands it to the daemon. ---
    let pod_config = sandbox_config_with_attempt(&node.containerd, &pod, &pod_uid, 0);
    let sandbox_id_of_pod = cri
        .run_pod_sandbox(pod_config, "")
        .await
        .map_err(|e| Failure { step: Step::Attached, detail: e.to_string() })?;
    let netns = node.containerd.sandbox_netns(cri, &sandbox_id_of_pod).await;
    let links = links_in(&netns);
    if links.get("net1") != Some(&Some("macvlan".to_owned())) {
        return Err(Failure {
            step: Step::Attached,
            detail: format!("the pod's links: {links:?}, no macvlan net1"),
        });
    }
    wait_for(Step::Attached, patience, || async {
        let current = claims.get(&claim_name).await.map_err(|e| e.to_string())?;
        let status = current.status.unwrap_or_default();
        let ready = status.devices.iter().flatten().any(|d| {
            d.driver == DRIVER
                && d.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True" && c.reason == "NetworkReady")
        });
        if ready { Ok(()) } else { Err(format!("claim status: {:?}", status.devices)) }
    })
    .await?;
    // The traffic counters of the pod's interface are loaded and pinned in the node's bpffs
    // (bpf(2) needs bpf_capable(): CAP_BPF or, as here, SYS_ADMIN; the tc filter NET_ADMIN).
    let pins = node.bpffs.0.join(format!("netclaim/{}/{pod_uid}", node.name));
    wait_for(Step::Attached, patience, || async {
        let count = std::fs::read_dir(&pins).map_or(0, Iterator::count);
        if count > 0 { Ok(()) } else { Err(format!("nothing pinned under {}", pins.display())) }
    })
    .await?;
    println!(
        "pod {pod}: net1 is a macvlan on {}; the claim is Ready; counters pinned",
        node.veth.a
    );

    // --- Teardown as kubelet does it: the pod, the claim, then the DaemonSet pod. ---
    cri.stop_pod_sandbox(&sandbox_id_of_pod).await.unwrap();
    cri.remove_pod_sandbox(&sandbox_id_of_pod).await.unwrap();
    let answer = dra
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![claim_ref] })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.claims.values().all(|c| c.error.is_empty()), "{answer:?}");
    let grace = daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);
    cri.stop_container(&container_id, Duration::from_secs(grace)).await.unwrap();
    let log = kit::daemonset::cri_log_messages(&daemon_log);
    assert!(!log.contains("\"level\":\"ERROR\""), "the daemon logged errors:\n{log}");
    Ok(())
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// One probe as kubelet sends it: plain HTTP, or HTTPS without verifying the certificate
/// when the probe's `scheme` is `HTTPS`; the status code.
async fn probe(container: &Value, probe: &str, port: u16, path: &str) -> Result<u16, String> {
    if container[probe]["httpGet"]["scheme"] == "HTTPS" {
        kit::https::get(port, path, None).await.map(|(code, _)| code)
    } else {
        kit::daemonset::http_get(port, path).await
    }
}

/// The manifest runs the secure metrics mode (decision 0018): over HTTPS, `/metrics` answers
/// 401 without a token, 403 to a ServiceAccount without deploy/monitoring's
/// `netclaim-metrics-reader`, and the series to one bound to it. The daemon reviews the
/// tokens through its in-cluster identity.
async fn scrape_as_deploy_monitoring_says(admin: &kube::Client, port: u16) {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use serde::Deserialize as _;

    let create = PostParams::default();
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "monitoring"}})).unwrap();
    let _exists = Api::<Namespace>::all(admin.clone()).create(&create, &namespace).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "monitoring");
    let mut tokens = Vec::new();
    for name in ["prometheus", "nobody"] {
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        let _exists = accounts.create(&create, &account).await;
        let request: TokenRequest = serde_json::from_value(json!({"spec": {}})).unwrap();
        let issued = accounts.create_token_request(name, &create, &request).await.unwrap();
        tokens.push(issued.status.unwrap().token.unwrap());
    }
    let text =
        std::fs::read_to_string(kit::repo().join("deploy/monitoring/metrics-reader-rbac.yaml"))
            .unwrap();
    let role = yaml_serde::Deserializer::from_str(&text)
        .map(|document| Value::deserialize(document).unwrap())
        .find(|o| o["kind"] == "ClusterRole")
        .unwrap();
    let role: ClusterRole = serde_json::from_value(role).unwrap();
    let _exists = Api::<ClusterRole>::all(admin.clone()).create(&create, &role).await;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "prometheus-netclaim-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role.metadata.name},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
    }))
    .unwrap();
    let _exists = Api::<ClusterRoleBinding>::all(admin.clone()).create(&create, &binding).await;
    let (code, body) = kit::https::get(port, "/metrics", Some(&tokens[0])).await.unwrap();
    assert_eq!(code, 200, "a permitted scraper: {body}");
    assert!(body.contains("netclaim_devices_published"), "{body}");
    let (code, body) = kit::https::get(port, "/metrics", Some(&tokens[1])).await.unwrap();
    assert_eq!(code, 403, "a scraper without the role: {body}");
    let (code, body) = kit::https::get(port, "/metrics", None).await.unwrap();
    assert_eq!(code, 401, "no token: {body}");
    println!(
        "/metrics on port {port}: 200 with a permitted token, 403 without the role, 401 without a token"
    );
}

/// The `server:` of a kubeconfig, as `host:port`.
fn kubeconfig_server(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let server = text.lines().find_map(|l| l.trim().strip_prefix("server:"));
    let server = server.unwrap_or_else(|| panic!("no server in {}", path.display()));
    server.trim().trim_matches('"').trim_start_matches("http://").to_owned()
}

#[test]
#[ignore = "needs root, containerd, kubectl and the image archive: run `make test` as root"]
fn the_daemonset_runs_as_written() {
    run_daemonset(&[], PATIENCE).unwrap();
}

/// The table of test paths is complete and explicit: a hostPath volume it does not know fails
/// the translation instead of being mounted from the host as written.
#[test]
#[ignore = "needs kubectl: run `make test`"]
#[should_panic(expected = "hostPath /var/lib/unknown has no test instance")]
fn an_unknown_host_path_fails_the_translation() {
    let mut daemonset = kit::daemonset::rendered_node_daemonset();
    let spec = &mut daemonset["spec"]["template"]["spec"];
    spec["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "unknown", "hostPath": {"path": "/var/lib/unknown"}}));
    spec["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "unknown", "mountPath": "/var/lib/unknown"}));
    let dir = tempfile::tempdir().unwrap();
    let ctx = KubeletContext {
        pod_name: "netclaim-node-x".to_owned(),
        pod_namespace: "netclaim-system".to_owned(),
        pod_uid: "uid".to_owned(),
        node_name: "node".to_owned(),
        api_host: "127.0.0.1".to_owned(),
        api_port: 443,
        service_account_dir: dir.path().join("sa"),
        pod_dir: dir.path().join("pod"),
        log_dir: dir.path().join("log"),
    };
    let known = ["/var/lib/netclaim", "/var/lib/kubelet/plugins/netclaim.dev", "/var/run/cdi"];
    let known = known.map(|p| (p, dir.path().join(p.trim_start_matches('/'))));
    let registry = dir.path().join("registry");
    std::fs::create_dir_all(&registry).unwrap();
    for sysfs in ["pci", "devices"] {
        std::fs::create_dir_all(dir.path().join(sysfs)).unwrap();
    }
    let paths = HostPathMap::new(known.into_iter().chain([
        ("/var/lib/kubelet/plugins_registry", registry),
        ("/var/run/nri", dir.path().join("nri")),
        ("/var/run/netns", dir.path().join("netns")),
        ("/sys/fs/bpf", dir.path().to_owned()),
        ("/sys/bus/pci", dir.path().join("pci")),
        ("/sys/devices", dir.path().join("devices")),
    ]));
    let template = daemonset["spec"]["template"].clone();
    let _ = kit::daemonset::container_config(&template, &ctx, &paths, &[]);
}

/// Runs the flow with `mutations`; it must fail. Returns where and why.
fn expect_failure(mutations: &[Mutation]) -> Failure {
    match run_daemonset(mutations, MUTATION_PATIENCE) {
        Ok(()) => panic!("the flow passed with {mutations:?}: the test does not see that change"),
        Err(failure) => {
            println!("with {mutations:?}: {failure:?}");
            failure
        }
    }
}

/// The issue's mutation: no NRI socket mount, no NET_ADMIN. The daemon comes up, registers
/// and publishes, but never reaches the runtime: no pod would get its interface.
#[test]
#[ignore = "needs root, containerd, kubectl and the image archive: run `make test` as root"]
fn without_the_nri_mount_and_net_admin_the_flow_fails() {
    let failure = expect_failure(&[
        Mutation::RemoveVolumeMount("nri"),
        Mutation::RemoveCapability("NET_ADMIN"),
    ]);
    assert_eq!(failure.step, Step::NriSynchronized, "{failure:?}");
    assert!(failure.detail.contains("/var/run/nri/nri.sock: No such file"), "{failure:?}");
}

/// The NRI mount alone: the same failure (the socket is not in the container).
#[test]
#[ignore = "needs root, containerd, kubectl and the image archive: run `make test` as root"]
fn without_the_nri_mount_the_flow_fails() {
    let failure = expect_failure(&[Mutation::RemoveVolumeMount("nri")]);
    assert_eq!(failure.step, Step::NriSynchronized, "{failure:?}");
    assert!(failure.detail.contains("/var/run/nri/nri.sock: No such file"), "{failure:?}");
}

/// NET_ADMIN alone: everything up to the attach works (netlink reads, the API, kubelet's
/// sockets, NRI); creating the macvlan (RTM_NEWLINK) is refused, so the sandbox fails.
#[test]
#[ignore = "needs root, containerd, kubectl and the image archive: run `make test` as root"]
fn without_net_admin_the_flow_fails() {
    let failure = expect_failure(&[Mutation::RemoveCapability("NET_ADMIN")]);
    assert_eq!(failure.step, Step::Attached, "{failure:?}");
    assert!(failure.detail.contains("RTM_NEWLINK macvlan"), "{failure:?}");
    assert!(failure.detail.contains("Operation not permitted"), "{failure:?}");
}

/// SYS_ADMIN alone: entering the pod's network namespace (setns(2) with CLONE_NEWNET needs
/// CAP_SYS_ADMIN) is refused, so the sandbox fails. The netns is entered on its own thread
/// while the attach starts (`host::pod_sockets`): the refusal is the attach's first step's,
/// naming the netns.
#[test]
#[ignore = "needs root, containerd, kubectl and the image archive: run `make test` as root"]
fn without_sys_admin_the_flow_fails() {
    let failure = expect_failure(&[Mutation::RemoveCapability("SYS_ADMIN")]);
    assert_eq!(failure.step, Step::Attached, "{failure:?}");
    assert!(failure.detail.contains("failed at step 0"), "{failure:?}");
    assert!(failure.detail.contains(": netns /var/run/netns/"), "{failure:?}");
    assert!(failure.detail.contains("Operation not permitted"), "{failure:?}");
}

/// The netns mount without HostToContainer: the pod's namespace, mounted by containerd after
/// the daemon started, is an empty file in the container (no propagation), which the daemon
/// refuses to enter.
#[test]
#[ignore = "needs root, containerd, kubectl and the image archive: run `make test` as root"]
fn without_host_to_container_on_the_netns_mount_the_flow_fails() {
    let failure = expect_failure(&[Mutation::RemovePropagation("netns")]);
    assert_eq!(failure.step, Step::Attached, "{failure:?}");
    assert!(failure.detail.contains("not a namespace file (nsfs)"), "{failure:?}");
}
