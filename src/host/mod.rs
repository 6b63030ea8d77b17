//! Kernel adapters: the only code that talks to netlink, sysfs and network namespaces.

// clippy.toml disallows `setns`, `unshare` and opening netlink sockets everywhere else.
#![allow(
    clippy::disallowed_methods,
    reason = "host/ is where namespaces are entered and netlink sockets are opened"
)]

pub mod bpf;
pub mod discovery;
pub mod ethtool;
pub mod fd_limit;
pub mod kernel_probe;
pub mod link_events;
pub mod netlink;
pub mod netlink_batch;
pub mod netlink_dump;
pub mod netns;
mod netns_file;
pub mod parent_death;
pub mod pod_links;
pub mod pod_netns;
mod pod_sockets;
pub mod qdisc;
pub mod qdisc_ceiling;
pub mod rdma;
pub mod rdma_events;
pub mod rdma_move;
pub mod routing;
pub mod sriov;
pub mod sysfs;
pub mod vfio;
