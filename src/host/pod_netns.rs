//! The attach service's kernel port ([`NetnsPort`]) over rtnetlink: per-pod
//! [`NetlinkOps`] and a dump of the host's links.

use std::path::Path;

use super::netlink::{HostNetlink, NetlinkOps};
use crate::attach::NetnsPort;
use crate::podnet::LinkOpError;
use crate::podnet::ports::LinkState;

impl NetnsPort for HostNetlink {
    type Ops = NetlinkOps;

    async fn open(&self, path: &Path) -> Result<NetlinkOps, LinkOpError> {
        NetlinkOps::open(self, path).await
    }

    async fn open_for_detach(&self, path: &Path) -> Result<NetlinkOps, LinkOpError> {
        NetlinkOps::open_for_detach(self, path).await
    }

    async fn host_links(&self) -> Result<Vec<LinkState>, LinkOpError> {
        self.links().await
    }

    async fn host(&self) -> Result<NetlinkOps, LinkOpError> {
        Ok(NetlinkOps::host_only(self))
    }
}
