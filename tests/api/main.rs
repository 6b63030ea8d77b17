//! The API tier: the driver in process or as the built binary over loopback, against the
//! in-process API server or `netclaim dev --api-only`, the kubelet sockets, the CLI, the
//! manifests and the layout rules. Needs no root; a few tests need kubectl or the grpc-go
//! kubelet client and are `#[ignore]`d for a plain run (docs/testing.md).

use netclaim_testkit as kit;

mod admission_policies;
mod claim_status;
mod claims_grpc;
mod cli;
mod controller_api;
mod controller_leader;
mod core_imports;
mod deploy_kustomize;
mod dev_admission;
mod dev_allocator;
mod dev_api_crds;
mod dev_bandwidth;
mod dev_kubectl;
mod examples_subnets;
mod health_grpc;
mod install_rendered;
mod ipam_sim;
mod ipblock_watch;
mod kubelet_grpc_go;
mod kubelet_sockets;
mod metrics_access;
mod network_config_doc;
mod podnetwork_devices;
mod podnetwork_ipam;
mod podnetwork_rules;
mod prometheus_rule;
mod status_cli;
