//! Request bodies in `application/vnd.kubernetes.protobuf`, decoded into the JSON objects
//! the server stores.
//!
//! kubectl's typed clients (`kubectl create namespace|configmap|secret|deployment|service|
//! serviceaccount|role|rolebinding|clusterrole|clusterrolebinding|job|cronjob|pdb|
//! priorityclass|token`) encode built-in kinds as protobuf whatever discovery says, and
//! client-go falls back to JSON after a 415 only for CBOR: a server that refuses protobuf
//! makes those commands fail. The schema is
//! `proto/kubectl_create.proto`, the subset of the upstream `generated.proto` files those
//! commands fill; a field outside it is refused (400) rather than dropped.
//!
//! The JSON follows what the Go types marshal to: `Time` as RFC 3339 (the zero time left
//! out, as `creationTimestamp: null` means nothing), `Quantity` and `IntOrString` as their
//! scalar, `bytes` as base64, `RawExtension`/`FieldsV1` as their embedded JSON. Empty
//! strings, zeros and false are left out except in fields that are pointers in Go: Go's
//! protobuf encoder writes every non-pointer field, set or not, where its JSON encoder
//! leaves the zero ones out (`omitempty`) and the server reads zero and absent alike.

use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, DynamicMessage, MapKey, MessageDescriptor, ReflectMessage};
use serde_json::{Map, Value};

use super::error::ApiError;

/// The media type of Kubernetes' protobuf encoding.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Every protobuf body starts with these 4 bytes, then a `runtime.Unknown` envelope.
const MAGIC: &[u8] = b"k8s\0";

/// The package of `proto/kubectl_create.proto`.
const PACKAGE: &str = "netclaim.k8s";

/// The kinds decoded, by `apiVersion`: the ones kubectl creates with typed clients and this
/// server serves.
const KINDS: &[(&str, &[&str])] = &[
    ("v1", &["Namespace", "ConfigMap", "Secret", "ServiceAccount", "Service"]),
    ("apps/v1", &["Deployment"]),
    ("batch/v1", &["Job", "CronJob"]),
    ("policy/v1", &["PodDisruptionBudget"]),
    ("scheduling.k8s.io/v1", &["PriorityClass"]),
    ("rbac.authorization.k8s.io/v1", &["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]),
    // `kubectl create token` (the serviceaccounts/token subresource).
    ("authentication.k8s.io/v1", &["TokenRequest"]),
];

static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(
        include_bytes!(concat!(env!("OUT_DIR"), "/kubectl_create.bin")).as_slice(),
    )
    .expect("build.rs encodes the descriptor set protox compiled, which decodes")
});

fn message(name: &str) -> Option<MessageDescriptor> {
    POOL.get_message_by_name(&format!("{PACKAGE}.{name}"))
}

fn refused(message: String) -> ApiError {
    ApiError::with(415, "UnsupportedMediaType", message)
}

/// Decodes a protobuf request body into the object's JSON (with `apiVersion` and `kind`).
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let rest = body.strip_prefix(MAGIC).ok_or_else(|| {
        ApiError::bad_request("a protobuf body must start with the 4 bytes \"k8s\\x00\"")
    })?;
    let envelope_type = message("Unknown").ok_or_else(|| ApiError::internal("no Unknown type"))?;
    let envelope = DynamicMessage::decode(envelope_type, rest)
        .map_err(|e| ApiError::bad_request(format!("error decoding protobuf envelope: {e}")))?;
    let text = |m: &DynamicMessage, field: &str| {
        m.get_field_by_name(field).and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    };
    let type_meta = envelope
        .get_field_by_name("typeMeta")
        .and_then(|v| v.as_message().cloned())
        .unwrap_or_else(|| DynamicMessage::new(envelope.descriptor()));
    let (api_version, kind) = (text(&type_meta, "apiVersion"), text(&type_meta, "kind"));
    let encoding = text(&envelope, "contentEncoding");
    if !encoding.is_empty() {
        return Err(refused(format!("protobuf content encoding {encoding:?} is not supported")));
    }
    let known = KINDS
        .iter()
        .any(|(version, kinds)| *version == api_version && kinds.contains(&kind.as_str()));
    let descriptor = message(&kind).filter(|_| known).ok_or_else(|| {
        refused(format!(
            "this dev API server decodes protobuf only for the kinds kubectl creates imperatively ({}); send {api_version} {kind} as application/json (kubectl create -f or kubectl apply -f)",
            KINDS.iter().flat_map(|(_, k)| k.iter().copied()).collect::<Vec<_>>().join(", ")
        ))
    })?;
    let raw = envelope.get_field_by_name("raw").and_then(|v| v.as_bytes().cloned());
    let object = DynamicMessage::decode(descriptor, raw.unwrap_or_default())
        .map_err(|e| ApiError::bad_request(format!("error decoding protobuf {kind}: {e}")))?;
    let mut json = to_json(&object, &kind)
        .map_err(|field| {
            ApiError::bad_request(format!(
                "{kind}: field {field} is not decoded from protobuf by this dev API server; send the object as JSON (kubectl create -f or kubectl apply -f)"
            ))
        })?
        .unwrap_or_else(|| Value::Object(Map::new()));
    json["apiVersion"] = Value::String(api_version);
    json["kind"] = Value::String(kind);
    Ok(json)
}

/// A message as JSON (`None`: a zero `Time`, left out); `Err` names the path of a field
/// the schema does not know.
fn to_json(msg: &DynamicMessage, path: &str) -> Result<Option<Value>, String> {
    if let Some(unknown) = msg.unknown_fields().next() {
        return Err(format!("{path} (#{})", unknown.number()));
    }
    let field = |name: &str| msg.get_field_by_name(name);
    match msg.descriptor().name() {
        "Time" | "MicroTime" => {
            let seconds = field("seconds").and_then(|v| v.as_i64()).unwrap_or_default();
            let nanos = field("nanos").and_then(|v| v.as_i32()).unwrap_or_default();
            if seconds == 0 && nanos == 0 {
                return Ok(None);
            }
            let time = k8s_openapi::jiff::Timestamp::new(seconds, nanos)
                .map_err(|_| format!("{path} (a time out of range)"))?;
            let text = if msg.descriptor().name() == "Time" {
                time.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
            } else {
                time.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
            };
            return Ok(Some(Value::String(text)));
        }
        "Quantity" => {
            let text = field("string").and_then(|v| v.as_str().map(str::to_owned));
            return Ok(Some(Value::String(text.unwrap_or_default())));
        }
        // k8s.io/apimachinery/pkg/util/intstr: type 0 is an int, 1 a string.
        "IntOrString" => {
            return Ok(Some(if field("type").and_then(|v| v.as_i64()) == Some(1) {
                Value::String(
                    field("strVal").and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
                )
            } else {
                Value::from(field("intVal").and_then(|v| v.as_i32()).unwrap_or_default())
            }));
        }
        "RawExtension" | "FieldsV1" => {
            let raw = field("raw").and_then(|v| v.as_bytes().cloned()).unwrap_or_default();
            if raw.is_empty() {
                return Ok(None);
            }
            return serde_json::from_slice(&raw)
                .map(Some)
                .map_err(|_| format!("{path}.raw (not JSON)"));
        }
        _ => {}
    }
    let mut out = Map::new();
    for (desc, value) in msg.fields() {
        let name = desc.name();
        let at = format!("{path}.{name}");
        if is_zero(value) && !KEEP_ZERO.contains(&name) {
            continue;
        }
        if let Some(json) = value_json(value, &at)? {
            out.insert(name.to_owned(), json);
        }
    }
    Ok(Some(Value::Object(out)))
}

/// The scalar fields of the schema that are pointers in the Go types (`*int32`, `*bool`),
/// where zero or false is a value the user chose (`replicas: 0`, `immutable: false`),
/// unlike the other scalars, whose zero Go's protobuf encoder writes and its JSON encoder
/// leaves out.
const KEEP_ZERO: &[&str] = &[
    "activeDeadlineSeconds",
    "allocateLoadBalancerNodePorts",
    "automountServiceAccountToken",
    "backoffLimit",
    "backoffLimitPerIndex",
    "blockOwnerDeletion",
    "collisionCount",
    "completions",
    "controller",
    "deletionGracePeriodSeconds",
    "enableServiceLinks",
    "failedJobsHistoryLimit",
    "hostUsers",
    "immutable",
    "manualSelector",
    "maxFailedIndexes",
    "parallelism",
    "priority",
    "progressDeadlineSeconds",
    "ready",
    "replicas",
    "revisionHistoryLimit",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "startingDeadlineSeconds",
    "successfulJobsHistoryLimit",
    "suspend",
    "terminating",
    "terminatingReplicas",
    "terminationGracePeriodSeconds",
    "timeoutSeconds",
    "ttlSecondsAfterFinished",
];

/// An empty string, zero number or false: what a non-pointer Go field holds when unset.
fn is_zero(value: &prost_reflect::Value) -> bool {
    use prost_reflect::Value as P;
    match value {
        P::String(s) => s.is_empty(),
        P::Bool(b) => !b,
        P::I32(n) | P::EnumNumber(n) => *n == 0,
        P::I64(n) => *n == 0,
        P::U32(n) => *n == 0,
        P::U64(n) => *n == 0,
        _ => false,
    }
}

fn value_json(value: &prost_reflect::Value, path: &str) -> Result<Option<Value>, String> {
    use prost_reflect::Value as P;
    Ok(Some(match value {
        P::Bool(b) => Value::Bool(*b),
        P::I32(n) | P::EnumNumber(n) => Value::from(*n),
        P::I64(n) => Value::from(*n),
        P::U32(n) => Value::from(*n),
        P::U64(n) => Value::from(*n),
        P::F32(n) => Value::from(f64::from(*n)),
        P::F64(n) => Value::from(*n),
        P::String(s) => Value::String(s.clone()),
        // Go marshals []byte as standard base64, as `Secret.data` is served.
        P::Bytes(b) => serde_json::to_value(k8s_openapi::ByteString(b.to_vec()))
            .map_err(|_| format!("{path} (bytes)"))?,
        P::Message(m) => return to_json(m, path),
        P::List(items) => Value::Array(
            items
                .iter()
                .map(|item| Ok(value_json(item, &format!("{path}[]"))?.unwrap_or(Value::Null)))
                .collect::<Result<_, String>>()?,
        ),
        P::Map(entries) => {
            let mut out = Map::new();
            for (key, item) in entries {
                let key = match key {
                    MapKey::String(s) => s.clone(),
                    MapKey::Bool(b) => b.to_string(),
                    MapKey::I32(n) => n.to_string(),
                    MapKey::I64(n) => n.to_string(),
                    MapKey::U32(n) => n.to_string(),
                    MapKey::U64(n) => n.to_string(),
                };
                let at = format!("{path}[{key}]");
                out.insert(key, value_json(item, &at)?.unwrap_or(Value::Null));
            }
            Value::Object(out)
        }
    }))
}

#[cfg(test)]
mod tests {
    use prost_reflect::Value as P;
    use prost_reflect::prost::Message as _;

    use super::*;

    fn msg(name: &str, fields: Vec<(&str, P)>) -> DynamicMessage {
        let mut m = DynamicMessage::new(message(name).unwrap());
        for (field, value) in fields {
            m.set_field_by_name(field, value);
        }
        m
    }

    /// `object` of `kind` in the envelope kubectl sends.
    fn body(api_version: &str, kind: &str, object: &DynamicMessage) -> Vec<u8> {
        let type_meta = msg(
            "TypeMeta",
            vec![("apiVersion", P::String(api_version.into())), ("kind", P::String(kind.into()))],
        );
        let envelope = msg(
            "Unknown",
            vec![
                ("typeMeta", P::Message(type_meta)),
                ("raw", P::Bytes(object.encode_to_vec().into())),
            ],
        );
        [MAGIC, envelope.encode_to_vec().as_slice()].concat()
    }

    #[test]
    fn go_zero_values_are_left_out_but_chosen_zeros_stay() {
        // As Go encodes a Deployment: every non-pointer field written, zero or not.
        let meta = msg(
            "ObjectMeta",
            vec![
                ("name", P::String("web".into())),
                ("generateName", P::String(String::new())),
                ("generation", P::I64(0)),
                ("creationTimestamp", P::Message(msg("Time", vec![]))),
            ],
        );
        let spec = msg(
            "DeploymentSpec",
            vec![
                ("replicas", P::I32(0)),
                ("paused", P::Bool(false)),
                ("minReadySeconds", P::I32(0)),
            ],
        );
        let deployment =
            msg("Deployment", vec![("metadata", P::Message(meta)), ("spec", P::Message(spec))]);
        let json = decode(&body("apps/v1", "Deployment", &deployment)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web"}, "spec": {"replicas": 0}})
        );
    }

    #[test]
    fn kubernetes_scalars_become_their_json() {
        let time = msg("Time", vec![("seconds", P::I64(1_700_000_000))]);
        let meta = msg(
            "ObjectMeta",
            vec![("name", P::String("s".into())), ("creationTimestamp", P::Message(time))],
        );
        let port = msg(
            "ServicePort",
            vec![
                ("port", P::I32(80)),
                (
                    "targetPort",
                    P::Message(msg(
                        "IntOrString",
                        vec![("type", P::I64(1)), ("strVal", P::String("http".into()))],
                    )),
                ),
            ],
        );
        let service = msg(
            "Service",
            vec![
                ("metadata", P::Message(meta)),
                (
                    "spec",
                    P::Message(msg(
                        "ServiceSpec",
                        vec![("ports", P::List(vec![P::Message(port)]))],
                    )),
                ),
            ],
        );
        let json = decode(&body("v1", "Service", &service)).unwrap();
        assert_eq!(json["metadata"]["creationTimestamp"], "2023-11-14T22:13:20Z");
        assert_eq!(json["spec"]["ports"][0], serde_json::json!({"port": 80, "targetPort": "http"}));
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused() {
        // Field 99 of a ConfigMap is not in the schema: refused, not dropped.
        let mut raw = msg("ConfigMap", vec![]).encode_to_vec();
        raw.extend_from_slice(&[0x98, 0x06, 0x01]);
        let envelope = msg(
            "Unknown",
            vec![
                (
                    "typeMeta",
                    P::Message(msg(
                        "TypeMeta",
                        vec![
                            ("apiVersion", P::String("v1".into())),
                            ("kind", P::String("ConfigMap".into())),
                        ],
                    )),
                ),
                ("raw", P::Bytes(raw.into())),
            ],
        );
        let err = decode(&[MAGIC, envelope.encode_to_vec().as_slice()].concat()).unwrap_err();
        assert_eq!(err.code, 400, "{}", err.message);
        assert!(err.message.contains("ConfigMap (#99)"), "{}", err.message);
        let err = decode(&body("v1", "Pod", &msg("ConfigMap", vec![]))).unwrap_err();
        assert_eq!(err.code, 415, "{}", err.message);
        assert_eq!(decode(b"{}").unwrap_err().code, 400);
    }
}
