//! The REST layer: maps method + path + query onto discovery documents and resource verbs
//! (get, list, watch, create, update, patch, apply, delete, deletecollection).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Shared;
use super::admission;
use super::discovery;
use super::error::ApiError;
use super::objects::{self, DeleteOptions, WriteContext, Written};
use super::pod_streams;
use super::protobuf;
use super::resources::ResourceInfo;
use super::reviews;
use super::scale;
use super::selectors::{FieldSelector, LabelSelector};
use super::strategic;
use super::table;
use super::typed::FieldValidation;
use super::watch::WatchRequest;

/// A request as the REST layer sees it.
pub(crate) struct ApiRequest<'a> {
    /// HTTP method.
    pub(crate) method: &'a str,
    /// URL path.
    pub(crate) path: &'a str,
    /// Decoded query parameters.
    pub(crate) query: &'a HashMap<String, String>,
    /// `Accept` header.
    pub(crate) accept: &'a str,
    /// `Content-Type` header.
    pub(crate) content_type: &'a str,
    /// `User-Agent` header.
    pub(crate) user_agent: &'a str,
    /// Body bytes.
    pub(crate) body: &'a [u8],
    /// Who asks (admission policies see it as `request.userInfo`).
    pub(crate) user: &'a reviews::UserInfo,
}

/// What the REST layer answers.
pub(crate) enum ApiResponse {
    /// A JSON document with a status code and `Warning` headers.
    Json { code: u16, body: Value, warnings: Vec<String> },
    /// An already serialised JSON document (large lists, written without building a
    /// `Value` copy of every item).
    Bytes { code: u16, body: Vec<u8> },
    /// A watch to stream.
    Watch(WatchRequest),
}

fn ok(body: Value) -> ApiResponse {
    ApiResponse::Json { code: 200, body, warnings: Vec::new() }
}

/// The resource addressed by a path.
struct Target {
    resource: Arc<ResourceInfo>,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_target(
    shared: &Shared,
    group: &str,
    version: &str,
    rest: &[&str],
    path: &str,
) -> Result<Target, ApiError> {
    let lookup = |plural: &str| shared.store.with_registry(|r| r.lookup(group, version, plural));
    let (namespace, plural, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] if lookup(plural).is_some_and(|r| r.namespaced) => {
            (Some((*ns).to_owned()), *plural, tail)
        }
        [plural, tail @ ..] => (None, *plural, tail),
        [] => return Err(ApiError::no_route(path)),
    };
    let resource = lookup(plural).ok_or_else(|| ApiError::no_route(path))?;
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some((*name).to_owned()), None),
        [name, sub] => (Some((*name).to_owned()), Some((*sub).to_owned())),
        _ => return Err(ApiError::no_route(path)),
    };
    if let Some(sub) = &subresource
        && !((sub == "status" && resource.has_status)
            || (sub == "scale" && scale::has_scale(&resource)))
    {
        return Err(ApiError::no_route(path));
    }
    Ok(Target { resource, namespace, name, subresource })
}

/// Routes one request.
pub(crate) fn handle(shared: &Shared, req: &ApiRequest<'_>) -> Result<ApiResponse, ApiError> {
    let segments: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
    let get = req.method == "GET";
    match segments.as_slice() {
        ["version"] if get => Ok(ok(discovery::version())),
        ["healthz" | "readyz" | "livez"] if get => Ok(ok(json!("ok"))),
        ["api"] if get => Ok(ok(discovery::core_versions(&shared.address))),
        ["apis"] if get => Ok(ok(shared.store.with_registry(discovery::group_list))),
        ["apis", group] if get => shared
            .store
            .with_registry(|r| discovery::group(r, group))
            .map(ok)
            .ok_or_else(|| ApiError::no_route(req.path)),
        ["api", version] if get => shared
            .store
            .with_registry(|r| discovery::resource_list(r, "", version))
            .map(ok)
            .ok_or_else(|| ApiError::no_route(req.path)),
        ["apis", group, version] if get => shared
            .store
            .with_registry(|r| discovery::resource_list(r, group, version))
            .map(ok)
            .ok_or_else(|| ApiError::no_route(req.path)),
        ["openapi", "v3"] if get => Ok(ok(shared.store.with_registry(discovery::openapi_index))),
        ["openapi", "v3", rest @ ..] if get => shared
            .store
            .with_registry(|r| discovery::openapi_group_version(r, &rest.join("/")))
            .map(ok)
            .ok_or_else(|| ApiError::no_route(req.path)),
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] if req.method == "POST" => {
            reviews::token_review(shared, req)
        }
        ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"] if req.method == "POST" => {
            reviews::subject_access_review(shared, req)
        }
        ["api", "v1", "namespaces", namespace, "serviceaccounts", name, "token"]
            if req.method == "POST" =>
        {
            reviews::token_request(shared, req, namespace, name)
        }
        ["api", "v1", "namespaces", namespace, "pods", name, sub]
            if pod_streams::SUBRESOURCES.contains(sub) =>
        {
            Err(pod_streams::answer(shared, namespace, name, sub))
        }
        ["api", version, rest @ ..] => {
            resource_request(shared, req, &parse_target(shared, "", version, rest, req.path)?)
        }
        ["apis", group, version, rest @ ..] => {
            resource_request(shared, req, &parse_target(shared, group, version, rest, req.path)?)
        }
        _ => Err(ApiError::no_route(req.path)),
    }
}

fn q<'a>(req: &'a ApiRequest<'_>, key: &str) -> Option<&'a str> {
    req.query.get(key).map(String::as_str)
}

fn q_bool(req: &ApiRequest<'_>, key: &str) -> bool {
    matches!(q(req, key), Some("true" | "1"))
}

fn dry_run(req: &ApiRequest<'_>) -> Result<bool, ApiError> {
    match q(req, "dryRun") {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "unsupported dryRun value {other:?}: only \"All\" is supported"
        ))),
    }
}

/// The field manager of a non-apply write: `fieldManager`, else the user agent's program
/// name (what the real server derives).
fn update_manager<'a>(req: &'a ApiRequest<'_>) -> &'a str {
    match q(req, "fieldManager").filter(|m| !m.is_empty()) {
        Some(m) => m,
        None => req.user_agent.split('/').next().filter(|s| !s.is_empty()).unwrap_or("unknown"),
    }
}

fn parse_body(req: &ApiRequest<'_>) -> Result<Value, ApiError> {
    let ct = req.content_type.split(';').next().unwrap_or_default().trim();
    if ct == protobuf::MEDIA_TYPE {
        return protobuf::decode(req.body);
    }
    // Only the media types API clients send: a `text/plain` or form body is what a web page
    // can send without a CORS preflight, and is never parsed.
    if ct != "application/json" && ct != "application/yaml" {
        return Err(ApiError::unsupported_media_type(ct));
    }
    if ct.contains("yaml") {
        yaml_serde::from_slice(req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
    } else {
        serde_json::from_slice(req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding JSON: {e}")))
    }
}

fn written(r: &ResourceInfo, w: Written) -> ApiResponse {
    ApiResponse::Json {
        code: if w.created { 201 } else { 200 },
        body: r.present(&w.object).into_owned(),
        warnings: w.warnings,
    }
}

fn resource_request(
    shared: &Shared,
    req: &ApiRequest<'_>,
    target: &Target,
) -> Result<ApiResponse, ApiError> {
    let r = &*target.resource;
    if !r.namespaced && target.namespace.is_some() {
        return Err(ApiError::no_route(req.path));
    }
    if let (Some("scale"), Some(name)) = (target.subresource.as_deref(), target.name.as_deref()) {
        // A write through /scale changes the main object's spec.replicas.
        let ctx =
            WriteContext { subresource: "", ..context(shared, req, update_manager(req), target)? };
        return scale::handle(shared, req, r, &key(target, name), &ctx, dry_run(req)?);
    }
    match (req.method, target.name.as_deref()) {
        ("GET", None) if q_bool(req, "watch") => watch(shared, req, target),
        ("GET", None) => list(shared, req, target),
        ("GET", Some(name)) => get(shared, req, target, name),
        ("POST", None) => create(shared, req, target),
        ("PUT", Some(name)) => update(shared, req, target, name),
        ("PATCH", Some(name)) => patch(shared, req, target, name),
        ("DELETE", Some(name)) => delete(shared, req, target, name),
        ("DELETE", None) => delete_collection(shared, req, target),
        (method, _) => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {})",
            req.path
        ))),
    }
}

fn key(target: &Target, name: &str) -> (String, String) {
    (target.namespace.clone().unwrap_or_default(), name.to_owned())
}

fn get(
    shared: &Shared,
    req: &ApiRequest<'_>,
    target: &Target,
    name: &str,
) -> Result<ApiResponse, ApiError> {
    let r = &*target.resource;
    let obj = shared
        .store
        .transact(false, |t| t.get(r, &key(target, name)))
        .ok_or_else(|| ApiError::not_found(&r.group, &r.plural, name))?;
    if table::wants_table(req.accept) {
        let rv = obj
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        return Ok(ok(table::table(r, &[&obj], &rv, q(req, "includeObject") == Some("Object"))));
    }
    Ok(ok(r.present(&obj).into_owned()))
}

fn selectors(
    req: &ApiRequest<'_>,
    r: &ResourceInfo,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    Ok((
        LabelSelector::parse(q(req, "labelSelector").unwrap_or_default())?,
        FieldSelector::parse(q(req, "fieldSelector").unwrap_or_default(), r)?,
    ))
}

fn hex(s: &str) -> String {
    use std::fmt::Write;
    s.bytes().fold(String::with_capacity(s.len() * 2), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

fn list(shared: &Shared, req: &ApiRequest<'_>, target: &Target) -> Result<ApiResponse, ApiError> {
    let r = &*target.resource;
    let (labels, fields) = selectors(req, r)?;
    let limit = match q(req, "limit") {
        None | Some("" | "0") => None,
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        ),
    };
    // Continue token: the key after which to resume. Pages are served from the current
    // state rather than from a snapshot at the first page's version (documented gap).
    let after = match q(req, "continue").filter(|c| !c.is_empty()) {
        Some(c) => Some(unhex(c).ok_or_else(|| ApiError::bad_request("invalid continue token"))?),
        None => None,
    };
    let (mut objects, rv) =
        shared.store.transact(false, |t| (t.list(r, target.namespace.as_deref()), t.rv()));
    // One Event resource, two API versions (as in Kubernetes): core v1 lists include the
    // events.k8s.io/v1 Events, converted, so `kubectl describe` shows what controllers
    // recorded through the newer API.
    if r.group.is_empty()
        && r.plural == "events"
        && let Some(newer) =
            shared.store.with_registry(|reg| reg.lookup("events.k8s.io", "v1", "events"))
    {
        let converted =
            shared.store.transact(false, |t| t.list(&newer, target.namespace.as_deref()));
        objects.extend(converted.iter().map(|e| std::sync::Arc::new(core_event(e))));
        objects.sort_by_key(|o| {
            let (ns, name) = objects::key_of(o);
            format!("{ns}/{name}")
        });
    }
    let sort_key = |o: &Value| {
        let (ns, name) = objects::key_of(o);
        format!("{ns}/{name}")
    };
    let mut items: Vec<&Value> = objects
        .iter()
        .map(AsRef::as_ref)
        .filter(|o| after.as_ref().is_none_or(|a| sort_key(o) > *a))
        .filter(|o| labels.matches(o) && fields.matches(o))
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(limit) = limit
        && items.len() > limit
    {
        let remaining = items.len() - limit;
        items.truncate(limit);
        if let Some(last) = items.last() {
            meta["continue"] = json!(hex(&sort_key(last)));
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    if table::wants_table(req.accept) {
        let mut t =
            table::table(r, &items, &rv.to_string(), q(req, "includeObject") == Some("Object"));
        t["metadata"] = meta;
        return Ok(ok(t));
    }
    let head = json!({"kind": r.list_kind, "apiVersion": r.api_version(), "metadata": meta});
    let presented: Vec<std::borrow::Cow<'_, Value>> = items.iter().map(|o| r.present(o)).collect();
    let items: Vec<&Value> = presented.iter().map(AsRef::as_ref).collect();
    Ok(ApiResponse::Bytes { code: 200, body: list_body(&head, &items) })
}

/// `{...head, "items": [...]}` serialised straight from the stored objects.
fn list_body(head: &Value, items: &[&Value]) -> Vec<u8> {
    let mut out = head.to_string().into_bytes();
    // `head` is a non-empty JSON object: replace its closing brace with the items.
    out.pop();
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Writing a Value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, item);
    }
    out.extend_from_slice(b"]}");
    out
}

fn watch(shared: &Shared, req: &ApiRequest<'_>, target: &Target) -> Result<ApiResponse, ApiError> {
    let r = &*target.resource;
    let (labels, fields) = selectors(req, r)?;
    let since = match q(req, "resourceVersion") {
        None | Some("" | "0") => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {v:?}")))?,
        ),
    };
    let timeout = match q(req, "timeoutSeconds") {
        Some(t) if !t.is_empty() => Duration::from_secs(
            t.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
        ),
        _ => shared.options.default_watch_timeout,
    };
    Ok(ApiResponse::Watch(WatchRequest {
        resource: target.resource.clone(),
        namespace: target.namespace.clone(),
        labels,
        fields,
        since,
        send_initial_events: q_bool(req, "sendInitialEvents"),
        bookmarks: q_bool(req, "allowWatchBookmarks"),
        bookmark_interval: shared.options.bookmark_interval,
        timeout,
        as_table: table::wants_table(req.accept),
    }))
}

fn context<'a>(
    shared: &'a Shared,
    req: &'a ApiRequest<'_>,
    manager: &'a str,
    target: &'a Target,
) -> Result<WriteContext<'a>, ApiError> {
    Ok(WriteContext {
        manager,
        subresource: target.subresource.as_deref().unwrap_or_default(),
        field_validation: FieldValidation::parse(q(req, "fieldValidation"))?,
        drop_consumable_capacity: shared.options.drop_consumable_capacity,
        admission: Some(caller(shared, req)),
    })
}

/// The request's caller as admission sees it.
fn caller<'a>(shared: &'a Shared, req: &'a ApiRequest<'_>) -> admission::Caller<'a> {
    admission::Caller {
        policies: &shared.admission,
        user: req.user,
        dry_run: q(req, "dryRun").is_some_and(|d| !d.is_empty()),
    }
}

/// Admits the deletion of `old` by the admission policies (warnings of `Warn` bindings).
fn admit_delete(
    t: &super::store::Txn<'_>,
    r: &ResourceInfo,
    caller: &admission::Caller<'_>,
    old: &Value,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    let write = admission::Write {
        resource: r,
        operation: admission::Operation::Delete,
        subresource: "",
        object: None,
        old_object: Some(old),
    };
    admission::admit(t, Some(caller), &write, warnings)
}

fn create(shared: &Shared, req: &ApiRequest<'_>, target: &Target) -> Result<ApiResponse, ApiError> {
    let r = &*target.resource;
    let mut obj = parse_body(req)?;
    objects::check_type_meta(r, &mut obj)?;
    objects::set_namespace(r, &mut obj, target.namespace.as_deref())?;
    let manager = update_manager(req);
    let ctx = context(shared, req, manager, target)?;
    let w = shared.store.transact(dry_run(req)?, |t| objects::create(t, r, obj, &ctx, None))?;
    Ok(written(r, w))
}

fn update(
    shared: &Shared,
    req: &ApiRequest<'_>,
    target: &Target,
    name: &str,
) -> Result<ApiResponse, ApiError> {
    let r = &*target.resource;
    let mut obj = parse_body(req)?;
    objects::check_type_meta(r, &mut obj)?;
    objects::set_namespace(r, &mut obj, target.namespace.as_deref())?;
    let body_name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let manager = update_manager(req);
    let ctx = context(shared, req, manager, target)?;
    let w = shared.store.transact(dry_run(req)?, |t| {
        let old = t
            .get(r, &key(target, name))
            .ok_or_else(|| ApiError::not_found(&r.group, &r.plural, name))?;
        check_rv_precondition(r, &obj, &old, name)?;
        objects::update(t, r, &old, obj, &ctx, false)
    })?;
    Ok(written(r, w))
}

fn check_rv_precondition(
    r: &ResourceInfo,
    obj: &Value,
    old: &Value,
    name: &str,
) -> Result<(), ApiError> {
    if let Some(rv) =
        obj.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|s| !s.is_empty())
        && Some(rv) != old.pointer("/metadata/resourceVersion").and_then(Value::as_str)
    {
        return Err(ApiError::conflict(
            &r.group,
            &r.plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    Ok(())
}

/// PATCH with `application/apply-patch+yaml`: server-side apply.
fn server_side_apply_patch(
    shared: &Shared,
    req: &ApiRequest<'_>,
    target: &Target,
    name: &str,
    dry: bool,
) -> Result<ApiResponse, ApiError> {
    let r = &*target.resource;
    let manager = q(req, "fieldManager").filter(|m| !m.is_empty()).ok_or_else(|| {
        ApiError::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            &[super::error::FieldError::required("fieldManager", "is required for apply patch")],
        )
    })?;
    let mut config: Value = yaml_serde::from_slice(req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    objects::check_type_meta(r, &mut config)?;
    for (field, what) in [("apiVersion", "apiVersion"), ("kind", "kind")] {
        if config.get(field).is_none() {
            return Err(ApiError::bad_request(format!("{what} must be set in an apply patch")));
        }
    }
    let body_name = config.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    config["metadata"]["name"] = json!(name);
    objects::set_namespace(r, &mut config, target.namespace.as_deref())?;
    if let Some(m) = config["metadata"].as_object_mut() {
        for f in ["managedFields", "resourceVersion", "uid", "creationTimestamp", "generation"] {
            m.remove(f);
        }
    }
    let force = q_bool(req, "force");
    let ctx = context(shared, req, manager, target)?;
    let w = shared.store.transact(dry, |t| {
        let live = t.get(r, &key(target, name));
        objects::server_side_apply(t, r, live.as_ref(), config, &ctx, force)
    })?;
    Ok(written(r, w))
}

fn patch(
    shared: &Shared,
    req: &ApiRequest<'_>,
    target: &Target,
    name: &str,
) -> Result<ApiResponse, ApiError> {
    let r = &*target.resource;
    let ct = req.content_type.split(';').next().unwrap_or_default().trim().to_owned();
    let dry = dry_run(req)?;
    if ct == "application/apply-patch+yaml" || ct == "application/apply-patch+json" {
        return server_side_apply_patch(shared, req, target, name, dry);
    }
    if !matches!(
        ct.as_str(),
        "application/json-patch+json"
            | "application/merge-patch+json"
            | "application/strategic-merge-patch+json"
    ) {
        return Err(ApiError::unsupported_media_type(&ct));
    }
    let patch_doc: Value = serde_json::from_slice(req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let manager = update_manager(req);
    let ctx = context(shared, req, manager, target)?;
    let w = shared.store.transact(dry, |t| {
        let old = t
            .get(r, &key(target, name))
            .ok_or_else(|| ApiError::not_found(&r.group, &r.plural, name))?;
        let mut doc = (*old).clone();
        match ct.as_str() {
            "application/json-patch+json" => {
                let ops: json_patch::Patch = serde_json::from_value(patch_doc.clone())
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                json_patch::patch(&mut doc, &ops).map_err(|e| ApiError {
                    code: 422,
                    reason: "Invalid",
                    message: format!("the JSON patch could not be applied: {e}"),
                    details: None,
                })?;
            }
            "application/merge-patch+json" => {
                if !patch_doc.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                json_patch::merge(&mut doc, &patch_doc);
            }
            // The real server has no merge keys for custom resources: 415, as there.
            "application/strategic-merge-patch+json" if r.custom.is_some() => {
                return Err(ApiError::with(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                ));
            }
            "application/strategic-merge-patch+json" => {
                if !patch_doc.is_object() {
                    return Err(ApiError::bad_request(
                        "a strategic merge patch must be a JSON object",
                    ));
                }
                strategic::apply(r, &mut doc, &patch_doc);
            }
            other => return Err(ApiError::unsupported_media_type(other)),
        }
        check_rv_precondition(r, &doc, &old, name)?;
        if objects::key_of(&doc).1 != name {
            return Err(ApiError::bad_request("metadata.name cannot be changed by a patch"));
        }
        objects::update(t, r, &old, doc, &ctx, false)
    })?;
    Ok(written(r, w))
}

fn delete_options(req: &ApiRequest<'_>) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions::default();
    if !req.body.is_empty() {
        let body: Value = serde_json::from_slice(req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        opts.grace_period = body.get("gracePeriodSeconds").and_then(Value::as_i64);
        opts.uid = body.pointer("/preconditions/uid").and_then(Value::as_str).map(str::to_owned);
        opts.resource_version = body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_owned);
    }
    if let Some(g) = q(req, "gracePeriodSeconds").filter(|g| !g.is_empty()) {
        opts.grace_period = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?,
        );
    }
    Ok(opts)
}

fn delete(
    shared: &Shared,
    req: &ApiRequest<'_>,
    target: &Target,
    name: &str,
) -> Result<ApiResponse, ApiError> {
    let r = &*target.resource;
    let opts = delete_options(req)?;
    let caller = caller(shared, req);
    let mut warnings = Vec::new();
    let obj = shared.store.transact(dry_run(req)?, |t| {
        let old = t
            .get(r, &key(target, name))
            .ok_or_else(|| ApiError::not_found(&r.group, &r.plural, name))?;
        admit_delete(t, r, &caller, &old, &mut warnings)?;
        objects::delete(t, r, &old, &opts)
    })?;
    Ok(ApiResponse::Json { code: 200, body: r.present(&obj).into_owned(), warnings })
}

fn delete_collection(
    shared: &Shared,
    req: &ApiRequest<'_>,
    target: &Target,
) -> Result<ApiResponse, ApiError> {
    let r = &*target.resource;
    let (labels, fields) = selectors(req, r)?;
    let opts = delete_options(req)?;
    let caller = caller(shared, req);
    let mut warnings = Vec::new();
    let deleted: Vec<Value> =
        shared.store.transact(dry_run(req)?, |t| -> Result<Vec<Value>, ApiError> {
            let all = t.list(r, target.namespace.as_deref());
            let mut out = Vec::new();
            for o in all.iter().filter(|o| labels.matches(o) && fields.matches(o)) {
                admit_delete(t, r, &caller, o, &mut warnings)?;
                let gone = objects::delete(t, r, o, &opts)?;
                out.push(r.present(&gone).into_owned());
            }
            Ok(out)
        })?;
    let rv = shared.store.current_rv();
    let body = json!({"kind": r.list_kind, "apiVersion": r.api_version(), "metadata": {"resourceVersion": rv.to_string()}, "items": deleted});
    Ok(ApiResponse::Json { code: 200, body, warnings })
}

/// An events.k8s.io/v1 Event in core/v1 form (the fields kubectl describe prints).
fn core_event(event: &Value) -> Value {
    let pick = |field: &str| event.get(field).cloned().unwrap_or(Value::Null);
    let mut metadata = pick("metadata");
    if let Some(m) = metadata.as_object_mut() {
        m.remove("managedFields");
    }
    let count =
        event.get("deprecatedCount").cloned().or_else(|| event.pointer("/series/count").cloned());
    let last = event
        .get("deprecatedLastTimestamp")
        .cloned()
        .or_else(|| event.pointer("/series/lastObservedTime").cloned())
        .or_else(|| event.get("eventTime").cloned());
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": metadata,
        "involvedObject": pick("regarding"),
        "related": pick("related"),
        "reason": pick("reason"),
        "message": pick("note"),
        "type": pick("type"),
        "action": pick("action"),
        "eventTime": pick("eventTime"),
        "firstTimestamp": event.get("deprecatedFirstTimestamp").cloned().or_else(|| event.get("eventTime").cloned()),
        "lastTimestamp": last,
        "count": count.unwrap_or(json!(1)),
        "source": {"component": pick("reportingController"), "host": event.get("deprecatedSource").and_then(|s| s.get("host")).cloned()},
        "reportingComponent": pick("reportingController"),
        "reportingInstance": pick("reportingInstance"),
    })
}
