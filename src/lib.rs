//! netclaim: a Kubernetes networking DRA driver that gives pods extra network interfaces
//! without CNI.
//!
//! The life of a claim: the node daemon publishes the node's NICs as DRA devices
//! (`inventory` → `ResourceSlices`), kubelet asks it to prepare allocated claims (`kubelet`,
//! `claims`), the container runtime announces the pod sandbox through NRI (the `nri-rs` crate,
//! handled in `attach`), the driver attaches the planned interfaces with netlink (`podnet`,
//! `host`) and reports the result in the claim status (`k8s`).
//!
//! The core (`model`, `inventory`, `claims`, `ipam`, `podnet::plan`, `health`) does no I/O;
//! adapters (`host`, `k8s`, `kubelet`, `store`, `cdi`) sit at the edge; `node` wires them
//! together.

// Dependencies that nothing imports are caught at the crate roots (the lint misfires in test
// crates, which see the dev-dependencies too).
#![cfg_attr(not(test), warn(unused_crate_dependencies))]

// `anyhow` is the binary's error type (src/main.rs); the library returns typed errors.
use anyhow as _;

pub mod attach;
pub mod cdi;
pub mod claims;
pub mod cli;
pub mod controller;
#[cfg(feature = "dev")]
pub mod dev;
pub mod failpoints;
pub mod health;
pub mod host;
pub mod inventory;
pub mod ipam;
pub mod k8s;
pub mod kubelet;
pub mod metrics;
pub mod model;
pub mod node;
pub mod podnet;
pub mod stats;
pub mod store;
pub mod telemetry;
#[cfg(any(test, feature = "testkit"))]
pub mod testing;
