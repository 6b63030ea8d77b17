//! The PodNetwork reconciler (API calls): finalizer, DeviceClass, status; on deletion the
//! DeviceClass goes and the finalizer waits for the network's IPBlocks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

use super::cache::NetworkCache;
use super::device_class::{device_class, is_current, is_managed_for};
use super::metrics::{ControllerMetrics, ResultLabel};
use super::status::{Verdict, deleting_status, desired_status, needs_write, verdict};
use super::sweep::SweepTrigger;
use crate::model::pod_network::{FINALIZER, IpBlock, PodNetwork, device_class_name, reason};

/// A reconciled network is looked at again this often even without events (a missed watch
/// event, a DeviceClass edited while the controller was down).
const RESYNC: Duration = Duration::from_mins(5);
/// A network being deleted checks its IPBlocks this often (their deletions also trigger it).
const DELETION_RECHECK: Duration = Duration::from_secs(30);

/// A failed reconcile (retried with backoff by the runtime).
#[derive(Debug, thiserror::Error)]
pub(super) enum ReconcileError {
    /// An API call failed.
    #[error("{action} {what}: {source}")]
    Api {
        /// `patching the status of`, ...
        action: &'static str,
        /// `PodNetwork medianet`, ...
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The PodNetwork cache stopped (the controller is shutting down).
    #[error("the PodNetwork cache is gone")]
    CacheGone,
}

fn api_error(action: &'static str, what: String) -> impl FnOnce(kube::Error) -> ReconcileError {
    move |source| ReconcileError::Api { action, what, source }
}

/// What every reconcile shares.
pub(super) struct Context {
    /// The driver name: field manager, DeviceClass driver, the networks we own.
    pub(super) driver: String,
    /// Unary API calls.
    pub(super) client: kube::Client,
    /// Every PodNetwork (all providers), for the overlap check; updated before each change
    /// is announced, so a reconcile triggered by a change sees it.
    pub(super) networks: NetworkCache,
    /// Metrics.
    pub(super) metrics: Arc<ControllerMetrics>,
    /// Asks the sweep to judge the live IPBlocks against a spec that changed.
    sweep: SweepTrigger,
    /// The `Ready` reason last written per network of ours, for the gauge.
    reasons: Mutex<BTreeMap<String, &'static str>>,
}

impl Context {
    pub(super) fn new(
        driver: String,
        client: kube::Client,
        networks: NetworkCache,
        metrics: Arc<ControllerMetrics>,
        sweep: SweepTrigger,
    ) -> Self {
        Self { driver, client, networks, metrics, sweep, reasons: Mutex::default() }
    }

    /// Records `reason` for `name` (`None`: the network is gone or not ours) and refreshes
    /// the gauge, dropping networks that left the cache.
    fn record_reason(&self, name: &str, reason: Option<&'static str>) {
        let mut reasons = self.reasons.lock().unwrap_or_else(PoisonError::into_inner);
        match reason {
            Some(reason) => {
                reasons.insert(name.to_owned(), reason);
            }
            None => {
                reasons.remove(name);
            }
        }
        let present: std::collections::BTreeSet<String> =
            self.networks.state().iter().map(|n| n.name_any()).collect();
        reasons.retain(|name, _| present.contains(name));
        self.metrics.set_pod_networks(reasons.values().copied());
    }
}

/// Reconciles one network, counting the outcome.
pub(super) async fn reconcile(
    network: Arc<PodNetwork>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let result = reconcile_network(&network, &ctx).await;
    let label = ResultLabel { result: if result.is_ok() { "success" } else { "error" } };
    ctx.metrics.reconciles.get_or_create(&label).inc();
    result
}

/// The runtime's retry policy for a failed reconcile.
#[allow(clippy::needless_pass_by_value, reason = "the signature kube-runtime's Controller calls")]
pub(super) fn error_policy(
    network: Arc<PodNetwork>,
    err: &ReconcileError,
    _: Arc<Context>,
) -> Action {
    tracing::warn!(network = %network.name_any(), %err, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile_network(network: &PodNetwork, ctx: &Context) -> Result<Action, ReconcileError> {
    // The overlap check needs every network: never judge against a half-filled cache.
    ctx.networks.ready().await.map_err(|_| ReconcileError::CacheGone)?;
    let name = network.name_any();
    if network.spec.provider != ctx.driver {
        ctx.record_reason(&name, None);
        return Ok(Action::await_change());
    }
    if network.metadata.deletion_timestamp.is_some() {
        return finalize(network, ctx).await;
    }
    let networks: Api<PodNetwork> = Api::all(ctx.client.clone());
    if !network.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = network.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        set_finalizers(&networks, network, &finalizers, &ctx.driver).await?;
    }

    let observed = network.status.as_ref().and_then(|status| status.observed_generation);
    if observed != network.metadata.generation {
        // A new spec: compare it with the live IPBlocks now rather than at the next period.
        ctx.sweep.trigger();
    }
    let all = ctx.networks.state();
    let verdict = verdict(network, all.iter().map(AsRef::as_ref));
    let class = sync_device_class(network, &verdict, ctx).await?;
    let desired = desired_status(network, &verdict, class, Timestamp::now());
    if needs_write(network, &desired) {
        let mut body = serde_json::to_value(&desired).unwrap_or(Value::Null);
        if desired.device_class_name.is_none() {
            // A merge patch keeps fields it does not name: remove a stale name explicitly.
            body["deviceClassName"] = Value::Null;
        }
        let params =
            PatchParams { field_manager: Some(ctx.driver.clone()), ..PatchParams::default() };
        // On the resourceVersion read: the sweep writes the same status (`nodes`, the
        // `Conflict` condition) and neither may drop what the other wrote after this read;
        // a 409 is retried on the fresh object.
        let patch = json!({
            "metadata": {"resourceVersion": network.resource_version()},
            "status": body,
        });
        networks
            .patch_status(&name, &params, &Patch::Merge(patch))
            .await
            .map_err(api_error("patching the status of", format!("PodNetwork {name}")))?;
        let level_is_ready = matches!(verdict, Verdict::Ready | Verdict::Disabled);
        if level_is_ready {
            tracing::info!(network = %name, reason = verdict.reason(), message = %verdict.message(), "PodNetwork status");
        } else {
            tracing::warn!(network = %name, reason = verdict.reason(), message = %verdict.message(), "PodNetwork status");
        }
    }
    ctx.record_reason(&name, Some(verdict.reason()));
    Ok(Action::requeue(RESYNC))
}

/// Creates or updates the DeviceClass when the verdict calls for it; returns its name when
/// it exists.
async fn sync_device_class(
    network: &PodNetwork,
    verdict: &Verdict,
    ctx: &Context,
) -> Result<Option<String>, ReconcileError> {
    let name = device_class_name(&network.name_any());
    let classes: Api<DeviceClass> = Api::all(ctx.client.clone());
    let existing = classes
        .get_opt(&name)
        .await
        .map_err(api_error("reading", format!("DeviceClass {name}")))?;
    if !verdict.manages_device_class() {
        // Invalid or overlapping: pods already running on the network keep their class.
        return Ok(existing.map(|_| name));
    }
    let desired = device_class(network, &ctx.driver);
    if existing.as_ref().is_none_or(|existing| !is_current(existing, &desired)) {
        let params = PatchParams::apply(&ctx.driver).force();
        classes
            .patch(&name, &params, &Patch::Apply(&desired))
            .await
            .map_err(api_error("applying", format!("DeviceClass {name}")))?;
        tracing::info!(network = %network.name_any(), class = %name, "DeviceClass applied");
    }
    Ok(Some(name))
}

/// Writes `finalizers` with the object's resourceVersion as a precondition (a concurrent
/// change by someone else fails with 409 and is retried on a fresh read).
async fn set_finalizers(
    api: &Api<PodNetwork>,
    network: &PodNetwork,
    finalizers: &[String],
    driver: &str,
) -> Result<(), ReconcileError> {
    let name = network.name_any();
    let patch = json!({
        "metadata": {"resourceVersion": network.resource_version(), "finalizers": finalizers}
    });
    let params = PatchParams { field_manager: Some(driver.to_owned()), ..PatchParams::default() };
    match api.patch(&name, &params, &Patch::Merge(patch)).await {
        // Gone already: a reconcile queued before our last finalizer write let the deleted
        // network go runs on the stale copy; there is nothing left to hold.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        result => result
            .map(|_| ())
            .map_err(api_error("writing the finalizers of", format!("PodNetwork {name}"))),
    }
}

/// A network being deleted: its DeviceClass goes now; our finalizer goes once no IPBlock of
/// it is left (nodes release a deleted network's empty blocks at once; a block still holding
/// addresses keeps the network).
async fn finalize(network: &PodNetwork, ctx: &Context) -> Result<Action, ReconcileError> {
    let name = network.name_any();
    if !network.finalizers().iter().any(|f| f == FINALIZER) {
        ctx.record_reason(&name, None);
        return Ok(Action::await_change());
    }
    let class_name = device_class_name(&name);
    let classes: Api<DeviceClass> = Api::all(ctx.client.clone());
    let existing = classes
        .get_opt(&class_name)
        .await
        .map_err(api_error("reading", format!("DeviceClass {class_name}")))?;
    if let Some(class) = existing.filter(|class| is_managed_for(class, &name)) {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: class.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match classes.delete(&class_name, &params).await {
            Ok(_) => {
                tracing::info!(network = %name, class = %class_name, "DeviceClass deleted with its network");
            }
            Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {}
            Err(e) => return Err(api_error("deleting", format!("DeviceClass {class_name}"))(e)),
        }
    }
    let blocks = blocks_of(&ctx.client, &name).await?;
    if !blocks.is_empty() {
        tracing::info!(
            network = %name,
            blocks = blocks.len(),
            first = %blocks[0].0,
            "PodNetwork deletion waits for its IPBlocks"
        );
        ctx.record_reason(&name, Some(reason::DELETING));
        write_deleting_status(network, &blocks, ctx).await?;
        return Ok(Action::requeue(DELETION_RECHECK));
    }
    let networks: Api<PodNetwork> = Api::all(ctx.client.clone());
    let rest: Vec<String> =
        network.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    set_finalizers(&networks, network, &rest, &ctx.driver).await?;
    tracing::info!(network = %name, "PodNetwork has no IPBlocks left; finalizer removed");
    ctx.record_reason(&name, None);
    Ok(Action::await_change())
}

/// Says in `Ready` that the deletion waits for `blocks` (`kubectl get podnetwork` showed
/// `Ready` until the object went, up to [`DELETION_RECHECK`] and more later).
async fn write_deleting_status(
    network: &PodNetwork,
    blocks: &[(String, String)],
    ctx: &Context,
) -> Result<(), ReconcileError> {
    let name = network.name_any();
    let desired = deleting_status(network, blocks, Timestamp::now());
    if !needs_write(network, &desired) {
        return Ok(());
    }
    let mut body = serde_json::to_value(&desired).unwrap_or(Value::Null);
    // A merge patch keeps fields it does not name: the class is gone.
    body["deviceClassName"] = Value::Null;
    let patch = json!({
        "metadata": {"resourceVersion": network.resource_version()},
        "status": body,
    });
    let params = PatchParams { field_manager: Some(ctx.driver.clone()), ..PatchParams::default() };
    match Api::<PodNetwork>::all(ctx.client.clone())
        .patch_status(&name, &params, &Patch::Merge(patch))
        .await
    {
        // Changed since the read (the sweep's status, a block's release): the change
        // triggers another reconcile; gone: the last finalizer went meanwhile.
        Err(kube::Error::Api(status)) if status.is_conflict() || status.is_not_found() => Ok(()),
        result => result
            .map(|_| ())
            .map_err(api_error("patching the status of", format!("PodNetwork {name}"))),
    }
}

/// Names and nodes of the IPBlocks of `pod_network`, read from the API server (not a cache: a block
/// created a moment ago must hold the finalizer). Uses the CRD's selectable field
/// `spec.podNetwork`; a server without selectable fields for custom resources (before
/// Kubernetes 1.31) refuses it, and then every block is listed and filtered here.
async fn blocks_of(
    client: &kube::Client,
    pod_network: &str,
) -> Result<Vec<(String, String)>, ReconcileError> {
    let api: Api<IpBlock> = Api::all(client.clone());
    let selected = ListParams::default().fields(&format!("spec.podNetwork={pod_network}"));
    let list = match api.list(&selected).await {
        Ok(list) => list,
        Err(kube::Error::Api(status)) if status.code == 400 => api
            .list(&ListParams::default())
            .await
            .map_err(api_error("listing", "IPBlocks".to_owned()))?,
        Err(e) => return Err(api_error("listing", format!("IPBlocks of {pod_network}"))(e)),
    };
    Ok(list
        .items
        .into_iter()
        .filter(|block| block.spec.pod_network == pod_network)
        .map(|block| (block.name_any(), block.spec.node_name))
        .collect())
}
