//! `netclaim dev`: a single-node cluster in a box (DESIGN §8): the in-memory API server and
//! allocator of the `kube-inmemory` crate, the dev kubelet, a CRI client for running pods
//! through containerd, the composition of all of them with the node daemon ([`cluster`]) and
//! the demo ([`demo`]).

pub mod api_only;
pub mod cluster;
pub mod cri;
pub mod demo;
pub mod kubelet;
