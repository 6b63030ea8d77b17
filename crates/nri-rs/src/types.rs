//! Plain NRI domain types shared by the plugin and runtime sides, and their wire conversions.
//!
//! The generated protobuf types stay private to the library; handlers see these instead.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use super::proto::api;

/// The `LinuxNamespace.type` value of a pod's network namespace.
const NETWORK_NAMESPACE: &str = "network";

/// A pod sandbox as the runtime announces it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSandbox {
    /// CRI sandbox ID.
    pub id: String,
    /// Kubernetes pod UID.
    pub uid: String,
    /// Kubernetes pod name.
    pub name: String,
    /// Kubernetes pod namespace.
    pub namespace: String,
    /// Path of the pod's network namespace (containerd: `/var/run/netns/cni-<uuid>`). `None`
    /// for host-network pods, and in containerd 1.7's `StopPodSandbox` and `RemovePodSandbox`
    /// events, where the runtime no longer sends it: remember it from `RunPodSandbox`.
    pub netns_path: Option<PathBuf>,
    /// Pod labels.
    pub labels: BTreeMap<String, String>,
    /// Pod annotations.
    pub annotations: BTreeMap<String, String>,
    /// Pod IPs (NRI 0.8 and later; empty otherwise).
    pub ips: Vec<String>,
}

impl fmt::Display for PodSandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// A container as the runtime announces it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Container {
    /// Container ID.
    pub id: String,
    /// CRI sandbox ID of the container's pod.
    pub pod_sandbox_id: String,
    /// Container name from the pod spec.
    pub name: String,
}

/// An NRI lifecycle event, with the numbering of the wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Event {
    /// A pod sandbox started (its netns exists and CNI ran).
    RunPodSandbox = 1,
    /// A pod sandbox stopped (before its netns is torn down).
    StopPodSandbox = 2,
    /// A pod sandbox was removed.
    RemovePodSandbox = 3,
    /// A container is about to be created; a plugin may refuse it.
    CreateContainer = 4,
    /// Pod resources are updated (NRI 0.10 and later).
    UpdatePodSandbox = 12,
}

impl Event {
    /// The event's bit in a subscription mask: `1 << (event - 1)`.
    #[must_use]
    pub fn mask_bit(self) -> EventMask {
        EventMask(1 << (self as u32 - 1))
    }
}

/// A set of NRI events, as the `events` field of `ConfigureResponse` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventMask(pub u32);

impl EventMask {
    /// Pod sandbox run, stop and remove: what a pod network driver needs.
    pub const POD_SANDBOX_LIFECYCLE: EventMask = EventMask(0x7);
    /// Bits that runtimes with NRI 0.9 and older accept (events 1 to 11). containerd 1.7,
    /// 2.0 and 2.1 reject a mask with any other bit ("invalid plugin events").
    pub const VALID_BEFORE_NRI_0_10: EventMask = EventMask(0x07FF);
    /// Bits that runtimes with NRI 0.10 and later accept (events 1 to 14).
    pub const VALID_FROM_NRI_0_10: EventMask = EventMask(0x3FFF);

    /// The empty set. Never sent as is: on the wire 0 means "every event".
    pub const EMPTY: EventMask = EventMask(0);

    /// Adds `event` to the set.
    #[must_use]
    pub fn with(self, event: Event) -> Self {
        Self(self.0 | event.mask_bit().0)
    }

    /// Whether `event` is in the set.
    #[must_use]
    pub fn contains(self, event: Event) -> bool {
        self.0 & event.mask_bit().0 != 0
    }

    /// The subset a runtime of `version` accepts (older runtimes reject unknown bits, so they
    /// are dropped rather than sent).
    #[must_use]
    pub fn for_runtime(self, version: &NriVersion) -> Self {
        let valid = if version.at_least(0, 10) {
            Self::VALID_FROM_NRI_0_10
        } else {
            Self::VALID_BEFORE_NRI_0_10
        };
        Self(self.0 & valid.0)
    }
}

/// The NRI version a runtime reports in `ConfigureRequest.NRI_version` (NRI 0.12 and later;
/// older runtimes send nothing, which reads as [`NriVersion::Unknown`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NriVersion {
    /// Not reported: NRI 0.11 or older.
    Unknown,
    /// A parsed `vMAJOR.MINOR[.PATCH...]` version.
    Known {
        /// Major version.
        major: u32,
        /// Minor version.
        minor: u32,
    },
}

impl NriVersion {
    /// Parses `v0.12.0`, `0.12.2-rc.1` and similar; anything else is `Unknown`.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let text = text.trim().trim_start_matches('v');
        let mut parts = text.split(|c: char| !c.is_ascii_digit());
        let major = parts.next().and_then(|p| p.parse().ok());
        let minor = parts.next().and_then(|p| p.parse().ok());
        match (major, minor) {
            (Some(major), Some(minor)) => Self::Known { major, minor },
            _ => Self::Unknown,
        }
    }

    /// Whether the version is known and at least `major.minor`.
    #[must_use]
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        match self {
            Self::Unknown => false,
            Self::Known { major: m, minor: n } => (*m, *n) >= (major, minor),
        }
    }
}

impl fmt::Display for NriVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown => f.write_str("unknown (< 0.12)"),
            Self::Known { major, minor } => write!(f, "v{major}.{minor}"),
        }
    }
}

impl From<&api::PodSandbox> for PodSandbox {
    fn from(pod: &api::PodSandbox) -> Self {
        let netns_path = pod
            .linux
            .as_ref()
            .and_then(|linux| {
                linux
                    .namespaces
                    .iter()
                    .find(|ns| ns.type_ == NETWORK_NAMESPACE && !ns.path.is_empty())
            })
            .map(|ns| PathBuf::from(&ns.path));
        Self {
            id: pod.id.clone(),
            uid: pod.uid.clone(),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            netns_path,
            labels: pod.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            annotations: pod.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            ips: pod.ips.clone(),
        }
    }
}

impl From<&PodSandbox> for api::PodSandbox {
    fn from(pod: &PodSandbox) -> Self {
        let mut wire = api::PodSandbox {
            id: pod.id.clone(),
            uid: pod.uid.clone(),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            labels: pod.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            annotations: pod.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            ips: pod.ips.clone(),
            ..Default::default()
        };
        if let Some(path) = &pod.netns_path {
            let mut linux = api::LinuxPodSandbox::new();
            linux.namespaces.push(api::LinuxNamespace {
                type_: NETWORK_NAMESPACE.to_owned(),
                path: path.to_string_lossy().into_owned(),
                ..Default::default()
            });
            wire.linux = Some(linux).into();
        }
        wire
    }
}

impl From<&api::Container> for Container {
    fn from(c: &api::Container) -> Self {
        Self { id: c.id.clone(), pod_sandbox_id: c.pod_sandbox_id.clone(), name: c.name.clone() }
    }
}

impl From<&Container> for api::Container {
    fn from(c: &Container) -> Self {
        Self {
            id: c.id.clone(),
            pod_sandbox_id: c.pod_sandbox_id.clone(),
            name: c.name.clone(),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_follow_event_numbers() {
        assert_eq!(Event::RunPodSandbox.mask_bit(), EventMask(0x1));
        assert_eq!(Event::RemovePodSandbox.mask_bit(), EventMask(0x4));
        assert_eq!(Event::CreateContainer.mask_bit(), EventMask(0x8));
        assert_eq!(Event::UpdatePodSandbox.mask_bit(), EventMask(0x800));
        let mask = EventMask::POD_SANDBOX_LIFECYCLE.with(Event::CreateContainer);
        assert_eq!(mask, EventMask(0xF));
        assert!(mask.contains(Event::StopPodSandbox));
        assert!(!mask.contains(Event::UpdatePodSandbox));
    }

    #[test]
    fn bits_unknown_to_old_runtimes_are_dropped() {
        let mask = EventMask::POD_SANDBOX_LIFECYCLE.with(Event::UpdatePodSandbox);
        assert_eq!(mask.for_runtime(&NriVersion::Unknown), EventMask(0x7));
        assert_eq!(mask.for_runtime(&NriVersion::parse("v0.8.0")), EventMask(0x7));
        assert_eq!(mask.for_runtime(&NriVersion::parse("v0.12.2")), EventMask(0x807));
        assert_eq!(EventMask(0xFFFF).for_runtime(&NriVersion::Unknown), EventMask(0x7FF));
    }

    #[test]
    fn nri_versions_parse_loosely() {
        assert_eq!(NriVersion::parse(""), NriVersion::Unknown);
        assert_eq!(NriVersion::parse("garbage"), NriVersion::Unknown);
        assert_eq!(NriVersion::parse("v0.12.2-rc.1"), NriVersion::Known { major: 0, minor: 12 });
        assert!(NriVersion::parse("1.0").at_least(0, 12));
        assert!(!NriVersion::parse("v0.11.0").at_least(0, 12));
    }

    #[test]
    fn pod_sandbox_round_trips_through_the_wire_type() {
        let pod = PodSandbox {
            id: "sb1".into(),
            uid: "u1".into(),
            name: "p".into(),
            namespace: "ns".into(),
            netns_path: Some("/var/run/netns/cni-1".into()),
            labels: BTreeMap::from([("a".into(), "b".into())]),
            annotations: BTreeMap::new(),
            ips: vec!["10.0.0.2".into()],
        };
        let wire = api::PodSandbox::from(&pod);
        assert_eq!(PodSandbox::from(&wire), pod);
    }

    #[test]
    fn netns_path_comes_from_the_network_namespace_entry_only() {
        let mut wire = api::PodSandbox::new();
        let mut linux = api::LinuxPodSandbox::new();
        for (t, p) in [("ipc", "/proc/1/ns/ipc"), ("network", "/var/run/netns/x")] {
            linux.namespaces.push(api::LinuxNamespace {
                type_: t.into(),
                path: p.into(),
                ..Default::default()
            });
        }
        wire.linux = Some(linux).into();
        assert_eq!(PodSandbox::from(&wire).netns_path, Some(PathBuf::from("/var/run/netns/x")));
        assert_eq!(PodSandbox::from(&api::PodSandbox::new()).netns_path, None);
    }
}
