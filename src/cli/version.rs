//! `netclaim version`: this build's version and the Kubernetes APIs it speaks, for people or
//! as one JSON or YAML document.

use std::io::{self, Write};

use serde::Serialize;

use super::document::{DocumentError, write_json, write_yaml};
use super::{OutputFormat, VersionArgs};

/// What `netclaim version` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionInfo {
    /// The crate version.
    pub version: &'static str,
    /// The `resource.k8s.io` version the node daemon and controller use.
    pub resource_api: &'static str,
    /// The oldest Kubernetes release that serves it.
    pub kubernetes: &'static str,
    /// kubelet DRA plugin services served, preferred first.
    pub kubelet_plugin_apis: [&'static str; 2],
    /// kubelet device health services served, preferred first.
    pub device_health_apis: [&'static str; 2],
}

/// This build's versions.
pub const VERSION: VersionInfo = VersionInfo {
    version: env!("CARGO_PKG_VERSION"),
    resource_api: "resource.k8s.io/v1",
    kubernetes: "1.34",
    kubelet_plugin_apis: ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    device_health_apis: ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"],
};

/// Why `netclaim version` failed.
#[derive(Debug, thiserror::Error)]
pub enum VersionCommandError {
    /// Writing the JSON or YAML document failed.
    #[error(transparent)]
    Document(#[from] DocumentError),
    /// Writing to stdout failed.
    #[error("writing output")]
    Write(#[from] io::Error),
}

/// Runs the command, writing to `out`.
pub fn run(args: &VersionArgs, out: &mut impl Write) -> Result<(), VersionCommandError> {
    let info = &VERSION;
    match args.output {
        OutputFormat::Table => {
            writeln!(out, "netclaim {}", info.version)?;
            writeln!(out, "resource API: {} (Kubernetes {}+)", info.resource_api, info.kubernetes)?;
            writeln!(out, "kubelet plugin API: {}", info.kubelet_plugin_apis.join(", "))?;
            writeln!(out, "device health API: {}", info.device_health_apis.join(", "))?;
        }
        OutputFormat::Json => write_json(info, out)?,
        OutputFormat::Yaml => write_yaml(info, out)?,
    }
    Ok(())
}
