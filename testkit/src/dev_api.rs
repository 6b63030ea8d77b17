//! `netclaim dev --api-only` as a child process on a free loopback port: the one launcher of
//! the tests that reach the dev API server through the kubeconfig it writes (kubectl, kube-rs,
//! the claim tests).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the server may take to write its kubeconfig (~0.2 s on this machine's debug build;
/// the rest is room for a loaded CI machine).
const STARTUP: Duration = Duration::from_secs(30);

/// The running server, stopped (SIGTERM, then waited for) when dropped.
pub struct DevApiServer {
    child: Child,
    /// The kubeconfig it wrote (`<dir>/kubeconfig`), naming the admin user.
    pub kubeconfig: PathBuf,
    /// Its temp dir, also holding its log (`api.log`).
    pub dir: tempfile::TempDir,
}

impl DevApiServer {
    /// Starts it and returns once its kubeconfig exists (it writes the file once it serves);
    /// panics, naming its log, when it exits or writes none in time.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let log = std::fs::File::create(dir.path().join("api.log")).unwrap();
        let mut child = Command::new(super::netclaim_bin())
            .args(["dev", "--api-only", "--listen", "127.0.0.1:0", "--kubeconfig-out"])
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let started = Instant::now();
        while !kubeconfig.exists() {
            let log = || std::fs::read_to_string(dir.path().join("api.log")).unwrap_or_default();
            assert!(
                child.try_wait().unwrap().is_none(),
                "netclaim dev --api-only exited:\n{}",
                log()
            );
            assert!(started.elapsed() < STARTUP, "no kubeconfig after {STARTUP:?}:\n{}", log());
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child, kubeconfig, dir }
    }

    /// A kube-rs client of the admin user.
    pub async fn client(&self) -> kube::Client {
        netclaim::k8s::client(Some(&self.kubeconfig)).await.unwrap()
    }
}

impl Drop for DevApiServer {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}
