//! `claims::ethtool::EthtoolPort` over the kernel's ethtool generic netlink family
//! (`ethtool-genl`): features by their `ETH_SS_FEATURES` names, ring sizes and channel counts.
//!
//! A netlink socket acts on the network namespace it was created in, so each call opens its
//! socket on a thread in the right one: a blocking-pool thread of the daemon (the host netns,
//! where an exclusive device is at prepare and again at unprepare), or, for a namespace given
//! by path (tests, a daemon run in a netns of its own), a thread that entered it
//! (`host::netns::run_in`). A socket per call costs one `CTRL_CMD_GETFAMILY`; prepares that
//! set ethtool values are rare, and no socket then stays bound to a namespace that may go.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ethtool_genl::{ChannelCounts, Client, Error as GenlError, RingSizes};
use futures::FutureExt as _;
use futures::future::BoxFuture;

use crate::claims::ethtool::{EthtoolPort, EthtoolPortError, FeatureState, Limited};
use crate::model::network_config::{EthtoolChannels, EthtoolRings};

/// The kernel's id of the running boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// ethtool settings through a netlink socket in the daemon's netns, or in the netns at a
/// path.
#[derive(Debug, Clone, Default)]
pub struct NetlinkEthtool {
    netns: Option<PathBuf>,
    boot_id: Option<PathBuf>,
}

impl NetlinkEthtool {
    /// In the daemon's own network namespace (the host netns on a node).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// In the network namespace at `netns` (a bind-mounted netns file), with the boot id read
    /// from `boot_id` when given (tests simulate a reboot with another file).
    #[must_use]
    pub fn in_netns(netns: impl Into<PathBuf>, boot_id: Option<PathBuf>) -> Self {
        Self { netns: Some(netns.into()), boot_id }
    }

    /// Runs `job` with a client in the right namespace, on a blocking thread.
    fn call<T: Send + 'static>(
        &self,
        op: String,
        job: impl FnOnce(&mut Client) -> Result<T, GenlError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, EthtoolPortError>> {
        let netns = self.netns.clone();
        async move {
            let run = move || Client::open().and_then(|mut client| job(&mut client));
            let joined = tokio::task::spawn_blocking(move || match netns {
                None => Ok(run()),
                Some(path) => crate::host::netns::run_in(&path, run).map_err(|e| e.to_string()),
            })
            .await;
            match joined {
                Ok(Ok(Ok(value))) => Ok(value),
                Ok(Ok(Err(err))) => Err(port_error(&op, &err)),
                Ok(Err(message)) => Err(EthtoolPortError { op, errno: None, message }),
                Err(join) => Err(EthtoolPortError { op, errno: None, message: join.to_string() }),
            }
        }
        .boxed()
    }
}

fn port_error(op: &str, err: &GenlError) -> EthtoolPortError {
    EthtoolPortError { op: op.to_owned(), errno: err.errno(), message: err.to_string() }
}

fn rings(sizes: RingSizes) -> EthtoolRings {
    EthtoolRings { rx: sizes.rx, tx: sizes.tx, rx_mini: sizes.rx_mini, rx_jumbo: sizes.rx_jumbo }
}

fn channels(counts: ChannelCounts) -> EthtoolChannels {
    EthtoolChannels { rx: counts.rx, tx: counts.tx, other: counts.other, combined: counts.combined }
}

impl EthtoolPort for NetlinkEthtool {
    fn features<'a>(
        &'a self,
        dev: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, FeatureState>, EthtoolPortError>> {
        let owned = dev.to_owned();
        self.call(format!("ETHTOOL_MSG_FEATURES_GET {dev}"), move |client| {
            let features = client.features(&owned)?;
            Ok(features
                .names()
                .filter_map(|name| {
                    let f = features.get(name)?;
                    let state = FeatureState {
                        active: f.active,
                        wanted: f.wanted,
                        changeable: f.changeable,
                    };
                    Some((name.to_owned(), state))
                })
                .collect())
        })
    }

    fn set_features<'a>(
        &'a self,
        dev: &'a str,
        changes: &'a [(String, bool)],
    ) -> BoxFuture<'a, Result<(), EthtoolPortError>> {
        let (owned, changes) = (dev.to_owned(), changes.to_vec());
        self.call(format!("ETHTOOL_MSG_FEATURES_SET {dev}"), move |client| {
            client.set_features(&owned, &changes)
        })
    }

    fn rings<'a>(
        &'a self,
        dev: &'a str,
    ) -> BoxFuture<'a, Result<Limited<EthtoolRings>, EthtoolPortError>> {
        let owned = dev.to_owned();
        self.call(format!("ETHTOOL_MSG_RINGS_GET {dev}"), move |client| {
            let found = client.rings(&owned)?;
            Ok(Limited { current: rings(found.current), max: rings(found.max) })
        })
    }

    fn set_rings<'a>(
        &'a self,
        dev: &'a str,
        wanted: EthtoolRings,
    ) -> BoxFuture<'a, Result<(), EthtoolPortError>> {
        let owned = dev.to_owned();
        let sizes = RingSizes {
            rx: wanted.rx,
            rx_mini: wanted.rx_mini,
            rx_jumbo: wanted.rx_jumbo,
            tx: wanted.tx,
        };
        self.call(format!("ETHTOOL_MSG_RINGS_SET {dev}"), move |client| {
            client.set_rings(&owned, sizes)
        })
    }

    fn channels<'a>(
        &'a self,
        dev: &'a str,
    ) -> BoxFuture<'a, Result<Limited<EthtoolChannels>, EthtoolPortError>> {
        let owned = dev.to_owned();
        self.call(format!("ETHTOOL_MSG_CHANNELS_GET {dev}"), move |client| {
            let found = client.channels(&owned)?;
            Ok(Limited { current: channels(found.current), max: channels(found.max) })
        })
    }

    fn set_channels<'a>(
        &'a self,
        dev: &'a str,
        wanted: EthtoolChannels,
    ) -> BoxFuture<'a, Result<(), EthtoolPortError>> {
        let owned = dev.to_owned();
        let counts = ChannelCounts {
            rx: wanted.rx,
            tx: wanted.tx,
            other: wanted.other,
            combined: wanted.combined,
        };
        self.call(format!("ETHTOOL_MSG_CHANNELS_SET {dev}"), move |client| {
            client.set_channels(&owned, counts)
        })
    }

    fn boot_id(&self) -> Result<String, EthtoolPortError> {
        let path = self.boot_id.clone().unwrap_or_else(|| PathBuf::from(BOOT_ID));
        std::fs::read_to_string(&path).map(|id| id.trim().to_owned()).map_err(|err| {
            EthtoolPortError {
                op: format!("reading {}", path.display()),
                errno: err.raw_os_error(),
                message: err.to_string(),
            }
        })
    }
}
