//! A [`LinkPort`] that fails one chosen call: the failure-injection seam for everything that
//! applies plans. Wrapped around the real kernel (root tests in a throwaway netns) or the
//! fake one, it fails the n-th mutating call with an errno as the kernel would, so a test
//! can walk a failure through every step of an attach and check what is left behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use ipnetwork::IpNetwork;

use super::plan::ChildKind;
use super::ports::{LinkOpError, LinkPort, LinkState, PodLinkConfig, PodRequest, Side};
use crate::model::network_config::{MacAddr, Route};

mod routing;

/// Which mutating call fails, shared by every [`FailingOps`] made from it (one per netns
/// opened), so a failure can be placed anywhere in a sequence that spans several of them.
#[derive(Debug)]
pub struct FailurePlan {
    fail_at: u32,
    errno: i32,
    calls: AtomicU32,
}

impl FailurePlan {
    /// Fails the `fail_at`-th mutating call (1 = the first; lookups with [`LinkPort::link`]
    /// do not count) with `errno`; `fail_at = 0` never fails (a clean run that counts the
    /// calls, read with [`FailurePlan::calls`]).
    #[must_use]
    pub fn new(fail_at: u32, errno: i32) -> Arc<FailurePlan> {
        Arc::new(FailurePlan { fail_at, errno, calls: AtomicU32::new(0) })
    }

    /// Mutating calls so far, the failed one included.
    #[must_use]
    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Counts a mutating call; `Err` when it is the one to fail.
    fn gate(&self, op: &str, side: Side) -> Result<(), LinkOpError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_at {
            Err(LinkOpError::Kernel {
                op: format!("{op} (injected failure of call {n})"),
                side,
                errno: self.errno,
                message: std::io::Error::from_raw_os_error(self.errno).to_string(),
            })
        } else {
            Ok(())
        }
    }
}

/// Wraps `O`, failing the call its [`FailurePlan`] names without passing it on.
#[derive(Debug)]
pub struct FailingOps<O> {
    inner: O,
    plan: Arc<FailurePlan>,
}

impl<O: LinkPort> FailingOps<O> {
    /// `inner` with failures from `plan`.
    pub fn new(inner: O, plan: Arc<FailurePlan>) -> Self {
        FailingOps { inner, plan }
    }

    fn gate(&self, op: &str, side: Side) -> Result<(), LinkOpError> {
        self.plan.gate(op, side)
    }
}

impl<O: LinkPort + Send> LinkPort for FailingOps<O> {
    async fn link(&self, side: Side, name: &str) -> Result<Option<LinkState>, LinkOpError> {
        self.inner.link(side, name).await
    }

    async fn pod_config(&self, index: u32) -> Result<PodLinkConfig, LinkOpError> {
        self.inner.pod_config(index).await
    }

    async fn create_child(
        &self,
        kind: ChildKind,
        parent_index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        self.gate("create child", Side::Pod)?;
        self.inner.create_child(kind, parent_index, name, mtu, mac).await
    }

    async fn create_vlan(
        &self,
        parent_index: u32,
        name: &str,
        id: u16,
        alias: &str,
    ) -> Result<(), LinkOpError> {
        self.gate("create vlan", Side::Host)?;
        self.inner.create_vlan(parent_index, name, id, alias).await
    }

    async fn move_to_pod(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
        alias: &str,
    ) -> Result<(), LinkOpError> {
        self.gate("move to pod", Side::Host)?;
        self.inner.move_to_pod(index, name, mtu, mac, alias).await
    }

    async fn move_to_host(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        self.gate("move to host", Side::Pod)?;
        self.inner.move_to_host(index, name, mtu, mac).await
    }

    async fn restore_in_host(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        self.gate("restore in host", Side::Host)?;
        self.inner.restore_in_host(index, name, mtu, mac).await
    }

    async fn delete_link(&self, side: Side, index: u32) -> Result<(), LinkOpError> {
        self.gate("delete link", side)?;
        self.inner.delete_link(side, index).await
    }

    async fn add_address(
        &self,
        index: u32,
        address: IpNetwork,
        nodad: bool,
    ) -> Result<(), LinkOpError> {
        self.gate("add address", Side::Pod)?;
        self.inner.add_address(index, address, nodad).await
    }

    async fn delete_address(&self, index: u32, address: IpNetwork) -> Result<(), LinkOpError> {
        self.gate("delete address", Side::Pod)?;
        self.inner.delete_address(index, address).await
    }

    async fn set_up(&self, index: u32, up: bool) -> Result<(), LinkOpError> {
        self.gate("set up/down", Side::Pod)?;
        self.inner.set_up(index, up).await
    }

    async fn add_route(&self, index: u32, route: &Route) -> Result<(), LinkOpError> {
        self.gate("add route", Side::Pod)?;
        self.inner.add_route(index, route).await
    }

    async fn delete_route(&self, index: u32, route: &Route) -> Result<(), LinkOpError> {
        self.gate("delete route", Side::Pod)?;
        self.inner.delete_route(index, route).await
    }

    async fn rdma_device(&self, side: Side, name: &str) -> Result<Option<u32>, LinkOpError> {
        self.inner.rdma_device(side, name).await
    }

    async fn move_rdma(&self, from: Side, index: u32) -> Result<(), LinkOpError> {
        self.gate("move rdma", from)?;
        self.inner.move_rdma(from, index).await
    }

    /// Each request counts as one mutating call, as its single call does: the one to fail is
    /// answered here, and the others still go to the inner port, as one batch (pipelined on
    /// the real kernel), so a failure can sit in the middle of a batch whose later requests
    /// succeed.
    async fn apply_batch(&self, requests: &[PodRequest<'_>]) -> Vec<Result<(), LinkOpError>> {
        let mut failed: Vec<Option<LinkOpError>> = Vec::with_capacity(requests.len());
        let mut passed = Vec::with_capacity(requests.len());
        for request in requests {
            match self.gate(request.name(), Side::Pod) {
                Ok(()) => {
                    passed.push(*request);
                    failed.push(None);
                }
                Err(err) => failed.push(Some(err)),
            }
        }
        let mut answers = self.inner.apply_batch(&passed).await.into_iter();
        failed
            .into_iter()
            .map(|injected| match injected {
                Some(err) => Err(err),
                None => answers.next().unwrap_or_else(|| {
                    Err(LinkOpError::Protocol {
                        op: "batch".to_owned(),
                        side: Side::Pod,
                        message: "the inner port answered fewer requests".to_owned(),
                    })
                }),
            })
            .collect()
    }
}
