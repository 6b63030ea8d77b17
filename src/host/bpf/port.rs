//! The stats service's kernel ports on the pinned programs: [`CounterPort`] (hook, unhook,
//! read the counters with the link's drops) and [`PacingPort`] (the bandwidth ceilings), each
//! call handed to a blocking thread.

use std::path::Path;

use super::{BpfError, CounterPins};
use crate::model::stats::{CeilingCounters, InterfaceStats};
use crate::podnet::LinkOpError;
use crate::stats::{Ceilings, CounterPort, PacingPort};

/// Errors of the stats service's kernel port.
#[derive(Debug, thiserror::Error)]
pub enum CounterPortError {
    /// A counter operation.
    #[error(transparent)]
    Bpf(#[from] BpfError),
    /// Reading the link counters in the pod netns.
    #[error("reading the link counters")]
    Link(#[source] LinkOpError),
    /// Reading the ceiling qdiscs' counters in the pod netns.
    #[error("reading the bandwidth ceiling qdiscs")]
    Qdisc(#[source] crate::host::qdisc_ceiling::CeilingPortError),
    /// The blocking task was cancelled or panicked.
    #[error("the counters task did not finish")]
    Task(#[source] tokio::task::JoinError),
}

/// The stats service's kernel port: pins on bpffs, drops from the pod's link counters.
impl CounterPort for CounterPins {
    type Error = CounterPortError;

    async fn hook(&self, netns: &Path, pod_uid: &str, interface: &str) -> Result<(), Self::Error> {
        let (pins, netns, pod_uid, interface) =
            (self.clone(), netns.to_owned(), pod_uid.to_owned(), interface.to_owned());
        tokio::task::spawn_blocking(move || pins.attach(&netns, &pod_uid, &interface))
            .await
            .map_err(CounterPortError::Task)?
            .map_err(CounterPortError::Bpf)
    }

    async fn unhook(
        &self,
        netns: Option<&Path>,
        pod_uid: &str,
        interface: &str,
    ) -> Result<(), Self::Error> {
        let (pins, netns, pod_uid, interface) =
            (self.clone(), netns.map(Path::to_owned), pod_uid.to_owned(), interface.to_owned());
        tokio::task::spawn_blocking(move || pins.detach(netns.as_deref(), &pod_uid, &interface))
            .await
            .map_err(CounterPortError::Task)?
            .map_err(CounterPortError::Bpf)
    }

    async fn read(
        &self,
        netns: &Path,
        pod_uid: &str,
        interfaces: &[String],
    ) -> Result<Vec<Option<InterfaceStats>>, Self::Error> {
        let drops = super::super::netlink::link_drops(netns, interfaces)
            .await
            .map_err(CounterPortError::Link)?;
        // The ceiling's qdisc (ours at the root): its drops and throttling.
        let qdiscs = crate::host::qdisc_ceiling::ceiling_qdisc_counters(netns, interfaces)
            .await
            .map_err(CounterPortError::Qdisc)?;
        interfaces
            .iter()
            .zip(drops)
            .zip(qdiscs)
            .map(|((interface, drops), qdisc)| {
                // Pinned maps are read with two bpf(2) lookups: no thread hand-off needed.
                let counters = self.read_counters(pod_uid, interface)?;
                Ok(counters.map(|c| {
                    let (rx_dropped, tx_dropped) = drops.unwrap_or_default();
                    InterfaceStats {
                        rx: c.rx,
                        tx: c.tx,
                        rx_dropped,
                        tx_dropped,
                        ceiling: CeilingCounters { qdisc, ..c.ceiling },
                    }
                }))
            })
            .collect()
    }

    fn hooked(&self) -> Result<Vec<(String, String)>, Self::Error> {
        let mut pairs = Vec::new();
        for pod in self.pods()? {
            let interfaces = self.interfaces(&pod)?;
            if interfaces.is_empty() {
                // An empty pod directory an interrupted detach left behind.
                let _ignored = std::fs::remove_dir(self.root.join(&pod));
            }
            pairs.extend(interfaces.into_iter().map(|interface| (pod.clone(), interface)));
        }
        Ok(pairs)
    }
}

/// The bandwidth ceilings of the same programs.
impl PacingPort for CounterPins {
    type Error = CounterPortError;

    async fn set_pacing(
        &self,
        netns: &Path,
        pod_uid: &str,
        interface: &str,
        ceilings: Ceilings,
    ) -> Result<(), Self::Error> {
        let (pins, netns, pod_uid, interface) =
            (self.clone(), netns.to_owned(), pod_uid.to_owned(), interface.to_owned());
        tokio::task::spawn_blocking(move || pins.set_pacing(&netns, &pod_uid, &interface, ceilings))
            .await
            .map_err(CounterPortError::Task)?
            .map_err(CounterPortError::Bpf)
    }
}
