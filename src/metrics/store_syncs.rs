//! `netclaim_store_syncs_total`: the `fdatasync`/`fsync` calls of the daemon's state dir, read
//! from the store at each scrape. What a burst of prepares costs the disk shows here: group
//! commit makes concurrent prepares share syncs (decision 0022), so this counter grows more
//! slowly than `netclaim_prepare_duration_seconds_count`.

use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

/// Reads the store's running count of syncs.
type ReadSyncs = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The counter's source, set once the store is open (after the metrics endpoint starts):
/// until then the family is declared without a series.
#[derive(Default)]
pub struct StoreSyncs {
    read: OnceLock<ReadSyncs>,
}

impl std::fmt::Debug for StoreSyncs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSyncs").field("read", &self.read.get().map(|read| read())).finish()
    }
}

impl StoreSyncs {
    /// Reads the count from `read` at each scrape. A store opened once per process: a second
    /// call is ignored (the first store's count stays).
    pub fn read_from(&self, read: impl Fn() -> u64 + Send + Sync + 'static) {
        let _already_set = self.read.set(Arc::new(read));
    }
}

impl Collector for StoreSyncs {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let family = encoder.encode_descriptor(
            "store_syncs",
            "fdatasync and fsync calls on the state dir's journal (group commits, compactions)",
            None,
            MetricType::Counter,
        )?;
        if let Some(read) = self.read.get() {
            ConstCounter::new(read()).encode(family)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn the_family_is_declared_before_the_store_opens_and_then_counts_each_scrape() {
        let metrics = Metrics::new();
        let text = metrics.encode();
        assert!(text.contains("# TYPE netclaim_store_syncs counter\n"), "{text}");
        assert!(!text.contains("netclaim_store_syncs_total "), "a series without a store: {text}");
        let syncs = Arc::new(AtomicU64::new(3));
        let read = Arc::clone(&syncs);
        metrics.store_syncs.read_from(move || read.load(Ordering::Relaxed));
        assert!(metrics.encode().contains("netclaim_store_syncs_total 3\n"));
        syncs.store(10, Ordering::Relaxed);
        assert!(metrics.encode().contains("netclaim_store_syncs_total 10\n"));
        metrics.store_syncs.read_from(|| 99);
        assert!(metrics.encode().contains("netclaim_store_syncs_total 10\n"), "second source");
    }
}
