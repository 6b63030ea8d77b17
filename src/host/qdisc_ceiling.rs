//! The attach service's [`CeilingPort`] over the kernel: a root qdisc on the pod interface,
//! inside the pod netns (`host::qdisc`), and for Earliest Departure Time the pacing rate of the
//! interface's eBPF program (`stats::PacingPort`, which also polices ingress).
//!
//! The qdisc parameters are chosen here, where the kernel's behaviour is known:
//! - `tbf`: the bucket holds [`BURST_TIME`] at the rate and never less than
//!   [`MIN_BURST`] (a GSO packet of 64 KiB plus its headers: a smaller bucket makes tbf
//!   segment every such packet in software, or drop it if it cannot); the FIFO behind it holds
//!   [`QUEUE_TIME`] at the rate and at least two buckets. Over an iperf3 run of one second
//!   the first bucket adds `burst / (rate · 1 s)` to the average: ≤ 2.1 % at 50 Mbit/s.
//! - `htb`: one class with rate = ceiling and the same buckets; quantum fixed at
//!   [`HTB_QUANTUM`] (the default `rate / r2q` passes the kernel's 200000 cap from 16 Mbit/s
//!   up and makes it warn for every class).
//! - `fq`: the kernel defaults but a 2 s horizon past which packets are dropped (the program
//!   drops beyond the same horizon itself; this only bounds a stamp from elsewhere).

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tc_qdisc::fq::Fq;
use tc_qdisc::htb::{HtbClass, HtbQdisc};
use tc_qdisc::tbf::Tbf;

use super::netlink::{link_by_name, open_in_netns};
use super::qdisc::{self, HTB_CLASS_MINOR, QdiscError, QdiscState, RootQdisc};
use crate::attach::bandwidth::{
    CeilingFuture, CeilingMechanism, CeilingPort, CeilingSupport, InterfaceCeiling,
};
use crate::host::bpf::CounterPins;
use crate::model::bandwidth::{BitsPerSecond, IngressPolicy};
use crate::model::cause::{Cause, cause};
use crate::model::stats::CeilingQdiscCounters;
use crate::podnet::LinkOpError;
use crate::stats::{Ceilings, PacingPort};

/// How long the token bucket lasts at the rate.
pub const BURST_TIME: std::time::Duration = std::time::Duration::from_millis(2);
/// The smallest bucket: a 64 KiB GSO packet with its headers fits.
pub const MIN_BURST: u32 = 128 * 1024;
/// How long the FIFO behind the bucket lasts at the rate.
pub const QUEUE_TIME: std::time::Duration = std::time::Duration::from_millis(50);
/// htb's class quantum (bytes per round; one class, so only the warning matters).
pub const HTB_QUANTUM: u32 = 200_000;
/// fq's horizon, microseconds.
pub const FQ_HORIZON_US: u32 = 2_000_000;

/// Bytes the rate carries in `time`, saturated into a `u32`.
fn bytes_in(rate: BitsPerSecond, time: std::time::Duration) -> u32 {
    let bytes = u128::from(rate.bytes_per_second()) * time.as_micros() / 1_000_000;
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// The root qdisc that holds an interface to `rate` by `mechanism` (`None` for a VF's rate,
/// which is no qdisc).
#[must_use]
pub fn root_qdisc(mechanism: CeilingMechanism, rate: BitsPerSecond) -> Option<RootQdisc> {
    let burst = bytes_in(rate, BURST_TIME).max(MIN_BURST);
    let limit = bytes_in(rate, QUEUE_TIME).max(burst.saturating_mul(2));
    let bytes = rate.bytes_per_second();
    match mechanism {
        CeilingMechanism::Tbf => Some(RootQdisc::Tbf(Tbf { rate: bytes, burst, limit })),
        CeilingMechanism::Htb => Some(RootQdisc::Htb {
            qdisc: HtbQdisc {
                default_class: u32::from(HTB_CLASS_MINOR),
                rate2quantum: 10,
                direct_qlen: Some(1000),
            },
            class: HtbClass {
                rate: bytes,
                ceil: bytes,
                burst,
                cburst: burst,
                quantum: HTB_QUANTUM,
                prio: 0,
            },
        }),
        CeilingMechanism::EdtFq => Some(RootQdisc::Fq(Fq {
            horizon_us: Some(FQ_HORIZON_US),
            horizon_drop: Some(true),
            ..Fq::default()
        })),
        CeilingMechanism::VfMaxTxRate => None,
    }
}

/// How this node enforces ceilings, decided once at start ([`node_ceilings`]).
#[derive(Debug)]
pub struct NodeCeilings {
    /// The gate's port.
    pub port: HostCeilings<CounterPins>,
    /// What it offers.
    pub support: CeilingSupport,
    /// Why ingress cannot be policed here (the programs are not available), for prepare's
    /// refusal of `bandwidth.ingress: police`; `None` when it can.
    pub no_police: Option<String>,
}

/// How this node enforces ceilings: the counting programs pace egress (EDT, where `fq` is
/// true: the kernel probe created an `fq` qdisc) and police ingress when `pins` is given (a
/// BPF file system is mounted where the counters go) and the kernel takes the programs
/// ([`crate::host::bpf::programs_load`]); the same pins as the stats service, so one program
/// per direction counts and enforces. Otherwise `tbf` and no policing, said once in the log.
/// Blocking (a verifier pass).
#[must_use]
pub fn node_ceilings(pins: Option<CounterPins>, fq: bool) -> NodeCeilings {
    let (pins, no_police) = match pins {
        None => (None, Some("no BPF file system for its eBPF programs (--bpffs)".to_owned())),
        Some(pins) => match crate::host::bpf::programs_load() {
            Ok(()) => (Some(pins), None),
            Err(err) => (
                None,
                Some(format!(
                    "the kernel refused its eBPF programs ({})",
                    crate::model::cause::chain(&err)
                )),
            ),
        },
    };
    let support = CeilingSupport { fq, pacing: pins.is_some() };
    let mechanism =
        crate::attach::bandwidth::mechanism(crate::model::network_config::Mode::Macvlan, support);
    match &no_police {
        None => tracing::info!(%mechanism, "bandwidth ceilings; ingress policing by the programs"),
        Some(why) => tracing::warn!(%mechanism, why = %why,
            "bandwidth ceilings without the eBPF programs: no edt-fq, bandwidth.ingress police \
             refused at prepare"),
    }
    NodeCeilings { port: HostCeilings::new(pins.map(Arc::new)), support, no_police }
}

/// Why one interface's ceiling failed.
#[derive(Debug, thiserror::Error)]
pub enum CeilingPortError {
    /// The pod netns or the interface could not be reached.
    #[error("{0}")]
    Link(#[from] LinkOpError),
    /// The interface is not in the pod netns.
    #[error("no interface {0} in the pod netns")]
    NoInterface(String),
    /// The qdisc was refused.
    #[error("qdisc {kind}: {source}")]
    Qdisc {
        /// The qdisc kind.
        kind: &'static str,
        /// The kernel's answer.
        #[source]
        source: QdiscError,
    },
    /// The eBPF program's pacing or policing rate could not be set.
    #[error("eBPF pacing: {0}")]
    Pacing(#[source] Cause),
    /// Pacing was asked of a node without the programs.
    #[error("eBPF pacing asked of a daemon without the counting programs")]
    NoPacing,
}

/// [`CeilingPort`] over netlink and the counting programs.
#[derive(Debug, Clone)]
pub struct HostCeilings<P> {
    pacing: Option<Arc<P>>,
}

impl<P: PacingPort> HostCeilings<P> {
    /// Ceilings with the programs' pacing (`None`: qdiscs only; EDT and policing then fail).
    #[must_use]
    pub fn new(pacing: Option<Arc<P>>) -> Self {
        Self { pacing }
    }

    /// The programs' rates for `ceiling` (`None` when it needs none).
    fn program_rates(ceiling: &InterfaceCeiling) -> Option<Ceilings> {
        let rate = ceiling.rate.get();
        let rates = Ceilings {
            egress_bps: (ceiling.mechanism == CeilingMechanism::EdtFq).then_some(rate),
            ingress_police_bps: (ceiling.ingress == IngressPolicy::Police).then_some(rate),
        };
        (!rates.is_none()).then_some(rates)
    }

    async fn set_rates(
        &self,
        netns: &Path,
        pod_uid: &str,
        interface: &str,
        rates: Ceilings,
    ) -> Result<(), CeilingPortError> {
        let pacing = self.pacing.as_ref().ok_or(CeilingPortError::NoPacing)?;
        pacing
            .set_pacing(netns, pod_uid, interface, rates)
            .await
            .map_err(|err| CeilingPortError::Pacing(cause(err)))
    }

    async fn apply_inner(
        &self,
        netns: &Path,
        pod_uid: &str,
        ceiling: &InterfaceCeiling,
    ) -> Result<(), CeilingPortError> {
        let (handle, _netns) = open_in_netns(netns).await?;
        let index = link_by_name(&handle, &ceiling.interface, &[])
            .await
            .ok()
            .flatten()
            .ok_or_else(|| CeilingPortError::NoInterface(ceiling.interface.clone()))?
            .header
            .index;
        let root = root_qdisc(ceiling.mechanism, ceiling.rate);
        if let Some(root) = &root {
            qdisc::replace_root(&handle, index, root)
                .await
                .map_err(|source| CeilingPortError::Qdisc { kind: root.kind(), source })?;
        }
        if let Some(rates) = Self::program_rates(ceiling)
            && let Err(err) = self.set_rates(netns, pod_uid, &ceiling.interface, rates).await
        {
            if root.is_some()
                && let Err(undo) = qdisc::delete_root(&handle, index).await
            {
                tracing::warn!(interface = %ceiling.interface, %undo,
                    "removing the qdisc of a ceiling whose pacing failed");
            }
            return Err(err);
        }
        Ok(())
    }

    async fn remove_inner(
        &self,
        netns: &Path,
        pod_uid: &str,
        ceiling: &InterfaceCeiling,
    ) -> Result<(), CeilingPortError> {
        if Self::program_rates(ceiling).is_some() {
            self.set_rates(netns, pod_uid, &ceiling.interface, Ceilings::default()).await?;
        }
        let (handle, _netns) = open_in_netns(netns).await?;
        let Some(link) = link_by_name(&handle, &ceiling.interface, &[]).await.ok().flatten() else {
            return Ok(());
        };
        qdisc::delete_root(&handle, link.header.index)
            .await
            .map(|_| ())
            .map_err(|source| CeilingPortError::Qdisc { kind: "root", source })
    }
}

/// What the ceiling qdisc `root` did: zeros unless it is ours (handle `4e43:`), so that a
/// qdisc somebody else put at the root is never reported as the ceiling's. `fq`'s own
/// counters come from its `TCA_XSTATS` (`tc_fq_qd_stats`).
#[must_use]
pub fn qdisc_counters(root: &QdiscState) -> CeilingQdiscCounters {
    if !root.is_ours() {
        return CeilingQdiscCounters::default();
    }
    let fq = (root.kind == tc_qdisc::fq::KIND)
        .then(|| root.xstats.as_deref().map(tc_qdisc::fq::FqStats::parse))
        .flatten()
        .unwrap_or_default();
    CeilingQdiscCounters {
        dropped: root.counters.drops,
        overlimits: root.counters.overlimits,
        throttled: fq.throttled,
        horizon_drops: fq.horizon_drops,
        flows_plimit: fq.flows_plimit,
    }
}

/// The ceiling qdisc's counters of each of `interfaces` in the netns at `netns`, one socket
/// for all of them: zeros for an interface without a ceiling qdisc of ours, or gone.
///
/// # Errors
/// [`CeilingPortError::Link`] when the netns cannot be entered, [`CeilingPortError::Qdisc`]
/// when the kernel's qdisc dump fails.
pub async fn ceiling_qdisc_counters(
    netns: &Path,
    interfaces: &[String],
) -> Result<Vec<CeilingQdiscCounters>, CeilingPortError> {
    let (handle, _netns) = open_in_netns(netns).await?;
    let mut counters = Vec::with_capacity(interfaces.len());
    for interface in interfaces {
        let Some(link) = link_by_name(&handle, interface, &[]).await.ok().flatten() else {
            counters.push(CeilingQdiscCounters::default());
            continue;
        };
        let root = qdisc::root(&handle, link.header.index)
            .await
            .map_err(|source| CeilingPortError::Qdisc { kind: "root", source })?;
        counters.push(root.as_ref().map(qdisc_counters).unwrap_or_default());
    }
    Ok(counters)
}

fn boxed<'a>(
    work: impl Future<Output = Result<(), CeilingPortError>> + Send + 'a,
) -> CeilingFuture<'a> {
    Box::pin(async move { work.await.map_err(cause) })
}

impl<P: PacingPort> CeilingPort for HostCeilings<P> {
    fn apply<'a>(
        &'a self,
        netns: &'a Path,
        pod_uid: &'a str,
        ceiling: &'a InterfaceCeiling,
    ) -> CeilingFuture<'a> {
        boxed(self.apply_inner(netns, pod_uid, ceiling))
    }

    fn remove<'a>(
        &'a self,
        netns: &'a Path,
        pod_uid: &'a str,
        ceiling: &'a InterfaceCeiling,
    ) -> CeilingFuture<'a> {
        boxed(self.remove_inner(netns, pod_uid, ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tbf_buckets_hold_a_gso_packet_and_queues_two_buckets() {
        let Some(RootQdisc::Tbf(small)) =
            root_qdisc(CeilingMechanism::Tbf, BitsPerSecond(50_000_000))
        else {
            panic!("tbf");
        };
        assert_eq!((small.rate, small.burst), (6_250_000, MIN_BURST));
        // 50 ms at 6.25 MB/s is 312500 bytes, above two buckets.
        assert_eq!(small.limit, 312_500);
        let Some(RootQdisc::Tbf(big)) =
            root_qdisc(CeilingMechanism::Tbf, BitsPerSecond(2_000_000_000))
        else {
            panic!("tbf");
        };
        // 2 ms at 250 MB/s.
        assert_eq!((big.burst, big.limit), (500_000, 12_500_000));
    }

    fn state(kind: &str, handle: u32, xstats: Option<Vec<u8>>) -> QdiscState {
        QdiscState {
            kind: kind.to_owned(),
            handle,
            parent: u32::MAX,
            options: Vec::new(),
            xstats,
            counters: qdisc::QdiscCounters {
                drops: 12,
                overlimits: 340,
                ..qdisc::QdiscCounters::default()
            },
        }
    }

    #[test]
    fn a_tbf_ceiling_reports_its_drops_and_overlimits_and_someone_elses_root_nothing() {
        let ours = qdisc_counters(&state("tbf", 0x4e43_0000, None));
        assert_eq!(
            ours,
            CeilingQdiscCounters {
                dropped: 12,
                overlimits: 340,
                ..CeilingQdiscCounters::default()
            }
        );
        assert!(
            qdisc_counters(&state("tbf", 0x0001_0000, None)).is_zero(),
            "handle 1: is not ours"
        );
    }

    #[test]
    fn an_fq_ceiling_adds_its_throttling_and_drop_reasons_from_xstats() {
        // tc_fq_qd_stats: throttled at 24, flows_plimit at 32, horizon_drops at 88.
        let mut xstats = vec![0u8; 136];
        for (at, value) in [(24, 55_u64), (32, 2), (88, 10)] {
            xstats[at..at + 8].copy_from_slice(&value.to_ne_bytes());
        }
        let fq = qdisc_counters(&state("fq", 0x4e43_0000, Some(xstats)));
        assert_eq!(
            fq,
            CeilingQdiscCounters {
                dropped: 12,
                overlimits: 340,
                throttled: 55,
                horizon_drops: 10,
                flows_plimit: 2
            }
        );
        // A tbf's xstats (none) or an fq without them: the queue counters alone.
        assert_eq!(qdisc_counters(&state("fq", 0x4e43_0000, None)).throttled, 0);
    }

    #[test]
    fn a_vf_rate_is_no_qdisc_and_edt_is_fq() {
        assert_eq!(root_qdisc(CeilingMechanism::VfMaxTxRate, BitsPerSecond(1)), None);
        assert!(matches!(
            root_qdisc(CeilingMechanism::EdtFq, BitsPerSecond(1)),
            Some(RootQdisc::Fq(Fq { horizon_drop: Some(true), .. }))
        ));
    }
}
