//! The dev cluster's own kernel plumbing: the node network namespaces of `netclaim dev
//! --nodes N` and the demo's veth. Production code reaches the kernel only through `host/`;
//! this is test infrastructure that the release image does not link (feature `dev`).

// clippy.toml disallows `setns`, `unshare` and opening netlink sockets outside `host/`. The dev
// cluster builds its own node namespaces: it enters them only on the dedicated OS threads
// `host::netns` and `host::netlink` spawn, or on a thread of its own that exits after the spawn
// (`nodes::spawn_in_node`), so no pooled thread is left in another namespace.
#![allow(
    clippy::disallowed_methods,
    reason = "the dev cluster creates and enters its own node namespaces on dedicated threads"
)]

pub mod demo_network;
pub mod nodes;
