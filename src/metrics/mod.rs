//! The metrics adapter: the node daemon's Prometheus families (`families`) and the one
//! operations endpoint, `/metrics`, `/healthz` and `/readyz`, that `netclaim node` and
//! `netclaim controller` both serve ([`endpoint`]; the controller's families live in
//! `controller::metrics`), plain on loopback or over HTTPS for the scrapers the API server
//! allows ([`access`], [`tls`]).

pub mod access;
pub mod endpoint;
mod families;
pub mod tls;

pub use endpoint::{
    Health, MetricsRegistry, MetricsSecurity, MetricsServerError, encode, serve, serve_with,
};
pub use families::{
    DurationFamily, InterfaceLabels, InterfaceTraffic, IpamLabels, KubeletRequestLabels, Metrics,
    ModeLabel, NriEventLabels, PodNetworkLabel, ResultLabel,
};
