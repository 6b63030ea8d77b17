//! The controller's [`ClusterApi`] on a Kubernetes API server: lists, the conditional IPBlock
//! delete and the conditional PodNetwork status write, each one request (claims paged).

use std::collections::BTreeSet;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

use crate::controller::ports::{BlockDeleted, ClusterApi, ClusterApiError, StatusWritten};
use crate::model::cause::cause;
use crate::model::pod_network::{IpBlock, PodNetwork, PodNetworkStatus};

/// Page size of the cluster-wide claim list.
const CLAIM_PAGE: u32 = 500;

/// [`ClusterApi`] through a kube client, writing as `field_manager`.
#[derive(Clone)]
pub struct KubeCluster {
    client: kube::Client,
    field_manager: String,
}

impl KubeCluster {
    /// Calls through `client` (unary calls: it should have a read timeout), writes named
    /// after `field_manager` (the driver name).
    #[must_use]
    pub fn new(client: kube::Client, field_manager: &str) -> Self {
        Self { client, field_manager: field_manager.to_owned() }
    }
}

fn failed(action: &'static str) -> impl FnOnce(kube::Error) -> ClusterApiError {
    move |err| ClusterApiError { action, source: cause(err) }
}

impl ClusterApi for KubeCluster {
    fn list_ip_blocks(&self) -> BoxFuture<'_, Result<Vec<IpBlock>, ClusterApiError>> {
        Box::pin(async move {
            Api::<IpBlock>::all(self.client.clone())
                .list(&ListParams::default())
                .await
                .map(|list| list.items)
                .map_err(failed("listing IPBlocks"))
        })
    }

    fn list_pod_networks(&self) -> BoxFuture<'_, Result<Vec<PodNetwork>, ClusterApiError>> {
        Box::pin(async move {
            Api::<PodNetwork>::all(self.client.clone())
                .list(&ListParams::default())
                .await
                .map(|list| list.items)
                .map_err(failed("listing PodNetworks"))
        })
    }

    fn node_names(&self) -> BoxFuture<'_, Result<BTreeSet<String>, ClusterApiError>> {
        Box::pin(async move {
            Api::<Node>::all(self.client.clone())
                .list_metadata(&ListParams::default())
                .await
                .map(|list| list.items.into_iter().map(|node| node.name_any()).collect())
                .map_err(failed("listing Nodes"))
        })
    }

    fn list_claims(&self) -> BoxFuture<'_, Result<Vec<ResourceClaim>, ClusterApiError>> {
        Box::pin(async move {
            let api: Api<ResourceClaim> = Api::all(self.client.clone());
            let mut params = ListParams::default().limit(CLAIM_PAGE);
            let mut claims = Vec::new();
            loop {
                let page = api.list(&params).await.map_err(failed("listing ResourceClaims"))?;
                claims.extend(page.items);
                match page.metadata.continue_.filter(|token| !token.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => return Ok(claims),
                }
            }
        })
    }

    fn delete_ip_block<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<BlockDeleted, ClusterApiError>> {
        Box::pin(async move {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.to_owned()),
                    resource_version: Some(resource_version.to_owned()),
                }),
                ..DeleteParams::default()
            };
            match Api::<IpBlock>::all(self.client.clone()).delete(name, &params).await {
                Ok(_) => Ok(BlockDeleted::Deleted),
                Err(kube::Error::Api(status)) if status.is_not_found() => Ok(BlockDeleted::Gone),
                Err(kube::Error::Api(status)) if status.is_conflict() => Ok(BlockDeleted::Changed),
                Err(err) => Err(failed("deleting an IPBlock")(err)),
            }
        })
    }

    fn write_network_status<'a>(
        &'a self,
        name: &'a str,
        resource_version: &'a str,
        status: &'a PodNetworkStatus,
    ) -> BoxFuture<'a, Result<StatusWritten, ClusterApiError>> {
        Box::pin(async move {
            let body = status_replacement(status);
            let patch = json!({"metadata": {"resourceVersion": resource_version}, "status": body});
            let params = PatchParams {
                field_manager: Some(self.field_manager.clone()),
                ..PatchParams::default()
            };
            match Api::<PodNetwork>::all(self.client.clone())
                .patch_status(name, &params, &Patch::Merge(patch))
                .await
            {
                Ok(_) => Ok(StatusWritten::Written),
                Err(kube::Error::Api(status)) if status.is_not_found() => Ok(StatusWritten::Gone),
                Err(kube::Error::Api(status)) if status.is_conflict() => Ok(StatusWritten::Changed),
                Err(err) => Err(failed("writing a PodNetwork status")(err)),
            }
        })
    }
}

/// `status` as a merge patch that replaces the whole status: a merge patch keeps the fields it
/// does not name, so every field this driver writes that serialisation left out is named as
/// null.
#[must_use]
pub fn status_replacement(status: &PodNetworkStatus) -> Value {
    let mut body = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let Some(object) = body.as_object_mut() {
        for key in ["observedGeneration", "conditions", "deviceClassName", "nodes"] {
            object.entry(key).or_insert(Value::Null);
        }
    }
    body
}
