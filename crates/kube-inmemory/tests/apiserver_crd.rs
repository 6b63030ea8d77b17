//! CustomResourceDefinitions against the real kube client: installing a definition
//! (status, discovery), CRUD, watch, field selectors and the status subresource of its
//! objects, pruning and defaults, each schema keyword accepted and rejected with the real
//! server's causes, CEL rules (immutability, append-only lists, the IP/CIDR library,
//! messageExpression, fieldPath, reason, optionalOldSelf, runtime errors), definitions
//! refused (not structural, a rule that does not compile, clashing names), several
//! versions, server-side apply with the schema's list types, and deleting a definition.
#![allow(clippy::unwrap_used, reason = "test helpers: a failed setup step should panic")]
#![allow(clippy::too_many_lines, reason = "each test is one scenario told step by step")]

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube_inmemory::apiserver::{ApiServer, ServerOptions, start};
use serde_json::{Value, json};

async fn server() -> (ApiServer, kube::Client) {
    let srv = start("127.0.0.1:0".parse().unwrap(), ServerOptions::default()).await.unwrap();
    let config = kube::Config::new(srv.url().parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    (srv, client)
}

fn api_status(err: kube::Error) -> Box<kube::core::Status> {
    match err {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// `(reason, field, message)` of every cause of a 422.
fn causes(status: &kube::core::Status) -> Vec<(String, String, String)> {
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"), "{status:?}");
    status
        .details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| (c.reason.clone(), c.field.clone(), c.message.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A cluster-scoped `Widget` (group example.com) exercising most of what a definition
/// can say.
const WIDGETS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Cluster
  names: {kind: Widget, plural: widgets, singular: widget, shortNames: [wd], categories: [things]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    selectableFields:
    - jsonPath: .spec.owner
    additionalPrinterColumns:
    - {name: Owner, type: string, jsonPath: .spec.owner}
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Ready, type: string, jsonPath: '.status.conditions[?(@.type=="Ready")].status'}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        required: [spec]
        properties:
          spec:
            type: object
            required: [owner]
            x-kubernetes-validations:
            - rule: "self.owner == oldSelf.owner"
              message: "owner is immutable"
              fieldPath: .owner
            - rule: "oldSelf.tags.all(t, t in self.tags)"
              message: "tags may only be added"
              fieldPath: .tags
            - rule: "!has(self.gateway) || self.subnets.exists(s, cidr(s).containsIP(ip(self.gateway)))"
              messageExpression: "'gateway ' + self.gateway + ' is in none of the subnets'"
              fieldPath: .gateway
            - rule: "self.size <= 100 || self.owner == 'admin'"
              message: "only admin may have big widgets"
              reason: FieldValueForbidden
            properties:
              owner: {type: string, minLength: 1, maxLength: 20}
              size: {type: integer, default: 1, minimum: 1, maximum: 1000}
              color: {type: string, enum: [red, green, blue], default: red}
              tags:
                type: array
                default: []
                x-kubernetes-list-type: set
                items: {type: string}
              subnets:
                type: array
                default: []
                x-kubernetes-list-type: set
                items:
                  type: string
                  x-kubernetes-validations:
                  - rule: "isCIDR(self)"
                    message: "must be a CIDR"
                  - rule: "!isCIDR(self) || cidr(self).masked() == cidr(self)"
                    message: "must be in network form"
              gateway: {type: string}
              limits:
                type: object
                default: {}
                properties:
                  cpu: {type: integer, default: 2}
              extra:
                type: object
                x-kubernetes-preserve-unknown-fields: true
          status:
            type: object
            properties:
              phase: {type: string}
              conditions:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [type]
                items:
                  type: object
                  required: [type, status]
                  properties:
                    type: {type: string}
                    status: {type: string, enum: ["True", "False", "Unknown"]}
                    lastTransitionTime: {type: string, format: date-time}
"#;

fn crd(yaml: &str) -> CustomResourceDefinition {
    yaml_serde::from_str(yaml).unwrap()
}

fn widgets(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    );
    Api::all_with(client.clone(), &ar)
}

fn widget(name: &str, spec: &Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

async fn install(client: &kube::Client, yaml: &str) -> CustomResourceDefinition {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd(yaml)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installs_a_definition_and_serves_its_resource() {
    let (srv, client) = server().await;
    let created = install(&client, WIDGETS).await;
    let status = created.status.unwrap();
    let conditions = status.conditions.unwrap();
    for ty in ["Established", "NamesAccepted"] {
        let c = conditions.iter().find(|c| c.type_ == ty).unwrap();
        assert_eq!(c.status, "True", "{ty}");
    }
    let accepted = status.accepted_names.unwrap();
    assert_eq!(accepted.kind, "Widget");
    assert_eq!(accepted.list_kind.as_deref(), Some("WidgetList"));
    assert_eq!(status.stored_versions, Some(vec!["v1".to_owned()]));

    // Discovery: the group, its version, and the resource with its names.
    let groups = client.list_api_groups().await.unwrap();
    let group = groups.groups.iter().find(|g| g.name == "example.com").unwrap();
    assert_eq!(group.preferred_version.as_ref().unwrap().version, "v1");
    let list = client.list_api_group_resources("example.com/v1").await.unwrap();
    let res = list.resources.iter().find(|r| r.name == "widgets").unwrap();
    assert_eq!(
        (res.kind.as_str(), res.singular_name.as_str(), res.namespaced),
        ("Widget", "widget", false)
    );
    assert_eq!(res.short_names, Some(vec!["wd".to_owned()]));
    assert_eq!(res.categories, Some(vec!["things".to_owned()]));
    assert!(res.verbs.iter().any(|v| v == "watch"));
    assert!(list.resources.iter().any(|r| r.name == "widgets/status"));

    // CRUD, with the status subresource's rules and generations.
    let api = widgets(&client);
    let mut w = widget("w1", &json!({"owner": "ann", "tags": ["a"]}));
    w.data["status"] = json!({"phase": "ignored"});
    let created_w1 = api.create(&PostParams::default(), &w).await.unwrap();
    assert!(created_w1.data.get("status").is_none(), "status is reset on create");
    assert_eq!(created_w1.metadata.generation, Some(1));
    assert_eq!(created_w1.data["spec"]["size"], 1, "defaulted");
    let status_written = api
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}, "spec": {"size": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(
        (
            status_written.data["status"]["phase"].clone(),
            status_written.data["spec"]["size"].clone()
        ),
        (json!("Ready"), json!(1))
    );
    assert_eq!(status_written.metadata.generation, Some(1), "status writes keep the generation");
    // A status write is validated against the status schema (and its list types).
    let bad_status = json!({"status": {"conditions": [{"type": "Ready", "status": "Maybe"}]}});
    let err = api_status(
        api.patch_status("w1", &PatchParams::default(), &Patch::Merge(bad_status))
            .await
            .unwrap_err(),
    );
    // (Then the cause upstream adds when a blocking error keeps the CEL rules from running.)
    let got = causes(&err);
    assert_eq!(
        got[0],
        (
            "FieldValueNotSupported".to_owned(),
            "status.conditions[0].status".to_owned(),
            "Unsupported value: \"Maybe\": supported values: \"True\", \"False\", \"Unknown\""
                .to_owned()
        )
    );
    assert_eq!(got[1].1, "<nil>");
    let twice = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Ready", "status": "False"}]}});
    let err = api_status(
        api.patch_status("w1", &PatchParams::default(), &Patch::Merge(twice)).await.unwrap_err(),
    );
    assert_eq!(causes(&err)[0].1, "status.conditions[1]");
    let spec_written = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}, "status": {"phase": "x"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        (spec_written.data["status"]["phase"].clone(), spec_written.data["spec"]["size"].clone()),
        (json!("Ready"), json!(5))
    );
    assert_eq!(spec_written.metadata.generation, Some(2));
    let mut stale = spec_written.clone();
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await
    .unwrap();
    stale.data["spec"]["size"] = json!(6);
    let err = api_status(api.replace("w1", &PostParams::default(), &stale).await.unwrap_err());
    assert_eq!(err.code, 409);
    let sm = api
        .patch("w1", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"size": 6}})))
        .await
        .unwrap_err();
    assert_eq!(api_status(sm).code, 415, "no strategic merge patch for custom resources");

    // Field selectors: the declared field, and a 400 for any other.
    api.create(&PostParams::default(), &widget("w2", &json!({"owner": "bob"}))).await.unwrap();
    let names = |l: kube::core::ObjectList<DynamicObject>| -> Vec<String> {
        l.items.into_iter().map(|o| o.metadata.name.unwrap()).collect()
    };
    assert_eq!(
        names(api.list(&ListParams::default().fields("spec.owner=bob")).await.unwrap()),
        ["w2"]
    );
    assert_eq!(
        names(api.list(&ListParams::default().fields("spec.owner!=bob")).await.unwrap()),
        ["w1"]
    );
    assert_eq!(
        names(api.list(&ListParams::default().fields("metadata.name=w1")).await.unwrap()),
        ["w1"]
    );
    let bad = api_status(api.list(&ListParams::default().fields("spec.size=1")).await.unwrap_err());
    assert_eq!(bad.code, 400);

    // Watch: modifications, deletions, filtered by the field selector.
    let mut stream = api
        .watch(&WatchParams::default().fields("spec.owner=bob").timeout(10), "0")
        .await
        .unwrap()
        .boxed();
    assert!(
        matches!(stream.try_next().await.unwrap().unwrap(), WatchEvent::Added(o) if o.metadata.name.as_deref() == Some("w2"))
    );
    api.patch("w2", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 3}})))
        .await
        .unwrap();
    api.patch("w1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 4}})))
        .await
        .unwrap();
    api.delete("w2", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match stream.try_next().await.unwrap().unwrap() {
            WatchEvent::Modified(o) => seen.push(format!("MODIFIED {}", o.data["spec"]["size"])),
            WatchEvent::Deleted(o) => seen.push(format!("DELETED {}", o.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["MODIFIED 3", "DELETED w2"]);

    // Table output with the printer columns (kubectl get).
    let mut req = kube::core::Request::new("/apis/example.com/v1/widgets")
        .list(&ListParams::default())
        .unwrap();
    req.headers_mut()
        .insert("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io".parse().unwrap());
    let table: Value = client.request(req).await.unwrap();
    let headers: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(headers, ["Name", "Owner", "Size", "Ready", "Age"]);
    assert_eq!(table["rows"][0]["cells"][1], "ann");
    assert_eq!(table["rows"][0]["cells"][2], 4);
    drop(stream);
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_unknown_fields_and_applies_defaults() {
    let (srv, client) = server().await;
    install(&client, WIDGETS).await;
    let api = widgets(&client);
    let w = widget(
        "w",
        &json!({"owner": "ann", "bogus": 1, "limits": {"mem": 3}, "extra": {"free": {"form": true}}}),
    );
    let mut with_root_extra = w.clone();
    with_root_extra.data["other"] = json!(1);
    with_root_extra.data["metadata"] = json!({"name": "w", "bogus": true, "labels": {"a": "b"}});
    let c = api.create(&PostParams::default(), &with_root_extra).await.unwrap();
    assert_eq!(c.metadata.labels.as_ref().unwrap()["a"], "b");
    assert_eq!(
        c.data["spec"],
        json!({"owner": "ann", "size": 1, "color": "red", "tags": [], "subnets": [],
               "limits": {"cpu": 2}, "extra": {"free": {"form": true}}})
    );
    assert!(c.data.get("other").is_none());
    // fieldValidation=Strict refuses unknown fields instead.
    let strict = PatchParams {
        field_validation: Some(kube::api::ValidationDirective::Strict),
        ..PatchParams::default()
    };
    let err = api_status(
        api.patch("w", &strict, &Patch::Merge(json!({"spec": {"bogus": 1}}))).await.unwrap_err(),
    );
    assert_eq!(err.code, 400);
    assert!(err.message.contains("unknown field \"spec.bogus\""), "{}", err.message);
    // A null for a field with a default gets the default.
    let n = api
        .patch("w", &PatchParams::default(), &Patch::Merge(json!({"spec": {"color": null}})))
        .await
        .unwrap();
    assert_eq!(n.data["spec"]["color"], "red");
    srv.shutdown().await.unwrap();
}

/// A schema case: name, spec fields, and `None` (accepted) or the expected cause
/// `(reason, field, message)`.
type Case<'a> = (&'a str, Value, Option<(&'a str, &'a str, &'a str)>);

/// A definition with one field per schema keyword.
const KEYWORDS: &str = r"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: samples.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {kind: Sample, plural: samples, singular: sample}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [need]
            properties:
              need: {type: string}
              int: {type: integer}
              num: {type: number}
              bool: {type: boolean}
              obj: {type: object, properties: {a: {type: string}}}
              port: {x-kubernetes-int-or-string: true}
              maybe: {type: string, nullable: true}
              mode: {type: string, enum: [fast, slow]}
              name: {type: string, pattern: '^[a-z]+$', minLength: 2, maxLength: 5}
              when: {type: string, format: date-time}
              addr: {type: string, format: ipv4}
              small: {type: integer, minimum: 1, maximum: 10}
              open: {type: number, exclusiveMinimum: true, minimum: 0, exclusiveMaximum: true, maximum: 1}
              few: {type: array, minItems: 1, maxItems: 2, items: {type: string}}
              labels: {type: object, additionalProperties: {type: string}, maxProperties: 2, minProperties: 1}
              set: {type: array, x-kubernetes-list-type: set, items: {type: string}}
              map:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [k]
                items: {type: object, required: [k], properties: {k: {type: string}, v: {type: integer}}}
              any: {type: object, x-kubernetes-preserve-unknown-fields: true}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_schema_keyword_accepts_and_rejects() {
    let (srv, client) = server().await;
    install(&client, KEYWORDS).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Sample"),
        "samples",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    // (case, spec fields added to {need: x}, None = accepted or Some((reason, field, message)))
    let cases: Vec<Case<'_>> = vec![
        ("int ok", json!({"int": 3}), None),
        (
            "int wrong type",
            json!({"int": "3"}),
            Some((
                "FieldValueTypeInvalid",
                "spec.int",
                "Invalid value: \"string\": spec.int in body must be of type integer: \"string\"",
            )),
        ),
        (
            "int not float",
            json!({"int": 1.5}),
            Some((
                "FieldValueTypeInvalid",
                "spec.int",
                "Invalid value: \"number\": spec.int in body must be of type integer: \"number\"",
            )),
        ),
        ("number takes ints", json!({"num": 2}), None),
        ("bool", json!({"bool": true}), None),
        (
            "bool wrong",
            json!({"bool": "yes"}),
            Some((
                "FieldValueTypeInvalid",
                "spec.bool",
                "Invalid value: \"string\": spec.bool in body must be of type boolean: \"string\"",
            )),
        ),
        (
            "object wrong",
            json!({"obj": [1]}),
            Some((
                "FieldValueTypeInvalid",
                "spec.obj",
                "Invalid value: \"array\": spec.obj in body must be of type object: \"array\"",
            )),
        ),
        ("int-or-string int", json!({"port": 80}), None),
        ("int-or-string string", json!({"port": "http"}), None),
        (
            "int-or-string bool",
            json!({"port": true}),
            Some((
                "FieldValueTypeInvalid",
                "spec.port",
                "Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\"",
            )),
        ),
        ("nullable null", json!({"maybe": null}), None),
        (
            "required",
            json!({"need": null}),
            Some(("FieldValueRequired", "spec.need", "Required value")),
        ),
        ("enum ok", json!({"mode": "fast"}), None),
        (
            "enum bad",
            json!({"mode": "medium"}),
            Some((
                "FieldValueNotSupported",
                "spec.mode",
                "Unsupported value: \"medium\": supported values: \"fast\", \"slow\"",
            )),
        ),
        ("pattern ok", json!({"name": "abc"}), None),
        (
            "pattern bad",
            json!({"name": "ab1"}),
            Some((
                "FieldValueInvalid",
                "spec.name",
                "Invalid value: \"ab1\": spec.name in body should match '^[a-z]+$'",
            )),
        ),
        (
            "minLength",
            json!({"name": "a"}),
            Some((
                "FieldValueInvalid",
                "spec.name",
                "Invalid value: \"a\": spec.name in body should be at least 2 chars long",
            )),
        ),
        (
            "maxLength",
            json!({"name": "abcdef"}),
            Some(("FieldValueTooLong", "spec.name", "Too long: may not be more than 5 bytes")),
        ),
        ("date-time ok", json!({"when": "2026-01-02T03:04:05Z"}), None),
        (
            "date-time bad",
            json!({"when": "tomorrow"}),
            Some((
                "FieldValueTypeInvalid",
                "spec.when",
                "Invalid value: \"tomorrow\": spec.when in body must be of type date-time: \"tomorrow\"",
            )),
        ),
        (
            "ipv4 bad",
            json!({"addr": "10.0.0.300"}),
            Some((
                "FieldValueTypeInvalid",
                "spec.addr",
                "Invalid value: \"10.0.0.300\": spec.addr in body must be of type ipv4: \"10.0.0.300\"",
            )),
        ),
        (
            "minimum",
            json!({"small": 0}),
            Some((
                "FieldValueInvalid",
                "spec.small",
                "Invalid value: 0: spec.small in body should be greater than or equal to 1",
            )),
        ),
        (
            "maximum",
            json!({"small": 11}),
            Some((
                "FieldValueInvalid",
                "spec.small",
                "Invalid value: 11: spec.small in body should be less than or equal to 10",
            )),
        ),
        ("bounds ok", json!({"small": 10, "open": 0.5}), None),
        (
            "exclusiveMinimum",
            json!({"open": 0}),
            Some((
                "FieldValueInvalid",
                "spec.open",
                "Invalid value: 0: spec.open in body should be greater than 0",
            )),
        ),
        (
            "exclusiveMaximum",
            json!({"open": 1}),
            Some((
                "FieldValueInvalid",
                "spec.open",
                "Invalid value: 1: spec.open in body should be less than 1",
            )),
        ),
        (
            "minItems",
            json!({"few": []}),
            Some((
                "FieldValueInvalid",
                "spec.few",
                "Invalid value: 0: spec.few in body should have at least 1 items",
            )),
        ),
        (
            "maxItems",
            json!({"few": ["a", "b", "c"]}),
            Some(("FieldValueTooMany", "spec.few", "Too many: 3: must have at most 2 items")),
        ),
        ("map type ok", json!({"labels": {"a": "b"}}), None),
        (
            "map values typed",
            json!({"labels": {"a": 1}}),
            Some((
                "FieldValueTypeInvalid",
                "spec.labels.a",
                "Invalid value: \"integer\": spec.labels.a in body must be of type string: \"integer\"",
            )),
        ),
        (
            "maxProperties",
            json!({"labels": {"a": "1", "b": "2", "c": "3"}}),
            Some(("FieldValueTooMany", "spec.labels", "Too many: 3: must have at most 2 items")),
        ),
        (
            "minProperties",
            json!({"labels": {}}),
            Some((
                "FieldValueInvalid",
                "spec.labels",
                "Invalid value: 0: spec.labels in body should have at least 1 properties",
            )),
        ),
        ("set ok", json!({"set": ["a", "b"]}), None),
        (
            "set duplicate",
            json!({"set": ["a", "b", "a"]}),
            Some(("FieldValueDuplicate", "spec.set[2]", "Duplicate value: \"a\"")),
        ),
        ("map ok", json!({"map": [{"k": "a", "v": 1}, {"k": "b", "v": 1}]}), None),
        (
            "map duplicate key",
            json!({"map": [{"k": "a", "v": 1}, {"k": "a", "v": 2}]}),
            Some(("FieldValueDuplicate", "spec.map[1]", "Duplicate value: {\"k\":\"a\"}")),
        ),
        (
            "map item required",
            json!({"map": [{"v": 1}]}),
            Some(("FieldValueRequired", "spec.map[0].k", "Required value")),
        ),
        ("preserved anything", json!({"any": {"x": [1, {"y": null}]}}), None),
    ];
    let mut failures = Vec::new();
    for (i, (case, fields, expect)) in cases.into_iter().enumerate() {
        let mut spec = json!({"need": "x"});
        for (k, v) in fields.as_object().unwrap() {
            if v.is_null() && k == "need" {
                spec.as_object_mut().unwrap().remove("need");
            } else {
                spec[k] = v.clone();
            }
        }
        let obj: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Sample",
            "metadata": {"name": format!("s{i}")}, "spec": spec}))
            .unwrap();
        match (api.create(&PostParams::default(), &obj).await, expect) {
            (Ok(_), None) => {}
            (Ok(_), Some(want)) => failures.push(format!("{case}: accepted, expected {want:?}")),
            (Err(e), None) => failures.push(format!("{case}: rejected: {e}")),
            (Err(e), Some((reason, field, message))) => {
                let got = causes(&api_status(e));
                if !got.iter().any(|(r, f, m)| r == reason && f == field && m == message) {
                    failures.push(format!(
                        "{case}: expected {reason} {field} {message:?}, got {got:?}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cel_rules_run_where_they_are_declared() {
    let (srv, client) = server().await;
    install(&client, WIDGETS).await;
    let api = widgets(&client);
    let base = json!({"owner": "ann", "tags": ["a", "b"], "subnets": ["10.0.0.0/24"], "gateway": "10.0.0.1"});
    api.create(&PostParams::default(), &widget("w", &base)).await.unwrap();
    let patch = |spec: Value| {
        let api = api.clone();
        async move {
            api.patch("w", &PatchParams::default(), &Patch::Merge(json!({"spec": spec}))).await
        }
    };
    // self == oldSelf on a field: immutable, reported at the fieldPath.
    let got = causes(&api_status(patch(json!({"owner": "bob"})).await.unwrap_err()));
    assert_eq!(
        got,
        [(
            "FieldValueInvalid".into(),
            "spec.owner".into(),
            "Invalid value: owner is immutable".into()
        )]
    );
    // An append-only list.
    let got = causes(&api_status(patch(json!({"tags": ["a"]})).await.unwrap_err()));
    assert_eq!(
        got,
        [(
            "FieldValueInvalid".into(),
            "spec.tags".into(),
            "Invalid value: tags may only be added".into()
        )]
    );
    patch(json!({"tags": ["a", "b", "c"]})).await.unwrap();
    // The IP/CIDR library with a messageExpression.
    let got = causes(&api_status(patch(json!({"gateway": "10.0.1.1"})).await.unwrap_err()));
    assert_eq!(
        got,
        [(
            "FieldValueInvalid".into(),
            "spec.gateway".into(),
            "Invalid value: gateway 10.0.1.1 is in none of the subnets".into()
        )]
    );
    // Rules on list items, with the item's path.
    let got = causes(&api_status(
        patch(json!({"subnets": ["10.0.0.0/24", "10.0.0.1/24", "nope"]})).await.unwrap_err(),
    ));
    assert_eq!(
        got,
        [
            (
                "FieldValueInvalid".into(),
                "spec.subnets[1]".into(),
                "Invalid value: \"10.0.0.1/24\": must be in network form".into()
            ),
            (
                "FieldValueInvalid".into(),
                "spec.subnets[2]".into(),
                "Invalid value: \"nope\": must be a CIDR".into()
            ),
        ]
    );
    // A reason.
    let got = causes(&api_status(patch(json!({"size": 500})).await.unwrap_err()));
    assert_eq!(
        got,
        [(
            "FieldValueForbidden".into(),
            "spec".into(),
            "Forbidden: only admin may have big widgets".into()
        )]
    );
    // A rule that fails at runtime is an Invalid cause at its node: `ip()` refuses
    // IPv4-mapped IPv6.
    let got = causes(&api_status(patch(json!({"gateway": "::ffff:10.0.0.1"})).await.unwrap_err()));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].0.as_str(), got[0].1.as_str()), ("FieldValueInvalid", "spec"));
    assert!(
        got[0].2.starts_with("Invalid value: \"object\": ")
            && got[0].2.contains("IPv4-mapped IPv6 address"),
        "{got:?}"
    );
    assert!(got[0].2.ends_with("evaluating rule: !has(self.gateway) || self.subnets.exists(s, cidr(s).containsIP(ip(self.gateway)))"), "{got:?}");
    // Schema errors of the blocking kinds stop the rules, as upstream.
    let got = causes(&api_status(patch(json!({"owner": "", "color": "pink"})).await.unwrap_err()));
    assert!(
        got.iter()
            .any(|(_, f, m)| f == "<nil>" && m.contains("some validation rules were not checked")),
        "{got:?}"
    );
    assert!(!got.iter().any(|(_, _, m)| m.contains("immutable")), "{got:?}");
    // Transition rules do not run on create.
    api.create(&PostParams::default(), &widget("fresh", &json!({"owner": "x", "tags": []})))
        .await
        .unwrap();
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_definitions_are_refused() {
    let (srv, client) = server().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let refuse = |yaml: String| {
        let crds = crds.clone();
        async move {
            causes(&api_status(crds.create(&PostParams::default(), &crd(&yaml)).await.unwrap_err()))
        }
    };
    // Not structural: a field without a type.
    let got =
        refuse(WIDGETS.replace("gateway: {type: string}", "gateway: {description: where}")).await;
    assert_eq!(
        got,
        [(
            "FieldValueRequired".into(),
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[gateway].type"
                .into(),
            "Required value: must not be empty for specified object fields".into(),
        )]
    );
    let got = refuse(WIDGETS.replace(
        "items: {type: string}\n              subnets",
        "uniqueItems: true\n                items: {type: string}\n              subnets",
    ))
    .await;
    assert_eq!(
        got[0].1,
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[tags].uniqueItems"
    );
    // A rule that does not compile, named by its path.
    let got =
        refuse(WIDGETS.replace("self.owner == oldSelf.owner", "self.ownr == oldSelf.owner")).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        got[0].1,
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
    );
    assert!(got[0].2.contains("undefined field 'ownr'"), "{got:?}");
    let got = refuse(WIDGETS.replace("rule: \"isCIDR(self)\"", "rule: \"isCIDR(self\"")).await;
    assert_eq!(
        got[0].1,
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[subnets].items.x-kubernetes-validations[0].rule"
    );
    // A default that breaks its own schema.
    let got = refuse(WIDGETS.replace("default: 1, minimum: 1", "default: 0, minimum: 1")).await;
    assert_eq!(
        got[0].1,
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[size].default"
    );
    // Names.
    let got =
        refuse(WIDGETS.replace("name: widgets.example.com", "name: gizmos.example.com")).await;
    assert_eq!(got[0].1, "metadata.name");
    let got = refuse(
        WIDGETS
            .replace("group: example.com", "group: example")
            .replace("widgets.example.com", "widgets.example"),
    )
    .await;
    assert!(
        got.iter()
            .any(|(_, f, m)| f == "spec.group"
                && m.contains("should be a domain with at least one dot")),
        "{got:?}"
    );
    let got = refuse(WIDGETS.replace("example.com", "things.k8s.io")).await;
    assert_eq!(got[0].1, "metadata.annotations[api-approved.kubernetes.io]");
    // Clashing with an installed definition of the group.
    install(&client, WIDGETS).await;
    let gizmos = WIDGETS
        .replace("widgets", "gizmos")
        .replace("kind: Widget", "kind: Gizmo")
        .replace("singular: widget", "singular: gizmo");
    let got = refuse(gizmos.clone()).await;
    assert_eq!(
        got,
        [(
            "FieldValueInvalid".into(),
            "spec.names.shortNames[0]".into(),
            "Invalid value: \"wd\": \"wd\" is already in use by widgets.example.com".into(),
        )]
    );
    let got = refuse(
        gizmos
            .replace("shortNames: [wd]", "shortNames: [gz]")
            .replace("kind: Gizmo", "kind: Widget"),
    )
    .await;
    assert_eq!(got[0].1, "spec.names.kind");
    install(&client, &gizmos.replace("shortNames: [wd]", "shortNames: [gz]")).await;
    // Updates: the group is immutable.
    let mut changed = crds.get("widgets.example.com").await.unwrap();
    changed.spec.names.plural = "widgetz".into();
    let got = causes(&api_status(
        crds.replace("widgets.example.com", &PostParams::default(), &changed).await.unwrap_err(),
    ));
    assert!(
        got.iter().any(|(_, f, m)| f == "spec.names.plural" && m.ends_with("field is immutable")),
        "{got:?}"
    );
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_definition_deletes_its_objects_and_endpoints() {
    let (srv, client) = server().await;
    install(&client, WIDGETS).await;
    let api = widgets(&client);
    api.create(&PostParams::default(), &widget("plain", &json!({"owner": "a"}))).await.unwrap();
    let mut held = widget("held", &json!({"owner": "a"}));
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    let mut stream = api.watch(&WatchParams::default().timeout(20), "0").await.unwrap().boxed();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete("widgets.example.com", &DeleteParams::default()).await.unwrap();
    // An object with a finalizer of its own holds the definition.
    let terminating = crds.get("widgets.example.com").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert!(
        terminating
            .status
            .unwrap()
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Terminating" && c.status == "True")
    );
    assert!(api.get_opt("plain").await.unwrap().is_none());
    assert!(api.get("held").await.unwrap().metadata.deletion_timestamp.is_some());
    let refused = api_status(
        api.create(&PostParams::default(), &widget("new", &json!({"owner": "a"})))
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, 405);
    // Releasing it finishes the deletion: the definition, the endpoints, the watch.
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(crds.get_opt("widgets.example.com").await.unwrap().is_none());
    assert_eq!(api_status(api.get("held").await.unwrap_err()).code, 404);
    let groups = client.list_api_groups().await.unwrap();
    assert!(!groups.groups.iter().any(|g| g.name == "example.com"));
    let mut events = Vec::new();
    while let Some(ev) = stream.try_next().await.unwrap() {
        match ev {
            WatchEvent::Added(o) => events.push(format!("ADDED {}", o.metadata.name.unwrap())),
            WatchEvent::Modified(o) => {
                events.push(format!("MODIFIED {}", o.metadata.name.unwrap()));
            }
            WatchEvent::Deleted(o) => events.push(format!("DELETED {}", o.metadata.name.unwrap())),
            _ => {}
        }
    }
    // The stream ended by itself (no timeout reached) after the deletions: `held` marked
    // for deletion, `plain` deleted, then `held` gone once its finalizer was removed.
    assert_eq!(
        events,
        ["ADDED held", "ADDED plain", "MODIFIED held", "DELETED plain", "DELETED held"]
    );
    // Without objects a definition goes at once, and can come back fresh.
    install(&client, WIDGETS).await;
    assert!(api.list(&ListParams::default()).await.unwrap().items.is_empty());
    crds.delete("widgets.example.com", &DeleteParams::default()).await.unwrap();
    assert!(crds.get_opt("widgets.example.com").await.unwrap().is_none());
    srv.shutdown().await.unwrap();
}

const VERSIONED: &str = r"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.org}
spec:
  group: example.org
  scope: Namespaced
  names: {kind: Gadget, plural: gadgets, singular: gadget}
  versions:
  - name: v1beta1
    served: true
    storage: false
    schema: {openAPIV3Schema: {type: object, properties: {spec: {type: object, properties: {n: {type: integer}}}}}}
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              n: {type: integer, maximum: 5}
              items:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items: {type: object, required: [name], properties: {name: {type: string}, value: {type: string}}}
              tags: {type: array, x-kubernetes-list-type: set, items: {type: string}}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_share_a_store_and_apply_uses_the_schema_list_types() {
    let (srv, client) = server().await;
    install(&client, VERSIONED).await;
    let groups = client.list_api_groups().await.unwrap();
    let group = groups.groups.iter().find(|g| g.name == "example.org").unwrap();
    let versions: Vec<&str> = group.versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(versions, ["v1", "v1beta1"]);
    let api = |v: &str| -> Api<DynamicObject> {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("example.org", v, "Gadget"),
            "gadgets",
        );
        Api::namespaced_with(client.clone(), "default", &ar)
    };
    let old: DynamicObject =
        serde_json::from_value(json!({"apiVersion": "example.org/v1beta1", "kind": "Gadget",
        "metadata": {"name": "g"}, "spec": {"n": 9}}))
        .unwrap();
    // Written through v1beta1 (its schema has no maximum), read through v1.
    let created = api("v1beta1").create(&PostParams::default(), &old).await.unwrap();
    assert_eq!(created.types.unwrap().api_version, "example.org/v1beta1");
    let read = api("v1").get("g").await.unwrap();
    assert_eq!(read.types.unwrap().api_version, "example.org/v1");
    assert_eq!(read.data["spec"]["n"], 9);

    // Server-side apply merges map lists by key and sets by value, per manager.
    let v1 = api("v1");
    let apply = |manager: &'static str, spec: Value| {
        let v1 = v1.clone();
        async move {
            v1.patch("a", &PatchParams::apply(manager), &Patch::Apply(json!({"apiVersion": "example.org/v1", "kind": "Gadget", "metadata": {"name": "a"}, "spec": spec})))
                .await
        }
    };
    apply("one", json!({"items": [{"name": "x", "value": "1"}], "tags": ["t1"]})).await.unwrap();
    let merged = apply("two", json!({"items": [{"name": "y", "value": "2"}], "tags": ["t2"]}))
        .await
        .unwrap();
    assert_eq!(
        merged.data["spec"]["items"],
        json!([{"name": "x", "value": "1"}, {"name": "y", "value": "2"}])
    );
    assert_eq!(merged.data["spec"]["tags"], json!(["t1", "t2"]));
    let conflict = api_status(
        apply("two", json!({"items": [{"name": "x", "value": "changed"}]})).await.unwrap_err(),
    );
    assert_eq!(conflict.code, 409);
    let dropped = apply("one", json!({"tags": ["t1"]})).await.unwrap();
    assert_eq!(
        dropped.data["spec"]["items"],
        json!([{"name": "y", "value": "2"}]),
        "one stopped applying x"
    );
    // The schema applies to applied objects too.
    let got = causes(&api_status(apply("three", json!({"n": 7})).await.unwrap_err()));
    assert_eq!(got[0].1, "spec.n");
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_old_self_and_ratcheting() {
    let (srv, client) = server().await;
    let yaml = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: locks.example.com}
spec:
  group: example.com
  scope: Cluster
  names: {kind: Lock, plural: locks, singular: lock}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "!oldSelf.hasValue() || !has(oldSelf.value().key) || (has(self.key) && self.key == oldSelf.value().key)"
              optionalOldSelf: true
              message: "key is set once"
            properties:
              key: {type: string}
              level: {type: integer, maximum: 3}
"#;
    install(&client, yaml).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Lock"),
        "locks",
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let lock: DynamicObject = serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Lock", "metadata": {"name": "l"}, "spec": {"level": 1}})).unwrap();
    api.create(&PostParams::default(), &lock).await.unwrap();
    api.patch("l", &PatchParams::default(), &Patch::Merge(json!({"spec": {"key": "k"}})))
        .await
        .unwrap();
    let got = causes(&api_status(
        api.patch("l", &PatchParams::default(), &Patch::Merge(json!({"spec": {"key": "z"}})))
            .await
            .unwrap_err(),
    ));
    assert_eq!(got[0].2, "Invalid value: key is set once");
    // Tighten the schema: the stored level 1 breaks nothing, a stored 3 under a new
    // maximum of 2 is kept (ratcheted) while other fields change.
    api.patch("l", &PatchParams::default(), &Patch::Merge(json!({"spec": {"level": 3}})))
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "locks.example.com",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(json!([{"op": "replace", "path": "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/level/maximum", "value": 2}])).unwrap()),
    )
    .await
    .unwrap();
    api.patch(
        "l",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await
    .unwrap();
    let got = causes(&api_status(
        api.patch("l", &PatchParams::default(), &Patch::Merge(json!({"spec": {"level": 4}})))
            .await
            .unwrap_err(),
    ));
    assert_eq!(got[0].1, "spec.level");
    srv.shutdown().await.unwrap();
}
