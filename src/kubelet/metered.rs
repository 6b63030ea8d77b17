//! Call metrics around the prepare port: `netclaim_{prepare,unprepare}_duration_seconds` and
//! `netclaim_kubelet_requests_total{method,code}` for every call kubelet makes.

use std::sync::Arc;
use std::time::Instant;

use crate::claims::{ClaimPreparer, PrepareResults, UnprepareResults};
use crate::metrics::{KubeletRequestLabels, Metrics};
use crate::model::ClaimRef;

/// Wraps a preparer with `netclaim_{prepare,unprepare}_duration_seconds` and
/// `netclaim_kubelet_requests_total{method,code}`.
#[derive(Debug)]
pub struct MeteredPreparer<P> {
    inner: P,
    metrics: Arc<Metrics>,
}

impl<P> MeteredPreparer<P> {
    /// Records the calls of `inner` in `metrics`.
    #[must_use]
    pub fn new(inner: P, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    /// The wrapped preparer.
    #[must_use]
    pub fn inner(&self) -> &P {
        &self.inner
    }

    fn count(&self, method: &'static str, all_ok: bool) {
        let code = if all_ok { "OK" } else { "ClaimError" };
        self.metrics.kubelet_requests.get_or_create(&KubeletRequestLabels { method, code }).inc();
    }
}

impl<P: ClaimPreparer> ClaimPreparer for MeteredPreparer<P> {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let started = Instant::now();
        let results = self.inner.prepare(claims).await;
        self.metrics.prepare_duration.observe(started.elapsed().as_secs_f64());
        self.count("NodePrepareResources", results.values().all(Result::is_ok));
        results
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let started = Instant::now();
        let results = self.inner.unprepare(claims).await;
        self.metrics.unprepare_duration.observe(started.elapsed().as_secs_f64());
        self.count("NodeUnprepareResources", results.values().all(Result::is_ok));
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::UnavailablePreparer;

    #[tokio::test]
    async fn calls_are_timed_and_counted_by_method_and_outcome() {
        let metrics = Arc::new(Metrics::new());
        let preparer =
            MeteredPreparer::new(UnavailablePreparer::new("netclaim.dev"), Arc::clone(&metrics));
        let claim = ClaimRef { namespace: "ns".into(), name: "c".into(), uid: "u".into() };
        preparer.prepare(vec![claim.clone()]).await;
        preparer.unprepare(vec![claim]).await;
        let text = metrics.encode();
        for line in [
            r#"netclaim_kubelet_requests_total{method="NodePrepareResources",code="ClaimError"} 1"#,
            r#"netclaim_kubelet_requests_total{method="NodeUnprepareResources",code="OK"} 1"#,
            "netclaim_prepare_duration_seconds_count 1",
            "netclaim_unprepare_duration_seconds_count 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}
