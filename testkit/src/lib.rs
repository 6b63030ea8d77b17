//! The integration tests' support kit, one module tree shared by every test binary (`api`,
//! `netns`, `containerd`, `vm`) and by the benches that drive the same harnesses: each binary
//! includes it with `#[path = "../kit/mod.rs"] mod kit;`, so a helper is written once here
//! rather than copied into each binary that needs it.
//!
//! The kit's own unit tests live in `self_tests.rs`, which only the `api` binary declares: a
//! `#[cfg(test)]` module here would run once in every binary that includes the kit.

#![allow(dead_code, reason = "each test binary and bench uses a different subset of the kit")]
#![allow(clippy::unwrap_used, reason = "test helpers: a failed step fails the calling test")]

use std::path::PathBuf;

pub(crate) mod api_server;
pub(crate) mod claims;
pub(crate) mod containerd;
pub(crate) mod counters;
pub(crate) mod daemon;
pub(crate) mod daemonset;
pub(crate) mod devices;
pub(crate) mod image;
pub(crate) mod ipam;
pub(crate) mod kubelet;
pub(crate) mod kustomize;
pub(crate) mod netns;
pub(crate) mod rbac;
pub(crate) mod vm;

/// The driver name the tests' claims, classes and plugins use.
pub(crate) const DRIVER: &str = "netclaim.dev";

/// The repository root (the root package's manifest directory).
pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
