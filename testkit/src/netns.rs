//! Shared helpers of the privileged integration tests: root checks and throwaway network
//! namespaces with generated names, removed on drop even when the test fails.
//!
//! Tests build their topologies with `ip` (iproute2): the product never execs it, but a test
//! may, and it keeps the test's setup independent of the code under test.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Checks that the privileged tier can run. Root-tier tests are `#[ignore = "needs root"]`,
/// so a plain `cargo nextest run` reports them as skipped; `make test` as root runs them
/// with `--run-ignored all`. A root-tier test run without root is a failure, never a pass.
pub fn require_root(test: &str) -> bool {
    // The effective uid, from procfs (no libc call needed).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let is_root = status
        .lines()
        .find(|line| line.starts_with("Uid:"))
        .and_then(|line| line.split_whitespace().nth(2))
        == Some("0");
    assert!(is_root, "{test}: needs root (run `make test` as root)");
    true
}

/// A short unique prefix for names in this process (interface names are ≤ 15 bytes).
pub fn unique_prefix() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mixed = (std::process::id() << 12) ^ (nanos >> 8) ^ count.wrapping_mul(0x9e37);
    format!("nc{:06x}", mixed & 0x00ff_ffff)
}

/// Runs a command and returns its output, panicking with stderr when it fails.
pub fn run(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("spawning {program} {args:?}: {err}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A network namespace created for one test and deleted (with every link in it) on drop.
pub struct Netns {
    /// Its name under /run/netns.
    pub name: String,
    /// Prefix for interface names created inside it.
    pub prefix: String,
}

impl Netns {
    /// Creates a fresh namespace with loopback up.
    #[allow(
        clippy::new_without_default,
        reason = "new() creates a network namespace: not a default value"
    )]
    pub fn new() -> Self {
        let prefix = unique_prefix();
        let name = format!("{prefix}-ns");
        run("ip", &["netns", "add", &name]);
        let netns = Self { name, prefix };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    /// An interface name inside this namespace: `<prefix><suffix>`.
    pub fn ifname(&self, suffix: &str) -> String {
        let name = format!("{}{suffix}", self.prefix);
        assert!(name.len() <= 15, "interface name {name} too long");
        name
    }

    /// `ip -n <ns> <args>`.
    pub fn ip(&self, args: &[&str]) -> Output {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// Runs `program args` inside the namespace with its own sysfs (`ip netns exec`).
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", self.name.as_str(), program];
        full.extend_from_slice(args);
        Command::new("ip")
            .args(&full)
            .output()
            .unwrap_or_else(|err| panic!("spawning ip netns exec {program}: {err}"))
    }
}

impl Netns {
    /// Runs `work` on a dedicated OS thread that has entered this namespace, on a
    /// current-thread tokio runtime: every socket it opens (API clients, HTTP probes) lives in
    /// the namespace, and no other thread's namespace changes.
    pub fn block_on<F, Fut, T>(&self, work: F) -> T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
        T: Send + 'static,
    {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("the namespace file exists");
            #[allow(
                clippy::disallowed_methods,
                reason = "test support: a throwaway thread of the test's own namespace"
            )]
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("entering the test namespace");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current-thread runtime");
            runtime.block_on(work())
        })
        .join()
        .expect("the namespace thread finished")
    }

    /// Starts `program args` inside the namespace (with its own sysfs) as a child that is
    /// killed when the returned guard drops.
    pub fn spawn(&self, program: &str, args: &[&str], log: &std::path::Path) -> Child {
        self.spawn_with_env(program, args, &[], log)
    }

    /// [`Netns::spawn`] with extra environment variables.
    pub fn spawn_with_env(
        &self,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
        log: &std::path::Path,
    ) -> Child {
        let mut full = vec!["netns", "exec", self.name.as_str(), program];
        full.extend_from_slice(args);
        let log_file = std::fs::File::create(log).expect("creating the child's log file");
        let child = Command::new("ip")
            .args(&full)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(log_file.try_clone().expect("duplicating the log file"))
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|err| panic!("spawning {program}: {err}"));
        Child { child }
    }
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Child {
    /// The process (`ip netns exec` replaces itself with the program, so this is its pid).
    pub child: std::process::Child,
}

impl Child {
    /// Its pid.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pids fit in i32")
    }

    /// Sends SIGTERM and waits up to `limit` for the exit; returns how long it took, or
    /// `None` if it did not exit.
    pub fn terminate(&mut self, limit: std::time::Duration) -> Option<std::time::Duration> {
        let started = std::time::Instant::now();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), nix::sys::signal::SIGTERM)
            .expect("sending SIGTERM");
        while started.elapsed() < limit {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Some(started.elapsed());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ignored = self.child.kill();
        let _ignored = self.child.wait();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace destroys every virtual link inside it.
        let _ignored = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Where the API server and the daemon's metrics listen inside a test's own netns (each test
/// has its own loopback, so fixed ports cannot collide).
pub const NETNS_API_LISTEN: &str = "127.0.0.1:16443";
/// See [`NETNS_API_LISTEN`].
pub const NETNS_METRICS_LISTEN: &str = "127.0.0.1:19178";

/// Starts `netclaim dev --api-only` (`binary`) inside `netns` on [`NETNS_API_LISTEN`], writing
/// `<dir>/kubeconfig` and logging to `<dir>/api.log`; returns once the kubeconfig exists.
pub fn start_api_server(
    netns: &Netns,
    binary: &str,
    dir: &std::path::Path,
    extra: &[&str],
) -> Child {
    let kubeconfig = dir.join("kubeconfig");
    let kubeconfig_arg = kubeconfig.to_str().expect("temp paths are UTF-8").to_owned();
    let mut args = vec![
        "dev",
        "--api-only",
        "--listen",
        NETNS_API_LISTEN,
        "--kubeconfig-out",
        &kubeconfig_arg,
    ];
    args.extend_from_slice(extra);
    let api = netns.spawn(binary, &args, &dir.join("api.log"));
    // The debug build's start costs 0.07 s of CPU on the host, but ~16 s in an idle TCG guest
    // (`--version` alone takes 3.4 s there) and 43–57 s with two guests sharing the 2 host
    // cores, as `make test` runs them: a one-minute wait failed CI once on 6.1.
    let deadline = std::time::Instant::now() + std::time::Duration::from_mins(3);
    while !kubeconfig.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the API server did not write its kubeconfig:\n{}",
            std::fs::read_to_string(dir.join("api.log")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    api
}

/// The flags every `netclaim node` of a netns test gets: node `test-node`, the kubeconfig,
/// metrics on [`NETNS_METRICS_LISTEN`], and state and kubelet dirs under `dir`.
pub fn node_daemon_args(dir: &std::path::Path) -> Vec<String> {
    let path = |name: &str| dir.join(name).to_str().expect("temp paths are UTF-8").to_owned();
    vec![
        "node".to_owned(),
        "--node-name".to_owned(),
        "test-node".to_owned(),
        "--kubeconfig".to_owned(),
        path("kubeconfig"),
        "--metrics-address".to_owned(),
        NETNS_METRICS_LISTEN.to_owned(),
        "--state-dir".to_owned(),
        path("state"),
        "--kubelet-registry-dir".to_owned(),
        path("registry"),
        "--kubelet-plugin-dir".to_owned(),
        path("plugin"),
        "--cdi-spec-dir".to_owned(),
        path("cdi"),
        // No counters: root tests share the host, and the host's bpffs is not theirs.
        "--bpffs=".to_owned(),
    ]
}

/// One metric's value from the daemon's `/metrics` on [`NETNS_METRICS_LISTEN`] (0 when
/// absent); must run inside the netns (see [`Netns::block_on`]).
pub async fn scrape_metric(name: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(NETNS_METRICS_LISTEN)
        .await
        .expect("the daemon serves /metrics");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("writing the request");
    let mut body = String::new();
    stream.read_to_string(&mut body).await.expect("reading /metrics");
    body.lines()
        .find(|line| line.starts_with(name))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}
