//! `rdma` of a `NetworkConfig` (DESIGN §3): what the pod gets of the allocated netdev's RDMA
//! function, resolved at prepare against the device and the node's RDMA netns mode, so that a
//! claim the kernel would refuse never reaches the sandbox.
//!
//! The kernel facts the rules rest on (drivers/infiniband/core, 6.1 and 6.12):
//! - In *exclusive* netns mode (`ib_core.netns_mode=0`, `rdma system set netns exclusive`) an
//!   RDMA device belongs to one network namespace: `ib_uverbs_open` refuses a process of
//!   another netns with `EPERM` (`rdma_dev_access_netns`). A pod can use it only once it was
//!   moved there (`RDMA_NLDEV_CMD_SET` with `RDMA_NLDEV_NET_NS_FD`), and an RDMA device left in
//!   the host netns (the parent of a macvlan child) is of no use to a pod.
//! - In *shared* mode every netns sees every RDMA device and the kernel refuses a move
//!   (`ib_device_set_netns_put` answers `EOPNOTSUPP` while `ib_devices_shared_netns`).
//! - A move needs the driver's `disassociate_ucontext` (every user context is reset on the
//!   move); without it the kernel answers `EOPNOTSUPP`. The software drivers `rdma_rxe`
//!   (soft-RoCE, until a 2026 patch) and `siw` (soft-iWARP) lack it, and a software device is
//!   what discovery reports without a bus device behind it ([`RdmaFacts::is_software`]).
//!   There is no harmless probe: the only question the kernel answers is the move itself,
//!   and a "move" into the caller's own netns is not refused for a driver that supports moves
//!   (`rdma_dev_change_netns` disables and re-enables the device, resetting every user), so
//!   the refusal comes from what the device is, not from asking.
//! - When a netns is destroyed, the kernel moves the RDMA devices it holds back to the initial
//!   netns (`rdma_dev_exit_net`), as it does with physical netdevs (`default_device_exit`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::model::rdma::{RdmaFacts, RdmaNetnsMode};

/// `rdma` as written in a config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RdmaConfig {
    /// The RDMA device moves into the pod netns with its netdev (node in exclusive mode).
    Exclusive,
    /// The RDMA device stays where it is; its character devices are injected (node in shared
    /// mode, or the "RDMA shared device" pattern of macvlan children on an RDMA parent).
    Shared,
    /// No RDMA character devices, no move.
    #[serde(rename = "none")]
    Disabled,
}

impl RdmaConfig {
    /// The config spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Shared => "shared",
            Self::Disabled => "none",
        }
    }
}

/// How the pod gets the RDMA device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RdmaMode {
    /// Moved into the pod netns with its netdev, back at detach.
    Exclusive,
    /// Left where it is.
    Shared,
}

impl RdmaMode {
    /// The config spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Shared => "shared",
        }
    }
}

/// The resolved `rdma` of a device that has an RDMA function and does not turn it off.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedRdma {
    /// Moved or left.
    pub mode: RdmaMode,
    /// The RDMA device's name.
    pub device: String,
    /// The character devices injected into the pod's containers (CDI `deviceNodes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub char_devices: Vec<PathBuf>,
}

/// Why an `rdma` value was refused; each names the fact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdmaRefusal {
    /// The device has no RDMA function.
    #[error("{device} has no RDMA function")]
    NoRdmaFunction {
        /// The netdev.
        device: String,
    },
    /// A shared device (macvlan/ipvlan parent) keeps its RDMA device on the host: the
    /// "RDMA shared device" pattern.
    #[error(
        "{device} is a shared parent: its RDMA device {rdma} stays on the host for every child \
         (use shared or none)"
    )]
    SharedParent {
        /// The parent netdev.
        device: String,
        /// Its RDMA device.
        rdma: String,
    },
    /// The node's RDMA netns mode does not allow this value.
    #[error("the node's RDMA netns mode is {mode}: {why}")]
    NetnsMode {
        /// The node's mode.
        mode: &'static str,
        /// What that means for the value.
        why: &'static str,
    },
    /// The RDMA device is a software one, which cannot change network namespace.
    #[error(
        "RDMA device {rdma} is a software device (rdma_rxe or siw), which cannot change network \
         namespace: the driver has no disassociate_ucontext and the kernel answers EOPNOTSUPP"
    )]
    SoftwareDevice {
        /// The RDMA device.
        rdma: String,
    },
}

/// The `rdma` a device gets: `asked` (the merged config's value) checked against its RDMA
/// function `facts` (`None`: it has none; a netns mode discovery could not read is the
/// kernel's default, shared), whether the netdev moves into the pod (`moves`:
/// exclusive, not a child on a shared parent) and the netdev's name. The default is the
/// value that works: `exclusive` on a node in exclusive mode when the netdev moves and its
/// driver can move the RDMA device, `shared` on a node in shared mode, else nothing (an RDMA
/// device a pod cannot use is not offered, and a claim that names no `rdma` never fails for
/// it).
pub(super) fn resolve(
    asked: Option<RdmaConfig>,
    facts: Option<&RdmaFacts>,
    moves: bool,
    if_name: &str,
) -> Result<Option<ResolvedRdma>, RdmaRefusal> {
    let Some(facts) = facts else {
        return match asked {
            None | Some(RdmaConfig::Disabled) => Ok(None),
            Some(_) => Err(RdmaRefusal::NoRdmaFunction { device: if_name.to_owned() }),
        };
    };
    // Unread (discovery could not ask the kernel): the kernel's default.
    let netns_mode = facts.netns_mode.unwrap_or(RdmaNetnsMode::Shared);
    let resolved = |mode| {
        Some(ResolvedRdma {
            mode,
            device: facts.device.clone(),
            char_devices: facts.char_devices.clone(),
        })
    };
    let exclusive_check = || -> Result<(), RdmaRefusal> {
        if !moves {
            return Err(RdmaRefusal::SharedParent {
                device: if_name.to_owned(),
                rdma: facts.device.clone(),
            });
        }
        if netns_mode == RdmaNetnsMode::Shared {
            return Err(RdmaRefusal::NetnsMode {
                mode: RdmaNetnsMode::Shared.as_str(),
                why: "every netns sees every RDMA device and the kernel refuses moves \
                      (use shared)",
            });
        }
        if facts.is_software() {
            return Err(RdmaRefusal::SoftwareDevice { rdma: facts.device.clone() });
        }
        Ok(())
    };
    match asked {
        Some(RdmaConfig::Disabled) => Ok(None),
        Some(RdmaConfig::Exclusive) => {
            exclusive_check()?;
            Ok(resolved(RdmaMode::Exclusive))
        }
        Some(RdmaConfig::Shared) => match netns_mode {
            RdmaNetnsMode::Shared => Ok(resolved(RdmaMode::Shared)),
            RdmaNetnsMode::Exclusive => Err(RdmaRefusal::NetnsMode {
                mode: RdmaNetnsMode::Exclusive.as_str(),
                why: "an RDMA device left in the host netns cannot be opened from the pod's \
                      (the kernel answers EPERM)",
            }),
        },
        None => match netns_mode {
            RdmaNetnsMode::Shared => Ok(resolved(RdmaMode::Shared)),
            RdmaNetnsMode::Exclusive if exclusive_check().is_ok() => {
                Ok(resolved(RdmaMode::Exclusive))
            }
            RdmaNetnsMode::Exclusive => Ok(None),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use RdmaNetnsMode::{Exclusive as NodeExclusive, Shared as NodeShared};

    use super::*;
    use crate::model::device::PciAddress;

    /// An RDMA function on the node in `mode`; `hardware`: a PCI function behind it (else a
    /// software device, as rxe).
    fn facts(mode: RdmaNetnsMode, hardware: bool) -> RdmaFacts {
        let mut facts = RdmaFacts::new(if hardware { "mlx5_0" } else { "rxe0" }, 1);
        facts.netns_mode = Some(mode);
        facts.pci_address = hardware.then(|| "0000:3b:00.1".parse::<PciAddress>().unwrap());
        facts.char_devices =
            vec!["/dev/infiniband/uverbs0".into(), "/dev/infiniband/rdma_cm".into()];
        facts
    }

    fn mode(result: Result<Option<ResolvedRdma>, RdmaRefusal>) -> Option<RdmaMode> {
        result.unwrap().map(|r| r.mode)
    }

    #[test]
    fn the_default_is_the_value_that_works() {
        let mlx = facts(NodeExclusive, true);
        assert_eq!(mode(resolve(None, Some(&mlx), true, "eth1")), Some(RdmaMode::Exclusive));
        // A child on an RDMA parent in exclusive mode: the pod could not open it.
        assert_eq!(mode(resolve(None, Some(&mlx), false, "eth1")), None);
        let rxe = facts(NodeExclusive, false);
        assert_eq!(mode(resolve(None, Some(&rxe), true, "eth1")), None);
        let shared = facts(NodeShared, false);
        assert_eq!(mode(resolve(None, Some(&shared), true, "eth1")), Some(RdmaMode::Shared));
        assert_eq!(mode(resolve(None, Some(&shared), false, "eth1")), Some(RdmaMode::Shared));
        assert_eq!(mode(resolve(None, None, true, "eth1")), None);
        assert_eq!(mode(resolve(Some(RdmaConfig::Disabled), Some(&mlx), true, "eth1")), None);
        let mut unread = facts(NodeExclusive, true);
        unread.netns_mode = None;
        assert_eq!(mode(resolve(None, Some(&unread), true, "eth1")), Some(RdmaMode::Shared));
    }

    #[test]
    fn the_resolved_value_carries_the_device_and_its_char_devices() {
        let mlx = facts(NodeExclusive, true);
        let resolved = resolve(Some(RdmaConfig::Exclusive), Some(&mlx), true, "eth1").unwrap();
        assert_eq!(
            resolved,
            Some(ResolvedRdma {
                mode: RdmaMode::Exclusive,
                device: "mlx5_0".to_owned(),
                char_devices: mlx.char_devices.clone(),
            })
        );
    }

    #[test]
    fn each_refusal_names_its_fact() {
        let text = |asked, facts: Option<&RdmaFacts>, moves| {
            resolve(Some(asked), facts, moves, "eth1").unwrap_err().to_string()
        };
        let without = text(RdmaConfig::Shared, None, true);
        assert!(without.contains("eth1 has no RDMA function"), "{without}");
        let exclusive = text(RdmaConfig::Exclusive, None, true);
        assert!(exclusive.contains("eth1 has no RDMA function"), "{exclusive}");
        let mlx = facts(NodeExclusive, true);
        let parent = text(RdmaConfig::Exclusive, Some(&mlx), false);
        assert!(parent.contains("shared parent") && parent.contains("mlx5_0"), "{parent}");
        let node = text(RdmaConfig::Exclusive, Some(&facts(NodeShared, true)), true);
        assert!(node.contains("netns mode is shared"), "{node}");
        let rxe = text(RdmaConfig::Exclusive, Some(&facts(NodeExclusive, false)), true);
        assert!(rxe.contains("rxe0 is a software device") && rxe.contains("EOPNOTSUPP"), "{rxe}");
        let left = text(RdmaConfig::Shared, Some(&mlx), true);
        assert!(left.contains("netns mode is exclusive") && left.contains("EPERM"), "{left}");
    }

    /// Through the whole validation: the error names `rdma`, the value and the fact, and the
    /// resolved config carries the RDMA device.
    #[test]
    fn validation_names_the_field_and_resolves_the_device() {
        use crate::model::network_config::{NetworkConfig, NodeSupport, Rule};
        use crate::testing::facts::{FactsBuilder as _, physical_nic};
        let support = NodeSupport::everything();
        let config = |rdma: &str| -> NetworkConfig {
            serde_json::from_value(serde_json::json!({"rdma": rdma})).unwrap()
        };
        let rxe = physical_nic("eth1").rdma(facts(NodeExclusive, false));
        let err = config("exclusive").validate(&rxe, &support).unwrap_err();
        assert_eq!(err.path(), "rdma");
        assert_eq!(err.value(), "\"exclusive\"");
        assert!(matches!(err.rule(), Some(Rule::Rdma(RdmaRefusal::SoftwareDevice { .. }))));
        let text = err.to_string();
        assert!(text.starts_with("rdma: \"exclusive\": RDMA device rxe0"), "{text}");
        let parent = physical_nic("eth1").shared().rdma(facts(NodeShared, true));
        let err = config("exclusive").validate(&parent, &support).unwrap_err();
        assert!(err.to_string().contains("eth1 is a shared parent"), "{err}");
        let resolved = config("shared").validate(&parent, &support).unwrap();
        assert_eq!(
            resolved.rdma.map(|r| (r.mode, r.device)),
            Some((RdmaMode::Shared, "mlx5_0".to_owned()))
        );
        let plain = physical_nic("eth1");
        let err = config("shared").validate(&plain, &support).unwrap_err();
        assert!(err.to_string().contains("eth1 has no RDMA function"), "{err}");
        let none = config("none").validate(&plain, &support).unwrap();
        assert_eq!(none.rdma, None);
        let unknown =
            serde_json::from_value::<NetworkConfig>(serde_json::json!({"rdma": "always"}));
        assert!(unknown.is_err());
    }

    #[test]
    fn the_config_spelling_round_trips() {
        for value in [RdmaConfig::Exclusive, RdmaConfig::Shared, RdmaConfig::Disabled] {
            let json = serde_json::to_string(&value).unwrap();
            assert_eq!(json, format!("\"{}\"", value.as_str()));
            assert_eq!(serde_json::from_str::<RdmaConfig>(&json).unwrap(), value);
        }
    }
}
