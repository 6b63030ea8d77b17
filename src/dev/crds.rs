//! The project's CustomResourceDefinitions (`deploy/crds/`), built into the binary, and
//! installing them on a dev API server: `netclaim dev` serves PodNetworks and IPBlocks
//! with the same schemas and CEL rules a real cluster enforces.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

/// Every definition in `deploy/crds/` (a test checks that none is missing).
pub const CRDS: &[(&str, &str)] = &[
    ("podnetworks.yaml", include_str!("../../deploy/crds/podnetworks.yaml")),
    ("ipblocks.yaml", include_str!("../../deploy/crds/ipblocks.yaml")),
];

/// Field manager of the definitions `netclaim dev` applies.
const MANAGER: &str = "netclaim-dev";

/// How long a definition may take to become Established.
const ESTABLISHED_LIMIT: Duration = Duration::from_secs(10);

/// Errors installing the definitions.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// An embedded file is not a CustomResourceDefinition.
    #[error("deploy/crds/{file} is not a CustomResourceDefinition: {source}")]
    Parse {
        /// The file.
        file: &'static str,
        /// The decoder's error.
        #[source]
        source: yaml_serde::Error,
    },
    /// The API server refused a definition or could not be reached.
    #[error("applying CustomResourceDefinition {name} (deploy/crds/{file}): {source}")]
    Apply {
        /// The definition.
        name: String,
        /// Its file.
        file: &'static str,
        /// The client's error (a 422 names the field).
        #[source]
        source: Box<kube::Error>,
    },
    /// No client for the server could be built.
    #[error("a client for the API server on {addr}: {reason}")]
    Client {
        /// The server's address.
        addr: SocketAddr,
        /// Why not.
        reason: String,
    },
    /// A definition did not become Established in time.
    #[error("CustomResourceDefinition {name} was not Established within {ESTABLISHED_LIMIT:?}")]
    NotEstablished {
        /// The definition.
        name: String,
    },
}

/// The embedded definitions, parsed.
pub fn definitions() -> Result<Vec<(&'static str, CustomResourceDefinition)>, CrdError> {
    CRDS.iter()
        .map(|(file, text)| {
            yaml_serde::from_str(text)
                .map(|crd| (*file, crd))
                .map_err(|source| CrdError::Parse { file, source })
        })
        .collect()
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|conditions| {
        conditions.iter().any(|c| c.type_ == "Established" && c.status == "True")
    })
}

/// Applies every embedded definition (server-side apply, so a restart against the same
/// server updates them) and waits until each is Established.
pub async fn install(client: &kube::Client) -> Result<(), CrdError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(MANAGER).force();
    for (file, crd) in definitions()? {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let apply_error =
            |source| CrdError::Apply { name: name.clone(), file, source: Box::new(source) };
        let mut current =
            api.patch(&name, &params, &Patch::Apply(&crd)).await.map_err(apply_error)?;
        let deadline = tokio::time::Instant::now() + ESTABLISHED_LIMIT;
        while !established(&current) {
            if tokio::time::Instant::now() > deadline {
                return Err(CrdError::NotEstablished { name });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            current = api.get(&name).await.map_err(apply_error)?;
        }
        tracing::debug!(%name, "CustomResourceDefinition established");
    }
    Ok(())
}

/// A client for a dev API server listening on `addr` (with its bearer token, if it
/// wants one).
pub fn client_for(addr: SocketAddr, token: Option<&str>) -> Result<kube::Client, CrdError> {
    let client_error = |reason: String| CrdError::Client { addr, reason };
    let uri = http::Uri::builder()
        .scheme("http")
        .authority(addr.to_string())
        .path_and_query("/")
        .build()
        .map_err(|e| client_error(e.to_string()))?;
    let mut config = kube::Config::new(uri);
    config.auth_info.token = token.map(|t| t.to_owned().into());
    kube::Client::try_from(config).map_err(|e| client_error(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_definition_of_deploy_crds_is_embedded_and_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let text = std::fs::read_to_string(p).unwrap_or_default();
                yaml_serde::from_str::<yaml_serde::Value>(&text)
                    .is_ok_and(|v| v["kind"] == "CustomResourceDefinition")
            })
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = CRDS.iter().map(|(f, _)| (*f).to_owned()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded, "add new definitions of deploy/crds/ to CRDS");
        for (file, crd) in definitions().unwrap() {
            assert_eq!(crd.spec.group, "netclaim.dev", "{file}");
        }
    }
}
