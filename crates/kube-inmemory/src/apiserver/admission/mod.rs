//! Validating admission: the stored `admissionregistration.k8s.io/v1`
//! ValidatingAdmissionPolicies and their bindings, evaluated on every create, update and
//! delete a client sends (status writes included) before the object is stored, as
//! kube-apiserver's ValidatingAdmissionPolicy plugin evaluates them.
//!
//! For each binding whose policy exists: the policy's `matchConstraints` and the binding's
//! `matchResources` (resource rules with groups, versions, resources and subresources,
//! operations, scope and names; `excludeResourceRules`; namespace and object selectors;
//! `matchPolicy: Equivalent` across the served versions of one resource), the parameters
//! (`paramKind` with the binding's `paramRef` by name or selector, and its
//! `parameterNotFoundAction`), then per parameter the `matchConditions`, the `variables` in
//! order and each validation (`message`, `messageExpression`, `reason`). A failed
//! validation of a `Deny` binding refuses the request with the real server's status:
//! `<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding
//! '<binding>' denied request: <message>`, code from the reason (403 Forbidden, 422
//! Invalid, 401, 413); a `Warn` binding adds a `Warning` header instead; `Audit` has no
//! audit log to write to here. An expression that fails to compile or evaluate fails the
//! request under `failurePolicy: Fail` (the default) and is skipped under `Ignore`.
//!
//! CEL sees `object`, `oldObject` (null on create and delete respectively), `request`
//! (kind, resource, subResource, name, namespace, operation, userInfo with the extra of
//! bound ServiceAccount tokens, dryRun), `params`, `namespaceObject` and `variables`, with
//! the same library as CRD rules (strings, IP and CIDR). Not provided: `authorizer` (an
//! expression using it fails, so a `Fail` policy refuses: closed, not open), type checking
//! of expressions against the schemas, the cost budget, and `auditAnnotations`.
//! Writes to admissionregistration.k8s.io itself are exempt, as upstream (no policy can lock
//! the policies out).

mod evaluate;
mod matching;
mod policy;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::error::ApiError;
use super::resources::ResourceInfo;
use super::reviews::UserInfo;
use super::store::Txn;

use self::evaluate::{Decision, Outcome};
use self::policy::Compiled;

/// The group whose objects configure admission (exempt from it).
const GROUP: &str = "admissionregistration.k8s.io";

/// The operation being admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// A create (also a server-side apply that creates).
    Create,
    /// An update, patch or apply of an existing object (or of its status).
    Update,
    /// A delete.
    Delete,
}

impl Operation {
    /// As `request.operation` and the rules' `operations` spell it.
    fn name(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
        }
    }
}

/// Who makes a write: what admission knows about a request beyond the object.
#[derive(Clone, Copy)]
pub(crate) struct Caller<'a> {
    /// Compiled policies, shared by the server's requests.
    pub(crate) policies: &'a PolicyCache,
    /// The authenticated user.
    pub(crate) user: &'a UserInfo,
    /// `dryRun=All`.
    pub(crate) dry_run: bool,
}

/// Policies compiled once per version: policy uid → (resourceVersion, compiled).
#[derive(Default)]
pub(crate) struct PolicyCache {
    compiled: Mutex<HashMap<String, (String, Arc<Compiled>)>>,
}

impl PolicyCache {
    /// `policy` compiled, from the cache when its version was compiled before.
    fn get(&self, policy: &Value) -> Arc<Compiled> {
        let text = |p: &str| policy.pointer(p).and_then(Value::as_str).unwrap_or_default();
        let (uid, version) = (text("/metadata/uid"), text("/metadata/resourceVersion"));
        let mut cache = self.compiled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((cached_version, compiled)) = cache.get(uid)
            && cached_version == version
        {
            return compiled.clone();
        }
        let compiled = Arc::new(policy::compile(policy));
        cache.insert(uid.to_owned(), (version.to_owned(), compiled.clone()));
        compiled
    }

    /// Forgets policies that are gone.
    fn retain(&self, live: &[Arc<Value>]) {
        let mut cache = self.compiled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() > live.len() {
            let uids: Vec<&str> = live
                .iter()
                .filter_map(|p| p.pointer("/metadata/uid").and_then(Value::as_str))
                .collect();
            cache.retain(|uid, _| uids.contains(&uid.as_str()));
        }
    }
}

/// One write as admission sees it.
pub(crate) struct Write<'a> {
    /// The resource written (the endpoint's version).
    pub(crate) resource: &'a ResourceInfo,
    /// What is done.
    pub(crate) operation: Operation,
    /// `""` or `"status"`.
    pub(crate) subresource: &'a str,
    /// The object to store (None on delete).
    pub(crate) object: Option<&'a Value>,
    /// The stored object (None on create).
    pub(crate) old_object: Option<&'a Value>,
}

impl Write<'_> {
    fn name_and_namespace(&self) -> (String, String) {
        let obj = self.object.or(self.old_object);
        let text = |p: &str| {
            obj.and_then(|o| o.pointer(p)).and_then(Value::as_str).unwrap_or_default().to_owned()
        };
        (text("/metadata/name"), text("/metadata/namespace"))
    }
}

/// Admits `write` by the stored policies: `Ok` with the warnings of `Warn` bindings, or the
/// first refusal of a `Deny` binding. Without a caller (the server's own writes) nothing is
/// checked.
pub(crate) fn admit(
    txn: &Txn<'_>,
    caller: Option<&Caller<'_>>,
    write: &Write<'_>,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    let Some(caller) = caller else { return Ok(()) };
    if write.resource.group == GROUP && write.resource.custom.is_none() {
        return Ok(());
    }
    let lookup = |plural: &str| txn.registry().lookup(GROUP, "v1", plural);
    let (Some(policies), Some(bindings)) =
        (lookup("validatingadmissionpolicies"), lookup("validatingadmissionpolicybindings"))
    else {
        return Ok(());
    };
    let bindings = txn.list(&bindings, None);
    if bindings.is_empty() {
        return Ok(());
    }
    let all_policies = txn.list(&policies, None);
    caller.policies.retain(&all_policies);
    let by_name: HashMap<&str, &Arc<Value>> = all_policies
        .iter()
        .filter_map(|p| Some((p.pointer("/metadata/name")?.as_str()?, p)))
        .collect();
    for binding in &bindings {
        let spec = &binding["spec"];
        let Some(policy) = spec["policyName"].as_str().and_then(|n| by_name.get(n)) else {
            continue;
        };
        let compiled = caller.policies.get(policy);
        let binding_name = binding["metadata"]["name"].as_str().unwrap_or_default();
        let outcome = evaluate::binding(txn, caller, write, &compiled, spec);
        let actions = validation_actions(spec);
        for decision in outcome_decisions(outcome) {
            if actions.contains(&"Warn") {
                warnings.push(format!(
                    "Validation failed for ValidatingAdmissionPolicy '{}' with binding '{binding_name}': {}",
                    compiled.name, decision.message
                ));
            }
            if actions.contains(&"Deny") {
                return Err(denied(write, &compiled.name, binding_name, &decision));
            }
        }
    }
    Ok(())
}

fn validation_actions(binding_spec: &Value) -> Vec<&str> {
    binding_spec["validationActions"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn outcome_decisions(outcome: Outcome) -> Vec<Decision> {
    match outcome {
        Outcome::NotMatched | Outcome::Admitted => Vec::new(),
        Outcome::Refused(decisions) => decisions,
    }
}

/// The real server's refusal: `admission.NewForbidden` with the policy's reason and code,
/// and the message as its one cause.
fn denied(write: &Write<'_>, policy: &str, binding: &str, decision: &Decision) -> ApiError {
    let message = format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {}",
        decision.message
    );
    let (name, _) = write.name_and_namespace();
    let resource = write.resource.qualified();
    let full = if name.is_empty() {
        format!("{resource} is forbidden: {message}")
    } else {
        format!("{resource} \"{name}\" is forbidden: {message}")
    };
    let code = match decision.reason {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    };
    let mut err = ApiError::with(code, decision.reason, full);
    err.details = Some(json!({
        "name": name,
        "group": write.resource.group,
        "kind": write.resource.plural,
        "causes": [{"message": message}],
    }));
    err
}
