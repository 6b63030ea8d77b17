//! The in-process API server (`kube_inmemory`) as the API-tier tests and benches use it: a
//! client for it, and our CRDs from `deploy/crds` applied the way an operator would.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube_inmemory::apiserver::ApiServer;
use netclaim::model::pod_network::{IpBlock, PodNetwork};

/// Bound for the CRDs to be served (they are within milliseconds; the bound only keeps a
/// broken build from hanging).
const PATIENCE: Duration = Duration::from_secs(20);

/// A client of `server` (plain HTTP on loopback, no credentials).
pub fn client_for(server: &ApiServer) -> kube::Client {
    kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap()
}

/// Applies `deploy/crds` (PodNetworks, IPBlocks) when the server installs CRDs, then waits
/// until both kinds are served; a server that serves them from a fixed table answers 404 for
/// the CRD kind and is used as it is, one that has them already answers AlreadyExists.
pub async fn install_crds(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in ["podnetworks.yaml", "ipblocks.yaml"] {
        let path = super::repo().join("deploy/crds").join(file);
        let crd: CustomResourceDefinition =
            yaml_serde::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 || status.is_already_exists() => {}
            Err(err) => panic!("applying {}: {err}", path.display()),
        }
    }
    let started = Instant::now();
    let networks: Api<PodNetwork> = Api::all(client.clone());
    let blocks: Api<IpBlock> = Api::all(client.clone());
    while networks.list(&ListParams::default()).await.is_err()
        || blocks.list(&ListParams::default()).await.is_err()
    {
        assert!(started.elapsed() < PATIENCE, "PodNetworks and IPBlocks are never served");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
