//! The metrics adapter: the node daemon's Prometheus families (`families`) and the one
//! operations endpoint, `/metrics`, `/healthz` and `/readyz`, that `netclaim node` and
//! `netclaim controller` both serve ([`endpoint`]; the controller's families live in
//! `controller::metrics`).

pub mod endpoint;
mod families;

pub use endpoint::{Health, MetricsRegistry, MetricsServerError, encode, serve};
pub use families::{
    DurationFamily, InterfaceLabels, InterfaceTraffic, IpamLabels, KubeletRequestLabels, Metrics,
    ModeLabel, NriEventLabels, ResultLabel,
};
