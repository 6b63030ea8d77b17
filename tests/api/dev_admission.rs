//! The admission policies of deploy/ enforced by `netclaim dev`, tried as a user would with
//! kubectl: `kubectl apply -k deploy/overlays/k8s-1.34` stores them; a token of the node
//! daemon's ServiceAccount bound to node n1 (`kubectl create token --bound-object-kind
//! Node`) names n1 (TokenReview); acting as that identity (kubectl sends no token over plain
//! HTTP, so through impersonation: a kubeconfig user with `as` and `as-user-extra`), n1's
//! ResourceSlices and IPBlocks may be written but not n2's (refused with the policy's
//! message), a block must have its network's size (the PodNetwork parameter), and the
//! ServiceAccount without a node is refused; the admin is not subject to the node policies;
//! a malformed NetworkConfig is refused with its policy's message. `#[ignore]`d: it needs
//! kubectl (scripts/setup/kubectl.sh; `make test` installs it).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::kit::dev_api::DevApiServer;
use crate::kit::kustomize::kubectl;

/// `netclaim dev --api-only` on a free port, driven with kubectl.
struct Dev {
    server: DevApiServer,
}

impl Dev {
    fn start() -> Self {
        Self { server: DevApiServer::start() }
    }

    /// A kubeconfig acting as the node daemon's ServiceAccount on `node` (None: with no
    /// node), as a user writes one (the server from the dev kubeconfig).
    fn as_node(&self, node: Option<&str>) -> PathBuf {
        let dev = std::fs::read_to_string(&self.server.kubeconfig).unwrap();
        let server = dev.lines().find_map(|l| l.trim().strip_prefix("server: ")).unwrap();
        let extra = node.map_or(String::new(), |n| {
            format!(", as-user-extra: {{authentication.kubernetes.io/node-name: [{n}]}}")
        });
        let path = self.server.dir.path().join(format!("node-{}", node.unwrap_or("none")));
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: dev, cluster: {{server: {server}}}}}]\n\
             users: [{{name: node, user: {{as: system:serviceaccount:netclaim-system:netclaim-node{extra}}}}}]\n\
             contexts: [{{name: node, context: {{cluster: dev, user: node}}}}]\ncurrent-context: node\n"
        );
        std::fs::write(&path, config).unwrap();
        path
    }

    /// `kubectl <args>` (with another kubeconfig when given), `stdin` piped in.
    fn kubectl(&self, kubeconfig: Option<&Path>, args: &[&str], stdin: &str) -> Output {
        let mut command = Command::new(kubectl());
        command.arg("--kubeconfig").arg(kubeconfig.unwrap_or(&self.server.kubeconfig));
        command.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut input, stdin.as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    }

    /// `kubectl create -f -` of `yaml`: Ok(stdout) or Err(stderr).
    fn create(&self, kubeconfig: Option<&Path>, yaml: &str) -> Result<String, String> {
        let out = self.kubectl(kubeconfig, &["create", "-f", "-"], yaml);
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        if out.status.success() { Ok(text(&out.stdout)) } else { Err(text(&out.stderr)) }
    }

    /// `kubectl <args>`, which must succeed: its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(None, args, "");
        assert!(
            out.status.success(),
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

fn deploy(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(path).display().to_string()
}

fn slice(node: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {{name: {node}-netclaim.dev}}\n\
         spec: {{driver: netclaim.dev, nodeName: {node}, pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}, devices: []}}\n"
    )
}

fn block(name: &str, cidr: &str, node: &str) -> String {
    format!(
        "apiVersion: netclaim.dev/v1alpha1\nkind: IPBlock\nmetadata: {{name: {name}}}\n\
         spec: {{podNetwork: medianet, cidr: {cidr}, nodeName: {node}}}\n"
    )
}

const NETWORK: &str = "apiVersion: netclaim.dev/v1alpha1\nkind: PodNetwork\nmetadata: {name: medianet}\n\
    spec: {mode: macvlan, parents: [eth1], ipam: {subnets: [10.10.0.0/16]}}\n";

const BAD_CLAIM: &str = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n\
    metadata: {name: bad-mode, namespace: default}\n\
    spec: {devices: {requests: [{name: net, exactly: {deviceClassName: netclaim}}],\n\
    config: [{opaque: {driver: netclaim.dev, parameters: {apiVersion: netclaim.dev/v1alpha1, kind: NetworkConfig, mode: bogus}}}]}}\n";

#[test]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
fn deploy_policies_are_enforced_for_a_node_token() {
    let dev = Dev::start();
    dev.ok(&["apply", "-k", &deploy("overlays/k8s-1.34")]);
    let policies = dev.ok(&["get", "validatingadmissionpolicies", "-o", "name"]);
    for name in [
        "netclaim-network-config",
        "netclaim-node-slices",
        "netclaim-node-ipblocks",
        "netclaim-node-ipblocks-network",
        "netclaim-node-claim-status",
    ] {
        assert!(policies.contains(&format!("/{name}\n")), "{name} not stored: {policies}");
    }
    for node in ["n1", "n2"] {
        dev.create(None, &format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\n"))
            .unwrap();
    }
    dev.create(None, NETWORK).unwrap();
    let token = dev.ok(&[
        "create",
        "token",
        "netclaim-node",
        "-n",
        "netclaim-system",
        "--bound-object-kind",
        "Node",
        "--bound-object-name",
        "n1",
    ]);
    // The token names its node (what the node policies compare with), as TokenReview says.
    let review = format!(
        "{{\"apiVersion\": \"authentication.k8s.io/v1\", \"kind\": \"TokenReview\", \"spec\": {{\"token\": \"{}\"}}}}",
        token.trim()
    );
    let out = dev.kubectl(
        None,
        &["create", "--raw", "/apis/authentication.k8s.io/v1/tokenreviews", "-f", "-"],
        &review,
    );
    let user = String::from_utf8_lossy(&out.stdout);
    assert!(
        user.contains("\"username\":\"system:serviceaccount:netclaim-system:netclaim-node\"")
            && user.contains("\"authentication.kubernetes.io/node-name\":[\"n1\"]"),
        "{user} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n1 = dev.as_node(Some("n1"));
    let node = Some(n1.as_path());

    // ResourceSlices: another node's refused, its own accepted, the admin not subject.
    let refused = dev.create(node, &slice("n2")).unwrap_err();
    assert!(
        refused.contains(
            "resourceslices.resource.k8s.io \"n2-netclaim.dev\" is forbidden: ValidatingAdmissionPolicy 'netclaim-node-slices' with binding 'netclaim-node-slices' denied request: netclaim-node on node n1 may only write ResourceSlices of its own node; this one is for node n2"
        ),
        "{refused}"
    );
    dev.create(node, &slice("n1")).unwrap();
    dev.create(None, &slice("n2")).unwrap();

    // IPBlocks: its own (the derived name, the network's /26) accepted; another size refused
    // by the network's parameters; another node's not deleted.
    dev.create(node, &block("medianet.v4-10-10-0-64-26", "10.10.0.64/26", "n1")).unwrap();
    let refused =
        dev.create(node, &block("medianet.v4-10-10-1-0-24", "10.10.1.0/24", "n1")).unwrap_err();
    assert!(
        refused.contains("ValidatingAdmissionPolicy 'netclaim-node-ipblocks-network' with binding 'netclaim-node-ipblocks-network' denied request: an IPBlock of PodNetwork medianet is a /26 (its blockSize), not 10.10.1.0/24"),
        "{refused}"
    );
    dev.create(None, &block("medianet.v4-10-10-0-128-26", "10.10.0.128/26", "n2")).unwrap();
    let out = dev.kubectl(node, &["delete", "ipblock", "medianet.v4-10-10-0-128-26"], "");
    let refused = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        refused.contains("netclaim-node on node n1 may only create and delete IPBlocks of its own node; medianet.v4-10-10-0-128-26 is of node n2"),
        "{refused}"
    );
    dev.ok(&["get", "ipblock", "medianet.v4-10-10-0-128-26"]);
    dev.ok(&["delete", "ipblock", "medianet.v4-10-10-0-128-26"]);

    // The ServiceAccount with no node (not a bound token of a pod on a node).
    let refused = dev.create(Some(&dev.as_node(None)), &slice("n3")).unwrap_err();
    assert!(refused.contains("denied request: netclaim-node's token names no node"), "{refused}");

    // A NetworkConfig its policy refuses, whoever writes it.
    let refused = dev.create(None, BAD_CLAIM).unwrap_err();
    assert!(
        refused.contains("ValidatingAdmissionPolicy 'netclaim-network-config' with binding 'netclaim-network-config' denied request: netclaim.dev config: mode must be macvlan, ipvlan, host-device or sriov-vf"),
        "{refused}"
    );
}
