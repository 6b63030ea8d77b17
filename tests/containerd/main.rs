//! The containerd tier: the driver on a real containerd (1.7 and 2.1) through NRI and CRI,
//! the node DaemonSet run from the image, and the image itself. Needs root, containerd and
//! the image archive (`make test` installs and builds them); the chaos, scale and DaemonSet
//! tests run one at a time (`.config/nextest.toml`, group `heavy`).

use netclaim_testkit as kit;

mod daemonset_containerd;
mod e2e_containerd;
mod image;
mod nri_containerd;
