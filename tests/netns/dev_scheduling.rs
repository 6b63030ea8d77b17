//! `netclaim dev` shows a pod it cannot schedule as a real cluster does, read with the real
//! kubectl: a pod whose claim names a DeviceClass that does not exist, and one whose class
//! matches no device, stay unbound with `PodScheduled=False`, reason `Unschedulable` and
//! kube-scheduler's message, and a Warning `FailedScheduling` Event that `kubectl get
//! events` and `kubectl describe pod` show; a retry after a change counts in the Event's
//! series instead of adding Events; creating the missing class schedules the pod
//! (`PodScheduled=True`) and it runs.
//!
//! Before: the dev kubelet bound every pod at once, so both pods showed `PodScheduled=True`
//! and no Event (the reason was only in the process log).
//!
//! Needs root (a throwaway netns with a veth pair as the node's NICs): `#[ignore]`d, run by
//! `make test` as root.

#![allow(clippy::unwrap_used, reason = "a failed step fails the test")]

use std::path::Path;
use std::time::{Duration, Instant};

use crate::kit;

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
const WAIT: Duration = Duration::from_mins(1);

/// `kubectl args` inside the netns (the API server listens on its loopback); stdout, or
/// `None` when kubectl fails.
fn kubectl(ns: &kit::netns::Netns, kubeconfig: &Path, args: &[&str]) -> Option<String> {
    let mut full = vec!["--kubeconfig", kubeconfig.to_str().unwrap()];
    full.extend_from_slice(args);
    let output = ns.exec("kubectl", &full);
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Polls `probe` until it answers.
fn wait<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn class(name: &str, if_name: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {{name: {name}}}\n\
         spec:\n  selectors:\n  - cel: {{expression: 'device.driver == \"netclaim.dev\" && \
         device.attributes[\"netclaim.dev\"].ifName == \"{if_name}\"'}}\n"
    )
}

/// A template for class `class` and a pod using it.
fn pod_and_template(pod: &str, class: &str, subnet: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\n\
         metadata: {{name: {pod}, namespace: default}}\n\
         spec:\n  spec:\n    devices:\n      requests:\n      - name: net\n        \
         exactly: {{deviceClassName: {class}}}\n      config:\n      - opaque:\n          \
         driver: netclaim.dev\n          parameters: {{apiVersion: netclaim.dev/v1alpha1, \
         kind: NetworkConfig, mode: macvlan, ipam: {{pool: {{subnet: \"{subnet}\"}}}}}}\n\
         ---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: default}}\n\
         spec:\n  containers: [{{name: app, image: pause}}]\n  \
         resourceClaims: [{{name: net, resourceClaimTemplateName: {pod}}}]\n"
    )
}

const SCHEDULED: &str = r#"{.spec.nodeName}|{.status.conditions[?(@.type=="PodScheduled")].status}|{.status.conditions[?(@.type=="PodScheduled")].reason}|{.status.conditions[?(@.type=="PodScheduled")].message}"#;

/// ghost's one `FailedScheduling` Event, as `kubectl get events` (core/v1) and `kubectl
/// describe` show it; a retry after a change is counted in its series.
fn event_series(ns: &kit::netns::Netns, kubeconfig: &Path, dir: &Path) {
    let events = |pod: &str| {
        kubectl(
            ns,
            kubeconfig,
            &[
                "get",
                "events",
                "--field-selector",
                &format!("involvedObject.name={pod}"),
                "-o",
                "jsonpath={range .items[*]}{.type}|{.reason}|{.count}|{.message}{\"\\n\"}{end}",
            ],
        )
        .unwrap_or_default()
    };
    // The series count of the pod's one FailedScheduling Event (core/v1 shows none for 1).
    let count = |out: &str| -> u32 {
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "one Event, not one per attempt: {out}");
        lines[0].split('|').nth(2).unwrap().parse().unwrap_or(1)
    };
    let first = wait("ghost's FailedScheduling Event", || {
        let out = events("ghost");
        out.contains("|FailedScheduling|").then_some(out)
    });
    let lines: Vec<&str> = first.lines().collect();
    assert!(
        lines[0].starts_with("Warning|FailedScheduling|")
            && lines[0].ends_with("device class nc does not exist. The request is in ResourceClaimTemplate ghost in namespace default."),
        "{first}"
    );
    // A DeviceClass appears (not the one it needs): kube-scheduler retries the pod, and the
    // attempt is counted in the same Event.
    let other = dir.join("other.yaml");
    let before = count(&events("ghost"));
    std::fs::write(&other, class("other", "no-such-nic")).unwrap();
    kubectl(ns, kubeconfig, &["apply", "-f", other.to_str().unwrap()]).unwrap();
    let counted = wait("the retry counted in the Event series", || {
        let now = count(&events("ghost"));
        (now > before).then_some(now)
    });
    let described = kubectl(ns, kubeconfig, &["describe", "pod", "ghost"]).unwrap();
    assert!(
        described.contains("Warning  FailedScheduling")
            && described.contains(&format!("(x{counted} over")),
        "{described}"
    );
}

fn scenario(ns: &kit::netns::Netns, kubeconfig: &Path, dir: &Path, parent: &str) {
    // The node's slice first: its publication is itself a change the scheduler retries on.
    wait("the node's ResourceSlice", || {
        let out = kubectl(ns, kubeconfig, &["get", "resourceslices", "-o", "name"])?;
        (!out.trim().is_empty()).then_some(())
    });
    let manifests = dir.join("pods.yaml");
    std::fs::write(
        &manifests,
        format!(
            "{}---\n{}---\n{}",
            pod_and_template("ghost", "nc", "10.10.9.0/24"),
            class("none", "no-such-nic"),
            pod_and_template("nomatch", "none", "10.10.10.0/24"),
        ),
    )
    .unwrap();
    kubectl(ns, kubeconfig, &["apply", "-f", manifests.to_str().unwrap()])
        .expect("kubectl apply of the pods");

    // No class: kube-scheduler's PreFilter wording, the pod unbound.
    let ghost = wait("ghost reported unschedulable", || {
        let out = kubectl(
            ns,
            kubeconfig,
            &["get", "pod", "ghost", "-o", &format!("jsonpath={SCHEDULED}")],
        )?;
        out.contains("|False|").then_some(out)
    });
    assert_eq!(
        ghost,
        "|False|Unschedulable|0/1 nodes are available: request net: device class nc does not \
         exist. The request is in ResourceClaimTemplate ghost in namespace default."
    );
    // No matching device: the Filter wording and the node's reason.
    let nomatch = wait("nomatch reported unschedulable", || {
        let out = kubectl(
            ns,
            kubeconfig,
            &["get", "pod", "nomatch", "-o", &format!("jsonpath={SCHEDULED}")],
        )?;
        out.contains("|False|").then_some(out)
    });
    assert!(
        nomatch.starts_with(
            "|False|Unschedulable|0/1 nodes are available: 1 cannot allocate all claims. \
             Per node: dev-node: claim nomatch-net: "
        ),
        "{nomatch}"
    );

    event_series(ns, kubeconfig, dir);

    // The class is created: the pod is bound, PodScheduled turns True, and it runs.
    let nc = dir.join("nc.yaml");
    std::fs::write(&nc, class("nc", parent)).unwrap();
    kubectl(ns, kubeconfig, &["apply", "-f", nc.to_str().unwrap()]).unwrap();
    let scheduled = wait("ghost scheduled", || {
        let out = kubectl(
            ns,
            kubeconfig,
            &["get", "pod", "ghost", "-o", &format!("jsonpath={SCHEDULED}")],
        )?;
        out.starts_with("dev-node|True|").then_some(out)
    });
    assert_eq!(scheduled, "dev-node|True||");
    wait("ghost running", || {
        let phase =
            kubectl(ns, kubeconfig, &["get", "pod", "ghost", "-o", "jsonpath={.status.phase}"])?;
        (phase == "Running").then_some(())
    });
    // The other pod still waits, unbound.
    let still =
        kubectl(ns, kubeconfig, &["get", "pod", "nomatch", "-o", &format!("jsonpath={SCHEDULED}")])
            .unwrap();
    assert!(still.starts_with("|False|Unschedulable|"), "{still}");

    kubectl(ns, kubeconfig, &["delete", "pod", "ghost", "nomatch", "--wait=true"])
        .expect("deleting the pods");
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn dev_reports_unschedulable_pods_as_kube_scheduler_does() {
    if !kit::netns::require_root("dev_scheduling") {
        return;
    }
    let ns = kit::netns::Netns::new();
    let parent = ns.ifname("p");
    let peer = ns.ifname("q");
    ns.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer]);
    ns.ip(&["link", "set", &parent, "up"]);
    ns.ip(&["link", "set", &peer, "up"]);
    let dir = tempfile::Builder::new().prefix("ncdevs").tempdir_in("/tmp").unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let run_parent = dir.path().join("run");
    std::fs::create_dir(&run_parent).unwrap();
    let args = [
        "dev",
        "--listen",
        "127.0.0.1:0",
        "--node-name",
        "dev-node",
        "--include-interfaces",
        &parent,
        "--shared-parents",
        &parent,
        "--kubeconfig-out",
        kubeconfig.to_str().unwrap(),
        "--run-dir",
        run_parent.to_str().unwrap(),
    ];
    let mut dev = ns.spawn(NETCLAIM, &args, &dir.path().join("dev.log"));
    wait("the kubeconfig", || kubeconfig.exists().then_some(()));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        scenario(&ns, &kubeconfig, dir.path(), &parent);
    }));
    if let Err(panic) = result {
        eprintln!(
            "netclaim dev log:\n{}",
            std::fs::read_to_string(dir.path().join("dev.log")).unwrap_or_default()
        );
        std::panic::resume_unwind(panic);
    }
    assert!(dev.terminate(Duration::from_secs(30)).is_some(), "netclaim dev did not stop");
}
