//! `netclaim dev`: a single-node cluster in a box (DESIGN §8). This module holds the
//! in-memory API server and the kubeconfig it hands to clients.

pub mod allocator;
pub mod api_only;
pub mod apiserver;
pub mod kubeconfig;
