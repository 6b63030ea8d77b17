//! Pipelined pod-side requests (issue 36): the requests of one attach or detach that need
//! nothing from each other's answers, handed to the kernel together. The real port sends them
//! back to back on one socket and reads the acks after; the kernel handles one socket's
//! requests in order (rtnetlink runs them inside `sendmsg`), so a batch keeps its order
//! (addresses before up, up before routes). Every request is attempted, even after one fails:
//! the caller gets one result per request and undoes every success.

use ipnetwork::IpNetwork;

use crate::model::network_config::{Route, Sysctl};
use crate::podnet::plan::{SourceRule, TableRoute};

use super::{LinkOpError, LinkPort};

/// One pod-side request of a batch; links by index (looked up before the batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodRequest<'a> {
    /// [`LinkPort::add_address`].
    AddAddress {
        /// The link.
        index: u32,
        /// The address.
        address: IpNetwork,
        /// `IFA_F_NODAD`.
        nodad: bool,
    },
    /// [`LinkPort::delete_address`].
    DeleteAddress {
        /// The link.
        index: u32,
        /// The address.
        address: IpNetwork,
    },
    /// [`LinkPort::set_up`].
    SetUp {
        /// The link.
        index: u32,
        /// Up (`true`) or down.
        up: bool,
    },
    /// [`LinkPort::add_route`].
    AddRoute {
        /// The link.
        index: u32,
        /// The route.
        route: &'a Route,
    },
    /// [`LinkPort::delete_route`].
    DeleteRoute {
        /// The link.
        index: u32,
        /// The route.
        route: &'a Route,
    },
    /// [`super::RoutingPort::add_table_route`].
    AddTableRoute {
        /// The link.
        index: u32,
        /// The route and its table.
        route: &'a TableRoute,
    },
    /// [`super::RoutingPort::delete_table_route`].
    DeleteTableRoute {
        /// The link.
        index: u32,
        /// The route and its table.
        route: &'a TableRoute,
    },
    /// [`super::RoutingPort::add_rule`].
    AddRule {
        /// The rule.
        rule: &'a SourceRule,
    },
    /// [`super::RoutingPort::delete_rule`].
    DeleteRule {
        /// The rule.
        rule: &'a SourceRule,
    },
    /// [`super::RoutingPort::set_master`].
    SetMaster {
        /// The link.
        index: u32,
        /// The master's index (0: none).
        master: u32,
    },
    /// [`super::RoutingPort::set_sysctls`]. The real port writes the settings that only
    /// `/proc/sys` takes before it sends the batch (on a thread in the pod netns), and sends
    /// the `IFLA_INET_CONF` part in the batch at this request's place.
    SetSysctls {
        /// The link.
        index: u32,
        /// Its name in the pod.
        if_name: &'a str,
        /// The settings.
        sysctls: &'a [Sysctl],
    },
    /// [`LinkPort::delete_link`] in the pod netns.
    DeleteLink {
        /// The link.
        index: u32,
    },
}

impl PodRequest<'_> {
    /// What the request does, for logs and injected failures (`add address`).
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            PodRequest::AddAddress { .. } => "add address",
            PodRequest::DeleteAddress { .. } => "delete address",
            PodRequest::SetUp { .. } => "set up/down",
            PodRequest::AddRoute { .. } => "add route",
            PodRequest::DeleteRoute { .. } => "delete route",
            PodRequest::AddTableRoute { .. } => "add table route",
            PodRequest::DeleteTableRoute { .. } => "delete table route",
            PodRequest::AddRule { .. } => "add rule",
            PodRequest::DeleteRule { .. } => "delete rule",
            PodRequest::SetMaster { .. } => "set master",
            PodRequest::SetSysctls { .. } => "set sysctls",
            PodRequest::DeleteLink { .. } => "delete link",
        }
    }
}

/// Runs `requests` one at a time through the port's single calls, each awaited, every one
/// attempted whatever the others' results: the default [`LinkPort::apply_batch`] (the fake
/// kernels), with the same results a pipelined batch gives.
pub async fn apply_sequentially<O: LinkPort + ?Sized>(
    ops: &O,
    requests: &[PodRequest<'_>],
) -> Vec<Result<(), LinkOpError>> {
    let mut results = Vec::with_capacity(requests.len());
    for request in requests {
        let result = match *request {
            PodRequest::AddAddress { index, address, nodad } => {
                ops.add_address(index, address, nodad).await
            }
            PodRequest::DeleteAddress { index, address } => {
                ops.delete_address(index, address).await
            }
            PodRequest::SetUp { index, up } => ops.set_up(index, up).await,
            PodRequest::AddRoute { index, route } => ops.add_route(index, route).await,
            PodRequest::DeleteRoute { index, route } => ops.delete_route(index, route).await,
            PodRequest::AddTableRoute { index, route } => ops.add_table_route(index, route).await,
            PodRequest::DeleteTableRoute { index, route } => {
                ops.delete_table_route(index, route).await
            }
            PodRequest::AddRule { rule } => ops.add_rule(rule).await,
            PodRequest::DeleteRule { rule } => ops.delete_rule(rule).await,
            PodRequest::SetMaster { index, master } => ops.set_master(index, master).await,
            PodRequest::SetSysctls { index, if_name, sysctls } => {
                ops.set_sysctls(index, if_name, sysctls).await
            }
            PodRequest::DeleteLink { index } => ops.delete_link(super::Side::Pod, index).await,
        };
        results.push(result);
    }
    results
}
