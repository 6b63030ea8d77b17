//! The kubelet end of the DRA gRPC API (`v1.DRAPlugin`): `NodePrepareResources` and
//! `NodeUnprepareResources` over the driver's `dra.sock`, as kubelet calls them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use crate::model::ClaimRef;

/// A device the driver prepared for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// Requests it satisfies.
    pub requests: Vec<String>,
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// Share of a shared device.
    pub share_id: Option<String>,
    /// CDI devices the runtime adds to the containers that use it (e.g. its metadata file).
    pub cdi_device_ids: Vec<String>,
}

/// Errors of the DRA client.
#[derive(Debug, thiserror::Error)]
pub enum DraClientError {
    /// The socket could not be reached.
    #[error("connecting to the DRA socket {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// The call failed as a whole. No variant names the call: each caller says which call
    /// failed (the pod condition's step, the log line), so naming it here would repeat it.
    #[error("{code:?}: {message}")]
    Call {
        /// gRPC status code.
        code: tonic::Code,
        /// The driver's message.
        message: String,
    },
    /// The driver answered with an error for one claim (as kubelet, which writes
    /// `NodePrepareResources failed for ResourceClaim <name>: <message>`).
    #[error("ResourceClaim {claim}: {message}")]
    Claim {
        /// `namespace/name`.
        claim: String,
        /// The driver's error.
        message: String,
    },
    /// The driver did not answer for a claim.
    #[error("no answer for ResourceClaim {claim}")]
    Missing {
        /// `namespace/name`.
        claim: String,
    },
}

/// A DRA v1 client on one plugin socket. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DraClient {
    inner: v1::dra_plugin_client::DraPluginClient<Channel>,
}

impl DraClient {
    /// Connects to `socket` (kubelet dials lazily too; the first call fails if it is absent).
    pub fn connect_lazy(socket: &Path, timeout: Duration) -> Result<Self, DraClientError> {
        let connect_err = |source| DraClientError::Connect { path: socket.to_owned(), source };
        let channel = Endpoint::from_shared(format!("unix://{}", socket.display()))
            .map_err(connect_err)?
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_lazy();
        Ok(Self { inner: v1::dra_plugin_client::DraPluginClient::new(channel) })
    }

    /// `NodePrepareResources` for `claims`: the devices of each claim, by UID order of
    /// `claims`; the first claim error fails the call.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> Result<Vec<Vec<PreparedDevice>>, DraClientError> {
        let request = v1::NodePrepareResourcesRequest { claims: claims.iter().map(wire).collect() };
        let response = self
            .inner
            .clone()
            .node_prepare_resources(request)
            .await
            .map_err(|s| call_error(&s))?
            .into_inner();
        claims
            .iter()
            .map(|claim| {
                let key = format!("{}/{}", claim.namespace, claim.name);
                let answer = response
                    .claims
                    .get(&claim.uid)
                    .ok_or_else(|| DraClientError::Missing { claim: key.clone() })?;
                if !answer.error.is_empty() {
                    return Err(DraClientError::Claim {
                        claim: key,
                        message: answer.error.clone(),
                    });
                }
                Ok(answer
                    .devices
                    .iter()
                    .map(|d| PreparedDevice {
                        requests: d.request_names.clone(),
                        pool: d.pool_name.clone(),
                        device: d.device_name.clone(),
                        share_id: d.share_id.clone(),
                        cdi_device_ids: d.cdi_device_ids.clone(),
                    })
                    .collect())
            })
            .collect()
    }

    /// `NodeUnprepareResources` for `claims`; the first claim error fails the call.
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> Result<(), DraClientError> {
        let request =
            v1::NodeUnprepareResourcesRequest { claims: claims.iter().map(wire).collect() };
        let response = self
            .inner
            .clone()
            .node_unprepare_resources(request)
            .await
            .map_err(|s| call_error(&s))?
            .into_inner();
        for claim in claims {
            let key = format!("{}/{}", claim.namespace, claim.name);
            let answer = response
                .claims
                .get(&claim.uid)
                .ok_or_else(|| DraClientError::Missing { claim: key.clone() })?;
            if !answer.error.is_empty() {
                return Err(DraClientError::Claim { claim: key, message: answer.error.clone() });
            }
        }
        Ok(())
    }
}

fn wire(claim: &ClaimRef) -> v1::Claim {
    v1::Claim {
        namespace: claim.namespace.clone(),
        uid: claim.uid.clone(),
        name: claim.name.clone(),
    }
}

fn call_error(status: &tonic::Status) -> DraClientError {
    DraClientError::Call { code: status.code(), message: status.message().to_owned() }
}
