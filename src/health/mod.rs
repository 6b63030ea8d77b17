//! Device health (KEP-4680, DESIGN §5 item 8): whether each published device works, from
//! what is known about its link, with a message naming the interface and what is wrong.
//!
//! [`assess`] is the pure mapping (link facts → Healthy / Unhealthy / Unknown and the
//! message); [`monitor`] keeps the node's [`HealthReport`] current from the published devices,
//! the host's interfaces and, for NICs moved into pods, a link watch inside each pod's netns
//! (through its port [`PodLinkSource`]). The kubelet adapter streams the report to kubelet.

pub mod monitor;
mod ports;

pub use monitor::{LinkReporter, MonitorInputs, MonitorSettings, MovedNic, run};
pub use ports::PodLinkSource;

use crate::model::device::{Device, DeviceKind, HostInterface, OperState};

/// A device's health as kubelet's health API knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthStatus {
    /// Its state cannot be read (kubelet shows the same when reports stop).
    Unknown,
    /// The link is up with a carrier.
    Healthy,
    /// Down, without carrier, or gone.
    Unhealthy,
}

/// One device of the pool and its health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    /// Device name as published.
    pub device: String,
    /// The verdict.
    pub status: HealthStatus,
    /// Why, naming the interface (shown to users in the pod status).
    pub message: String,
}

/// The health of every device of this node's pool, sorted by device name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthReport {
    /// The pool (the node name).
    pub pool: String,
    /// Every published device (and, for a while, devices whose interface was removed).
    pub devices: Vec<DeviceHealth>,
}

/// What the kernel says about a link's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkFacts {
    /// `IFF_UP`.
    pub admin_up: Option<bool>,
    /// `IFF_LOWER_UP`.
    pub lower_up: Option<bool>,
    /// `IFLA_OPERSTATE`.
    pub oper_state: OperState,
    /// `IFLA_CARRIER`.
    pub carrier: Option<bool>,
}

impl LinkFacts {
    /// The state facts of a discovered interface.
    #[must_use]
    pub fn of(interface: &HostInterface) -> Self {
        Self {
            admin_up: interface.admin_up,
            lower_up: interface.lower_up,
            oper_state: interface.oper_state,
            carrier: interface.carrier,
        }
    }
}

/// What a watch of one link last saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkObservation {
    /// The link exists in the watched netns, in this state.
    Present(LinkFacts),
    /// The link does not exist in the watched netns.
    Absent,
    /// The state could not be read; the text says why.
    Unreadable(String),
}

/// Where a device's interface is while it is assessed (for the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement<'a> {
    /// In the host netns under its host name.
    Host,
    /// Moved into a pod: the pod (`namespace/name`) and the interface's name there.
    Pod {
        /// `namespace/name` of the pod.
        pod: &'a str,
        /// The interface's name inside the pod.
        if_name: &'a str,
    },
}

/// The health of `device` given what was observed of its interface.
///
/// Unhealthy: administratively down (`IFF_UP` off), no carrier (`IFF_LOWER_UP` or
/// `IFLA_CARRIER` off, or operstate down / lowerlayerdown / notpresent), not operational
/// (dormant, testing), or gone. Healthy: up with a carrier (operstate up, or unknown as
/// drivers without operstate support report it, with `IFF_LOWER_UP` set). Unknown: the state
/// could not be read, or the kernel reported neither flags nor an operstate.
#[must_use]
pub fn assess(
    device: &Device,
    placement: Placement<'_>,
    observation: &LinkObservation,
) -> DeviceHealth {
    let subject = match placement {
        Placement::Host => device.if_name.clone(),
        Placement::Pod { pod, if_name } => {
            format!("{} ({if_name} in pod {pod})", device.if_name)
        }
    };
    let (status, message) = match observation {
        LinkObservation::Unreadable(reason) => {
            (HealthStatus::Unknown, format!("cannot read the state of {subject}: {reason}"))
        }
        LinkObservation::Absent if device.kind == DeviceKind::SriovVf => (
            HealthStatus::Unhealthy,
            format!("VF {subject} is gone: its PF or driver removed the interface"),
        ),
        LinkObservation::Absent => {
            (HealthStatus::Unhealthy, format!("{subject} was removed: the interface is gone"))
        }
        LinkObservation::Present(facts) => link_health(&subject, *facts),
    };
    DeviceHealth { device: device.name.clone(), status, message }
}

fn link_health(subject: &str, facts: LinkFacts) -> (HealthStatus, String) {
    let state = facts.oper_state.as_str();
    let unhealthy = |what: String| (HealthStatus::Unhealthy, what);
    if facts.admin_up == Some(false) {
        return unhealthy(format!("{subject} is administratively down (operstate {state})"));
    }
    if facts.lower_up == Some(false) || facts.carrier == Some(false) {
        return unhealthy(format!("{subject} has no carrier (operstate {state})"));
    }
    match facts.oper_state {
        OperState::Down | OperState::LowerLayerDown | OperState::NotPresent => {
            unhealthy(format!("{subject} has no carrier (operstate {state})"))
        }
        OperState::Dormant | OperState::Testing => {
            unhealthy(format!("{subject} is not operational (operstate {state})"))
        }
        OperState::Up => (HealthStatus::Healthy, format!("{subject} is up with carrier")),
        // Drivers without operstate support (dummy, some virtual NICs) report unknown; the
        // lower-up flag still says whether the link works.
        OperState::Unknown if facts.lower_up == Some(true) || facts.carrier == Some(true) => {
            (HealthStatus::Healthy, format!("{subject} is up with carrier (operstate unknown)"))
        }
        OperState::Unknown => (
            HealthStatus::Unknown,
            format!("the kernel reports no carrier or operstate for {subject}"),
        ),
    }
}

#[cfg(test)]
mod tests;
