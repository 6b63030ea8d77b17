//! The DRA node services `v1.DRAPlugin` and `v1beta1.DRAPlugin`: both translate kubelet's
//! messages to [`ClaimPreparer`] calls and guarantee kubelet's response contract (every
//! requested claim UID answered, a deadline below kubelet's 45 s).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::proto::k8s::io::kubelet::pkg::apis::dra::{v1, v1beta1};
use crate::claims::{ClaimFailure, ClaimPreparer, PreparedDevice};
use crate::model::ClaimRef;

/// Serves both DRA API versions from one [`ClaimPreparer`].
#[derive(Debug)]
pub struct DraService<P> {
    preparer: Arc<P>,
    call_timeout: Duration,
}

impl<P> Clone for DraService<P> {
    fn clone(&self) -> Self {
        Self { preparer: Arc::clone(&self.preparer), call_timeout: self.call_timeout }
    }
}

impl<P: ClaimPreparer> DraService<P> {
    /// A service answering through `preparer`; each call that takes longer than
    /// `call_timeout` is answered with per-claim errors instead.
    pub fn new(preparer: Arc<P>, call_timeout: Duration) -> Self {
        Self { preparer, call_timeout }
    }

    /// The `v1.DRAPlugin` gRPC service.
    #[must_use]
    pub fn v1_server(&self) -> v1::dra_plugin_server::DraPluginServer<Self> {
        v1::dra_plugin_server::DraPluginServer::new(self.clone())
    }

    /// The `v1beta1.DRAPlugin` gRPC service.
    #[must_use]
    pub fn v1beta1_server(&self) -> v1beta1::dra_plugin_server::DraPluginServer<Self> {
        v1beta1::dra_plugin_server::DraPluginServer::new(self.clone())
    }

    async fn prepare(
        &self,
        version: &'static str,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, ClaimFailure>> {
        let uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
        tracing::debug!(version, claims = ?uids, "NodePrepareResources");
        let results = tokio::time::timeout(self.call_timeout, self.preparer.prepare(claims)).await;
        complete_answers(uids, results, self.call_timeout, "prepare")
    }

    async fn unprepare(
        &self,
        version: &'static str,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<(), ClaimFailure>> {
        let uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
        tracing::debug!(version, claims = ?uids, "NodeUnprepareResources");
        let results =
            tokio::time::timeout(self.call_timeout, self.preparer.unprepare(claims)).await;
        complete_answers(uids, results, self.call_timeout, "unprepare")
    }
}

/// Keeps exactly the requested UIDs (kubelet rejects unknown ones) and fills in an error for
/// each UID the preparer left out or did not reach before the deadline.
fn complete_answers<T>(
    uids: Vec<String>,
    results: Result<HashMap<String, Result<T, ClaimFailure>>, tokio::time::error::Elapsed>,
    timeout: Duration,
    verb: &str,
) -> HashMap<String, Result<T, ClaimFailure>> {
    let (mut results, timed_out) = if let Ok(results) = results {
        (results, false)
    } else {
        tracing::warn!(?timeout, verb, "claim call timed out");
        (HashMap::new(), true)
    };
    uids.into_iter()
        .map(|uid| {
            let answer = results.remove(&uid).unwrap_or_else(|| {
                Err(ClaimFailure::new(if timed_out {
                    format!("cannot {verb} claim {uid}: no answer within {timeout:?}")
                } else {
                    format!("cannot {verb} claim {uid}: the driver returned no result for it")
                }))
            });
            (uid, answer)
        })
        .collect()
}

/// Validates one claim of a request: kubelet always fills all three fields.
fn claim_ref(namespace: String, name: String, uid: String) -> Result<ClaimRef, Status> {
    for (field, value) in [("namespace", &namespace), ("name", &name), ("uid", &uid)] {
        if value.is_empty() {
            return Err(Status::invalid_argument(format!(
                "claim {namespace}/{name} (uid {uid:?}): field {field} is empty"
            )));
        }
    }
    Ok(ClaimRef { namespace, name, uid })
}

macro_rules! dra_version {
    ($version:ident, $label:literal, |$device:ident| $convert:expr) => {
        #[tonic::async_trait]
        impl<P: ClaimPreparer> $version::dra_plugin_server::DraPlugin for DraService<P> {
            async fn node_prepare_resources(
                &self,
                request: Request<$version::NodePrepareResourcesRequest>,
            ) -> Result<Response<$version::NodePrepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| claim_ref(c.namespace, c.name, c.uid))
                    .collect::<Result<Vec<_>, _>>()?;
                let claims = self
                    .prepare($label, claims)
                    .await
                    .into_iter()
                    .map(|(uid, result)| {
                        let answer = match result {
                            Ok(devices) => $version::NodePrepareResourceResponse {
                                devices: devices.into_iter().map(|$device| $convert).collect(),
                                error: String::new(),
                            },
                            Err(failure) => $version::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error: failure.message,
                            },
                        };
                        (uid, answer)
                    })
                    .collect();
                Ok(Response::new($version::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$version::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$version::NodeUnprepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| claim_ref(c.namespace, c.name, c.uid))
                    .collect::<Result<Vec<_>, _>>()?;
                let claims = self
                    .unprepare($label, claims)
                    .await
                    .into_iter()
                    .map(|(uid, result)| {
                        let error = result.err().map(|f| f.message).unwrap_or_default();
                        (uid, $version::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($version::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_version!(v1, "v1", |device| v1::Device {
    request_names: device.request_names,
    pool_name: device.pool_name,
    device_name: device.device_name,
    cdi_device_ids: device.cdi_device_ids,
    share_id: device.share_id,
});

// v1beta1 has no share_id: only kubelets older than 1.34 pick v1beta1 (we advertise v1
// first), and they cannot allocate shares.
dra_version!(v1beta1, "v1beta1", |device| v1beta1::Device {
    request_names: device.request_names,
    pool_name: device.pool_name,
    device_name: device.device_name,
    cdi_device_ids: device.cdi_device_ids,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_unrequested_uids_are_fixed_up() {
        let mut results: HashMap<String, Result<(), ClaimFailure>> = HashMap::new();
        results.insert("a".into(), Ok(()));
        results.insert("stranger".into(), Ok(()));
        let answers = complete_answers(
            vec!["a".into(), "b".into()],
            Ok(results),
            Duration::from_secs(1),
            "prepare",
        );
        assert_eq!(answers.len(), 2);
        assert_eq!(answers["a"], Ok(()));
        let err = answers["b"].as_ref().unwrap_err();
        assert!(err.message.contains("claim b") && err.message.contains("no result"), "{err:?}");
    }

    #[test]
    fn empty_claim_field_is_named_in_the_error() {
        let err = claim_ref("ns".into(), "c".into(), String::new()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("field uid is empty"), "{}", err.message());
    }
}
