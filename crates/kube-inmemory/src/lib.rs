//! An in-memory Kubernetes API server and a DRA allocator, for development clusters and
//! tests that need the real API protocol without a real control plane.
//!
//! - [`apiserver`]: the REST protocol over HTTP on loopback (get/list/watch, create, update,
//!   merge/JSON/strategic patches, server-side apply, the status subresource, finalizers,
//!   Table output for kubectl) for the core, coordination, events and resource.k8s.io/v1
//!   kinds, with the resource.k8s.io/v1 validation rules, and for the custom resources of
//!   any CustomResourceDefinition created on it (structural schemas, defaults, CEL rules).
//! - [`allocator`]: a stand-in for the scheduler's DRA plugin that writes
//!   `status.allocation` of pending ResourceClaims (device classes, CEL selectors,
//!   consumable capacity).
//! - [`kubeconfig`]: a kubeconfig that points clients (kubectl, kube-rs) at the server.
//!
//! Loopback only: the server authenticates bearer tokens (optionally one per user, recorded
//! in an opt-in request log, and ServiceAccount tokens it issues) but authorises no request;
//! its RBAC policy answers SubjectAccessReviews, for servers that delegate to it.

// Dependencies that nothing imports are caught here (the lint misfires in test crates).
#![cfg_attr(not(test), warn(unused_crate_dependencies))]

pub mod allocator;
pub mod apiserver;
pub mod kubeconfig;
