//! The dev API server against kubectl (the machine's v1.32, or `$KUBECTL`): get, create -f, apply
//! --server-side, client-side apply, delete, get -w with a timeout, a custom resource
//! definition and its objects (wait for Established, columns, short names, categories,
//! validation errors), and the kubeconfig written by `kube_inmemory::kubeconfig`. `#[ignore]`d (they need kubectl, which `make test`
//! installs); run without kubectl they fail.
#![allow(clippy::unwrap_used, reason = "test helpers: a failed setup step should panic")]

use std::path::PathBuf;
use std::process::{Command, Output};

use kube_inmemory::apiserver::{ApiServer, ServerOptions, start};

/// `$KUBECTL`, else `/usr/bin/kubectl`, else what `scripts/setup/kubectl.sh` unpacked.
fn kubectl_path() -> PathBuf {
    let candidates: Vec<PathBuf> = match std::env::var_os("KUBECTL") {
        Some(p) => vec![PathBuf::from(p)],
        None => {
            vec![PathBuf::from("/usr/bin/kubectl"), PathBuf::from("/opt/netclaim-test/bin/kubectl")]
        }
    };
    let found = candidates.iter().find(|p| p.exists()).cloned();
    found.unwrap_or_else(|| {
        panic!("kubectl not found at {candidates:?}: run scripts/setup/kubectl.sh (make test does)")
    })
}

struct Kubectl {
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let kubeconfig = self.dir.path().join("kubeconfig");
        let cache = self.dir.path().join("cache");
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--kubeconfig").arg(&kubeconfig).arg("--cache-dir").arg(&cache).args(args);
        cmd.env("HOME", self.dir.path());
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl starts");
        if let Some(input) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        } else {
            drop(child.stdin.take());
        }
        child.wait_with_output().unwrap()
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "kubectl {args:?} failed: {stdout}\n{stderr}");
        stdout
    }

    fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        assert!(!out.status.success(), "kubectl {args:?} unexpectedly succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

async fn setup() -> (ApiServer, Kubectl) {
    let bin = kubectl_path();
    let srv = start("127.0.0.1:0".parse().unwrap(), ServerOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    kube_inmemory::kubeconfig::write(&dir.path().join("kubeconfig"), &srv.url(), None).unwrap();
    (srv, Kubectl { bin, dir })
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

const CLAIM: &str = r"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: net
  namespace: default
spec:
  devices:
    requests:
    - name: net
      exactly:
        deviceClassName: netclaim
";

const SLICE: &str = r"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: node-1-netclaim.dev-0
spec:
  driver: netclaim.dev
  nodeName: node-1
  pool: {name: node-1, generation: 1, resourceSliceCount: 1}
  devices:
  - name: eth1
    attributes:
      ifName: {string: eth1}
";

const POD: &str = r"
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  nodeName: node-1
  containers:
  - {name: c, image: busybox}
  - {name: d, image: nginx}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
#[allow(clippy::too_many_lines, reason = "one kubectl session, step by step")]
async fn kubectl_create_get_apply_delete() {
    let (srv, k) = setup().await;
    let k = std::sync::Arc::new(k);
    let k2 = k.clone();
    blocking(move || {
        let k = k2;
        assert!(k.ok(&["version", "-o", "json"], None).contains("\"minor\": \"35\""));
        let out = k.ok(&["create", "-f", "-"], Some(CLAIM));
        assert!(out.contains("resourceclaim.resource.k8s.io/net created"), "{out}");
        let err = k.fails(&["create", "-f", "-"], Some(CLAIM));
        assert!(err.contains("AlreadyExists") || err.contains("already exists"), "{err}");
        let out = k.ok(&["get", "resourceclaims"], None);
        assert!(out.contains("NAME") && out.contains("net"), "{out}");
        let out = k.ok(
            &[
                "get",
                "resourceclaim",
                "net",
                "-o",
                "jsonpath={.spec.devices.requests[0].exactly.deviceClassName}",
            ],
            None,
        );
        assert_eq!(out, "netclaim");

        // Server-side apply, then an unchanged re-apply, then a change.
        let out = k.ok(&["apply", "--server-side", "-f", "-"], Some(SLICE));
        assert!(out.contains("serverside-applied"), "{out}");
        let out = k.ok(&["get", "resourceslices", "-o", "yaml", "--show-managed-fields"], None);
        assert!(out.contains("ifName") && out.contains("manager: kubectl"), "{out}");
        let changed = SLICE.replace("generation: 1", "generation: 2");
        k.ok(&["apply", "--server-side", "-f", "-"], Some(&changed));
        let out = k.ok(
            &[
                "get",
                "resourceslice",
                "node-1-netclaim.dev-0",
                "-o",
                "jsonpath={.spec.pool.generation}",
            ],
            None,
        );
        assert_eq!(out, "2");
        // Another field manager changing a field kubectl owns: a conflict, unless forced.
        let other = SLICE.replace("generation: 1", "generation: 3");
        let err = k.fails(
            &["apply", "--server-side", "--field-manager=someone-else", "-f", "-"],
            Some(&other),
        );
        assert!(err.contains("conflict") && err.contains(".spec.pool.generation"), "{err}");
        k.ok(
            &[
                "apply",
                "--server-side",
                "--field-manager=someone-else",
                "--force-conflicts",
                "-f",
                "-",
            ],
            Some(&other),
        );
        let out = k.ok(
            &["get", "resourceslices", "--field-selector", "spec.nodeName=node-2", "-o", "name"],
            None,
        );
        assert_eq!(out, "");

        // Validation errors come back as 422 with the field.
        let bad =
            SLICE.replace("name: eth1", "name: Eth_1").replace("node-1-netclaim.dev-0", "bad");
        let err = k.fails(&["apply", "--server-side", "-f", "-"], Some(&bad));
        assert!(err.contains("spec.devices[0].name"), "{err}");
        // Unknown fields are rejected with kubectl's default strict validation.
        let unknown = SLICE
            .replace("  driver: netclaim.dev", "  driver: netclaim.dev\n  bogus: 1")
            .replace("node-1-netclaim.dev-0", "unknown");
        let err = k.fails(&["create", "-f", "-"], Some(&unknown));
        assert!(err.contains("unknown field") && err.contains("spec.bogus"), "{err}");

        // Client-side apply of a built-in kind sends a strategic merge patch with
        // `$setElementOrder` directives: containers merge by name.
        k.ok(&["apply", "-f", "-"], Some(POD));
        k.ok(&["apply", "-f", "-"], Some(&POD.replace("image: nginx", "image: nginx:2")));
        let out = k.ok(&["get", "pod", "web", "-o", "jsonpath={.spec.containers[*].image}"], None);
        assert_eq!(out, "busybox nginx:2");
        k.ok(&["label", "pod", "web", "tier=front"], None);
        let out = k.ok(&["get", "pods", "-l", "tier=front", "-o", "name"], None);
        assert_eq!(out.trim(), "pod/web");
        // A pod bound to a node waits for its kubelet; --grace-period=0 --force removes it.
        k.ok(&["delete", "pod", "web", "--wait=false"], None);
        let out =
            k.ok(&["get", "pod", "web", "-o", "jsonpath={.metadata.deletionTimestamp}"], None);
        assert!(!out.is_empty());
        k.ok(&["delete", "pod", "web", "--grace-period=0", "--force"], None);
        k.fails(&["get", "pod", "web"], None);

        let out = k.ok(&["delete", "resourceclaim", "net"], None);
        assert!(out.contains("deleted"), "{out}");
        let err = k.fails(&["get", "resourceclaim", "net"], None);
        assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
    })
    .await;
    srv.shutdown().await.unwrap();
}

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, shortNames: [wd], categories: [things]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Owner, type: string, jsonPath: .spec.owner}
    - {name: Parts, type: string, jsonPath: .spec.parts, priority: 1}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [owner]
            x-kubernetes-validations:
            - {rule: "self.owner == oldSelf.owner", message: "owner is immutable", fieldPath: .owner}
            properties:
              owner: {type: string}
              size: {type: integer, default: 1}
              parts: {type: array, x-kubernetes-list-type: set, items: {type: string}}
"#;

const WIDGET: &str = r"
apiVersion: example.com/v1
kind: Widget
metadata:
  name: w1
spec:
  owner: ann
  parts: [a]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
async fn kubectl_with_a_custom_resource_definition() {
    let (srv, k) = setup().await;
    let k = std::sync::Arc::new(k);
    let k2 = k.clone();
    blocking(move || {
        let k = k2;
        let out = k.ok(&["apply", "-f", "-"], Some(CRD));
        assert!(
            out.contains(
                "customresourcedefinition.apiextensions.k8s.io/widgets.example.com created"
            ),
            "{out}"
        );
        k.ok(
            &["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=10s"],
            None,
        );
        let out = k.ok(&["get", "crds"], None);
        assert!(out.contains("widgets.example.com"), "{out}");

        // Create (client-side apply), then change through a JSON merge patch.
        let out = k.ok(&["apply", "-f", "-"], Some(WIDGET));
        assert!(out.contains("widget.example.com/w1 created"), "{out}");
        k.ok(&["apply", "-f", "-"], Some(&WIDGET.replace("[a]", "[a, b]")));
        let out = k.ok(&["get", "wd", "w1", "-o", "jsonpath={.spec.parts} {.spec.size}"], None);
        assert_eq!(out, r#"["a","b"] 1"#);
        // Server-side apply with another manager.
        let ssa = WIDGET.replace("name: w1", "name: w2");
        let out = k.ok(&["apply", "--server-side", "-f", "-"], Some(&ssa));
        assert!(out.contains("serverside-applied"), "{out}");
        // Columns, by name, by short name, by category, wide.
        let out = k.ok(&["get", "widgets"], None);
        assert!(out.contains("OWNER") && out.contains("ann") && !out.contains("PARTS"), "{out}");
        let out = k.ok(&["get", "things", "-o", "wide"], None);
        assert!(out.contains("PARTS") && out.contains(r#"["a","b"]"#), "{out}");
        // A CEL rule's refusal names the field.
        let err = k.fails(&["apply", "-f", "-"], Some(&WIDGET.replace("owner: ann", "owner: bob")));
        assert!(err.contains("spec.owner") && err.contains("owner is immutable"), "{err}");
        // A schema refusal: a required field.
        let err = k.fails(
            &["create", "-f", "-"],
            Some(&WIDGET.replace("name: w1", "name: w3").replace(
                "  owner: ann
",
                "",
            )),
        );
        assert!(err.contains("spec.owner") && err.contains("Required value"), "{err}");
        // Unknown fields: kubectl asks for strict validation.
        let err = k.fails(
            &["create", "-f", "-"],
            Some(&WIDGET.replace("name: w1", "name: w4").replace(
                "parts: [a]",
                "parts: [a]
  bogus: 1",
            )),
        );
        assert!(err.contains("unknown field") && err.contains("spec.bogus"), "{err}");

        k.ok(&["delete", "widget", "w2"], None);
        let out = k.ok(&["delete", "-f", "-"], Some(CRD));
        assert!(out.contains("deleted"), "{out}");
        let err = k.fails(&["get", "widgets"], None);
        assert!(
            err.contains("the server doesn't have a resource type") || err.contains("NotFound"),
            "{err}"
        );
    })
    .await;
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
async fn kubectl_get_watch_with_timeout() {
    let (srv, k) = setup().await;
    let k = std::sync::Arc::new(k);
    // One slice before the watch (from the initial list), one created while kubectl
    // watches (only a watch event can show it).
    let k1 = k.clone();
    blocking(move || k1.ok(&["apply", "--server-side", "-f", "-"], Some(SLICE))).await;
    let watcher = {
        let k = k.clone();
        // Spawned now (not a lazy future): kubectl must be running while we wait below.
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let out = k.ok(&["get", "resourceslices", "-w", "--request-timeout=5s"], None);
            (out, started.elapsed())
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while srv.active_watches() == 0 {
        assert!(std::time::Instant::now() < deadline, "kubectl never started watching");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let second = SLICE.replace("node-1-netclaim.dev-0", "node-1-netclaim.dev-1");
    let k2 = k.clone();
    blocking(move || k2.ok(&["apply", "--server-side", "-f", "-"], Some(&second))).await;
    let (out, took) = watcher.await.unwrap();
    assert!(
        out.contains("node-1-netclaim.dev-0") && out.contains("node-1-netclaim.dev-1"),
        "{out}"
    );
    // --request-timeout ended the watch.
    assert!(took < std::time::Duration::from_secs(15), "{took:?}");
    // The server noticed the client leaving.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while srv.active_watches() != 0 {
        assert!(std::time::Instant::now() < deadline, "watch task still running");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    srv.shutdown().await.unwrap();
}
