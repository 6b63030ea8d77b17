//! Domain vocabulary shared by every module: pure data, no I/O.

pub mod bandwidth;
pub mod cause;
pub mod device;
pub mod link;
pub mod names;
pub mod network_config;
pub mod pod_network;
pub mod rdma;
pub mod refs;
pub mod stats;
pub mod support;

pub use refs::{ClaimRef, PodRef};
