//! Kernel adapters: the only code that talks to netlink, sysfs and network namespaces.

pub mod device_lookup;
pub mod discovery;
pub mod link_events;
pub mod netlink;
pub mod pod_netns;
pub mod sysfs;
