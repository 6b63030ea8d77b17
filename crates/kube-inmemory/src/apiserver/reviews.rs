//! Who a bearer token is, and the three APIs built on it that servers delegating to this one
//! use: TokenRequest (`serviceaccounts/<name>/token`: a token for a ServiceAccount),
//! TokenReview (`authentication.k8s.io/v1`: who a token is) and SubjectAccessReview
//! (`authorization.k8s.io/v1`: may this user do this, by the stored RBAC policy, see
//! [`super::rbac`]).
//!
//! Identities, with the groups the real server's authenticators give them:
//! - the admin token and same-user callers: [`super::ADMIN_USER`], groups `system:masters`
//!   and `system:authenticated`;
//! - a static user token ([`super::ServerOptions::user_tokens`]): its user; a name of the
//!   form `system:serviceaccount:<ns>:<name>` also gets `system:serviceaccounts` and
//!   `system:serviceaccounts:<ns>`, as a real service-account token would;
//! - a token issued by TokenRequest: its ServiceAccount, while that ServiceAccount exists
//!   with the same uid (deleting it revokes its tokens, as for bound tokens) and until the
//!   token expires. A token bound to an object (`spec.boundObjectRef`: a Pod, a Node or a
//!   Secret) dies with that object too, and carries the user extra kube-apiserver gives it:
//!   `authentication.kubernetes.io/pod-name` and `pod-uid` for a pod, `node-name` (and
//!   `node-uid` when the node exists) for a pod's node or a node (ServiceAccountTokenPodNodeInfo
//!   and ServiceAccountTokenNodeBinding, GA in 1.32 and 1.33), and `credential-id`
//!   (`JTI=<id>`, ServiceAccountTokenJTI) on every issued token. Admission policies read it
//!   as `request.userInfo.extra` (see [`super::admission`]).
//!
//! Issued tokens are opaque random strings the server remembers (the real ones are signed
//! JWTs that any holder of the public key can check); they are valid for the audiences they
//! were requested for, the API server's own ([`DEFAULT_AUDIENCE`]) by default.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde_json::{Value, json};

use super::error::{ApiError, FieldError};
use super::objects;
use super::rbac::{self, Policy, Request, Subject};
use super::rest::ApiRequest;
use super::{ADMIN_USER, Shared};

/// The audience of tokens the server issues when none is asked for, and that static tokens
/// are valid for: the in-cluster name of the API server.
pub const DEFAULT_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// TokenRequest's default `expirationSeconds`.
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// The shortest expiration a TokenRequest may ask for (the real server's 10 minutes).
const MIN_EXPIRATION_SECONDS: i64 = 600;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserInfo {
    /// User name.
    pub(crate) name: String,
    /// The ServiceAccount's uid for its tokens, else empty.
    pub(crate) uid: String,
    /// Groups, `system:authenticated` among them.
    pub(crate) groups: Vec<String>,
    /// User extra (`authentication.kubernetes.io/node-name`, ...).
    pub(crate) extra: BTreeMap<String, Vec<String>>,
    /// Audiences the credential is valid for.
    audiences: Vec<String>,
}

/// The prefix of the user extra keys of bound ServiceAccount tokens.
const EXTRA: &str = "authentication.kubernetes.io/";

/// The object a token is bound to (`spec.boundObjectRef`): it lives while that object does.
#[derive(Debug, Clone)]
struct BoundObject {
    /// `""` and `pods`, `nodes` or `secrets`.
    plural: &'static str,
    /// Empty for nodes.
    namespace: String,
    name: String,
    uid: String,
}

/// A token issued by TokenRequest.
#[derive(Debug, Clone)]
struct Issued {
    namespace: String,
    service_account: String,
    uid: String,
    audiences: Vec<String>,
    /// Unix seconds.
    expires: i64,
    /// The object it is bound to, if any.
    bound: Option<BoundObject>,
    /// User extra, fixed at issue.
    extra: BTreeMap<String, Vec<String>>,
}

/// The tokens issued so far (expired ones are dropped at the next issue).
#[derive(Debug, Default)]
pub(crate) struct IssuedTokens {
    tokens: Mutex<HashMap<String, Issued>>,
}

impl IssuedTokens {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Issued>> {
        self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The groups Kubernetes gives `name`.
fn groups_of(name: &str) -> Vec<String> {
    let mut groups = Vec::new();
    if name == ADMIN_USER {
        groups.push("system:masters".to_owned());
    } else if let Some((namespace, _)) =
        name.strip_prefix("system:serviceaccount:").and_then(|rest| rest.split_once(':'))
    {
        groups.push("system:serviceaccounts".to_owned());
        groups.push(format!("system:serviceaccounts:{namespace}"));
    }
    groups.push("system:authenticated".to_owned());
    groups
}

fn static_user(name: &str) -> UserInfo {
    UserInfo {
        name: name.to_owned(),
        uid: String::new(),
        groups: groups_of(name),
        extra: BTreeMap::new(),
        audiences: vec![DEFAULT_AUDIENCE.to_owned()],
    }
}

impl UserInfo {
    /// The identity an impersonating request names (see [`super::impersonation`]).
    pub(crate) fn impersonated(
        name: String,
        uid: String,
        groups: Vec<String>,
        extra: BTreeMap<String, Vec<String>>,
    ) -> Self {
        Self { name, uid, groups, extra, audiences: vec![DEFAULT_AUDIENCE.to_owned()] }
    }
}

/// Who calls with no credential, when the server asks for none.
pub(crate) fn anonymous() -> UserInfo {
    UserInfo {
        name: super::request_log::ANONYMOUS_USER.to_owned(),
        uid: String::new(),
        groups: vec!["system:unauthenticated".to_owned()],
        extra: BTreeMap::new(),
        audiences: Vec::new(),
    }
}

/// The admin's identity (admin token, same-user callers).
pub(crate) fn admin() -> UserInfo {
    static_user(ADMIN_USER)
}

/// Who `token` is, if anyone.
pub(crate) fn authenticate(shared: &Shared, token: &str) -> Option<UserInfo> {
    if let Some(user) = shared.options.user_tokens.get(token) {
        return Some(static_user(user));
    }
    if shared.options.bearer_token.as_deref() == Some(token) {
        return Some(admin());
    }
    let issued = shared.tokens.lock().get(token).cloned()?;
    if issued.expires <= objects::unix_now() {
        return None;
    }
    // A bound token dies with its ServiceAccount: a new one of the same name has another uid.
    let current_uid = service_account_uid(shared, &issued.namespace, &issued.service_account)?;
    if current_uid != issued.uid {
        return None;
    }
    // A bound token dies with its object too (the real server checks it on every request).
    if let Some(bound) = &issued.bound
        && object_uid(shared, bound.plural, &bound.namespace, &bound.name).as_deref()
            != Some(bound.uid.as_str())
    {
        return None;
    }
    let name = format!("system:serviceaccount:{}:{}", issued.namespace, issued.service_account);
    Some(UserInfo {
        groups: groups_of(&name),
        name,
        uid: issued.uid,
        extra: issued.extra,
        audiences: issued.audiences,
    })
}

fn service_account_uid(shared: &Shared, namespace: &str, name: &str) -> Option<String> {
    object_uid(shared, "serviceaccounts", namespace, name)
}

/// A core object, if it exists.
fn core_object(shared: &Shared, plural: &str, namespace: &str, name: &str) -> Option<Value> {
    let resource = shared.store.with_registry(|r| r.lookup("", "v1", plural))?;
    let object = shared
        .store
        .transact(false, |t| t.get(&resource, &(namespace.to_owned(), name.to_owned())))?;
    Some((*object).clone())
}

fn object_uid(shared: &Shared, plural: &str, namespace: &str, name: &str) -> Option<String> {
    let object = core_object(shared, plural, namespace, name)?;
    object.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_owned)
}

/// The object of `spec.boundObjectRef` and the user extra it gives the token, checked as
/// kube-apiserver checks it (kind, existence, uid, the pod's ServiceAccount).
fn bind(
    shared: &Shared,
    namespace: &str,
    service_account: &str,
    reference: &Value,
) -> Result<(BoundObject, BTreeMap<String, Vec<String>>), ApiError> {
    let text = |field: &str| reference[field].as_str().unwrap_or_default().to_owned();
    let (kind, name, uid) = (text("kind"), text("name"), text("uid"));
    let (plural, object_namespace) = match (text("apiVersion").as_str(), kind.as_str()) {
        ("v1", "Pod") => ("pods", namespace.to_owned()),
        ("v1", "Node") => ("nodes", String::new()),
        ("v1", "Secret") => ("secrets", namespace.to_owned()),
        _ => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {}, {kind}",
                text("apiVersion")
            )));
        }
    };
    let object = core_object(shared, plural, &object_namespace, &name)
        .ok_or_else(|| ApiError::not_found("", plural, &name))?;
    let actual_uid = object.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
    if !uid.is_empty() && uid != actual_uid {
        return Err(ApiError::conflict(
            "",
            plural,
            &name,
            &format!(
                "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    let mut extra = BTreeMap::new();
    let mut put = |key: &str, value: &str| {
        extra.insert(format!("{EXTRA}{key}"), vec![value.to_owned()]);
    };
    let node_name = match plural {
        "pods" => {
            let pod_account = object.pointer("/spec/serviceAccountName").and_then(Value::as_str);
            if pod_account.unwrap_or("default") != service_account {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount {service_account:?} to pod running with different serviceaccount name."
                )));
            }
            put("pod-name", &name);
            put("pod-uid", actual_uid);
            object.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default().to_owned()
        }
        "nodes" => name.clone(),
        _ => String::new(),
    };
    if !node_name.is_empty() {
        put("node-name", &node_name);
        // The node's uid only when the node exists (a pod may name one that does not yet).
        if let Some(node_uid) = object_uid(shared, "nodes", "", &node_name) {
            put("node-uid", &node_uid);
        }
    }
    let bound =
        BoundObject { plural, namespace: object_namespace, name, uid: actual_uid.to_owned() };
    Ok((bound, extra))
}

fn body(req: &ApiRequest<'_>) -> Result<Value, ApiError> {
    let ct = req.content_type.split(';').next().unwrap_or_default().trim();
    // `kubectl create token` sends its TokenRequest as protobuf.
    if ct == super::protobuf::MEDIA_TYPE {
        return super::protobuf::decode(req.body);
    }
    // No Content-Type is JSON, the server's first media type (`kubectl create --raw` sends
    // none).
    if !ct.is_empty() && ct != "application/json" {
        return Err(ApiError::unsupported_media_type(ct));
    }
    serde_json::from_slice(req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding JSON: {e}")))
}

fn string_list(value: &Value) -> Vec<String> {
    value.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
}

fn timestamp(unix: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// `POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`: a token for the
/// ServiceAccount (404 when it does not exist).
pub(crate) fn token_request(
    shared: &Shared,
    req: &ApiRequest<'_>,
    namespace: &str,
    name: &str,
) -> Result<super::rest::ApiResponse, ApiError> {
    let request = body(req)?;
    let uid = service_account_uid(shared, namespace, name)
        .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?;
    let expiration = match request.pointer("/spec/expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(value) => value.as_i64().unwrap_or(-1),
    };
    if !(MIN_EXPIRATION_SECONDS..=1 << 32).contains(&expiration) {
        return Err(ApiError::invalid(
            "TokenRequest",
            "authentication.k8s.io",
            name,
            &[FieldError::invalid(
                "spec.expirationSeconds",
                "may not specify a duration less than 10 minutes or more than 2^32 seconds",
            )],
        ));
    }
    let mut audiences = string_list(&request["spec"]["audiences"]);
    if audiences.is_empty() {
        audiences.push(DEFAULT_AUDIENCE.to_owned());
    }
    let (bound, mut extra) = match request.pointer("/spec/boundObjectRef") {
        Some(reference) if reference.is_object() => {
            let (bound, extra) = bind(shared, namespace, name, reference)?;
            (Some(bound), extra)
        }
        _ => (None, BTreeMap::new()),
    };
    let credential = uuid::Uuid::new_v4();
    extra.insert(format!("{EXTRA}credential-id"), vec![format!("JTI={credential}")]);
    let now = objects::unix_now();
    let expires = now.saturating_add(expiration);
    let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    {
        let mut tokens = shared.tokens.lock();
        tokens.retain(|_, issued| issued.expires > now);
        tokens.insert(
            token.clone(),
            Issued {
                namespace: namespace.to_owned(),
                service_account: name.to_owned(),
                uid,
                audiences: audiences.clone(),
                expires,
                bound: bound.clone(),
                extra,
            },
        );
    }
    let mut spec = request.get("spec").cloned().unwrap_or_else(|| json!({}));
    spec["audiences"] = json!(audiences);
    spec["expirationSeconds"] = json!(expiration);
    if let Some(bound) = bound {
        spec["boundObjectRef"]["uid"] = json!(bound.uid);
    }
    Ok(created(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": timestamp(now)},
        "spec": spec,
        "status": {"token": token, "expirationTimestamp": timestamp(expires)},
    })))
}

fn created(body: Value) -> super::rest::ApiResponse {
    super::rest::ApiResponse::Json { code: 201, body, warnings: Vec::new() }
}

/// The review as the server answers it: the request's `spec` with a `status`.
fn answer(kind: &str, group: &str, request: &Value, status: Value) -> super::rest::ApiResponse {
    let mut body = json!({
        "apiVersion": format!("{group}/v1"),
        "kind": kind,
        "metadata": {"creationTimestamp": null},
        "spec": request.get("spec").cloned().unwrap_or_else(|| json!({})),
    });
    body["status"] = status;
    created(body)
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`: who `spec.token` is, for
/// `spec.audiences` (the API server's own when empty).
pub(crate) fn token_review(
    shared: &Shared,
    req: &ApiRequest<'_>,
) -> Result<super::rest::ApiResponse, ApiError> {
    const GROUP: &str = "authentication.k8s.io";
    let request = body(req)?;
    let token = request.pointer("/spec/token").and_then(Value::as_str).unwrap_or_default();
    if token.is_empty() {
        return Err(ApiError::invalid(
            "TokenReview",
            GROUP,
            "",
            &[FieldError::required("spec.token", "token must be set")],
        ));
    }
    let mut wanted = string_list(&request["spec"]["audiences"]);
    if wanted.is_empty() {
        wanted.push(DEFAULT_AUDIENCE.to_owned());
    }
    let status = match authenticate(shared, token) {
        None => json!({"authenticated": false, "user": {}, "error": "invalid bearer token"}),
        Some(user) => {
            let audiences: Vec<&String> =
                wanted.iter().filter(|a| user.audiences.contains(a)).collect();
            if audiences.is_empty() {
                json!({"authenticated": false, "user": {},
                       "error": "token audiences are invalid for the target audiences"})
            } else {
                let mut user_json = json!({"username": user.name, "groups": user.groups});
                if !user.uid.is_empty() {
                    user_json["uid"] = json!(user.uid);
                }
                if !user.extra.is_empty() {
                    user_json["extra"] = json!(user.extra);
                }
                json!({"authenticated": true, "user": user_json, "audiences": audiences})
            }
        }
    };
    Ok(answer("TokenReview", GROUP, &request, status))
}

/// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`: whether the stored RBAC
/// policy lets `spec.user` (with `spec.groups`) make the request of
/// `spec.resourceAttributes` or `spec.nonResourceAttributes`.
pub(crate) fn subject_access_review(
    shared: &Shared,
    req: &ApiRequest<'_>,
) -> Result<super::rest::ApiResponse, ApiError> {
    const GROUP: &str = "authorization.k8s.io";
    let request = body(req)?;
    let spec = &request["spec"];
    let invalid = |field: &str, message: &str| {
        ApiError::invalid("SubjectAccessReview", GROUP, "", &[FieldError::invalid(field, message)])
    };
    let subject = Subject {
        user: spec["user"].as_str().unwrap_or_default().to_owned(),
        groups: string_list(&spec["groups"]),
    };
    if subject.user.is_empty() && subject.groups.is_empty() {
        return Err(invalid("spec.user", "at least one of user or group must be specified"));
    }
    let field =
        |attributes: &Value, name: &str| attributes[name].as_str().unwrap_or_default().to_owned();
    let asked = match (spec.get("resourceAttributes"), spec.get("nonResourceAttributes")) {
        (Some(r), None) if r.is_object() => Request::Resource {
            verb: field(r, "verb"),
            group: field(r, "group"),
            resource: field(r, "resource"),
            subresource: field(r, "subresource"),
            namespace: field(r, "namespace"),
            name: field(r, "name"),
        },
        (None, Some(n)) if n.is_object() => {
            Request::NonResource { verb: field(n, "verb"), path: field(n, "path") }
        }
        _ => {
            return Err(invalid(
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
    };
    let policy = policy(shared)?;
    let status = match policy.allows(&subject, &asked) {
        Some(reason) => json!({"allowed": true, "reason": reason}),
        None => json!({"allowed": false}),
    };
    Ok(answer("SubjectAccessReview", GROUP, &request, status))
}

/// The stored Roles, ClusterRoles and bindings.
fn policy(shared: &Shared) -> Result<Policy, ApiError> {
    let list = |plural: &str| {
        let resource = shared
            .store
            .with_registry(|r| r.lookup(rbac::GROUP, "v1", plural))
            .ok_or_else(|| ApiError::internal(format!("{plural} are not in the resource table")))?;
        Ok::<_, ApiError>(shared.store.transact(false, |t| t.list(&resource, None)))
    };
    Ok(Policy {
        cluster_roles: list("clusterroles")?,
        cluster_role_bindings: list("clusterrolebindings")?,
        roles: list("roles")?,
        role_bindings: list("rolebindings")?,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn groups_follow_the_identity() {
        assert_eq!(
            super::groups_of("system:serviceaccount:monitoring:prometheus"),
            ["system:serviceaccounts", "system:serviceaccounts:monitoring", "system:authenticated"]
        );
        assert_eq!(super::groups_of(super::ADMIN_USER), ["system:masters", "system:authenticated"]);
        assert_eq!(super::groups_of("alice"), ["system:authenticated"]);
    }
}
