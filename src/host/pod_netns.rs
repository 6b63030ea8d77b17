//! The attach service's kernel port ([`NetnsAccess`]) over rtnetlink: per-pod
//! [`NetlinkOps`] and a dump of the host's links.

use std::path::Path;

use super::netlink::{HostNetlink, NetlinkOps};
use crate::attach::NetnsAccess;
use crate::podnet::LinkOpError;
use crate::podnet::ops::LinkState;

impl NetnsAccess for HostNetlink {
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
