//! Renders a kustomization with kubectl's built-in kustomize, as an operator would apply it:
//! shared by the tests of `deploy/` (the manifests, RBAC derived from requests, the DaemonSet
//! run on containerd).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize as _;
use serde_json::Value;

/// `$KUBECTL`, else `/usr/bin/kubectl`, else what scripts/setup/kubectl.sh unpacked.
pub fn kubectl() -> PathBuf {
    let candidates: Vec<PathBuf> = match std::env::var_os("KUBECTL") {
        Some(path) => vec![PathBuf::from(path)],
        None => {
            vec![PathBuf::from("/usr/bin/kubectl"), PathBuf::from("/opt/netclaim-test/bin/kubectl")]
        }
    };
    candidates.iter().find(|p| p.exists()).cloned().unwrap_or_else(|| {
        panic!("kubectl not found at {candidates:?}: run scripts/setup/kubectl.sh (make test does)")
    })
}

/// `kubectl kustomize <dir>` as JSON objects (empty documents left out); fails with
/// kustomize's message.
pub fn kustomize(dir: &Path) -> Vec<Value> {
    let output = Command::new(kubectl()).arg("kustomize").arg(dir).output().unwrap();
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    yaml_serde::Deserializer::from_str(&text)
        .map(|document| Value::deserialize(document).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}
