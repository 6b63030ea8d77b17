//! The driver's test kit (`netclaim-testkit`, a dev-dependency of the root package only): the
//! support every integration-test binary (`api`, `netns`, `containerd`, `vm`) and the benches
//! share, so a helper is written once here rather than copied into each binary that needs it.
//! Each binary's `main.rs` says `use netclaim_testkit as kit;`.
//!
//! The test doubles of the driver's own ports (fixed devices, claims from a map, in-memory
//! leases, `DeviceFacts` builders) live in the driver, `netclaim::testing` (the crate's unit
//! tests use them too), and are re-exported here as [`testing`]; the fake and failing
//! kernels are `netclaim::podnet::{fake, failing}`. All of them exist only with the driver's
//! `testkit` feature, which this crate turns on: a release build never has them.

#![allow(
    missing_docs,
    reason = "the test binaries' helpers, public only to reach them: each harness and helper \
              says what it does, their fields and self-describing accessors need no prose"
)]
#![allow(clippy::unwrap_used, reason = "test helpers: a failed step fails the calling test")]
#![allow(
    clippy::missing_panics_doc,
    reason = "test helpers: every step panics on failure, which fails the calling test"
)]
#![allow(clippy::must_use_candidate, reason = "test helpers, not an API to misuse")]

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

pub use netclaim::testing;

pub mod api_server;
pub mod bandwidth;
pub mod ceilings;
pub mod cgroup;
pub mod claims;
pub mod cluster_scale;
pub mod containerd;
pub mod counters;
pub mod daemon;
pub mod daemonset;
pub mod dev_api;
pub mod e2e;
pub mod examples;
pub mod https;
pub mod image;
pub mod ipam;
pub mod ipam_sim;
pub mod kubelet;
pub mod kustomize;
pub mod netns;
pub mod rbac;
pub mod scale;
pub mod vm;

/// The kit's own unit tests (the RBAC evaluator, the DaemonSet's quantities).
#[cfg(test)]
mod self_tests;

/// The driver name the tests' claims, classes and plugins use.
pub const DRIVER: &str = "netclaim.dev";

/// The repository root (the workspace root, the root package's manifest directory).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the kit's manifest directory is testkit/ inside the repository")
        .to_owned()
}

/// The `netclaim` binary cargo built for the running test or bench. Cargo tells a test
/// binary of the root package (`CARGO_BIN_EXE_netclaim`, nextest `NEXTEST_BIN_EXE_netclaim`),
/// not this library; when neither is set (a test binary run by hand, or inside the VM) it is
/// the binary next to the test's own directory: `target/<profile>/deps/<test>-<hash>` →
/// `target/<profile>/netclaim`, where cargo puts it for every integration test and bench.
pub fn netclaim_bin() -> &'static str {
    static BIN: LazyLock<String> = LazyLock::new(|| {
        for variable in ["CARGO_BIN_EXE_netclaim", "NEXTEST_BIN_EXE_netclaim"] {
            if let Some(path) = std::env::var_os(variable).filter(|p| !p.is_empty()) {
                return path.into_string().expect("the build directory's path is UTF-8");
            }
        }
        let exe = std::env::current_exe().expect("the running test binary's path");
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .expect("a test binary lives in target/<profile>/deps/");
        profile.join("netclaim").into_os_string().into_string().expect("the target path is UTF-8")
    });
    &BIN
}
