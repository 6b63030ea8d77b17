//! The NRI plugin side against a real containerd 1.7 with NRI enabled, driven through our own
//! CRI client.
//!
//! The test starts its own containerd (config, root, state, sockets and CNI state under a temp
//! dir; never the system's), imports the local pause image made by
//! `scripts/setup/containerd.sh`, runs the `nri_logger` example as the plugin and checks that:
//! the plugin registers; `RunPodSandbox` reaches it with the pod's UID and netns path (the
//! same path containerd reports in `PodSandboxStatus`); a container of the refused pod fails to
//! be created while another pod's container is created; after a containerd restart the plugin
//! reconnects, is synchronized with the existing pods, and gets events again; stop and remove
//! reach it. Everything the test started is stopped and removed, also on failure.
//!
//! Needs root and the artifacts of `scripts/setup/containerd.sh` (or
//! `NETCLAIM_CONTAINERD_PREFIX` / `NETCLAIM_TEST_IMAGES`). Without them it prints `SKIPPED`,
//! except when `CI` is set, where it fails.

#![allow(clippy::unwrap_used, reason = "test helpers panic with the failing value, like the tests")]

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt as _;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use netclaim::cri::{CriClient, CriError, netns_path_from_verbose_info, proto};

const IMAGE: &str = "localhost/netclaim/pause:1.0";
const WAIT: Duration = Duration::from_secs(30);

struct Tools {
    containerd: PathBuf,
    ctr: PathBuf,
    bin_dir: PathBuf,
    pause_tar: PathBuf,
    plugin: PathBuf,
}

/// Skips (or, under CI, fails) when something the test needs is missing.
fn require<T>(what: &str) -> Option<T> {
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but {what}: run scripts/setup/containerd.sh as root"
    );
    println!("SKIPPED: {what} (run scripts/setup/containerd.sh as root)");
    None
}

fn find_tools() -> Option<Tools> {
    let is_root = fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !is_root {
        return require("not running as root");
    }
    let prefix = std::env::var_os("NETCLAIM_CONTAINERD_PREFIX")
        .map_or_else(|| PathBuf::from("/opt/netclaim-test/containerd"), PathBuf::from);
    let images = std::env::var_os("NETCLAIM_TEST_IMAGES")
        .map_or_else(|| PathBuf::from("/opt/netclaim-test/images"), PathBuf::from);
    let bin_dir = prefix.join("usr/bin");
    let tools = Tools {
        containerd: bin_dir.join("containerd"),
        ctr: bin_dir.join("ctr"),
        pause_tar: images.join("pause.tar"),
        plugin: plugin_binary(),
        bin_dir,
    };
    for path in [&tools.containerd, &tools.ctr, &tools.pause_tar] {
        if !path.exists() {
            return require(&format!("{} is missing", path.display()));
        }
    }
    for path in ["/usr/sbin/runc", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local"] {
        if !Path::new(path).exists() {
            return require(&format!("{path} is missing"));
        }
    }
    Some(tools)
}

/// The example plugin: built next to this test by `cargo test`/`cargo nextest run` (examples
/// are built with the tests), or named by `NETCLAIM_NRI_LOGGER`.
fn plugin_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NETCLAIM_NRI_LOGGER") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir =
        exe.parent().and_then(Path::parent).expect("test binaries live in <target>/<profile>/deps");
    let built = profile_dir.join("examples/nri_logger");
    if !built.exists() {
        // Built only when the test was run on its own (`cargo test --test nri_containerd`).
        let status = Command::new(env!("CARGO"))
            .args(["build", "--example", "nri_logger"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo");
        assert!(status.success(), "building the nri_logger example failed");
    }
    built
}

/// Everything the test starts; dropping it stops and removes all of it.
struct World {
    dir: tempfile::TempDir,
    tools: Tools,
    bridge: String,
    containerd: Option<Child>,
    plugins: Vec<Child>,
    lines: Option<mpsc::Receiver<String>>,
    /// Network namespaces containerd made for our pods (removed if a pod is left over).
    netns_paths: Vec<PathBuf>,
}

impl World {
    fn new(tools: Tools) -> Self {
        let dir = tempfile::Builder::new().prefix("ncnri").tempdir_in("/tmp").unwrap();
        let bridge = format!("ncnri{:x}", std::process::id() & 0xff_ffff);
        let world = Self {
            dir,
            tools,
            bridge,
            containerd: None,
            plugins: Vec::new(),
            lines: None,
            netns_paths: Vec::new(),
        };
        world.write_configs();
        world
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn cri_socket(&self) -> PathBuf {
        self.path("run/containerd.sock")
    }

    fn nri_socket(&self) -> PathBuf {
        self.path("run/nri.sock")
    }

    fn write_configs(&self) {
        for d in [
            "root",
            "state",
            "run",
            "cni/net.d",
            "cni/state",
            "nri/conf.d",
            "nri/plugins",
            "opt",
            "pods",
        ] {
            fs::create_dir_all(self.path(d)).unwrap();
        }
        let p = |rel: &str| self.path(rel).display().to_string();
        // Subnet from the PID as well, so two runs at once do not collide.
        let subnet = format!("10.251.{}.0/24", std::process::id() % 250);
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{grpc}"

[ttrpc]
  address = "{grpc}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  disable_connections = false
  plugin_config_path = "{nri_conf}"
  plugin_path = "{nri_plugins}"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
  socket_path = "{nri_sock}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  stream_server_port = "0"
  # The test machine lacks CAP_SYS_RESOURCE, so negative oom_score_adj values are refused.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"#,
            root = p("root"),
            state = p("state"),
            grpc = self.cri_socket().display(),
            opt = p("opt"),
            nri_conf = p("nri/conf.d"),
            nri_plugins = p("nri/plugins"),
            nri_sock = self.nri_socket().display(),
            cni_conf = p("cni/net.d"),
        );
        fs::write(self.path("containerd.toml"), config).unwrap();
        // An isolated bridge: no uplink, no masquerading, no default route in pods.
        let cni = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": format!("{}-net", self.bridge),
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": false,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": p("cni/state"),
                        "ranges": [[{ "subnet": subnet }]]
                    }
                },
                { "type": "loopback" }
            ]
        });
        fs::write(self.path("cni/net.d/10-nri-e2e.conflist"), cni.to_string()).unwrap();
    }

    fn start_containerd(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("containerd.log"))
            .unwrap();
        let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", self.tools.bin_dir.display());
        let child = Command::new(&self.tools.containerd)
            .arg("--config")
            .arg(self.path("containerd.toml"))
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        self.containerd = Some(child);
    }

    /// SIGTERM, as a service manager restarting containerd would send, then wait.
    fn stop_containerd(&mut self) {
        if let Some(mut child) = self.containerd.take() {
            terminate(&mut child);
        }
    }

    async fn cri(&self) -> CriClient {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(client) = CriClient::connect(&self.cri_socket(), Duration::from_mins(1)).await
                && client.version().await.is_ok()
            {
                return client;
            }
            assert!(Instant::now() < deadline, "containerd did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn import_image(&self) {
        let status = Command::new(&self.tools.ctr)
            .arg("--address")
            .arg(self.cri_socket())
            .args(["-n", "k8s.io", "images", "import", "--platform", "linux/amd64"])
            .arg(&self.tools.pause_tar)
            .stdout(Stdio::null())
            .status()
            .expect("running ctr");
        assert!(status.success(), "ctr images import failed");
    }

    /// Starts an `nri_logger` with `args`; its stdout lines arrive on the returned channel.
    fn spawn_plugin(&mut self, log_name: &str, args: &[&str]) -> mpsc::Receiver<String> {
        let log = fs::File::create(self.path(log_name)).unwrap();
        let mut child = Command::new(&self.tools.plugin)
            .arg("--socket")
            .arg(self.nri_socket())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("starting the nri_logger example");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        let tag = log_name.trim_end_matches(".log").to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                println!("{tag}: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        self.plugins.push(child);
        rx
    }

    fn start_plugin(&mut self, refuse_pod: &str) {
        let args = ["--index", "50", "--refuse-pod", refuse_pod, "--reconnect-max-ms", "500"];
        let lines = self.spawn_plugin("plugin.log", &args);
        self.lines = Some(lines);
    }

    /// Waits for the plugin's next `EVENT` line that starts with `prefix`; earlier lines are
    /// skipped.
    fn expect_line(&self, prefix: &str) -> String {
        expect_line(self.lines.as_ref().expect("plugin started"), prefix)
    }

    /// Stops and removes every sandbox of our containerd (ends the shims and pause processes
    /// the normal way).
    async fn remove_all_sandboxes(&self) {
        if self.containerd.is_none() {
            return;
        }
        let Ok(Ok(cri)) = tokio::time::timeout(
            Duration::from_secs(5),
            CriClient::connect(&self.cri_socket(), Duration::from_secs(20)),
        )
        .await
        else {
            return;
        };
        if let Ok(pods) = cri.list_pod_sandbox(None).await {
            for pod in pods {
                let _ = cri.stop_pod_sandbox(&pod.id).await;
                let _ = cri.remove_pod_sandbox(&pod.id).await;
            }
        }
    }

    fn print_logs(&self) {
        let containerd_log = fs::read_to_string(self.path("containerd.log")).unwrap_or_default();
        println!("--- NRI lines of containerd.log ---");
        for line in containerd_log.lines().filter(|l| l.contains("NRI") || l.contains("nri")) {
            println!("{line}");
        }
        for log in ["containerd.log", "plugin.log", "big-plugin.log"] {
            let text = fs::read_to_string(self.path(log)).unwrap_or_default();
            let tail: Vec<_> = text.lines().rev().take(60).collect();
            println!("--- last lines of {log} ---");
            for line in tail.into_iter().rev() {
                println!("{line}");
            }
        }
    }
}

/// Waits for the next `EVENT` line starting with `prefix` on `lines`; earlier lines are
/// skipped.
fn expect_line(lines: &mpsc::Receiver<String>, prefix: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix("EVENT ")
                    && rest.starts_with(prefix)
                {
                    return rest.to_owned();
                }
            }
            Err(e) => panic!("no plugin line starting with {prefix:?}: {e}"),
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for mut plugin in self.plugins.drain(..) {
            terminate(&mut plugin);
        }
        self.stop_containerd();
        // Shims outlive containerd by design; ours name our socket on their command line.
        // Containers left behind run binaries from rootfs mounts under our temp dir.
        let ours = self.dir.path().to_string_lossy().into_owned();
        for pid in processes_matching(&ours) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        unmount_under(self.dir.path());
        for netns in &self.netns_paths {
            if netns.exists() {
                let _ = nix::mount::umount2(netns, nix::mount::MntFlags::MNT_DETACH);
                let _ = fs::remove_file(netns);
            }
        }
        let _ =
            Command::new("ip").args(["link", "del", &self.bridge]).stderr(Stdio::null()).status();
    }
}

fn terminate(child: &mut Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pids fit in i32"));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// PIDs whose command line or executable path mentions `needle` (our unique temp dir).
fn processes_matching(needle: &str) -> Vec<i32> {
    let me = std::process::id();
    let mut pids = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if u32::try_from(pid).ok() == Some(me) {
            continue;
        }
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let exe = fs::read_link(entry.path().join("exe")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle)
            || exe.to_string_lossy().contains(needle)
        {
            pids.push(pid);
        }
    }
    pids
}

/// Detaches every mount below `dir` (deepest first), e.g. overlay rootfs and shm mounts of
/// sandboxes left by a failed run.
fn unmount_under(dir: &Path) {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// `key=value` fields of a plugin line.
fn fields(line: &str) -> BTreeMap<&str, &str> {
    line.split(' ').filter_map(|f| f.split_once('=')).collect()
}

fn sandbox_config(world: &World, name: &str, uid: &str) -> proto::PodSandboxConfig {
    let log_dir = world.path(&format!("pods/{name}"));
    fs::create_dir_all(&log_dir).unwrap();
    proto::PodSandboxConfig {
        metadata: Some(proto::PodSandboxMetadata {
            name: name.to_owned(),
            uid: uid.to_owned(),
            namespace: "default".to_owned(),
            attempt: 0,
        }),
        hostname: name.to_owned(),
        log_directory: log_dir.display().to_string(),
        linux: Some(proto::LinuxPodSandboxConfig {
            security_context: Some(proto::LinuxSandboxSecurityContext {
                namespace_options: Some(proto::NamespaceOption {
                    network: proto::NamespaceMode::Pod.into(),
                    pid: proto::NamespaceMode::Container.into(),
                    ipc: proto::NamespaceMode::Pod.into(),
                    target_id: String::new(),
                }),
                privileged: false,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_config(name: &str) -> proto::ContainerConfig {
    proto::ContainerConfig {
        metadata: Some(proto::ContainerMetadata { name: name.to_owned(), attempt: 0 }),
        image: Some(proto::ImageSpec { image: IMAGE.to_owned() }),
        log_path: format!("{name}.log"),
        linux: Some(proto::LinuxContainerConfig {}),
        ..Default::default()
    }
}

struct Pod {
    name: String,
    uid: String,
    id: String,
    config: proto::PodSandboxConfig,
}

/// Runs a sandbox through CRI and checks the plugin saw it with containerd's netns path.
async fn run_pod(
    world: &mut World,
    cri: &CriClient,
    name: &str,
    timings: &mut Vec<Duration>,
) -> Pod {
    let uid = format!("{name}-uid-{}", std::process::id());
    let config = sandbox_config(world, name, &uid);
    let started = Instant::now();
    let id = cri.run_pod_sandbox(config.clone(), "").await.unwrap();
    timings.push(started.elapsed());
    let status = cri.pod_sandbox_status(&id, true).await.unwrap();
    let netns = netns_path_from_verbose_info(&status).expect("containerd reports the netns path");
    world.netns_paths.push(netns.clone());

    let line = world.expect_line(&format!("run_pod_sandbox pod=default/{name} "));
    let f = fields(&line);
    assert_eq!(f["uid"], uid, "{line}");
    assert_eq!(f["id"], id, "{line}");
    assert_eq!(Path::new(f["netns"]), netns, "{line}");
    assert!(netns.exists(), "netns {} exists while the pod runs", netns.display());
    Pod { name: name.to_owned(), uid, id, config }
}

/// Stops and removes `pod` through CRI and checks that the plugin saw both events.
async fn stop_and_remove(world: &World, cri: &CriClient, pod: &Pod) {
    cri.stop_pod_sandbox(&pod.id).await.unwrap();
    let line = world.expect_line(&format!("stop_pod_sandbox pod=default/{} ", pod.name));
    assert_eq!(fields(&line)["uid"], pod.uid, "{line}");
    cri.remove_pod_sandbox(&pod.id).await.unwrap();
    let line = world.expect_line(&format!("remove_pod_sandbox pod=default/{} ", pod.name));
    assert_eq!(fields(&line)["uid"], pod.uid, "{line}");
}

async fn scenario(world: &mut World) {
    let suffix = format!("{:x}", std::process::id());
    let refused_name = format!("refused-{suffix}");
    world.start_containerd();
    let cri = world.cri().await;
    let version = cri.version().await.unwrap();
    println!(
        "runtime: {} {} (CRI {})",
        version.runtime_name, version.runtime_version, version.runtime_api_version
    );
    world.import_image();

    world.start_plugin(&refused_name);
    let configured = world.expect_line("status configured");
    println!("plugin: {configured}");
    // containerd 1.7 ships NRI < 0.12: no version, and only bits 0x7FF may be asked for.
    assert!(configured.contains("runtime=containerd"), "{configured}");
    assert!(configured.contains("events=0xf"), "{configured}");
    world.expect_line("synchronize pods=0");
    world.expect_line("status synchronized");

    // A plugin whose RegisterPlugin message (~6 kB of name) is larger than the 4096 bytes a
    // Go reader takes in one frame: registering proves containerd reads our frame split.
    let long_name = format!("big{}", "x".repeat(6000));
    let big = world.spawn_plugin("big-plugin.log", &["--index", "60", "--name", &long_name]);
    expect_line(&big, "status synchronized");
    let mut big_plugin = world.plugins.pop().expect("just started");
    terminate(&mut big_plugin);

    let mut timings = Vec::new();
    let allowed = run_pod(world, &cri, &format!("allowed-{suffix}"), &mut timings).await;
    let container = cri
        .create_container(&allowed.id, container_config("app"), allowed.config.clone())
        .await
        .expect("a container of an allowed pod is created");
    assert!(!container.is_empty());
    world.expect_line(&format!(
        "create_container pod=default/{} container=app refused=false",
        allowed.name
    ));

    let refused = run_pod(world, &cri, &refused_name, &mut timings).await;
    let err = cri
        .create_container(&refused.id, container_config("app"), refused.config.clone())
        .await
        .expect_err("the plugin refuses containers of this pod");
    match &err {
        CriError::Call { call, message, .. } => {
            assert_eq!(*call, "CreateContainer");
            assert!(message.contains("nri-logger refuses containers of pod"), "{message}");
        }
        other @ CriError::Connect { .. } => panic!("unexpected error: {other}"),
    }
    world.expect_line(&format!(
        "create_container pod=default/{refused_name} container=app refused=true"
    ));

    stop_and_remove(world, &cri, &refused).await;

    // containerd restarts: the plugin loses the connection, reconnects with backoff, and is
    // synchronized with the pods that still exist.
    world.stop_containerd();
    world.expect_line("status disconnected");
    world.start_containerd();
    let cri = world.cri().await;
    let sync = world.expect_line("synchronize pods=1 ");
    assert!(sync.contains(&allowed.name), "{sync}");
    world.expect_line("status synchronized");
    let after = run_pod(world, &cri, &format!("after-restart-{suffix}"), &mut timings).await;
    stop_and_remove(world, &cri, &after).await;

    // containerd 1.7's NRI layer only sends stop/remove for sandboxes it ran since it
    // started, so a pod from before the restart goes away without events: a driver must not
    // rely on them for such pods (it reconciles through Synchronize and kubelet's unprepare).
    cri.stop_pod_sandbox(&allowed.id).await.unwrap();
    cri.remove_pod_sandbox(&allowed.id).await.unwrap();
    assert!(cri.list_pod_sandbox(None).await.unwrap().is_empty());
    let ms: Vec<_> = timings.iter().map(Duration::as_millis).collect();
    println!("CRI RunPodSandbox with the NRI plugin attached (ms): {ms:?}");
}

#[test]
fn nri_plugin_follows_containerd_sandboxes_and_survives_a_restart() {
    let Some(tools) = find_tools() else { return };
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut world = World::new(tools);
    let outcome = rt.block_on(AssertUnwindSafe(scenario(&mut world)).catch_unwind());
    rt.block_on(world.remove_all_sandboxes());
    if outcome.is_err() {
        world.print_logs();
    }
    drop(world);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
