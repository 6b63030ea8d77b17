//! The routing capability of the pod netns (DESIGN §3 `routing`, `vrf`, `sysctls`): rules,
//! routes in tables other than `main`, VRF devices and the interface's sysctls. Every
//! [`super::LinkPort`] has it (a supertrait), so `podnet::apply` needs no second handle.

use std::future::Future;
use std::sync::Arc;

use crate::model::network_config::Sysctl;
use crate::podnet::plan::{SourceRule, TableRoute};

use super::LinkOpError;

/// `ENOENT`: a rule to delete is not there.
pub const ENOENT: i32 = 2;

/// A VRF device in the pod netns, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VrfState {
    /// Its interface index.
    pub index: u32,
    /// Its table; `None` when the link of that name is not a VRF.
    pub table: Option<u32>,
    /// How many links are enslaved to it.
    pub members: u32,
}

/// Rules, table routes, VRFs and sysctls in the pod netns.
pub trait RoutingPort: Sync {
    /// Adds `rule`.
    fn add_rule(&self, rule: &SourceRule) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Deletes `rule` (`ENOENT` when it is not there).
    fn delete_rule(
        &self,
        rule: &SourceRule,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Adds `route` through pod link `index` to its table.
    fn add_table_route(
        &self,
        index: u32,
        route: &TableRoute,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Deletes `route` through pod link `index` from its table.
    fn delete_table_route(
        &self,
        index: u32,
        route: &TableRoute,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// The pod link named `name` as a VRF, or `None` when there is no link of that name.
    fn vrf(&self, name: &str)
    -> impl Future<Output = Result<Option<VrfState>, LinkOpError>> + Send;

    /// Creates the VRF `name` with `table` in the pod netns, up (a VRF that is down routes
    /// nothing).
    fn create_vrf(
        &self,
        name: &str,
        table: u32,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Enslaves pod link `index` to pod link `master` (0: no master).
    fn set_master(
        &self,
        index: u32,
        master: u32,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Sets `sysctls` of pod link `index`, named `if_name` in the pod, in order.
    fn set_sysctls(
        &self,
        index: u32,
        if_name: &str,
        sysctls: &[Sysctl],
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;
}

impl<T: RoutingPort + Send> RoutingPort for Arc<T> {
    async fn add_rule(&self, rule: &SourceRule) -> Result<(), LinkOpError> {
        (**self).add_rule(rule).await
    }

    async fn delete_rule(&self, rule: &SourceRule) -> Result<(), LinkOpError> {
        (**self).delete_rule(rule).await
    }

    async fn add_table_route(&self, index: u32, route: &TableRoute) -> Result<(), LinkOpError> {
        (**self).add_table_route(index, route).await
    }

    async fn delete_table_route(&self, index: u32, route: &TableRoute) -> Result<(), LinkOpError> {
        (**self).delete_table_route(index, route).await
    }

    async fn vrf(&self, name: &str) -> Result<Option<VrfState>, LinkOpError> {
        (**self).vrf(name).await
    }

    async fn create_vrf(&self, name: &str, table: u32) -> Result<(), LinkOpError> {
        (**self).create_vrf(name, table).await
    }

    async fn set_master(&self, index: u32, master: u32) -> Result<(), LinkOpError> {
        (**self).set_master(index, master).await
    }

    async fn set_sysctls(
        &self,
        index: u32,
        if_name: &str,
        sysctls: &[Sysctl],
    ) -> Result<(), LinkOpError> {
        (**self).set_sysctls(index, if_name, sysctls).await
    }
}
