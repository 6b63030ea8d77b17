//! The dev API server against the real kube client: CRUD and errors, watch resume and 410,
//! selectors, bookmarks, server-side apply merges/removals/conflicts on both list kinds,
//! status subresource, finalizers, and 422 validation causes.
#![allow(clippy::unwrap_used, reason = "test helpers: a failed setup step should panic")]
#![allow(clippy::too_many_lines, reason = "each test is one scenario told step by step")]

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{DynamicObject, GroupVersionKind};
use kube_inmemory::apiserver::{ApiServer, ServerOptions, start};
use serde_json::{Value, json};

async fn server(options: ServerOptions) -> (ApiServer, kube::Client) {
    let srv = start("127.0.0.1:0".parse().unwrap(), options).await.unwrap();
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

fn pod(name: &str, node: &str, labels: &Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap()
}

fn slice(name: &str, node: &str, devices: &Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": "netclaim.dev", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
    })
}

fn allocated_claim(name: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "net", "exactly": {"deviceClassName": "netclaim"}}]}},
    }))
    .unwrap()
}

async fn allocate(claims: &Api<ResourceClaim>, name: &str) {
    let results: Vec<Value> = ["eth1", "eth2", "eth3"]
        .iter()
        .map(|d| json!({"request": "net", "driver": "netclaim.dev", "pool": "node-1", "device": d}))
        .chain(std::iter::once(json!({"request": "net", "driver": "other.dev", "pool": "node-1", "device": "gpu0"})))
        .chain(std::iter::once(json!({"request": "net", "driver": "netclaim.dev", "pool": "node-1", "device": "eth1", "shareID": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"})))
        .collect();
    let patch = json!({"status": {"allocation": {"devices": {"results": results}}}});
    claims.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

fn status_apply(devices: &Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "status": {"devices": devices}})
}

fn device_names(claim: &ResourceClaim) -> Vec<String> {
    claim.status.as_ref().and_then(|s| s.devices.as_ref()).map_or_else(Vec::new, |d| {
        d.iter()
            .map(|d| {
                format!(
                    "{}/{}{}",
                    d.driver,
                    d.device,
                    d.share_id.as_deref().map(|s| format!("#{s}")).unwrap_or_default()
                )
            })
            .collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_conflicts_and_errors() {
    let (srv, client) = server(ServerOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("p1", "node-1", &json!({"app": "a"})))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    assert_eq!(created.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"));

    let dup = api_status(
        pods.create(&PostParams::default(), &pod("p1", "node-1", &json!({}))).await.unwrap_err(),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));

    let missing = api_status(pods.get("nope").await.unwrap_err());
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    assert!(missing.is_not_found());

    // generateName
    let mut generated = pod("", "node-1", &json!({}));
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let g = pods.create(&PostParams::default(), &generated).await.unwrap();
    let gname = g.metadata.name.unwrap();
    assert!(gname.starts_with("gen-") && gname.len() == 9, "{gname}");

    // Update with a stale resourceVersion: 409 Conflict; with the current one: OK.
    let mut stale = created.clone();
    let mut fresh = created.clone();
    fresh.metadata.labels = Some([("app".to_owned(), "b".to_owned())].into());
    let updated = pods.replace("p1", &PostParams::default(), &fresh).await.unwrap();
    assert_ne!(updated.metadata.resource_version, created.metadata.resource_version);
    stale.metadata.labels = Some([("app".to_owned(), "c".to_owned())].into());
    let conflict =
        api_status(pods.replace("p1", &PostParams::default(), &stale).await.unwrap_err());
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));

    // Labels-only change does not bump the generation; a spec change does.
    assert_eq!(updated.metadata.generation, Some(1));
    let patched = pods
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));

    // JSON patch, including a failing test op.
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/metadata/labels/x", "value": "y"}]))
            .unwrap();
    let p = pods.patch("p1", &PatchParams::default(), &Patch::<()>::Json(jp)).await.unwrap();
    assert_eq!(p.metadata.labels.unwrap()["x"], "y");
    let bad: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/labels/x", "value": "z"}]))
            .unwrap();
    assert_eq!(
        api_status(
            pods.patch("p1", &PatchParams::default(), &Patch::<()>::Json(bad)).await.unwrap_err()
        )
        .code,
        422
    );

    // The main endpoint ignores status; /status ignores everything else.
    let s = pods
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(s.status.unwrap().phase.as_deref(), Some("Pending"));
    let s = pods
        .patch_status(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Running"}, "metadata": {"labels": {"ignored": "yes"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(s.status.unwrap().phase.as_deref(), Some("Running"));
    assert!(!s.metadata.labels.unwrap().contains_key("ignored"));

    // A pod bound to a node is deleted gracefully; grace 0 removes it.
    pods.delete("p1", &DeleteParams::default()).await.unwrap();
    let deleting = pods.get("p1").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    pods.delete("p1", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .unwrap();
    assert!(pods.get_opt("p1").await.unwrap().is_none());
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizers_hold_deletion() {
    let (srv, client) = server(ServerOptions::default()).await;
    let claims: Api<ResourceClaim> = Api::namespaced(client, "default");
    let mut c = allocated_claim("held");
    c.metadata.finalizers = Some(vec!["netclaim.dev/test".into()]);
    claims.create(&PostParams::default(), &c).await.unwrap();
    claims.delete("held", &DeleteParams::default()).await.unwrap();
    let held = claims.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    // No new finalizers on an object being deleted.
    let err = api_status(
        claims
            .patch(
                "held",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"finalizers": ["netclaim.dev/test", "x.dev/y"]}}),
                ),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    claims
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(claims.get_opt("held").await.unwrap().is_none());
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_after_disconnect_and_expires_old_versions() {
    let (srv, client) =
        server(ServerOptions { watch_history: 20, ..ServerOptions::default() }).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("a", "n1", &json!({}))).await.unwrap();
    let list = pods.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();

    // First connection: sees b, then disconnects.
    let mut stream = pods.watch(&WatchParams::default().timeout(30), &rv).await.unwrap().boxed();
    pods.create(&PostParams::default(), &pod("b", "n1", &json!({}))).await.unwrap();
    let last_rv = match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Added(p) => {
            assert_eq!(p.metadata.name.as_deref(), Some("b"));
            p.metadata.resource_version.unwrap()
        }
        other => panic!("unexpected {other:?}"),
    };
    drop(stream);

    // While disconnected: c created, a modified, b deleted.
    pods.create(&PostParams::default(), &pod("c", "n1", &json!({}))).await.unwrap();
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    pods.delete("b", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .unwrap();

    let mut stream =
        pods.watch(&WatchParams::default().timeout(30), &last_rv).await.unwrap().boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let ev = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(match ev {
            WatchEvent::Added(p) => format!("ADDED {}", p.metadata.name.unwrap()),
            WatchEvent::Modified(p) => format!("MODIFIED {}", p.metadata.name.unwrap()),
            WatchEvent::Deleted(p) => format!("DELETED {}", p.metadata.name.unwrap()),
            other => panic!("unexpected {other:?}"),
        });
    }
    assert_eq!(seen, ["ADDED c", "MODIFIED a", "DELETED b"]);
    drop(stream);

    // Push the first version out of the bounded history: 410 Gone.
    for i in 0..25 {
        pods.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"i": i.to_string()}}})),
        )
        .await
        .unwrap();
    }
    let mut stream = pods.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(s) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }

    // kube-runtime's watcher lists and watches: its initial page holds the live pods.
    let mut stream =
        kube::runtime::watcher(pods.clone(), kube::runtime::watcher::Config::default()).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            kube::runtime::watcher::Event::InitApply(p) => initial.push(p.metadata.name.unwrap()),
            kube::runtime::watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(initial, ["a", "c"]);
    pods.create(&PostParams::default(), &pod("d", "n1", &json!({}))).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        kube::runtime::watcher::Event::Apply(p) => {
            assert_eq!(p.metadata.name.as_deref(), Some("d"));
        }
        other => panic!("unexpected {other:?}"),
    }
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_bookmarks_and_timeouts() {
    let (srv, client) = server(ServerOptions {
        bookmark_interval: Duration::from_millis(200),
        ..ServerOptions::default()
    })
    .await;
    let slices: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice"),
            "resourceslices",
        ),
    );
    for (name, node) in [("s1", "node-1"), ("s2", "node-2"), ("s3", "node-1")] {
        let obj: DynamicObject =
            serde_json::from_value(slice(name, node, &json!([{"name": "eth1"}]))).unwrap();
        slices.create(&PostParams::default(), &obj).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<DynamicObject>| {
        l.items.into_iter().map(|o| o.metadata.name.unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(
        names(slices.list(&ListParams::default().fields("spec.nodeName=node-1")).await.unwrap()),
        ["s1", "s3"]
    );
    assert_eq!(
        names(
            slices
                .list(
                    &ListParams::default().fields("spec.pool.name=node-2,spec.driver=netclaim.dev")
                )
                .await
                .unwrap()
        ),
        ["s2"]
    );
    assert_eq!(
        names(slices.list(&ListParams::default().fields("metadata.name!=s1")).await.unwrap()),
        ["s2", "s3"]
    );
    let bad =
        api_status(slices.list(&ListParams::default().fields("spec.bogus=x")).await.unwrap_err());
    assert_eq!(bad.code, 400);

    // Pagination.
    let page = slices.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(page.items.len(), 2);
    let token = page.metadata.continue_.clone().unwrap();
    let rest = slices.list(&ListParams::default().limit(2).continue_token(&token)).await.unwrap();
    assert_eq!(names(rest), ["s3"]);

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (n, app, tier) in [("a", "web", "front"), ("b", "db", "back"), ("c", "web", "back")] {
        pods.create(&PostParams::default(), &pod(n, "node-1", &json!({"app": app, "tier": tier})))
            .await
            .unwrap();
    }
    let pnames = |l: kube::core::ObjectList<Pod>| {
        l.items.into_iter().map(|o| o.metadata.name.unwrap()).collect::<Vec<_>>()
    };
    for (sel, want) in [
        ("app=web", vec!["a", "c"]),
        ("app!=web", vec!["b"]),
        ("tier in (back),app notin (db)", vec!["c"]),
        ("tier", vec!["a", "b", "c"]),
        ("!tier", vec![]),
    ] {
        assert_eq!(
            pnames(pods.list(&ListParams::default().labels(sel)).await.unwrap()),
            want,
            "{sel}"
        );
    }

    // A filtered watch: a pod leaving the selector is seen as DELETED; bookmarks arrive.
    let rv = pods.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let wp = WatchParams::default().labels("app=web").timeout(3);
    let mut stream = pods.watch(&wp, &rv).await.unwrap().boxed();
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "api"}}})),
    )
    .await
    .unwrap();
    pods.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    let mut events = Vec::new();
    let mut bookmarks = 0;
    let started = std::time::Instant::now();
    while let Some(ev) = stream.try_next().await.unwrap() {
        match ev {
            WatchEvent::Added(p) => events.push(format!("ADDED {}", p.metadata.name.unwrap())),
            WatchEvent::Modified(p) => {
                events.push(format!("MODIFIED {}", p.metadata.name.unwrap()));
            }
            WatchEvent::Deleted(p) => events.push(format!("DELETED {}", p.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => bookmarks += 1,
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    // The stream ended by itself at timeoutSeconds=3.
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(2500) && took < Duration::from_secs(6), "{took:?}");
    assert_eq!(events, ["DELETED a", "ADDED b"]);
    assert!(bookmarks >= 2, "{bookmarks}");
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_on_claim_status_devices() {
    let (srv, client) = server(ServerOptions::default()).await;
    let claims: Api<ResourceClaim> = Api::namespaced(client, "default");
    claims.create(&PostParams::default(), &allocated_claim("c")).await.unwrap();
    allocate(&claims, "c").await;

    let ours = PatchParams::apply("netclaim.dev");
    let theirs = PatchParams::apply("other.dev");
    let dev = |driver: &str, device: &str, ready: &str| {
        json!({"driver": driver, "pool": "node-1", "device": device,
               "conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
               "networkData": {"interfaceName": "net1", "ips": ["10.0.0.5/24"]}})
    };
    claims
        .patch_status(
            "c",
            &ours,
            &Patch::Apply(status_apply(&json!([
                dev("netclaim.dev", "eth1", "False"),
                dev("netclaim.dev", "eth2", "True")
            ]))),
        )
        .await
        .unwrap();
    let c = claims
        .patch_status(
            "c",
            &theirs,
            &Patch::Apply(status_apply(&json!([dev("other.dev", "gpu0", "True")]))),
        )
        .await
        .unwrap();
    assert_eq!(device_names(&c), ["netclaim.dev/eth1", "netclaim.dev/eth2", "other.dev/gpu0"]);

    // The shared entry (same device, with shareID) is a distinct list-map entry.
    let mut shared = dev("netclaim.dev", "eth1", "True");
    shared["shareID"] = json!("6ba7b810-9dad-11d1-80b4-00c04fd430c8");
    // We stop applying eth2 and add the shared entry: eth2 goes, other.dev's entry stays.
    let c = claims
        .patch_status(
            "c",
            &ours,
            &Patch::Apply(status_apply(&json!([dev("netclaim.dev", "eth1", "True"), shared]))),
        )
        .await
        .unwrap();
    assert_eq!(
        device_names(&c),
        [
            "netclaim.dev/eth1",
            "other.dev/gpu0",
            "netclaim.dev/eth1#6ba7b810-9dad-11d1-80b4-00c04fd430c8"
        ]
    );
    let st = c.status.as_ref().unwrap().devices.as_ref().unwrap();
    assert_eq!(st[0].conditions.as_ref().unwrap()[0].status, "True");
    let mf = c.metadata.managed_fields.unwrap();
    let managers: Vec<(&str, &str, Option<&str>)> = mf
        .iter()
        .map(|m| {
            (
                m.manager.as_deref().unwrap(),
                m.operation.as_deref().unwrap(),
                m.subresource.as_deref(),
            )
        })
        .collect();
    assert!(managers.contains(&("netclaim.dev", "Apply", Some("status"))), "{managers:?}");
    assert!(managers.contains(&("other.dev", "Apply", Some("status"))), "{managers:?}");

    // Another manager changing our field conflicts; force takes it.
    let err = api_status(
        claims
            .patch_status(
                "c",
                &theirs,
                &Patch::Apply(status_apply(&json!([dev("netclaim.dev", "eth1", "False")]))),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(err.message.contains("netclaim.dev"), "{}", err.message);
    let c = claims
        .patch_status(
            "c",
            &theirs.clone().force(),
            &Patch::Apply(status_apply(&json!([
                dev("other.dev", "gpu0", "True"),
                dev("netclaim.dev", "eth1", "False")
            ]))),
        )
        .await
        .unwrap();
    let st = c.status.as_ref().unwrap().devices.as_ref().unwrap();
    assert_eq!(st[0].conditions.as_ref().unwrap()[0].status, "False");

    // An unchanged re-apply does not write (same resourceVersion).
    let again = claims
        .patch_status(
            "c",
            &theirs.clone().force(),
            &Patch::Apply(status_apply(&json!([
                dev("other.dev", "gpu0", "True"),
                dev("netclaim.dev", "eth1", "False")
            ]))),
        )
        .await
        .unwrap();
    assert_eq!(again.metadata.resource_version, c.metadata.resource_version);

    // Status for a device that is not allocated: 422 with the field path.
    let err = api_status(
        claims
            .patch_status(
                "c",
                &ours,
                &Patch::Apply(status_apply(&json!([dev("netclaim.dev", "eth9", "True")]))),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    let causes = err.details.unwrap().causes;
    assert!(
        causes.iter().any(|c| c.field == "status.devices[1]"
            || c.field == "status.devices[2]"
            || c.field == "status.devices[3]"),
        "{causes:?}"
    );

    // Non-canonical IP: 422 naming the ip.
    let mut bad = dev("netclaim.dev", "eth3", "True");
    bad["networkData"]["ips"] = json!(["2001:0db8::5/64"]);
    let err = api_status(
        claims
            .patch_status("c", &ours, &Patch::Apply(status_apply(&json!([bad]))))
            .await
            .unwrap_err(),
    );
    assert!(err.details.unwrap().causes.iter().any(|c| c.field.ends_with("networkData.ips[0]")));

    // Apply without a field manager is rejected.
    let err = api_status(
        claims
            .patch_status("c", &PatchParams::default(), &Patch::Apply(status_apply(&json!([]))))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_on_slices() {
    let (srv, client) = server(ServerOptions::default()).await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let pp = PatchParams::apply("netclaim.dev");
    // Create by apply, with labels.
    let mut first = slice(
        "node-1-0",
        "node-1",
        &json!([{"name": "eth1", "attributes": {"mtu": {"int": 1500}}}, {"name": "eth2"}]),
    );
    first["metadata"]["labels"] = json!({"a": "1", "b": "2"});
    let s = slices.patch("node-1-0", &pp, &Patch::Apply(&first)).await.unwrap();
    assert_eq!(s.metadata.generation, Some(1));
    let rv1 = s.metadata.resource_version.clone();

    // Same apply again: no write.
    let s = slices.patch("node-1-0", &pp, &Patch::Apply(&first)).await.unwrap();
    assert_eq!(s.metadata.resource_version, rv1);

    // The publisher stops applying eth2 and label b, changes eth1's MTU.
    let mut second = slice(
        "node-1-0",
        "node-1",
        &json!([{"name": "eth1", "attributes": {"mtu": {"int": 9000}}}]),
    );
    second["metadata"]["labels"] = json!({"a": "1"});
    second["spec"]["pool"]["generation"] = json!(2);
    let s = slices.patch("node-1-0", &pp, &Patch::Apply(&second)).await.unwrap();
    let devices = s.spec.devices.as_ref().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].attributes.as_ref().unwrap()["mtu"].int, Some(9000));
    assert_eq!(s.metadata.labels.as_ref().unwrap().keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(s.metadata.generation, Some(2));

    // spec.devices is atomic (listType=atomic upstream): another manager setting it
    // conflicts with the publisher, and a forced apply replaces the whole list.
    let other = PatchParams::apply("someone-else");
    let third = slice("node-1-0", "node-1", &json!([{"name": "eth7"}]));
    let err =
        api_status(slices.patch("node-1-0", &other, &Patch::Apply(&third)).await.unwrap_err());
    assert_eq!(err.code, 409);
    let s = slices.patch("node-1-0", &other.clone().force(), &Patch::Apply(&third)).await.unwrap();
    assert_eq!(
        s.spec.devices.as_ref().unwrap().iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["eth7"]
    );

    // Immutable pool name and driver: 422.
    let mut moved = third.clone();
    moved["spec"]["driver"] = json!("other.dev");
    let err = api_status(
        slices.patch("node-1-0", &other.clone().force(), &Patch::Apply(&moved)).await.unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(err.details.unwrap().causes.iter().any(|c| c.field == "spec.driver"));

    // 129 devices: 422 at spec.devices.
    let many: Vec<Value> = (0..129).map(|i| json!({"name": format!("d{i}")})).collect();
    let err = api_status(
        slices
            .patch("node-1-1", &pp, &Patch::Apply(slice("node-1-1", "node-1", &Value::Array(many))))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(err.details.unwrap().causes.iter().any(|c| c.field == "spec.devices"));
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumable_capacity_can_be_dropped_like_an_old_server() {
    let (srv, client) =
        server(ServerOptions { drop_consumable_capacity: true, ..ServerOptions::default() }).await;
    let slices: Api<ResourceSlice> = Api::all(client);
    let devices = json!([{"name": "eth1", "allowMultipleAllocations": true,
        "capacity": {"netclaim.dev/interfaces": {"value": "256", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "256", "step": "1"}}}}}]);
    let s = slices
        .patch(
            "s",
            &PatchParams::apply("netclaim.dev"),
            &Patch::Apply(slice("s", "node-1", &devices)),
        )
        .await
        .unwrap();
    let d = &s.spec.devices.unwrap()[0];
    assert_eq!(d.allow_multiple_allocations, None);
    assert!(d.capacity.as_ref().unwrap()["netclaim.dev/interfaces"].request_policy.is_none());
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_in_kinds_and_discovery() {
    let (srv, client) = server(ServerOptions::default()).await;
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    let mut kinds = Vec::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            kinds.push(format!(
                "{}/{} {}",
                ar.group,
                ar.plural,
                if caps.scope == kube::discovery::Scope::Namespaced { "ns" } else { "cluster" }
            ));
        }
    }
    for want in [
        "/pods ns",
        "/nodes cluster",
        "/events ns",
        "events.k8s.io/events ns",
        "coordination.k8s.io/leases ns",
        "resource.k8s.io/resourceslices cluster",
        "resource.k8s.io/deviceclasses cluster",
        "resource.k8s.io/resourceclaims ns",
        "resource.k8s.io/resourceclaimtemplates ns",
        "apiextensions.k8s.io/customresourcedefinitions cluster",
    ] {
        assert!(kinds.iter().any(|k| k == want), "{want} missing from {kinds:?}");
    }
    srv.shutdown().await.unwrap();
}

/// What a leader-election client does with a `coordination.k8s.io/v1` Lease: create it
/// (a second candidate gets 409 AlreadyExists), renew it with the read resourceVersion
/// (a stale one gets 409 Conflict, so two leaders cannot both win), watch it, release it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_for_leader_election() {
    use k8s_openapi::api::coordination::v1::Lease;
    let (srv, client) = server(ServerOptions::default()).await;
    let leases: Api<Lease> = Api::namespaced(client, "kube-system");
    let lease = |holder: &str, renew: &str| -> Lease {
        serde_json::from_value(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "controller"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": renew, "leaseTransitions": 0}}))
        .unwrap()
    };
    let a = leases
        .create(&PostParams::default(), &lease("a", "2026-01-01T00:00:00.000000Z"))
        .await
        .unwrap();
    let taken = api_status(
        leases
            .create(&PostParams::default(), &lease("b", "2026-01-01T00:00:01.000000Z"))
            .await
            .unwrap_err(),
    );
    assert_eq!((taken.code, taken.reason.as_str()), (409, "AlreadyExists"));
    let mut watch = leases
        .watch(&WatchParams::default().timeout(10), &a.metadata.resource_version.clone().unwrap())
        .await
        .unwrap()
        .boxed();
    // Both candidates read the same version; the first renewal wins, the second is stale.
    let read = leases.get("controller").await.unwrap();
    let mut renew_a = read.clone();
    renew_a.spec.as_mut().unwrap().renew_time =
        Some(serde_json::from_value(json!("2026-01-01T00:00:05.123456Z")).unwrap());
    let mut steal_b = read.clone();
    let spec = steal_b.spec.as_mut().unwrap();
    spec.holder_identity = Some("b".into());
    spec.lease_transitions = Some(1);
    let renewed = leases.replace("controller", &PostParams::default(), &renew_a).await.unwrap();
    let stale = api_status(
        leases.replace("controller", &PostParams::default(), &steal_b).await.unwrap_err(),
    );
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    let got = leases.get("controller").await.unwrap();
    let spec = got.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(
        serde_json::to_value(spec.renew_time).unwrap(),
        json!("2026-01-01T00:00:05.123456Z")
    );
    match watch.try_next().await.unwrap().unwrap() {
        WatchEvent::Modified(l) => {
            assert_eq!(l.metadata.resource_version, renewed.metadata.resource_version);
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    // Release: a delete with a stale precondition fails, with the current one succeeds.
    let dp = |rv: &str| DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: Some(rv.into()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    let stale = api_status(
        leases
            .delete("controller", &dp(&read.metadata.resource_version.unwrap()))
            .await
            .unwrap_err(),
    );
    assert_eq!(stale.code, 409);
    leases.delete("controller", &dp(&renewed.metadata.resource_version.unwrap())).await.unwrap();
    assert!(matches!(watch.try_next().await.unwrap().unwrap(), WatchEvent::Deleted(_)));
    drop(watch);
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_objects_with_watchers() {
    let rss_before = rss_kib();
    let (srv, client) = server(ServerOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    // Five watchers on pods (like several controllers) while we write.
    let mut watchers = Vec::new();
    for _ in 0..5 {
        let mut stream =
            pods.watch(&WatchParams::default().timeout(60), "0").await.unwrap().boxed();
        watchers.push(tokio::spawn(async move {
            let mut added = 0;
            while let Some(ev) = stream.try_next().await.unwrap() {
                if matches!(ev, WatchEvent::Added(_)) {
                    added += 1;
                    if added == 500 {
                        break;
                    }
                }
            }
            added
        }));
    }
    let started = std::time::Instant::now();
    for i in 0..500 {
        pods.create(
            &PostParams::default(),
            &pod(&format!("p{i}"), "node-1", &json!({"i": i.to_string()})),
        )
        .await
        .unwrap();
    }
    let create_ms = started.elapsed().as_millis();
    for w in watchers {
        assert_eq!(tokio::time::timeout(Duration::from_secs(20), w).await.unwrap().unwrap(), 500);
    }
    let started = std::time::Instant::now();
    let list = pods.list(&ListParams::default()).await.unwrap();
    let list_ms = started.elapsed().as_millis();
    assert_eq!(list.items.len(), 500);

    // 20 full slices (128 devices, 6 attributes and a capacity each), applied twice.
    let devices: Vec<Value> = (0..128)
        .map(|i| {
            json!({"name": format!("eth{i}"), "attributes": {
                "ifName": {"string": format!("eth{i}")}, "mtu": {"int": 1500}, "mac": {"string": "02:00:00:00:00:01"},
                "pciAddress": {"string": "0000:00:01.0"}, "sriov": {"bool": false}, "numaNode": {"int": 0}},
                "capacity": {"netclaim.dev/interfaces": {"value": "256"}}})
        })
        .collect();
    let pp = PatchParams::apply("netclaim.dev");
    let started = std::time::Instant::now();
    for round in 1..=2 {
        for s in 0..20 {
            let mut obj =
                slice(&format!("node-{s}-0"), &format!("node-{s}"), &Value::Array(devices.clone()));
            obj["spec"]["pool"]["generation"] = json!(round);
            slices.patch(&format!("node-{s}-0"), &pp, &Patch::Apply(&obj)).await.unwrap();
        }
    }
    let apply_ms = started.elapsed().as_millis();
    let started = std::time::Instant::now();
    let all = slices.list(&ListParams::default().fields("spec.nodeName=node-7")).await.unwrap();
    let slice_list_ms = started.elapsed().as_millis();
    assert_eq!(all.items.len(), 1);
    assert_eq!(all.items[0].spec.pool.generation, 2);
    println!(
        "500 pod creates with 5 watchers: {create_ms} ms; list 500 pods: {list_ms} ms; \
         40 applies of 128-device slices: {apply_ms} ms; filtered slice list: {slice_list_ms} ms; \
         test process RSS {rss_before} -> {} KiB (server + client)",
        rss_kib()
    );
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_event_recorder_creates_then_patches_a_series() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let (srv, client) = server(ServerOptions::default()).await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter { controller: "netclaim.dev".into(), instance: Some("node-1".into()) },
    );
    let node_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some("node-1".into()),
        uid: Some("u1".into()),
        ..ObjectReference::default()
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: "CapacityDropped".into(),
        note: Some("allowMultipleAllocations was dropped".into()),
        action: "Publish".into(),
        secondary: None,
    };
    recorder.publish(&ev, &node_ref).await.unwrap();
    recorder.publish(&ev, &node_ref).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, "default");
    let list = events.list(&ListParams::default().fields("regarding.name=node-1")).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].reason.as_deref(), Some("CapacityDropped"));
    assert_eq!(list.items[0].series.as_ref().map(|s| s.count), Some(2));
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_pruned_or_rejected_like_a_built_in_kind() {
    let (srv, client) = server(ServerOptions::default()).await;
    let slices: Api<ResourceSlice> = Api::all(client);
    let obj = slice("s", "node-1", &json!([{"name": "eth1", "futureField": {"x": 1}}]));
    let err = api_status(
        slices
            .patch(
                "s",
                &PatchParams::apply("netclaim.dev").validation_strict(),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
    assert!(err.message.contains("spec.devices[0].futureField"), "{}", err.message);
    // Default (Warn): the field is dropped, as an API server without that feature does.
    let s =
        slices.patch("s", &PatchParams::apply("netclaim.dev"), &Patch::Apply(&obj)).await.unwrap();
    let stored = serde_json::to_value(&s).unwrap();
    assert_eq!(stored["spec"]["devices"][0], json!({"name": "eth1"}));
    let fields = serde_json::to_string(&s.metadata.managed_fields).unwrap();
    assert!(!fields.contains("futureField"), "{fields}");
    srv.shutdown().await.unwrap();
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// One raw HTTP/1.1 request; returns the status code.
async fn raw_status(addr: std::net::SocketAddr, request: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The status line arrives first; read until it is complete.
    while !answer.windows(2).any(|w| w == b"\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed without an answer");
        answer.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&answer);
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn only_local_api_clients_with_the_token_are_served() {
    let (srv, _) =
        server(ServerOptions { bearer_token: Some("s3cr3t".into()), ..ServerOptions::default() })
            .await;
    let addr = srv.addr();
    let get = |host: &str, extra: &str| {
        format!(
            "GET /api/v1/namespaces HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"
        )
    };
    let local = format!("127.0.0.1:{}", addr.port());
    let token = "Authorization: Bearer s3cr3t\r\n";
    assert_eq!(raw_status(addr, &get(&local, token)).await, 200);
    assert_eq!(raw_status(addr, &get(&format!("localhost:{}", addr.port()), token)).await, 200);
    // No token, a wrong token.
    assert_eq!(raw_status(addr, &get(&local, "")).await, 401);
    assert_eq!(raw_status(addr, &get(&local, "Authorization: Bearer guess\r\n")).await, 401);
    // A page whose DNS name was rebound to 127.0.0.1 sends its own Host.
    assert_eq!(raw_status(addr, &get("evil.example:80", token)).await, 403);
    // A browser's cross-site request carries an Origin.
    let with_origin = format!("{token}Origin: http://evil.example\r\n");
    assert_eq!(raw_status(addr, &get(&local, &with_origin)).await, 403);
    // A body a web page can send without a CORS preflight is never parsed as JSON.
    let body = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"x"}}"#;
    let post = |content_type: &str| {
        format!(
            "POST /api/v1/namespaces HTTP/1.1\r\nHost: {local}\r\n{token}Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    assert_eq!(raw_status(addr, &post("text/plain")).await, 415);
    assert_eq!(raw_status(addr, &post("application/x-www-form-urlencoded")).await, 415);
    assert_eq!(raw_status(addr, &post("application/json")).await, 201);
    srv.shutdown().await.unwrap();

    // Serving its own user: a client socket of this process's uid needs no token; another
    // user's would get 401 (checked by the table test in `apiserver::peer`).
    let (srv, _) = server(ServerOptions {
        bearer_token: Some("s3cr3t".into()),
        same_user: true,
        ..ServerOptions::default()
    })
    .await;
    let addr = srv.addr();
    let local = format!("127.0.0.1:{}", addr.port());
    assert_eq!(raw_status(addr, &get(&local, "")).await, 200);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_request_log_records_each_callers_user_and_attributes() {
    use kube_inmemory::apiserver::ADMIN_USER;
    use kube_inmemory::apiserver::request_log::{ANONYMOUS_USER, RequestLog};
    let log = RequestLog::in_memory();
    let (srv, _) = server(ServerOptions {
        bearer_token: Some("admin-token".into()),
        user_tokens: [("node-token".to_owned(), "system:serviceaccount:ns:node".to_owned())].into(),
        request_log: Some(log.clone()),
        ..ServerOptions::default()
    })
    .await;
    let addr = srv.addr();
    let local = format!("127.0.0.1:{}", addr.port());
    let request = |method: &str, path: &str, token: &str| {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: {local}\r\nAuthorization: Bearer {token}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
    };
    let nodes = "/api/v1/nodes?fieldSelector=metadata.name%3Dn1";
    assert_eq!(raw_status(addr, &request("GET", nodes, "node-token")).await, 200);
    assert_eq!(raw_status(addr, &request("GET", "/api/v1/nodes/n1", "admin-token")).await, 404);
    assert_eq!(raw_status(addr, &request("DELETE", "/api/v1/nodes/n1", "guess")).await, 401);
    assert_eq!(raw_status(addr, &request("GET", "/version", "node-token")).await, 200);
    let seen: Vec<(String, String, String, String, bool, u16)> = log
        .records()
        .into_iter()
        .map(|r| {
            let a = r.attributes;
            (r.user, a.verb, a.resource, a.name, a.resource_request, r.code)
        })
        .collect();
    let node = "system:serviceaccount:ns:node".to_owned();
    let row = |user: &str, verb: &str, resource: &str, name: &str, res: bool, code: u16| {
        (user.to_owned(), verb.to_owned(), resource.to_owned(), name.to_owned(), res, code)
    };
    assert_eq!(
        seen,
        vec![
            row(&node, "list", "nodes", "n1", true, 200),
            row(ADMIN_USER, "get", "nodes", "n1", true, 404),
            row(ANONYMOUS_USER, "delete", "nodes", "n1", true, 401),
            row(&node, "get", "", "", false, 200),
        ]
    );
    srv.shutdown().await.unwrap();
}
