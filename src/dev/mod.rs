//! `netclaim dev`: a single-node cluster in a box (DESIGN §8): the in-memory API server and
//! its kubeconfig, the allocator, the dev kubelet, the composition of all of them with the
//! node daemon ([`cluster`]) and the demo ([`demo`]).

pub mod allocator;
pub mod api_only;
pub mod apiserver;
pub mod cluster;
pub mod demo;
pub mod kubeconfig;
pub mod kubelet;
