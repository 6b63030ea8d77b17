//! Egress ceilings of pod interfaces, put in place at the `CreateContainer` gate (DESIGN §3
//! `bandwidth`, issue 35): the pod's first container waits until every attached interface
//! whose claim resolved a ceiling (`ResolvedBandwidth::ceiling`) is held to it, so nothing of
//! the pod sends unshaped, and the sandbox's attach stays as fast as before (a qdisc, and for
//! EDT a verifier pass, cost milliseconds).
//!
//! How (the [`CeilingMechanism`] is chosen here from the mode and what the node offers):
//! - macvlan, ipvlan, host-device: `edt-fq` where the kernel has `sch_fq` and the eBPF
//!   program can pace (it stamps each packet's departure time from the rate; `fq` holds the
//!   packet until then), else `tbf` (one token bucket: a single ceiling needs no classes; see
//!   the notes of decision 0021 for why not htb);
//! - sriov-vf: the VF's hardware `max_tx_rate`, set through the PF with the other VF settings
//!   before the move (`claims::vf_settings`), nothing to do here.
//!
//! The kernel work is behind [`CeilingPort`] (`host::qdisc_ceiling` in the node). What was
//! put in place is remembered per pod so later containers pass without a netlink call; a
//! failure refuses the container with the interface and the cause, after taking back what
//! this gate put on the pod's other interfaces (the kubelet retries the container).
//!
//! Removal needs nothing of its own: a deleted child link takes its qdisc with it, and the
//! kernel drops the qdiscs of a device that changes network namespace (a NIC or VF returning
//! to the host comes back with its default qdisc; `host::qdisc`).

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde::Serialize;

use super::shared::AttachService;
use super::{
    AttachmentState, AttachmentStore, NetnsPort, PodAttachment, PodClaimSource, StatusSink, lock,
};
use crate::claims::PreparedClaim;
use crate::model::bandwidth::{BitsPerSecond, CeilingSource, IngressPolicy};
use crate::model::cause::Cause;
use crate::model::network_config::Mode;

/// How an interface is held to its ceiling (`data.bandwidth.mechanism`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum CeilingMechanism {
    /// Earliest Departure Time: the interface's eBPF program stamps each packet's departure
    /// time from the rate, an `fq` root qdisc holds it until then.
    #[serde(rename = "edt-fq")]
    EdtFq,
    /// A `tbf` root qdisc (token bucket).
    #[serde(rename = "tbf")]
    Tbf,
    /// An `htb` root qdisc with one class (kept for nodes that prefer it; not chosen today).
    #[serde(rename = "htb")]
    Htb,
    /// The VF's hardware transmit rate limit, set through its PF.
    #[serde(rename = "vf-max-tx-rate")]
    VfMaxTxRate,
}

impl CeilingMechanism {
    /// The name in the claim status and logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            CeilingMechanism::EdtFq => "edt-fq",
            CeilingMechanism::Tbf => "tbf",
            CeilingMechanism::Htb => "htb",
            CeilingMechanism::VfMaxTxRate => "vf-max-tx-rate",
        }
    }
}

impl std::fmt::Display for CeilingMechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the node offers for ceilings, learnt at start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CeilingSupport {
    /// The kernel has `sch_fq` (the start-up probe created one).
    pub fq: bool,
    /// The eBPF programs can pace egress (EDT stamps) and police ingress.
    pub pacing: bool,
}

/// The mechanism for an interface of `mode` on a node offering `support`.
#[must_use]
pub fn mechanism(mode: Mode, support: CeilingSupport) -> CeilingMechanism {
    match mode {
        Mode::SriovVf => CeilingMechanism::VfMaxTxRate,
        _ if support.fq && support.pacing => CeilingMechanism::EdtFq,
        _ => CeilingMechanism::Tbf,
    }
}

/// One pod interface's ceiling, as the gate asks the kernel for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InterfaceCeiling {
    /// The pod-side interface name.
    pub interface: String,
    /// The egress rate.
    pub rate: BitsPerSecond,
    /// How.
    pub mechanism: CeilingMechanism,
    /// Whether ingress is policed at the same rate.
    pub ingress: IngressPolicy,
}

/// `data.bandwidth` of a Ready status entry (DESIGN §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BandwidthData {
    /// The egress ceiling (a quantity of bits per second, `500M`).
    pub ceiling: BitsPerSecond,
    /// Where it comes from (`consumedCapacity` or `bandwidth.limit`).
    pub source: &'static str,
    /// How it is enforced.
    pub mechanism: CeilingMechanism,
    /// `none` or `police`.
    pub ingress: IngressPolicy,
}

/// `data.bandwidth` of a device of `mode` whose config resolved `bandwidth`; `None` without a
/// ceiling.
#[must_use]
pub fn bandwidth_data(
    config: &crate::model::network_config::ResolvedNetworkConfig,
    support: CeilingSupport,
) -> Option<BandwidthData> {
    let bandwidth = config.bandwidth.as_ref()?;
    let ceiling = bandwidth.ceiling?;
    Some(BandwidthData {
        ceiling: ceiling.rate,
        source: source_name(ceiling.source),
        mechanism: mechanism(config.mode.mode(), support),
        ingress: bandwidth.ingress,
    })
}

fn source_name(source: CeilingSource) -> &'static str {
    source.as_str()
}

/// The key of `data.bandwidth` in a status entry.
pub const BANDWIDTH_FIELD: &str = "bandwidth";

/// Sets `data.bandwidth` on the Ready entries of `entries` named in `data` (entries without a
/// `data` object, failed ones, are left alone).
pub(super) fn annotate(
    entries: &mut [AllocatedDeviceStatus],
    data: &[(super::status::DeviceKey, BandwidthData)],
) {
    for (key, bandwidth) in data {
        let entry = entries.iter_mut().find(|e| {
            e.driver == key.driver
                && e.pool == key.pool
                && e.device == key.device
                && e.share_id == key.share_id
        });
        if let Some(entry) = entry
            && let Some(RawExtension(serde_json::Value::Object(fields))) = entry.data.as_mut()
            && let Ok(value) = serde_json::to_value(bandwidth)
        {
            fields.insert(BANDWIDTH_FIELD.to_owned(), value);
        }
    }
}

/// The ceilings the gate must put on `record`'s attached interfaces: one per device whose
/// claim (in `claims`) resolved a ceiling, in the record's order. VFs are left out: their
/// rate was set on the PF before the move.
#[must_use]
pub fn ceilings_of(
    record: &PodAttachment,
    claims: &[PreparedClaim],
    support: CeilingSupport,
) -> Vec<InterfaceCeiling> {
    record
        .devices
        .iter()
        .filter(|d| d.result.is_some())
        .filter_map(|d| {
            let prepared = claims
                .iter()
                .find(|c| c.uid == d.claim_uid)?
                .devices
                .iter()
                .find(|p| p.request == d.request)?;
            let data = bandwidth_data(&prepared.config, support)?;
            (data.mechanism != CeilingMechanism::VfMaxTxRate).then(|| InterfaceCeiling {
                interface: d.plan.interface_name.clone(),
                rate: data.ceiling,
                mechanism: data.mechanism,
                ingress: data.ingress,
            })
        })
        .collect()
}

/// Why a ceiling could not be put in place.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CeilingError {
    /// The kernel refused the qdisc (or the pacing) of one interface.
    #[error("bandwidth ceiling {rate} bit/s ({mechanism}) on {interface}: {source}")]
    Kernel {
        /// The pod interface.
        interface: String,
        /// The ceiling.
        rate: BitsPerSecond,
        /// How it was to be enforced.
        mechanism: CeilingMechanism,
        /// The adapter's error (errno inside).
        #[source]
        source: Cause,
    },
    /// `bandwidth.ingress: police` on a node whose eBPF programs are not available (no BPF
    /// file system for them, or the kernel refused them at start: the daemon's log says which).
    #[error(
        "bandwidth.ingress: police on {interface}: this node cannot police ingress (its eBPF \
         programs are not available: no BPF file system at --bpffs, or the kernel refused them; \
         see the daemon's log at start); leave bandwidth.ingress out on this node"
    )]
    NoPolicing {
        /// The pod interface.
        interface: String,
    },
    /// The daemon was started without a way to enforce ceilings (never in the node daemon).
    #[error(
        "bandwidth ceiling {rate} bit/s on {interface}: this daemon has no ceiling enforcement"
    )]
    NotWired {
        /// The pod interface.
        interface: String,
        /// The ceiling.
        rate: BitsPerSecond,
    },
}

/// A boxed future of the ceiling port (the port is held as a trait object).
pub type CeilingFuture<'a> = Pin<Box<dyn Future<Output = Result<(), Cause>> + Send + 'a>>;

/// The kernel side of ceilings: puts one interface's ceiling in place, or takes it back.
pub trait CeilingPort: Send + Sync + 'static {
    /// Holds `ceiling.interface` in the netns at `netns` (of pod `pod_uid`) to the ceiling;
    /// a failure leaves the interface as it was. Idempotent.
    fn apply<'a>(
        &'a self,
        netns: &'a Path,
        pod_uid: &'a str,
        ceiling: &'a InterfaceCeiling,
    ) -> CeilingFuture<'a>;
    /// Takes back what [`CeilingPort::apply`] put on the interface (a rollback).
    fn remove<'a>(
        &'a self,
        netns: &'a Path,
        pod_uid: &'a str,
        ceiling: &'a InterfaceCeiling,
    ) -> CeilingFuture<'a>;
}

/// The service's ceiling state (kept in `shared::Inner`).
#[derive(Default)]
pub(super) struct CeilingState {
    /// The kernel port; `None` until the node wires it.
    pub(super) port: Option<Arc<dyn CeilingPort>>,
    /// What the node offers.
    pub(super) support: CeilingSupport,
    /// What the gate put in place, by pod UID: the netns and the ceilings.
    enforced: HashMap<String, (PathBuf, Vec<InterfaceCeiling>)>,
}

impl<C: PodClaimSource, N: NetnsPort, S: AttachmentStore, W: StatusSink> AttachService<C, N, S, W> {
    /// Enforces bandwidth ceilings through `port` on a node offering `support`.
    #[must_use]
    pub fn with_ceilings(self, port: Arc<dyn CeilingPort>, support: CeilingSupport) -> Self {
        {
            let mut inner = lock(&self.inner);
            inner.ceilings.port = Some(port);
            inner.ceilings.support = support;
        }
        self
    }

    /// The `CreateContainer` gate's ceilings: every attached interface of pod `uid` whose
    /// claim (of `claims`) resolved a ceiling is held to it before the container may start.
    /// Holds the pod's gate, so no attach, stop or detach of the pod runs meanwhile.
    pub(super) async fn enforce_ceilings(
        &self,
        uid: &str,
        claims: &[PreparedClaim],
    ) -> Result<(), CeilingError> {
        let _held = self.gates.hold(uid).await;
        let (netns, wanted, port, support) = {
            let mut inner = lock(&self.inner);
            let record =
                inner.pods.get(uid).filter(|r| r.state == AttachmentState::Attached).cloned();
            // Pods gone since: forget what was enforced for them (their links are gone).
            let live: std::collections::HashSet<String> = inner
                .pods
                .iter()
                .filter(|(_, r)| r.state == AttachmentState::Attached)
                .map(|(uid, _)| uid.clone())
                .collect();
            inner.ceilings.enforced.retain(|uid, _| live.contains(uid));
            let Some(record) = record else { return Ok(()) };
            let wanted = ceilings_of(&record, claims, inner.ceilings.support);
            let done = inner.ceilings.enforced.get(uid);
            if wanted.is_empty()
                || done
                    .is_some_and(|(netns, ceilings)| *netns == record.netns && *ceilings == wanted)
            {
                return Ok(());
            }
            (record.netns, wanted, inner.ceilings.port.clone(), inner.ceilings.support)
        };
        // Before any kernel work: nothing of this gate is put in place for a pod that
        // cannot get all of it.
        if let Some(police) = wanted.iter().find(|c| c.ingress == IngressPolicy::Police)
            && !support.pacing
        {
            return Err(CeilingError::NoPolicing { interface: police.interface.clone() });
        }
        let Some(port) = port else {
            let first = &wanted[0];
            return Err(CeilingError::NotWired {
                interface: first.interface.clone(),
                rate: first.rate,
            });
        };
        for (index, ceiling) in wanted.iter().enumerate() {
            if let Err(source) = port.apply(&netns, uid, ceiling).await {
                // Nothing of this gate stays: the kubelet retries the container from scratch.
                for done in wanted[..index].iter().rev() {
                    if let Err(err) = port.remove(&netns, uid, done).await {
                        tracing::warn!(pod = %uid, interface = %done.interface, %err,
                            "taking back a bandwidth ceiling after a later one failed");
                    }
                }
                return Err(CeilingError::Kernel {
                    interface: ceiling.interface.clone(),
                    rate: ceiling.rate,
                    mechanism: ceiling.mechanism,
                    source,
                });
            }
            tracing::debug!(pod = %uid, interface = %ceiling.interface, rate = %ceiling.rate,
                mechanism = %ceiling.mechanism, "bandwidth ceiling in place");
        }
        lock(&self.inner).ceilings.enforced.insert(uid.to_owned(), (netns, wanted));
        Ok(())
    }
}
