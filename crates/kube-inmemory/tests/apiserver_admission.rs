//! ValidatingAdmissionPolicies enforced by the in-memory API server, against the real kube
//! client: a node-bound ServiceAccount token carries its node (user extra
//! `authentication.kubernetes.io/node-name`) and a pod-bound one its pod and the pod's node;
//! a policy keyed on them refuses another node's objects on create, update and delete with
//! kube-apiserver's status (code from the reason, the policy and binding named), accepts
//! the caller's own, leaves other users alone; `Warn` bindings warn; parameters come from
//! the binding's `paramRef`; `failurePolicy` decides about expressions that fail.
#![allow(clippy::unwrap_used, reason = "test helpers: a failed setup step should panic")]
#![allow(clippy::too_many_lines, reason = "each test is one scenario told step by step")]

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube_inmemory::apiserver::{ApiServer, ServerOptions, start};
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "admin-token";
const AGENT: &str = "system:serviceaccount:agents:agent";

async fn server() -> (ApiServer, kube::Client) {
    let options =
        ServerOptions { bearer_token: Some(ADMIN_TOKEN.to_owned()), ..ServerOptions::default() };
    let srv = start("127.0.0.1:0".parse().unwrap(), options).await.unwrap();
    let client = client_with(&srv, ADMIN_TOKEN);
    (srv, client)
}

fn client_with(server: &ApiServer, token: &str) -> kube::Client {
    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.auth_info.token = Some(token.to_owned().into());
    kube::Client::try_from(config).unwrap()
}

fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

fn dynamic(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

async fn create(client: &kube::Client, resource: &ApiResource, body: Value) -> DynamicObject {
    Api::<DynamicObject>::all_with(client.clone(), resource)
        .create(&PostParams::default(), &object(body))
        .await
        .unwrap()
}

/// The namespace `agents`, its ServiceAccount `agent`, nodes n1 and n2.
async fn setup(client: &kube::Client) {
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &object(json!({"metadata": {"name": "agents"}})))
        .await
        .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), "agents")
        .create(&PostParams::default(), &object(json!({"metadata": {"name": "agent"}})))
        .await
        .unwrap();
    for node in ["n1", "n2"] {
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &object(json!({"metadata": {"name": node}})))
            .await
            .unwrap();
    }
}

/// A token of `agents/agent` bound to `bound` (`{"kind": "Node", ...}`).
async fn bound_token(client: &kube::Client, bound: &Value) -> String {
    let request: TokenRequest = object(json!({"spec": {"audiences": [], "boundObjectRef": bound}}));
    Api::<ServiceAccount>::namespaced(client.clone(), "agents")
        .create_token_request("agent", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .unwrap()
}

/// Writers of ResourceSlices may write only their own node's (the shape of a node agent's
/// policy): reason Forbidden, a message naming both nodes.
fn own_node_policy() -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "own-node"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}]},
            "matchConditions": [{"name": "agent", "expression": format!("request.userInfo.username == '{AGENT}'")}],
            "variables": [
                {"name": "node", "expression": "'authentication.kubernetes.io/node-name' in request.userInfo.extra ? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''"},
                {"name": "slice", "expression": "request.operation == 'DELETE' ? oldObject : object"},
            ],
            "validations": [
                {"expression": "variables.node != ''", "reason": "Forbidden", "message": "the token names no node"},
                {"expression": "variables.slice.spec.nodeName == variables.node", "reason": "Forbidden",
                 "messageExpression": "'agent on ' + variables.node + ' may not write slices of ' + variables.slice.spec.nodeName"},
            ],
        },
    })
}

fn binding(name: &str, policy: &str, actions: &[&str]) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": policy, "validationActions": actions},
    })
}

fn slice(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": "example.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": []},
    })
}

fn refusal(err: kube::Error) -> Box<kube::core::Status> {
    match err {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn node_bound_token_may_write_only_its_nodes_slices() {
    let (srv, admin) = server().await;
    setup(&admin).await;
    let policies = dynamic(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    );
    let bindings = dynamic(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    );
    create(&admin, &policies, own_node_policy()).await;
    create(&admin, &bindings, binding("own-node", "own-node", &["Deny"])).await;
    let token =
        bound_token(&admin, &json!({"apiVersion": "v1", "kind": "Node", "name": "n1"})).await;
    let agent = client_with(&srv, &token);
    let slices = dynamic("resource.k8s.io", "v1", "ResourceSlice", "resourceslices");
    let as_agent = Api::<DynamicObject>::all_with(agent.clone(), &slices);
    let as_admin = Api::<DynamicObject>::all_with(admin.clone(), &slices);

    // Another node's slice: refused as kube-apiserver refuses it.
    let err = refusal(
        as_agent.create(&PostParams::default(), &object(slice("s2", "n2"))).await.unwrap_err(),
    );
    let cause = "ValidatingAdmissionPolicy 'own-node' with binding 'own-node' denied request: agent on n1 may not write slices of n2";
    assert_eq!(err.code, 403);
    assert_eq!(err.reason, "Forbidden");
    assert_eq!(err.message, format!("resourceslices.resource.k8s.io \"s2\" is forbidden: {cause}"));
    let details = err.details.unwrap();
    assert_eq!((details.name.as_str(), details.kind.as_str()), ("s2", "resourceslices"));
    assert_eq!(details.causes[0].message, cause);
    assert!(as_admin.get_opt("s2").await.unwrap().is_none(), "a refused create stores nothing");

    // Its own node's slice: accepted; the admin (not the agent) is not subject to the policy.
    as_agent.create(&PostParams::default(), &object(slice("s1", "n1"))).await.unwrap();
    as_admin.create(&PostParams::default(), &object(slice("s2", "n2"))).await.unwrap();

    // Changing another node's slice (UPDATE), deleting it (DELETE: the policy reads
    // oldObject).
    let labelled = Patch::Merge(json!({"metadata": {"labels": {"mine": "yes"}}}));
    let err = refusal(as_agent.patch("s2", &PatchParams::default(), &labelled).await.unwrap_err());
    assert!(err.message.ends_with("agent on n1 may not write slices of n2"), "{}", err.message);
    as_agent.patch("s1", &PatchParams::default(), &labelled).await.unwrap();
    let err = refusal(as_agent.delete("s2", &DeleteParams::default()).await.unwrap_err());
    assert!(err.message.ends_with("agent on n1 may not write slices of n2"), "{}", err.message);
    assert!(as_admin.get_opt("s2").await.unwrap().is_some(), "a refused delete deletes nothing");
    as_agent.delete("s1", &DeleteParams::default()).await.unwrap();

    // A token bound to nothing names no node.
    let request: TokenRequest = object(json!({"spec": {"audiences": []}}));
    let unbound = Api::<ServiceAccount>::namespaced(admin.clone(), "agents")
        .create_token_request("agent", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .unwrap();
    let unbound = Api::<DynamicObject>::all_with(client_with(&srv, &unbound), &slices);
    let err = refusal(
        unbound.create(&PostParams::default(), &object(slice("s3", "n1"))).await.unwrap_err(),
    );
    assert!(err.message.ends_with("denied request: the token names no node"), "{}", err.message);

    // Without its binding the policy does nothing.
    Api::<DynamicObject>::all_with(admin.clone(), &bindings)
        .delete("own-node", &DeleteParams::default())
        .await
        .unwrap();
    as_agent.create(&PostParams::default(), &object(slice("s4", "n2"))).await.unwrap();
}

#[tokio::test]
async fn pod_bound_token_carries_pod_and_node_and_dies_with_the_pod() {
    let (srv, admin) = server().await;
    setup(&admin).await;
    let pods = Api::<Pod>::namespaced(admin.clone(), "agents");
    let pod: Pod = object(json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n2",
        "serviceAccountName": "agent", "containers": [{"name": "c", "image": "i"}]}}));
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod_uid = pod.metadata.uid.unwrap();
    let node_uid = Api::<Node>::all(admin.clone()).get("n2").await.unwrap().metadata.uid.unwrap();
    let token = bound_token(&admin, &json!({"apiVersion": "v1", "kind": "Pod", "name": "p"})).await;
    let review: TokenReview = object(json!({"spec": {"token": token}}));
    let status = Api::<TokenReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap();
    let user = status.user.unwrap();
    assert_eq!(user.username.as_deref(), Some(AGENT));
    let extra = user.extra.unwrap();
    let one = |key: &str| extra[&format!("authentication.kubernetes.io/{key}")].clone();
    assert_eq!(one("pod-name"), ["p"]);
    assert_eq!(one("pod-uid"), [pod_uid]);
    assert_eq!(one("node-name"), ["n2"]);
    assert_eq!(one("node-uid"), [node_uid]);
    assert!(one("credential-id")[0].starts_with("JTI="), "{extra:?}");

    // A pod of another ServiceAccount cannot be bound to this one's token.
    let other: Pod = object(json!({"metadata": {"name": "q"}, "spec": {"nodeName": "n2",
        "containers": [{"name": "c", "image": "i"}]}}));
    pods.create(&PostParams::default(), &other).await.unwrap();
    let request: TokenRequest = object(json!({"spec": {"boundObjectRef":
        {"apiVersion": "v1", "kind": "Pod", "name": "q"}}}));
    let err = Api::<ServiceAccount>::namespaced(admin.clone(), "agents")
        .create_token_request("agent", &PostParams::default(), &request)
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 400), "{err:?}");

    // The token authenticates while its pod lives (graceful deletion: the pod is bound to a
    // node, so it is removed with grace 0).
    let agent = client_with(&srv, &token);
    Api::<Namespace>::all(agent.clone()).get("agents").await.unwrap();
    pods.delete("p", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .unwrap();
    let err = Api::<Namespace>::all(agent).get("agents").await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 401), "{err:?}");
}

#[tokio::test]
async fn warn_bindings_params_and_failure_policies() {
    let (srv, admin) = server().await;
    let policies = dynamic(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    );
    let bindings = dynamic(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    );
    // Namespaces labelled `limit` are the parameters: a node's name must start with each
    // one's `prefix` label (selector), unless the binding only warns.
    let prefix_policy = |name: &str, failure: &str, expression: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": failure,
                "paramKind": {"apiVersion": "v1", "kind": "Namespace"},
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["nodes"]}]},
                "validations": [{"expression": expression, "message": "wrong prefix"}],
            },
        })
    };
    let with_params = |name: &str, policy: &str, actions: &[&str], missing: &str| {
        let mut b = binding(name, policy, actions);
        b["spec"]["paramRef"] = json!({"selector": {"matchLabels": {"limit": "yes"}},
            "parameterNotFoundAction": missing});
        b
    };
    create(
        &admin,
        &policies,
        prefix_policy(
            "prefix",
            "Fail",
            "object.metadata.name.startsWith(params.metadata.labels.prefix)",
        ),
    )
    .await;
    create(&admin, &bindings, with_params("prefix", "prefix", &["Deny"], "Allow")).await;
    let nodes = Api::<Node>::all(admin.clone());
    let node = |name: &str| -> Node { object(json!({"metadata": {"name": name}})) };
    // No parameter yet: Allow lets everything through.
    nodes.create(&PostParams::default(), &node("free")).await.unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "limits",
            "labels": {"limit": "yes", "prefix": "rack"}}})),
        )
        .await
        .unwrap();
    nodes.create(&PostParams::default(), &node("rack-1")).await.unwrap();
    let err = refusal(nodes.create(&PostParams::default(), &node("other")).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"), "no reason: Invalid");
    assert_eq!(
        err.message,
        "nodes \"other\" is forbidden: ValidatingAdmissionPolicy 'prefix' with binding 'prefix' denied request: wrong prefix"
    );

    // An expression that fails: refused under Fail, skipped under Ignore.
    Api::<DynamicObject>::all_with(admin.clone(), &bindings)
        .delete("prefix", &DeleteParams::default())
        .await
        .unwrap();
    create(
        &admin,
        &policies,
        prefix_policy("broken", "Fail", "params.metadata.labels.nope == 'x'"),
    )
    .await;
    create(&admin, &bindings, with_params("broken", "broken", &["Deny"], "Deny")).await;
    let err = refusal(nodes.create(&PostParams::default(), &node("rack-2")).await.unwrap_err());
    assert!(
        err.message.contains(
            "denied request: expression 'params.metadata.labels.nope == 'x'' resulted in error"
        ),
        "{}",
        err.message
    );
    let ignore = Patch::Merge(json!({"spec": {"failurePolicy": "Ignore"}}));
    Api::<DynamicObject>::all_with(admin.clone(), &policies)
        .patch("broken", &PatchParams::default(), &ignore)
        .await
        .unwrap();
    nodes.create(&PostParams::default(), &node("rack-2")).await.unwrap();

    // Warn: the write goes through with a Warning header naming policy and binding.
    create(
        &admin,
        &policies,
        prefix_policy(
            "warned",
            "Fail",
            "object.metadata.name.startsWith(params.metadata.labels.prefix)",
        ),
    )
    .await;
    create(&admin, &bindings, with_params("warned", "warned", &["Warn"], "Allow")).await;
    let response = raw_post(
        &srv,
        "/api/v1/nodes",
        &json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "warned-node"}}),
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    assert!(
        response.contains("299 - \"Validation failed for ValidatingAdmissionPolicy 'warned' with binding 'warned': wrong prefix\""),
        "{response}"
    );
}

/// A raw POST as the admin (the kube client hides `Warning` headers): the response head and
/// body.
async fn raw_post(srv: &ApiServer, path: &str, body: &Value) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(srv.addr()).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn status_subresource_rules_match_status_writes_only() {
    let (_srv, admin) = server().await;
    let policies = dynamic(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    );
    let bindings = dynamic(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    );
    create(&admin, &policies, json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "frozen-status"},
        "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": ["resourceclaims/status"]}]},
            "validations": [{"expression": "false",
                "reason": "Forbidden", "message": "the status is frozen"}],
        },
    }))
    .await;
    create(&admin, &bindings, binding("frozen-status", "frozen-status", &["Deny"])).await;
    let claims = Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        "default",
        &dynamic("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"),
    );
    claims
        .create(&PostParams::default(), &object(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [{"name": "net", "exactly": {"deviceClassName": "x"}}]}},
        })))
        .await
        .unwrap();
    // The main resource is not matched by a status rule.
    let label = Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}));
    claims.patch("c", &PatchParams::default(), &label).await.unwrap();
    let status = Patch::Merge(json!({"metadata": {"labels": {"c": "d"}}}));
    let err =
        refusal(claims.patch_status("c", &PatchParams::default(), &status).await.unwrap_err());
    assert_eq!(err.code, 403);
    assert!(err.message.ends_with("denied request: the status is frozen"), "{}", err.message);
}
