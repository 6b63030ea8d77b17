//! Prometheus metrics of the node daemon (DESIGN §1) and the HTTP endpoint that serves
//! them with `/healthz` and `/readyz`.

mod families;

pub use families::{
    DurationFamily, Health, InterfaceLabels, InterfaceTraffic, IpamLabels, KubeletRequestLabels,
    Metrics, MetricsServerError, ModeLabel, NriEventLabels, ResultLabel, serve,
};
