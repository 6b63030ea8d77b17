//! [`ClaimSource`] over the Kubernetes API: a direct GET of `resource.k8s.io/v1`
//! ResourceClaims (DESIGN §10: no claim watch on nodes).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

use crate::claims::{ClaimSource, ReadError, allocation};
use crate::model::cause::cause;

/// Reads claims with a shared client.
#[derive(Clone)]
pub struct KubeClaims {
    client: kube::Client,
}

impl std::fmt::Debug for KubeClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClaims").finish_non_exhaustive()
    }
}

impl KubeClaims {
    /// A reader using `client`.
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ReadError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(name).await {
            Ok(Some(claim)) => Ok(claim),
            Ok(None) => Err(ReadError::NotFound),
            Err(err) => Err(ReadError::Failed(cause(err))),
        }
    }

    async fn pod_claim_names(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<Option<Vec<String>>, ReadError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(pod).await {
            Ok(found) => Ok(found.as_ref().map(allocation::pod_claim_names)),
            Err(err) => Err(ReadError::Failed(cause(err))),
        }
    }
}
