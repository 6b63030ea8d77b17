//! The metrics adapter: the node daemon's Prometheus families (`families`, with the state
//! dir's sync count read at each scrape: [`StoreSyncs`]) and the one operations endpoint,
//! `/metrics`, `/healthz` and `/readyz`, that `netclaim node` and
//! `netclaim controller` both serve ([`endpoint`]; the controller's families live in
//! `controller::metrics`), plain on loopback or over HTTPS for the scrapers the API server
//! allows ([`access`], [`tls`]), in the exposition format the scraper asks for
//! ([`exposition`]), with the build and process families both carry ([`standard`],
//! [`process`]).

pub mod access;
pub mod endpoint;
pub mod exposition;
mod families;
pub mod process;
pub mod standard;
mod store_syncs;
pub mod tls;

pub use endpoint::{
    Health, MetricsRegistry, MetricsSecurity, MetricsServerError, encode, serve, serve_with,
};
pub use exposition::{Format, encode_as, negotiate};
pub use families::{
    DurationFamily, InterfaceLabels, InterfaceTraffic, IpamLabels, KubeletRequestLabels, Metrics,
    ModeLabel, NriEventLabels, PodNetworkLabel, ResultLabel,
};
pub use standard::Declared;
pub use store_syncs::StoreSyncs;
