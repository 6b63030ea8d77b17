//! TokenRequest, TokenReview and SubjectAccessReview against the real kube client: a token
//! issued for a ServiceAccount authenticates API requests and reviews with the
//! service-account groups, dies with its ServiceAccount, and the stored RBAC policy decides
//! the reviews (a ClusterRole's nonResourceURLs through a ClusterRoleBinding; a RoleBinding
//! in its namespace only; the bootstrap `cluster-admin` for the admin's `system:masters`).
#![allow(clippy::unwrap_used, reason = "test helpers: a failed setup step should panic")]
#![allow(clippy::too_many_lines, reason = "each test is one scenario told step by step")]

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube_inmemory::apiserver::{ADMIN_USER, ApiServer, ServerOptions, start};
use serde_json::json;

const ADMIN_TOKEN: &str = "admin-token";

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

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

async fn token_for(client: &kube::Client, namespace: &str, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request: TokenRequest = object(json!({"spec": {"audiences": []}}));
    let issued =
        accounts.create_token_request(name, &PostParams::default(), &request).await.unwrap();
    issued.status.unwrap().token.unwrap()
}

/// `(authenticated, user name, groups)` of `token`.
async fn review(client: &kube::Client, token: &str) -> (bool, String, Vec<String>) {
    let review: TokenReview = object(json!({"spec": {"token": token}}));
    let answer =
        Api::<TokenReview>::all(client.clone()).create(&PostParams::default(), &review).await;
    let status = answer.unwrap().status.unwrap();
    let user = status.user.unwrap_or_default();
    (
        status.authenticated == Some(true),
        user.username.unwrap_or_default(),
        user.groups.unwrap_or_default(),
    )
}

/// Whether `user` with `groups` may do `attributes` (`resourceAttributes` or
/// `nonResourceAttributes`).
async fn may(
    client: &kube::Client,
    user: &str,
    groups: &[String],
    attributes: serde_json::Value,
) -> bool {
    let mut spec = json!({"user": user, "groups": groups});
    spec.as_object_mut().unwrap().extend(attributes.as_object().unwrap().clone());
    let review: SubjectAccessReview = object(json!({"spec": spec}));
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    answer.status.unwrap().allowed
}

fn metrics_get() -> serde_json::Value {
    json!({"nonResourceAttributes": {"path": "/metrics", "verb": "get"}})
}

#[tokio::test]
async fn a_service_account_token_is_reviewed_and_authorised_by_the_stored_rbac() {
    let (server, admin) = server().await;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(&PostParams::default(), &object(json!({"metadata": {"name": "monitoring"}})))
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "monitoring");
    for name in ["prometheus", "nobody"] {
        let account: ServiceAccount = object(json!({"metadata": {"name": name}}));
        accounts.create(&PostParams::default(), &account).await.unwrap();
    }
    // No token for a ServiceAccount that does not exist.
    let missing: Api<ServiceAccount> = Api::namespaced(admin.clone(), "monitoring");
    let request: TokenRequest = object(json!({"spec": {"audiences": []}}));
    let refused = missing.create_token_request("ghost", &PostParams::default(), &request).await;
    assert!(matches!(refused, Err(kube::Error::Api(s)) if s.code == 404));
    let short: TokenRequest = object(json!({"spec": {"audiences": [], "expirationSeconds": 60}}));
    let refused = missing.create_token_request("prometheus", &PostParams::default(), &short).await;
    assert!(matches!(refused, Err(kube::Error::Api(s)) if s.code == 422));

    let prometheus = token_for(&admin, "monitoring", "prometheus").await;
    let nobody = token_for(&admin, "monitoring", "nobody").await;
    assert_ne!(prometheus, nobody);

    // TokenReview: who each token is, with the service-account groups.
    let (authenticated, user, groups) = review(&admin, &prometheus).await;
    assert!(authenticated);
    assert_eq!(user, "system:serviceaccount:monitoring:prometheus");
    assert_eq!(
        groups,
        ["system:serviceaccounts", "system:serviceaccounts:monitoring", "system:authenticated"]
    );
    assert!(!review(&admin, "not-a-token").await.0);
    let (authenticated, user, groups) = review(&admin, ADMIN_TOKEN).await;
    assert!(authenticated && user == ADMIN_USER && groups.contains(&"system:masters".into()));
    // A review for another audience than the token's is refused.
    let elsewhere: TokenReview =
        object(json!({"spec": {"token": prometheus, "audiences": ["https://elsewhere"]}}));
    let answer = Api::<TokenReview>::all(admin.clone())
        .create(&PostParams::default(), &elsewhere)
        .await
        .unwrap();
    assert_eq!(answer.status.unwrap().authenticated, Some(false));

    // The issued token authenticates API requests too; an unknown one does not.
    let as_prometheus = client_with(&server, &prometheus);
    Api::<Namespace>::all(as_prometheus).list(&ListParams::default()).await.unwrap();
    let stranger = Api::<Namespace>::all(client_with(&server, "not-a-token"));
    assert!(matches!(
        stranger.list(&ListParams::default()).await,
        Err(kube::Error::Api(s)) if s.code == 401
    ));

    // SubjectAccessReview: nothing is granted before a binding says so, except to the
    // admin's system:masters (bootstrap cluster-admin).
    let (_, prometheus_user, prometheus_groups) = review(&admin, &prometheus).await;
    let (_, nobody_user, nobody_groups) = review(&admin, &nobody).await;
    assert!(!may(&admin, &prometheus_user, &prometheus_groups, metrics_get()).await);
    assert!(may(&admin, ADMIN_USER, &["system:masters".to_owned()], metrics_get()).await);
    let reader: ClusterRole = object(json!({"metadata": {"name": "metrics-reader"},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}));
    Api::<ClusterRole>::all(admin.clone()).create(&PostParams::default(), &reader).await.unwrap();
    let binding: ClusterRoleBinding = object(json!({"metadata": {"name": "prometheus-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]}));
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    assert!(may(&admin, &prometheus_user, &prometheus_groups, metrics_get()).await);
    assert!(!may(&admin, &nobody_user, &nobody_groups, metrics_get()).await);
    let post = json!({"nonResourceAttributes": {"path": "/metrics", "verb": "post"}});
    assert!(!may(&admin, &prometheus_user, &prometheus_groups, post).await);
    // A RoleBinding grants in its namespace only, and never a non-resource URL.
    let pods: RoleBinding = object(json!({"metadata": {"name": "view", "namespace": "monitoring"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"kind": "Group", "name": "system:serviceaccounts:monitoring"}]}));
    Api::<RoleBinding>::namespaced(admin.clone(), "monitoring")
        .create(&PostParams::default(), &pods)
        .await
        .unwrap();
    let list_pods = |namespace: &str| json!({"resourceAttributes": {"verb": "list", "resource": "pods", "namespace": namespace}});
    assert!(may(&admin, &nobody_user, &nobody_groups, list_pods("monitoring")).await);
    assert!(!may(&admin, &nobody_user, &nobody_groups, list_pods("default")).await);
    assert!(!may(&admin, &nobody_user, &nobody_groups, metrics_get()).await);
    // Exactly one kind of attributes.
    let neither: SubjectAccessReview = object(json!({"spec": {"user": "x"}}));
    let refused = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &neither)
        .await;
    assert!(matches!(refused, Err(kube::Error::Api(s)) if s.code == 422));

    // Deleting the ServiceAccount revokes its tokens, also once one of the same name is back.
    accounts.delete("prometheus", &DeleteParams::default()).await.unwrap();
    assert!(!review(&admin, &prometheus).await.0);
    let account: ServiceAccount = object(json!({"metadata": {"name": "prometheus"}}));
    accounts.create(&PostParams::default(), &account).await.unwrap();
    assert!(!review(&admin, &prometheus).await.0);
    assert!(review(&admin, &nobody).await.0);
    server.shutdown().await.unwrap();
}
