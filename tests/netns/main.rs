//! The root tier: the daemon, the dev cluster and the library against the host's kernel in
//! throwaway network namespaces (iproute2, `ping`, a private bpffs), no container runtime but
//! the one demo that starts its own. Every test is `#[ignore]`d: `make test` runs them as root.

use netclaim_testkit as kit;

mod bandwidth_ceilings;
mod bandwidth_gate;
mod bandwidth_qdisc;
mod dev_demo;
mod dev_kubelet;
mod dev_nodes;
mod dev_nodes_bandwidth;
mod dev_scheduling;
mod ethtool_netns;
mod example_attach_macvlan;
mod examples_dev;
mod health_netns;
mod inventory_netns;
mod metrics_prometheus;
mod node_attach;
mod node_publisher;
mod podnet_netns;
mod podnetwork_two_daemons;
mod rbac_derived;
mod routing_netns;
mod stats_bpf;
mod stats_bpf_ceilings;
