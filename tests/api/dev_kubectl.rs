//! A new user's kubectl against `netclaim dev --api-only`: the imperative `kubectl create`
//! commands (which send protobuf), `kubectl logs`/`exec` (answered with where the pod's
//! network namespace is, the dev cluster runs no containers), and `kubectl apply -k` of each
//! install kustomization storing every object it renders, a second apply changing nothing.
//! `#[ignore]`d: they need kubectl (scripts/setup/kubectl.sh; `make test` installs it).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use crate::kit::dev_api::DevApiServer;
use crate::kit::kustomize::{kubectl, kustomize};

/// `netclaim dev --api-only` on a free port, driven with kubectl.
struct Dev {
    server: DevApiServer,
}

impl Dev {
    fn start() -> Self {
        Self { server: DevApiServer::start() }
    }

    fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut command = Command::new(kubectl());
        command.arg("--kubeconfig").arg(&self.server.kubeconfig).args(args);
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(bytes) = stdin {
            std::io::Write::write_all(&mut input, bytes).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    }

    /// `kubectl <args>`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, None);
        assert!(
            out.status.success(),
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kubectl <args>`, which must fail; its stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args, None);
        assert!(!out.status.success(), "kubectl {} succeeded", args.join(" "));
        String::from_utf8(out.stderr).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }
}

#[test]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
fn imperative_kubectl_create_is_served() {
    let dev = Dev::start();
    // Each of these sends its object as application/vnd.kubernetes.protobuf.
    for args in [
        &["create", "namespace", "shop"][..],
        &["-n", "shop", "create", "configmap", "settings", "--from-literal=colour=blue"],
        &["-n", "shop", "create", "secret", "generic", "pass", "--from-literal=word=s3cret"],
        &["-n", "shop", "create", "deployment", "web", "--image=nginx:1", "--replicas=3"],
        &["-n", "shop", "create", "deployment", "idle", "--image=nginx:1", "--replicas=0"],
        &["-n", "shop", "create", "service", "clusterip", "web", "--tcp=80:8080"],
        &["-n", "shop", "create", "serviceaccount", "robot"],
        &["-n", "shop", "create", "role", "reader", "--verb=get", "--resource=pods"],
        &["-n", "shop", "create", "rolebinding", "robot", "--role=reader", "--user=robot"],
        &["create", "clusterrole", "nodes", "--verb=get,list", "--resource=nodes"],
        &["create", "clusterrolebinding", "nodes", "--clusterrole=nodes", "--user=robot"],
        &["-n", "shop", "create", "job", "once", "--image=busybox", "--", "true"],
        &["-n", "shop", "create", "cronjob", "tick", "--image=busybox", "--schedule=* * * * *"],
        &["-n", "shop", "create", "pdb", "web", "--selector=app=web", "--min-available=1"],
        &["create", "priorityclass", "high", "--value=1000"],
    ] {
        dev.ok(args);
    }
    assert_eq!(dev.json(&["get", "namespace", "shop"])["status"]["phase"], "Active");
    let config = dev.json(&["-n", "shop", "get", "configmap", "settings"]);
    assert_eq!(config["data"]["colour"], "blue");
    // Secret data is bytes on the wire and base64 in JSON.
    assert_eq!(dev.json(&["-n", "shop", "get", "secret", "pass"])["data"]["word"], "czNjcmV0");
    // stringData is write-only: merged into data, as a real server does.
    let secret = r#"{"apiVersion": "v1", "kind": "Secret", "stringData": {"user": "admin"},
        "metadata": {"name": "login", "namespace": "shop"}}"#;
    let applied = dev.run(&["apply", "-f", "-"], Some(secret.as_bytes()));
    assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));
    let login = dev.json(&["-n", "shop", "get", "secret", "login"]);
    assert_eq!((&login["data"]["user"], &login["type"]), (&json!("YWRtaW4="), &json!("Opaque")));
    assert!(login.get("stringData").is_none(), "{login}");
    let web = dev.json(&["-n", "shop", "get", "deployment", "web"]);
    assert_eq!(web["spec"]["replicas"], 3);
    assert_eq!(web["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1");
    assert_eq!(web["spec"]["selector"]["matchLabels"]["app"], "web");
    // A zero the user chose (a pointer field in Go) stays; unset zeros are left out.
    let idle = dev.json(&["-n", "shop", "get", "deployment", "idle"]);
    assert_eq!(idle["spec"]["replicas"], 0);
    assert!(idle["spec"].get("paused").is_none(), "{idle}");
    let port = &dev.json(&["-n", "shop", "get", "service", "web"])["spec"]["ports"][0];
    assert_eq!((&port["port"], &port["targetPort"]), (&Value::from(80), &Value::from(8080)));
    let job = dev.json(&["-n", "shop", "get", "job", "once"]);
    assert_eq!(job["spec"]["template"]["spec"]["containers"][0]["command"][0], "true");
    let cron = dev.json(&["-n", "shop", "get", "cronjob", "tick"]);
    assert_eq!(cron["spec"]["schedule"], "* * * * *");
    let pdb = dev.json(&["-n", "shop", "get", "pdb", "web"]);
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(dev.json(&["get", "priorityclass", "high"])["value"], 1000);
    let binding = dev.json(&["get", "clusterrolebinding", "nodes"]);
    assert_eq!(binding["roleRef"]["name"], "nodes");
    assert_eq!(binding["subjects"][0]["name"], "robot");
    // A strategic merge patch of a workload's pod template merges containers by name.
    dev.ok(&[
        "-n",
        "shop",
        "patch",
        "deployment",
        "web",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"nginx","image":"nginx:2"}]}}}}"#,
    ]);
    let web = dev.json(&["-n", "shop", "get", "deployment", "web"]);
    let container = &web["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "nginx:2");
    assert!(container.get("resources").is_some(), "the patch replaced the container: {web}");
    // kubectl scale goes through the scale subresource kubectl finds in discovery.
    dev.ok(&["-n", "shop", "scale", "deployment", "web", "--replicas=5"]);
    assert_eq!(dev.json(&["-n", "shop", "get", "deployment", "web"])["spec"]["replicas"], 5);
}

#[test]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
fn logs_and_exec_say_where_the_pods_netns_is() {
    let dev = Dev::start();
    // Bound to a node as the scheduler would (--api-only runs none): it has a sandbox.
    dev.ok(&["run", "box", "--image=busybox", r#"--overrides={"spec":{"nodeName":"n1"}}"#]);
    let uid = dev.json(&["get", "pod", "box"])["metadata"]["uid"].as_str().unwrap().to_owned();
    for args in [&["logs", "box"][..], &["exec", "box", "--", "ip", "address"]] {
        let said = dev.fails(args);
        assert!(said.contains("Error from server (BadRequest)"), "{args:?}: {said}");
        assert!(said.contains("runs no containers"), "{args:?}: {said}");
        assert!(said.contains(&format!("nsenter --net=<run dir>/netns/{uid}")), "{said}");
    }
    // An unbound pod has no network namespace yet: the answer says so instead of a path.
    dev.ok(&["run", "waiting", "--image=busybox"]);
    let said = dev.fails(&["logs", "waiting"]);
    assert!(said.contains("not scheduled to a node yet") && !said.contains("nsenter"), "{said}");
    let said = dev.fails(&["logs", "nobody"]);
    assert!(said.contains("NotFound") && said.contains("\"nobody\" not found"), "{said}");
}

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

#[test]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
fn apply_k_stores_every_object_of_each_install() {
    for dir in ["base", "overlays/slots", "overlays/k8s-1.34"] {
        let dir = deploy().join(dir);
        let objects = kustomize(&dir);
        let rendered = objects.len();
        let dev = Dev::start();
        let path = dir.to_str().unwrap();
        let applied = dev.ok(&["apply", "-k", path]);
        assert_eq!(applied.lines().count(), rendered, "{path}: {applied}");
        // Every object reads back (`get -f` fails on the first it cannot find).
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
        let got = dev.run(&["get", "-f", "-", "-o", "name"], Some(list.to_string().as_bytes()));
        let stderr = String::from_utf8_lossy(&got.stderr);
        assert!(got.status.success(), "{path}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&got.stdout).lines().count(), rendered, "{path}");
        // Applying again changes nothing.
        let again = dev.ok(&["apply", "-k", path]);
        let changed: Vec<&str> = again.lines().filter(|l| !l.ends_with(" unchanged")).collect();
        assert!(changed.is_empty(), "{path}: a second apply changed {changed:?}");
        // Server-side apply takes over without conflicts: the CRDs netclaim dev installed
        // hold the same values (numbers re-encoded as floats by its typed client).
        dev.ok(&["apply", "--server-side", "-k", path]);
    }
}
