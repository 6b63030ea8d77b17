//! What both processes' registries hold besides their own families: `netclaim_build_info`,
//! the process families ([`super::process`]), and [`Declared`], which keeps a labelled family
//! declared before its first sample.

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use super::process::ProcessCollector;

/// A family whose `# HELP` and `# TYPE` are written even while it has no series.
/// `prometheus-client` skips empty families; a labelled counter then appears only at its
/// first event, so neither the scraper's metadata nor a reader of `/metrics` learns the
/// family exists, and an alert on it cannot be told apart from a typo.
#[derive(Debug, Clone, Default)]
pub struct Declared<M>(pub M);

impl<M: EncodeMetric> EncodeMetric for Declared<M> {
    fn encode(&self, encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        false
    }
}

/// Registers `metric` on `registry` as `name`, declared from the start ([`Declared`]), and
/// returns it for the caller to update.
pub fn declare<M: EncodeMetric + Clone + Send + Sync + std::fmt::Debug + 'static>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, Declared(metric.clone()));
    metric
}

/// Labels of `netclaim_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version the binary was built from (`CARGO_PKG_VERSION`).
    pub version: &'static str,
}

/// This binary's build labels. Only what the build knows: the crate version (the image is
/// built from a source tree without `.git`, so no commit is claimed).
#[must_use]
pub const fn build_labels() -> BuildLabels {
    BuildLabels { version: env!("CARGO_PKG_VERSION") }
}

/// Registers `netclaim_build_info{version} 1` and the process families on `root`, a
/// registry without prefix.
pub fn register(root: &mut Registry) {
    root.register(
        "netclaim_build",
        "The netclaim build this process runs, as labels; the value is 1",
        Info::new(build_labels()),
    );
    root.register_collector(Box::new(ProcessCollector));
}
