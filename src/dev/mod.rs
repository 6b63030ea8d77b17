//! `netclaim dev`: a cluster in a box (DESIGN §8): the in-memory API server and allocator of
//! the `kube-inmemory` crate with the project's CustomResourceDefinitions ([`crds`]) and the
//! PodNetwork controller ([`controller`]), the dev kubelet, a CRI client for running pods
//! through containerd, the composition of all of them with the node daemon on one node
//! ([`cluster`]) or on N nodes, each in a network namespace of its own ([`nodes`]), and the
//! demo ([`demo`]).

pub mod api_only;
pub mod cluster;
pub mod controller;
pub mod crds;
pub mod cri;
pub mod demo;
pub mod kernel;
pub mod kubelet;
pub mod nodes;
