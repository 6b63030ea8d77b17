//! `meta.k8s.io/v1` Table rendering, which `kubectl get` asks for (`Accept: ...;as=Table`).

use serde_json::{Value, json};

use super::crd::Column as CustomColumn;
use super::resources::ResourceInfo;

/// Whether the `Accept` header asks for a Table.
pub(crate) fn wants_table(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| first.contains("as=Table"))
}

/// Age as kubectl prints it (`45s`, `3m20s`, `5h`, `2d`).
pub(crate) fn human_age(seconds: i64) -> String {
    if seconds < 0 {
        return "<invalid>".into();
    }
    let (m, h, d) = (seconds / 60, seconds / 3600, seconds / 86400);
    if seconds < 120 {
        format!("{seconds}s")
    } else if m < 10 {
        if seconds % 60 == 0 { format!("{m}m") } else { format!("{m}m{}s", seconds % 60) }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 { format!("{h}h") } else { format!("{h}h{}m", m % 60) }
    } else if h < 48 {
        format!("{h}h")
    } else {
        format!("{d}d")
    }
}

fn age_of(obj: &Value) -> String {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map_or_else(
            || "<unknown>".to_owned(),
            |t| human_age(super::objects::unix_now() - t.as_second()),
        )
}

/// One column: header, `-o wide` only (priority 1), and the cell of an object.
struct Column {
    name: &'static str,
    wide: bool,
    cell: fn(&Value) -> Value,
}

fn text(obj: &Value, pointer: &str) -> Value {
    json!(obj.pointer(pointer).and_then(Value::as_str).unwrap_or("<none>"))
}

/// kubectl's `READY` of a pod: ready containers / containers.
fn pod_ready(obj: &Value) -> Value {
    let total = obj.pointer("/spec/containers").and_then(Value::as_array).map_or(0, Vec::len);
    let statuses = obj.pointer("/status/containerStatuses").and_then(Value::as_array);
    let ready = if let Some(statuses) = statuses {
        statuses.iter().filter(|s| s["ready"] == true).count()
    } else {
        // Without container statuses, the pod's Ready condition stands for all of them.
        let conditions = obj.pointer("/status/conditions").and_then(Value::as_array);
        let ready = conditions
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
        if ready { total } else { 0 }
    };
    json!(format!("{ready}/{total}"))
}

/// kubectl's `STATUS` of a pod: Terminating, the failure reason, or the phase.
fn pod_status(obj: &Value) -> Value {
    if obj.pointer("/metadata/deletionTimestamp").is_some() {
        return json!("Terminating");
    }
    let reason = obj.pointer("/status/reason").and_then(Value::as_str);
    let phase = obj.pointer("/status/phase").and_then(Value::as_str).unwrap_or("Pending");
    json!(reason.unwrap_or(phase))
}

/// kubectl's `STATE` of a claim: `pending`, `allocated`, `allocated,reserved`, `deleted`.
fn claim_state(obj: &Value) -> Value {
    let mut states = Vec::new();
    if obj.pointer("/status/allocation").is_some() {
        states.push("allocated");
    } else {
        states.push("pending");
    }
    if obj.pointer("/status/reservedFor").and_then(Value::as_array).is_some_and(|r| !r.is_empty()) {
        states.push("reserved");
    }
    if obj.pointer("/metadata/deletionTimestamp").is_some() {
        states.push("deleted");
    }
    json!(states.join(","))
}

fn claim_devices(obj: &Value) -> Value {
    let names: Vec<&str> = obj
        .pointer("/status/allocation/devices/results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("device").and_then(Value::as_str))
        .collect();
    json!(if names.is_empty() { "<none>".to_owned() } else { names.join(",") })
}

/// Interfaces and addresses the drivers reported (`status.devices[].networkData`).
fn claim_network(obj: &Value) -> Value {
    let entries: Vec<String> = obj
        .pointer("/status/devices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("networkData"))
        .map(|n| {
            let name = n.get("interfaceName").and_then(Value::as_str).unwrap_or("?");
            let ips: Vec<&str> = n
                .get("ips")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            format!("{name}={}", ips.join("+"))
        })
        .collect();
    json!(if entries.is_empty() { "<none>".to_owned() } else { entries.join(",") })
}

fn slice_devices(obj: &Value) -> Value {
    json!(obj.pointer("/spec/devices").and_then(Value::as_array).map_or(0, Vec::len))
}

/// The columns kubectl shows for `kind` (its built-in printers; Name and Age for the rest).
fn columns(kind: &str) -> Vec<Column> {
    let name = Column { name: "Name", wide: false, cell: |o| text(o, "/metadata/name") };
    let age = Column { name: "Age", wide: false, cell: |o| json!(age_of(o)) };
    match kind {
        "Pod" => vec![
            name,
            Column { name: "Ready", wide: false, cell: pod_ready },
            Column { name: "Status", wide: false, cell: pod_status },
            Column { name: "Restarts", wide: false, cell: |_| json!(0) },
            age,
            Column { name: "IP", wide: true, cell: |o| text(o, "/status/podIP") },
            Column { name: "Node", wide: true, cell: |o| text(o, "/spec/nodeName") },
        ],
        "ResourceClaim" => vec![
            name,
            Column { name: "State", wide: false, cell: claim_state },
            age,
            Column { name: "Devices", wide: true, cell: claim_devices },
            Column { name: "Network", wide: true, cell: claim_network },
        ],
        "ResourceSlice" => vec![
            name,
            Column { name: "Node", wide: false, cell: |o| text(o, "/spec/nodeName") },
            Column { name: "Driver", wide: false, cell: |o| text(o, "/spec/driver") },
            Column { name: "Pool", wide: false, cell: |o| text(o, "/spec/pool/name") },
            age,
            Column { name: "Devices", wide: true, cell: slice_devices },
            Column {
                name: "Generation",
                wide: true,
                cell: |o| o.pointer("/spec/pool/generation").cloned().unwrap_or(Value::Null),
            },
        ],
        "Deployment" => vec![
            name,
            Column { name: "Ready", wide: false, cell: |o| replicas(o, "readyReplicas") },
            Column {
                name: "Up-to-date",
                wide: false,
                cell: |o| count(o, "/status/updatedReplicas"),
            },
            Column {
                name: "Available",
                wide: false,
                cell: |o| count(o, "/status/availableReplicas"),
            },
            age,
            Column { name: "Containers", wide: true, cell: |o| containers(o, "name") },
            Column { name: "Images", wide: true, cell: |o| containers(o, "image") },
        ],
        "DaemonSet" => vec![
            name,
            Column {
                name: "Desired",
                wide: false,
                cell: |o| count(o, "/status/desiredNumberScheduled"),
            },
            Column {
                name: "Current",
                wide: false,
                cell: |o| count(o, "/status/currentNumberScheduled"),
            },
            Column { name: "Ready", wide: false, cell: |o| count(o, "/status/numberReady") },
            Column {
                name: "Available",
                wide: false,
                cell: |o| count(o, "/status/numberAvailable"),
            },
            age,
            Column { name: "Containers", wide: true, cell: |o| containers(o, "name") },
            Column { name: "Images", wide: true, cell: |o| containers(o, "image") },
        ],
        "Service" => vec![
            name,
            Column {
                name: "Type",
                wide: false,
                cell: |o| {
                    json!(o.pointer("/spec/type").and_then(Value::as_str).unwrap_or("ClusterIP"))
                },
            },
            Column { name: "Cluster-IP", wide: false, cell: |o| text(o, "/spec/clusterIP") },
            Column { name: "Port(s)", wide: false, cell: service_ports },
            age,
        ],
        "ConfigMap" | "Secret" => vec![
            name,
            Column {
                name: "Data",
                wide: false,
                cell: |o| {
                    json!(entries(o, "data") + entries(o, "binaryData") + entries(o, "stringData"))
                },
            },
            age,
        ],
        "Event" => event_columns(),
        _ => vec![name, age],
    }
}

/// kubectl's columns for Events (core/v1 and events.k8s.io/v1 share the kind; each cell reads
/// the core field first, then the events.k8s.io one).
fn event_columns() -> Vec<Column> {
    vec![
        Column { name: "Last Seen", wide: false, cell: event_last_seen },
        Column { name: "Type", wide: false, cell: |o| text(o, "/type") },
        Column { name: "Reason", wide: false, cell: |o| text(o, "/reason") },
        Column { name: "Object", wide: false, cell: event_object },
        Column {
            name: "Subobject",
            wide: true,
            cell: |o| json!(first_text(o, &["/involvedObject/fieldPath", "/regarding/fieldPath"])),
        },
        Column { name: "Source", wide: true, cell: event_source },
        Column {
            name: "Message",
            wide: false,
            cell: |o| json!(first_text(o, &["/message", "/note"]).trim()),
        },
        Column { name: "First Seen", wide: true, cell: event_first_seen },
        Column { name: "Count", wide: true, cell: event_count },
        Column { name: "Name", wide: true, cell: |o| text(o, "/metadata/name") },
    ]
}

/// The first of `pointers` that holds a non-empty string ("" when none does).
fn first_text<'a>(obj: &'a Value, pointers: &[&str]) -> &'a str {
    pointers
        .iter()
        .filter_map(|p| obj.pointer(p).and_then(Value::as_str))
        .find(|s| !s.is_empty())
        .unwrap_or("")
}

/// How long ago the first of `pointers` holding a timestamp was, as kubectl prints ages.
fn age_at(obj: &Value, pointers: &[&str]) -> Value {
    let seen = pointers
        .iter()
        .filter_map(|p| obj.pointer(p).and_then(Value::as_str))
        .find_map(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok());
    json!(seen.map_or_else(
        || "<unknown>".to_owned(),
        |t| human_age(super::objects::unix_now() - t.as_second())
    ))
}

/// A series' last observation, else the last timestamp, else the event time.
fn event_last_seen(obj: &Value) -> Value {
    age_at(
        obj,
        &[
            "/series/lastObservedTime",
            "/lastTimestamp",
            "/deprecatedLastTimestamp",
            "/eventTime",
            "/metadata/creationTimestamp",
        ],
    )
}

fn event_first_seen(obj: &Value) -> Value {
    age_at(
        obj,
        &[
            "/firstTimestamp",
            "/deprecatedFirstTimestamp",
            "/eventTime",
            "/metadata/creationTimestamp",
        ],
    )
}

/// `kind/name` of the object the event is about, the kind in lower case as kubectl shows it.
fn event_object(obj: &Value) -> Value {
    let kind = first_text(obj, &["/involvedObject/kind", "/regarding/kind"]).to_lowercase();
    let name = first_text(obj, &["/involvedObject/name", "/regarding/name"]);
    json!(format!("{kind}/{name}"))
}

/// The reporting component (the reporting controller when no source was written), with the
/// host after a comma when one was.
fn event_source(obj: &Value) -> Value {
    let component = first_text(
        obj,
        &[
            "/source/component",
            "/deprecatedSource/component",
            "/reportingController",
            "/reportingComponent",
        ],
    );
    let host = first_text(obj, &["/source/host", "/deprecatedSource/host"]);
    json!(if host.is_empty() { component.to_owned() } else { format!("{component}, {host}") })
}

/// A series' count, else the event's count, else 1.
fn event_count(obj: &Value) -> Value {
    let count = ["/series/count", "/count", "/deprecatedCount"]
        .iter()
        .filter_map(|p| obj.pointer(p).and_then(Value::as_i64))
        .find(|n| *n > 0)
        .unwrap_or(1);
    json!(count)
}

/// A count from the status (0 when the status has none: no controller fills it here).
fn count(obj: &Value, pointer: &str) -> Value {
    json!(obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0))
}

/// kubectl's `READY` of a workload: `<status field>/<spec.replicas>` (1 by default).
fn replicas(obj: &Value, status_field: &str) -> Value {
    let want = obj.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let have = obj.pointer(&format!("/status/{status_field}")).and_then(Value::as_i64);
    json!(format!("{}/{want}", have.unwrap_or(0)))
}

/// A field of each container of a workload's pod template, comma-separated.
fn containers(obj: &Value, field: &str) -> Value {
    let items = obj.pointer("/spec/template/spec/containers").and_then(Value::as_array);
    let values: Vec<&str> =
        items.into_iter().flatten().filter_map(|c| c.get(field)?.as_str()).collect();
    json!(values.join(","))
}

fn entries(obj: &Value, field: &str) -> usize {
    obj.get(field).and_then(Value::as_object).map_or(0, serde_json::Map::len)
}

/// `80/TCP,443:30443/TCP`, as kubectl prints a Service's ports.
fn service_ports(obj: &Value) -> Value {
    let ports = obj.pointer("/spec/ports").and_then(Value::as_array);
    let shown: Vec<String> = ports
        .into_iter()
        .flatten()
        .map(|p| {
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            let protocol = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            match p.get("nodePort").and_then(Value::as_i64) {
                Some(node) => format!("{port}:{node}/{protocol}"),
                None => format!("{port}/{protocol}"),
            }
        })
        .collect();
    json!(if shown.is_empty() { "<none>".to_owned() } else { shown.join(",") })
}

fn row_object(o: &Value, include_object: bool) -> Value {
    if include_object {
        o.clone()
    } else {
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]})
    }
}

fn table_doc(resource_version: &str, definitions: &[Value], rows: &[Value]) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

/// A Table of `objects` of `resource` with kubectl's columns for it (a custom resource's
/// `additionalPrinterColumns`). `include_object` selects whether rows carry the full
/// object or only its metadata (`includeObject=Object|Metadata`).
pub(crate) fn table(
    resource: &ResourceInfo,
    objects: &[&Value],
    resource_version: &str,
    include_object: bool,
) -> Value {
    if let Some(custom) = &resource.custom {
        return custom_table(&custom.columns, objects, resource_version, include_object);
    }
    if resource.kind == "CustomResourceDefinition" {
        let rows: Vec<Value> = objects
            .iter()
            .map(|o| {
                let cells =
                    json!([text(o, "/metadata/name"), text(o, "/metadata/creationTimestamp")]);
                json!({"cells": cells, "object": row_object(o, include_object)})
            })
            .collect();
        let definitions = vec![
            json!({"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}),
            json!({"name": "Created At", "type": "date", "format": "", "description": "", "priority": 0}),
        ];
        return table_doc(resource_version, &definitions, &rows);
    }
    let kind = resource.kind.as_str();
    let columns = columns(kind);
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let cells: Vec<Value> = columns.iter().map(|c| (c.cell)(o)).collect();
            json!({"cells": cells, "object": row_object(o, include_object)})
        })
        .collect();
    let definitions: Vec<Value> = columns
        .iter()
        .map(|c| {
            let format = if c.name == "Name" { "name" } else { "" };
            let kind = if c.name == "Restarts" || c.name == "Devices" && kind == "ResourceSlice" || c.name == "Generation" { "integer" } else { "string" };
            json!({"name": c.name, "type": kind, "format": format, "description": "", "priority": i32::from(c.wide)})
        })
        .collect();
    table_doc(resource_version, &definitions, &rows)
}

/// One cell of a custom column, as the real server's table convertor renders it:
/// strings through JSONPath printing (lists and maps as JSON), dates as ages, numbers
/// and booleans as they are; missing values as null.
fn custom_cell(column: &CustomColumn, obj: &Value) -> Value {
    let Some(value) = column.path.find(obj).into_iter().next() else {
        return Value::Null;
    };
    match (column.ty.as_str(), value) {
        ("string", Value::String(s)) => json!(s),
        ("string", Value::Null) => Value::Null,
        ("string", other) => json!(other.to_string()),
        ("integer", Value::Number(n)) => {
            // As Go's int64(float64): truncated.
            #[allow(clippy::cast_possible_truncation, reason = "upstream truncates too")]
            let truncated = n.as_f64().map(|f| f as i64);
            n.as_i64().map_or_else(|| json!(truncated), |i| json!(i))
        }
        ("number", Value::Number(n)) => json!(n.as_f64()),
        ("boolean", Value::Bool(b)) => json!(b),
        ("date", Value::String(s)) => match s.parse::<k8s_openapi::jiff::Timestamp>() {
            Ok(t) => json!(human_age(super::objects::unix_now() - t.as_second())),
            Err(_) => json!("<invalid>"),
        },
        _ => Value::Null,
    }
}

fn custom_table(
    columns: &[CustomColumn],
    objects: &[&Value],
    resource_version: &str,
    include_object: bool,
) -> Value {
    let name = json!({"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0});
    // Without printer columns a custom resource shows its age, as upstream.
    if columns.is_empty() {
        let rows: Vec<Value> = objects
            .iter()
            .map(|o| {
                let cells = json!([text(o, "/metadata/name"), age_of(o)]);
                json!({"cells": cells, "object": row_object(o, include_object)})
            })
            .collect();
        let age =
            json!({"name": "Age", "type": "date", "format": "", "description": "", "priority": 0});
        return table_doc(resource_version, &[name, age], &rows);
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![text(o, "/metadata/name")];
            cells.extend(columns.iter().map(|c| custom_cell(c, o)));
            json!({"cells": cells, "object": row_object(o, include_object)})
        })
        .collect();
    let mut definitions = vec![name];
    definitions.extend(columns.iter().map(|c| {
        json!({"name": c.name, "type": c.ty, "format": c.format, "description": c.description, "priority": c.priority})
    }));
    table_doc(resource_version, &definitions, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_like_kubectl() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(200), "3m20s");
        assert_eq!(human_age(600), "10m");
        assert_eq!(human_age(4 * 3600 + 60), "4h1m");
        assert_eq!(human_age(10 * 3600), "10h");
        assert_eq!(human_age(3 * 86400), "3d");
    }

    #[test]
    fn pods_and_claims_get_kubectls_columns() {
        let pod = json!({
            "metadata": {"name": "p1", "creationTimestamp": "2026-11-22T10:00:00Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "a"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        });
        let pods = super::super::resources::built_in_resource("", "v1", "pods").unwrap();
        let claims =
            super::super::resources::built_in_resource("resource.k8s.io", "v1", "resourceclaims")
                .unwrap();
        let t = table(&pods, &[&pod], "5", false);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Name", "Ready", "Status", "Restarts", "Age", "IP", "Node"]);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(
            (&cells[0], &cells[1], &cells[2], &cells[6]),
            (&json!("p1"), &json!("1/1"), &json!("Running"), &json!("n1"))
        );
        assert_eq!(t["columnDefinitions"][6]["priority"], 1);

        let claim = json!({
            "metadata": {"name": "c1"},
            "status": {
                "allocation": {"devices": {"results": [{"device": "eth1"}]}},
                "reservedFor": [{"resource": "pods", "name": "p1", "uid": "u"}],
                "devices": [{"networkData": {"interfaceName": "net1", "ips": ["10.0.0.2/24"]}}],
            },
        });
        let cells = &table(&claims, &[&claim], "5", false)["rows"][0]["cells"];
        assert_eq!(cells[1], "allocated,reserved");
        assert_eq!(cells[3], "eth1");
        assert_eq!(cells[4], "net1=10.0.0.2/24");
        let leases =
            super::super::resources::built_in_resource("coordination.k8s.io", "v1", "leases")
                .unwrap();
        let cells = &table(&leases, &[&claim], "5", false)["rows"][0]["cells"];
        assert_eq!(cells.as_array().unwrap().len(), 2);
    }

    #[test]
    fn events_get_kubectls_columns_from_either_api() {
        let core = json!({
            "metadata": {"name": "ghost.1"},
            "involvedObject": {"kind": "Pod", "name": "ghost"},
            "type": "Warning",
            "reason": "FailedScheduling",
            "message": "0/1 nodes are available. ",
            "source": {"component": "netclaim-dev-allocator"},
            "series": {"count": 3, "lastObservedTime": "2026-11-22T10:00:00.000000Z"},
        });
        let events = super::super::resources::built_in_resource("", "v1", "events").unwrap();
        let t = table(&events, &[&core], "5", false);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "Last Seen",
                "Type",
                "Reason",
                "Object",
                "Subobject",
                "Source",
                "Message",
                "First Seen",
                "Count",
                "Name"
            ]
        );
        let cells = &t["rows"][0]["cells"];
        assert_eq!(
            (&cells[1], &cells[2], &cells[3], &cells[5], &cells[6], &cells[8]),
            (
                &json!("Warning"),
                &json!("FailedScheduling"),
                &json!("pod/ghost"),
                &json!("netclaim-dev-allocator"),
                &json!("0/1 nodes are available."),
                &json!(3)
            )
        );
        let modern = json!({
            "metadata": {"name": "e"},
            "regarding": {"kind": "PodNetwork", "name": "medianet"},
            "note": "lost",
            "reportingController": "netclaim.dev/node",
        });
        let events =
            super::super::resources::built_in_resource("events.k8s.io", "v1", "events").unwrap();
        let cells = &table(&events, &[&modern], "5", false)["rows"][0]["cells"];
        assert_eq!(
            (&cells[3], &cells[5], &cells[6], &cells[8]),
            (&json!("podnetwork/medianet"), &json!("netclaim.dev/node"), &json!("lost"), &json!(1))
        );
    }

    #[test]
    fn table_accept_detection() {
        assert!(wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"));
        assert!(!wants_table("application/json"));
    }
}
