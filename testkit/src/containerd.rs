//! Shared by the tests that need a real containerd 1.7 with NRI: finds the artifacts of
//! `scripts/setup/containerd.sh`, runs a private containerd (config, root, state, sockets,
//! CNI config and state under one temp dir; never the system's), talks CRI to it through our
//! own `CriClient`, and removes everything it started (sandboxes, shims, mounts, network
//! namespaces, the CNI bridge) on drop, also when the test failed.
//!
//! Needs root and the artifacts (or `NETCLAIM_CONTAINERD_PREFIX` / `NETCLAIM_TEST_IMAGES`).
//! The tests are `#[ignore]`d; run without them, a test fails naming what is missing.

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use netclaim::dev::cri::{CriClient, netns_path_from_verbose_info, proto};

/// The pause image `scripts/setup/containerd.sh` builds (imported into each containerd).
pub const IMAGE: &str = "localhost/netclaim/pause:1.0";
/// Bound for containerd to come up. A restarted containerd recovers every sandbox through its
/// shim before it serves CRI, and a shim still busy with a RunPodSandbox cut short by the stop
/// can hold that up: under a loaded CI machine one restart in the chaos test's 20-run stress
/// logged nothing for 30 s after "connecting to shim" of such a sandbox. kubelet keeps waiting
/// for its runtime; so does the harness, for longer than that.
const STARTUP: Duration = Duration::from_secs(90);

/// The containerd binaries and the image archive.
pub struct Tools {
    pub containerd: PathBuf,
    pub ctr: PathBuf,
    pub bin_dir: PathBuf,
    pub pause_tar: PathBuf,
}

/// Fails when something the test needs is missing: these tests are `#[ignore]`d and run
/// only when asked for (`make test` as root installs what they need first), so a missing
/// tool is a failure, never a silent pass.
pub fn require<T>(what: &str) -> Option<T> {
    panic!("{what}: run scripts/setup/containerd.sh as root (make test does)");
}

/// A containerd release the e2e tests run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// containerd 1.7.24 (Debian trixie): NRI before 0.12, StateChange events.
    Containerd17,
    /// containerd 2.1.9 (Debian forky): NRI on by default, split Synchronize.
    Containerd21,
}

impl Runtime {
    /// Where `scripts/setup/containerd.sh` unpacks it, and the variable that overrides that.
    fn prefix(self) -> PathBuf {
        let (variable, default) = match self {
            Runtime::Containerd17 => {
                ("NETCLAIM_CONTAINERD_PREFIX", "/opt/netclaim-test/containerd")
            }
            Runtime::Containerd21 => {
                ("NETCLAIM_CONTAINERD21_PREFIX", "/opt/netclaim-test/containerd-2.1")
            }
        };
        std::env::var_os(variable).map_or_else(|| PathBuf::from(default), PathBuf::from)
    }
}

/// The tools of containerd 1.7 (see [`find_tools_for`]).
pub fn find_tools() -> Option<Tools> {
    find_tools_for(Runtime::Containerd17)
}

/// Whether we are root and `runtime`'s binaries and the image archive are installed: a
/// bench's smoke mode skips without them outside CI ([`find_tools_for`] fails naming what is
/// missing).
pub fn available(runtime: Runtime) -> bool {
    let is_root = fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let images = std::env::var_os("NETCLAIM_TEST_IMAGES")
        .map_or_else(|| PathBuf::from("/opt/netclaim-test/images"), PathBuf::from);
    is_root
        && runtime.prefix().join("usr/bin/containerd").exists()
        && images.join("pause.tar").exists()
}

/// The tools to run `runtime`; fails naming what is missing.
pub fn find_tools_for(runtime: Runtime) -> Option<Tools> {
    let is_root = fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !is_root {
        return require("not running as root");
    }
    let prefix = runtime.prefix();
    let images = std::env::var_os("NETCLAIM_TEST_IMAGES")
        .map_or_else(|| PathBuf::from("/opt/netclaim-test/images"), PathBuf::from);
    let bin_dir = prefix.join("usr/bin");
    let tools = Tools {
        containerd: bin_dir.join("containerd"),
        ctr: bin_dir.join("ctr"),
        pause_tar: images.join("pause.tar"),
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

/// A short name unique to this process and call (interface names are at most 15 bytes).
fn unique_suffix() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:x}", ((std::process::id() << 4) ^ count) & 0x0fff_ffff)
}

/// A private containerd and everything it started; dropping it stops and removes all of it.
pub struct Containerd {
    pub dir: tempfile::TempDir,
    tools: Tools,
    bridge: String,
    child: Option<Child>,
    /// Network namespaces containerd made for our pods (removed if a pod is left over).
    netns_paths: Mutex<Vec<PathBuf>>,
}

impl Containerd {
    /// Writes the configuration; `nri_request_timeout` bounds each NRI call to a plugin
    /// (containerd's default is 2 s; a plugin that misses it is disconnected).
    pub fn new(tools: Tools, nri_request_timeout: Duration) -> Self {
        let dir = tempfile::Builder::new().prefix("ncctrd").tempdir_in("/tmp").unwrap();
        let bridge = format!("ncbr{}", unique_suffix());
        let containerd =
            Self { dir, tools, bridge, child: None, netns_paths: Mutex::new(Vec::new()) };
        containerd.write_configs(nri_request_timeout);
        containerd
    }

    /// A path inside the temp dir.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The CRI (gRPC) socket.
    pub fn cri_socket(&self) -> PathBuf {
        self.path("run/containerd.sock")
    }

    /// The only directory this containerd reads CDI specs from.
    pub fn cdi_dir(&self) -> PathBuf {
        self.path("cdi")
    }

    /// The NRI socket plugins connect to.
    pub fn nri_socket(&self) -> PathBuf {
        self.path("run/nri.sock")
    }

    fn write_configs(&self, nri_request_timeout: Duration) {
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
            "cdi",
        ] {
            fs::create_dir_all(self.path(d)).unwrap();
        }
        let p = |rel: &str| self.path(rel).display().to_string();
        // Subnet from the PID as well, so two runs at once do not collide; a /22, so the
        // 1,000-pod scale bench fits.
        let subnet = format!("10.251.{}.0/22", (std::process::id() % 64) * 4);
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
  plugin_request_timeout = "{timeout}ms"
  socket_path = "{nri_sock}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  stream_server_port = "0"
  # CDI from a private spec dir only (1.7 has it off by default; 2.x on, reading /etc/cdi and
  # /var/run/cdi, which a test must not use).
  enable_cdi = true
  cdi_spec_dirs = ["{cdi}"]
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
            timeout = nri_request_timeout.as_millis(),
            nri_sock = self.nri_socket().display(),
            cni_conf = p("cni/net.d"),
            cdi = p("cdi"),
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

    /// Starts containerd (logging to `containerd.log`).
    pub fn start(&mut self) {
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
        self.child = Some(child);
    }

    /// Whether containerd was started and not stopped.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Sends `signal` to containerd without waiting (a test may still have calls in flight);
    /// [`Self::stop`] reaps it.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("containerd runs");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// SIGTERM, as a service manager restarting containerd would send, then wait.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child);
        }
    }

    /// A CRI client once containerd answers `Version`; calls time out after `call_timeout`.
    pub async fn cri(&self, call_timeout: Duration) -> CriClient {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Ok(client) = CriClient::connect(&self.cri_socket(), call_timeout).await
                && client.version().await.is_ok()
            {
                return client;
            }
            assert!(Instant::now() < deadline, "containerd did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Imports the pause image into the `k8s.io` namespace (the sandbox image).
    pub fn import_image(&self) {
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

    /// Remembers a pod's netns so that drop removes it if the pod is left over.
    pub fn track_netns(&self, path: &Path) {
        self.netns_paths.lock().unwrap().push(path.to_owned());
    }

    /// The netns path containerd reports for a sandbox (tracked for cleanup).
    pub async fn sandbox_netns(&self, cri: &CriClient, id: &str) -> PathBuf {
        let status = cri.pod_sandbox_status(id, true).await.unwrap();
        let netns =
            netns_path_from_verbose_info(&status).expect("containerd reports the netns path");
        self.track_netns(&netns);
        netns
    }

    /// A sandbox config for pod `default/<name>` with `uid` (logs under our temp dir).
    pub fn sandbox_config(&self, name: &str, uid: &str) -> proto::PodSandboxConfig {
        sandbox_config_with_attempt(self, name, uid, 0)
    }

    /// Stops and removes every sandbox of our containerd (ends the shims and pause processes
    /// the normal way).
    pub async fn remove_all_sandboxes(&self) {
        if self.child.is_none() {
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

    /// Prints the NRI lines of containerd's log, then the tails of `logs` (file names in the
    /// temp dir; `containerd.log` is always included).
    pub fn print_logs(&self, logs: &[&str]) {
        let containerd_log = fs::read_to_string(self.path("containerd.log")).unwrap_or_default();
        println!("--- NRI lines of containerd.log ---");
        for line in containerd_log.lines().filter(|l| l.contains("NRI") || l.contains("nri")) {
            println!("{line}");
        }
        for log in std::iter::once(&"containerd.log").chain(logs) {
            let text = fs::read_to_string(self.path(log)).unwrap_or_default();
            let tail: Vec<_> = text.lines().rev().take(80).collect();
            println!("--- last lines of {log} ---");
            for line in tail.into_iter().rev() {
                println!("{line}");
            }
        }
    }
}

/// A sandbox config for pod `default/<name>` with `uid`, as kubelet sends it for `attempt`
/// (kubelet bumps the attempt when it recreates a pod's sandbox).
pub fn sandbox_config_with_attempt(
    containerd: &Containerd,
    name: &str,
    uid: &str,
    attempt: u32,
) -> proto::PodSandboxConfig {
    let log_dir = containerd.path(&format!("pods/{name}"));
    fs::create_dir_all(&log_dir).unwrap();
    proto::PodSandboxConfig {
        metadata: Some(proto::PodSandboxMetadata {
            name: name.to_owned(),
            uid: uid.to_owned(),
            namespace: "default".to_owned(),
            attempt,
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

/// A container config running the pause image.
pub fn container_config(name: &str) -> proto::ContainerConfig {
    proto::ContainerConfig {
        metadata: Some(proto::ContainerMetadata { name: name.to_owned(), attempt: 0 }),
        image: Some(proto::ImageSpec { image: IMAGE.to_owned() }),
        log_path: format!("{name}.log"),
        linux: Some(proto::LinuxContainerConfig::default()),
        ..Default::default()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
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
        for netns in self.netns_paths.lock().map(|p| p.clone()).unwrap_or_default() {
            if netns.exists() {
                let _ = nix::mount::umount2(&netns, nix::mount::MntFlags::MNT_DETACH);
                let _ = fs::remove_file(&netns);
            }
        }
        let _ =
            Command::new("ip").args(["link", "del", &self.bridge]).stderr(Stdio::null()).status();
    }
}

/// SIGTERM, then SIGKILL after 10 s; reaps the child.
pub fn terminate(child: &mut Child) {
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
