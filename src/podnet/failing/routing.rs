//! [`RoutingPort`] of [`FailingOps`]: every mutating routing call counts and may be the one
//! that fails; the VRF lookup passes through like the link lookup.

use super::FailingOps;
use crate::model::network_config::Sysctl;
use crate::podnet::plan::{SourceRule, TableRoute};
use crate::podnet::ports::{LinkOpError, LinkPort, RoutingPort, Side, VrfState};

impl<O: LinkPort + Send> RoutingPort for FailingOps<O> {
    async fn add_rule(&self, rule: &SourceRule) -> Result<(), LinkOpError> {
        self.gate("add rule", Side::Pod)?;
        self.inner.add_rule(rule).await
    }

    async fn delete_rule(&self, rule: &SourceRule) -> Result<(), LinkOpError> {
        self.gate("delete rule", Side::Pod)?;
        self.inner.delete_rule(rule).await
    }

    async fn add_table_route(&self, index: u32, route: &TableRoute) -> Result<(), LinkOpError> {
        self.gate("add table route", Side::Pod)?;
        self.inner.add_table_route(index, route).await
    }

    async fn delete_table_route(&self, index: u32, route: &TableRoute) -> Result<(), LinkOpError> {
        self.gate("delete table route", Side::Pod)?;
        self.inner.delete_table_route(index, route).await
    }

    async fn vrf(&self, name: &str) -> Result<Option<VrfState>, LinkOpError> {
        self.inner.vrf(name).await
    }

    async fn create_vrf(&self, name: &str, table: u32) -> Result<(), LinkOpError> {
        self.gate("create vrf", Side::Pod)?;
        self.inner.create_vrf(name, table).await
    }

    async fn set_master(&self, index: u32, master: u32) -> Result<(), LinkOpError> {
        self.gate("set master", Side::Pod)?;
        self.inner.set_master(index, master).await
    }

    async fn set_sysctls(
        &self,
        index: u32,
        if_name: &str,
        sysctls: &[Sysctl],
    ) -> Result<(), LinkOpError> {
        self.gate("set sysctls", Side::Pod)?;
        self.inner.set_sysctls(index, if_name, sysctls).await
    }
}
