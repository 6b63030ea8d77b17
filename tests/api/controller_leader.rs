//! Two (then three) `netclaim controller` processes against one `netclaim dev --api-only`:
//! exactly one holds the Lease and acts (its metrics count reconciles, the other's stay at
//! zero), a kill -9 of the leader hands over within 20 s (the 15 s lease plus a poll), and a
//! SIGTERM hands over at once (the leader releases the Lease). Also the command line's
//! contract for the controller's flags. Needs only the built binary (no root).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use netclaim::model::pod_network::PodNetwork;
use serde_json::{Value, json};

use crate::kit::api_server::install_crds;

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
/// Bound for things that happen within a second or two.
const PATIENCE: Duration = Duration::from_secs(20);

/// A child process, killed (SIGKILL) and reaped on drop.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(args: &[&str], log: &Path) -> Self {
        let file = std::fs::File::create(log).unwrap();
        let child = Command::new(NETCLAIM)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Self { child, log: log.to_owned() }
    }

    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(self.pid(), signal).unwrap();
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(started.elapsed() < PATIENCE, "did not exit:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The JSON log lines.
    fn log_lines(&self) -> Vec<Value> {
        self.log_text().lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
    }

    /// The first log line whose message is `message`, waiting for it.
    fn wait_log(&self, message: &str) -> Value {
        let started = Instant::now();
        loop {
            if let Some(line) =
                self.log_lines().into_iter().find(|line| line["fields"]["message"] == message)
            {
                return line;
            }
            assert!(started.elapsed() < PATIENCE, "no {message:?} in:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ignored = self.child.kill();
        let _ignored = self.child.wait();
    }
}

/// One controller process: its holder identity and metrics address, from its log.
struct ControllerProcess {
    process: Process,
    identity: String,
    metrics: String,
}

impl ControllerProcess {
    fn start(dir: &Path, name: &str) -> Self {
        let kubeconfig = dir.join("kubeconfig");
        let process = Process::spawn(
            &[
                "--log-format",
                "json",
                "controller",
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--metrics-address",
                "127.0.0.1:0",
                "--leader-election-namespace",
                "default",
            ],
            &dir.join(format!("{name}.log")),
        );
        let identity = process.wait_log("leader election: candidate")["fields"]["identity"]
            .as_str()
            .unwrap()
            .to_owned();
        let metrics = process.wait_log("serving /metrics, /healthz, /readyz")["fields"]["address"]
            .as_str()
            .unwrap()
            .to_owned();
        Self { process, identity, metrics }
    }

    /// One sample of the controller's /metrics (0 when absent; ours are all integers).
    fn metric(&self, series: &str) -> u64 {
        let body = http_get(&self.metrics, "/metrics");
        body.lines()
            .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    }

    fn leading(&self) -> bool {
        self.metric("netclaim_controller_leader") == 1
    }

    fn reconciles(&self) -> u64 {
        self.metric("netclaim_controller_reconciles_total{result=\"success\"}")
    }
}

fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

/// The API server, its kubeconfig in `dir`.
fn start_api(dir: &Path) -> Process {
    let kubeconfig = dir.join("kubeconfig");
    let api = Process::spawn(
        &[
            "dev",
            "--api-only",
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig-out",
            kubeconfig.to_str().unwrap(),
        ],
        &dir.join("api.log"),
    );
    let started = Instant::now();
    while !kubeconfig.exists() {
        assert!(started.elapsed() < PATIENCE, "no kubeconfig:\n{}", api.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    // The server applies `deploy/crds` at start (AlreadyExists) or serves our kinds from a
    // fixed table (404 for CRDs); either way, wait until they are served.
    with_client(dir, |client| async move { install_crds(&client).await });
    api
}

/// Runs `work` with a client of the API server in `dir`, on a runtime of its own (a kube
/// client belongs to the runtime it was built on).
fn with_client<T, F>(dir: &Path, work: impl FnOnce(kube::Client) -> F) -> T
where
    F: Future<Output = T>,
{
    let kubeconfig = dir.join("kubeconfig");
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(
        async move {
            let client = netclaim::k8s::client(Some(&kubeconfig)).await.unwrap();
            work(client).await
        },
    )
}

fn lease_holder(dir: &Path) -> Option<String> {
    with_client(dir, |client| async move {
        let leases: Api<Lease> = Api::namespaced(client, "default");
        leases.get_opt("netclaim-controller").await.unwrap()?.spec?.holder_identity
    })
}

/// The network's Ready reason, if written for its current generation.
fn network_reason(dir: &Path, name: &str) -> Option<String> {
    with_client(dir, |client| async move {
        let network = Api::<PodNetwork>::all(client).get_opt(name).await.unwrap()?;
        let generation = network.metadata.generation;
        let status = network.status?;
        let condition = status.conditions.into_iter().find(|c| c.type_ == "Ready")?;
        (condition.observed_generation == generation && status.observed_generation == generation)
            .then_some(condition.reason)
    })
}

fn wait_until(what: &str, logs: &[&Process], check: impl Fn() -> bool) -> Instant {
    let started = Instant::now();
    while !check() {
        let text: Vec<String> =
            logs.iter().map(|p| format!("{}:\n{}", p.log.display(), p.log_text())).collect();
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "timed out: {what}\n{}",
            text.join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Instant::now()
}

#[test]
fn exactly_one_controller_acts_and_the_other_takes_over_after_kill_and_at_once_after_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let api = start_api(dir);
    let a = ControllerProcess::start(dir, "a");
    let b = ControllerProcess::start(dir, "b");
    assert_ne!(a.identity, b.identity);

    // One of them takes the (fresh) lease.
    wait_until("a leader", &[&a.process, &b.process], || a.leading() || b.leading());
    let (leader, standby) = if a.leading() { (a, b) } else { (b, a) };
    assert_eq!(lease_holder(dir).as_deref(), Some(leader.identity.as_str()));

    // A network: the leader reconciles it; the standby never does.
    with_client(dir, |client| async move {
        let network: PodNetwork = serde_json::from_value(json!({
            "metadata": {"name": "medianet"},
            "spec": {"parents": ["eth1"], "ipam": {"subnets": ["10.10.0.0/16"], "gateways": ["10.10.0.1"]}}
        }))
        .unwrap();
        Api::<PodNetwork>::all(client).create(&PostParams::default(), &network).await.unwrap();
    });
    wait_until("Ready", &[&leader.process, &standby.process], || {
        network_reason(dir, "medianet").as_deref() == Some("Ready")
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(leader.leading() && !standby.leading());
    assert!(leader.reconciles() >= 1);
    assert_eq!(standby.reconciles(), 0, "the standby reconciled");
    assert_eq!(lease_holder(dir).as_deref(), Some(leader.identity.as_str()));
    assert_eq!(http_get(&standby.metrics, "/readyz").lines().next(), Some("HTTP/1.1 200 OK"));

    // kill -9 of the leader: no release; the standby takes over once the lease runs out.
    let ControllerProcess { process: mut killed, .. } = leader;
    killed.signal(nix::sys::signal::Signal::SIGKILL);
    let killed_at = Instant::now();
    killed.wait_exit();
    let took_over = wait_until("the standby takes over", &[&standby.process], || standby.leading());
    let took = took_over.duration_since(killed_at);
    eprintln!("the standby took over {took:?} after kill -9 of the leader");
    assert!(took < Duration::from_secs(20), "took {took:?} to take over after kill -9");
    assert_eq!(lease_holder(dir).as_deref(), Some(standby.identity.as_str()));
    // It acts: a change of the network is reconciled by the new leader.
    with_client(dir, |client| async move {
        Api::<PodNetwork>::all(client)
            .patch(
                "medianet",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"enabled": false}})),
            )
            .await
            .unwrap();
    });
    wait_until("Disabled", &[&standby.process], || {
        network_reason(dir, "medianet").as_deref() == Some("Disabled")
    });
    assert!(standby.reconciles() >= 1);
    let leader = standby;

    // A new standby; SIGTERM of the leader releases the lease: the standby takes over at
    // once, well before a lease would have run out.
    let standby = ControllerProcess::start(dir, "c");
    std::thread::sleep(Duration::from_secs(3));
    assert!(!standby.leading() && standby.reconciles() == 0);
    let ControllerProcess { process: mut stopped, .. } = leader;
    stopped.signal(nix::sys::signal::Signal::SIGTERM);
    let signalled = Instant::now();
    assert!(stopped.wait_exit().success(), "{}", stopped.log_text());
    assert!(
        stopped
            .log_lines()
            .iter()
            .any(|l| l["fields"]["message"] == "leader election: lease released")
    );
    let took_over = wait_until("the standby takes over", &[&standby.process], || standby.leading());
    let took = took_over.duration_since(signalled);
    eprintln!("the standby took over {took:?} after SIGTERM of the leader");
    assert!(took < Duration::from_secs(5), "took {took:?} to take over after SIGTERM");
    assert_eq!(lease_holder(dir).as_deref(), Some(standby.identity.as_str()));
    drop(api);
}

#[test]
fn bad_controller_flags_exit_2_with_one_line() {
    for (args, names) in [
        (vec!["controller", "--leader-election=maybe"], vec!["maybe", "--leader-election"]),
        (vec!["controller", "--block-release-grace", "ten"], vec!["ten", "--block-release-grace"]),
        (vec!["controller", "--metrics-address", "here"], vec!["here", "--metrics-address"]),
        (
            vec!["controller", "--leader-election-namespace", "Bad_NS"],
            vec!["Bad_NS", "--leader-election-namespace"],
        ),
        (vec!["controller", "--no-such-flag"], vec!["--no-such-flag"]),
    ] {
        let output = Command::new(NETCLAIM).args(&args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        for name in names {
            assert!(stderr.contains(name), "{args:?}: {stderr} should name {name}");
        }
    }
    let output = Command::new(NETCLAIM)
        .args(["controller", "--leader-election=false", "--kubeconfig", "/nonexistent"])
        .env("NETCLAIM_BLOCK_RELEASE_GRACE", "soon")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("soon"));
    let output = Command::new(NETCLAIM)
        .args(["controller", "--kubeconfig", "/nonexistent"])
        .env("POD_NAMESPACE", "Not_A_Namespace")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("POD_NAMESPACE"));
}
