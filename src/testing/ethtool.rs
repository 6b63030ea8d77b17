//! A fake ethtool kernel for the claims' `EthtoolPort`: devices with features (some fixed),
//! rings and channels with maxima, answering as the kernel's ethtool netlink family does:
//! an unknown device `ENODEV`, a driver without rings or channels `EOPNOTSUPP`, a value above
//! the maximum `EINVAL`, a fixed feature silently kept, TSO held off while scatter-gather is
//! off (`netdev_fix_features`). Any set can be made to fail once with an errno.

#![allow(clippy::unwrap_used, reason = "a poisoned test mutex is a failed test")]
#![allow(clippy::missing_panics_doc, reason = "test support: it panics only on a poisoned mutex")]

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use futures::FutureExt as _;
use futures::future::BoxFuture;

use crate::claims::ethtool::{EthtoolPort, EthtoolPortError, FeatureState, Limited};
use crate::model::network_config::{EthtoolChannels, EthtoolRings};

const ENODEV: i32 = 19;
const EINVAL: i32 = 22;
const EOPNOTSUPP: i32 = 95;

/// One fake device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeEthtoolDevice {
    /// Features by name.
    pub features: BTreeMap<String, FeatureState>,
    /// Rings; `None`: the driver has no ring settings.
    pub rings: Option<Limited<EthtoolRings>>,
    /// Channels; `None`: the driver has no channel settings.
    pub channels: Option<Limited<EthtoolChannels>>,
}

impl FakeEthtoolDevice {
    /// A NIC like igb: rx-checksum, rx-gro, tx-scatter-gather and tx-tcp-segmentation on and
    /// changeable, `loopback` off and changeable, `rx-vlan-filter` fixed on; rings 256 of
    /// 4096; combined channels 4 of 8.
    #[must_use]
    pub fn nic() -> Self {
        let on = FeatureState { active: true, wanted: true, changeable: true };
        let off = FeatureState { active: false, wanted: false, changeable: true };
        let fixed_on = FeatureState { active: true, wanted: true, changeable: false };
        let features = [
            ("rx-checksum", on),
            ("rx-gro", on),
            ("tx-scatter-gather", on),
            ("tx-tcp-segmentation", on),
            ("loopback", off),
            ("rx-vlan-filter", fixed_on),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_owned(), s))
        .collect();
        let ring = |v| EthtoolRings { rx: Some(v), tx: Some(v), rx_mini: None, rx_jumbo: None };
        Self {
            features,
            rings: Some(Limited { current: ring(256), max: ring(4096) }),
            channels: Some(Limited {
                current: EthtoolChannels { combined: Some(4), ..EthtoolChannels::default() },
                max: EthtoolChannels { combined: Some(8), ..EthtoolChannels::default() },
            }),
        }
    }
}

/// The fake kernel.
#[derive(Debug)]
pub struct FakeEthtool {
    devices: Mutex<HashMap<String, FakeEthtoolDevice>>,
    boot_id: Mutex<String>,
    /// `(what, errno)`: the next set of `what` (`features`, `rings`, `channels`) fails.
    fail_next: Mutex<Option<(&'static str, i32)>>,
    /// Every set request, as `what dev`.
    pub sets: Mutex<Vec<String>>,
}

impl Default for FakeEthtool {
    fn default() -> Self {
        Self {
            devices: Mutex::new(HashMap::new()),
            boot_id: Mutex::new("boot-1".to_owned()),
            fail_next: Mutex::new(None),
            sets: Mutex::new(Vec::new()),
        }
    }
}

impl FakeEthtool {
    /// With `dev` as `device`.
    #[must_use]
    pub fn with(self, dev: &str, device: FakeEthtoolDevice) -> Self {
        self.devices.lock().unwrap().insert(dev.to_owned(), device);
        self
    }

    /// The device `dev` now.
    #[must_use]
    pub fn device(&self, dev: &str) -> FakeEthtoolDevice {
        self.devices.lock().unwrap()[dev].clone()
    }

    /// Replaces `dev` (a reboot's reset, an administrator's change).
    pub fn set_device(&self, dev: &str, device: FakeEthtoolDevice) {
        self.devices.lock().unwrap().insert(dev.to_owned(), device);
    }

    /// A new boot id (a simulated reboot).
    pub fn set_boot_id(&self, id: &str) {
        id.clone_into(&mut self.boot_id.lock().unwrap());
    }

    /// The next set of `what` (`features`, `rings`, `channels`) answers `errno`.
    pub fn fail_next(&self, what: &'static str, errno: i32) {
        *self.fail_next.lock().unwrap() = Some((what, errno));
    }

    fn error(op: String, errno: i32) -> EthtoolPortError {
        EthtoolPortError {
            op,
            errno: Some(errno),
            message: std::io::Error::from_raw_os_error(errno).to_string(),
        }
    }

    fn with_device<T>(
        &self,
        op: String,
        dev: &str,
        f: impl FnOnce(&mut FakeEthtoolDevice) -> Result<T, i32>,
    ) -> Result<T, EthtoolPortError> {
        let mut devices = self.devices.lock().unwrap();
        let device = devices.get_mut(dev).ok_or_else(|| Self::error(op.clone(), ENODEV))?;
        f(device).map_err(|errno| Self::error(op, errno))
    }

    fn set<T>(
        &self,
        what: &'static str,
        dev: &str,
        f: impl FnOnce(&mut FakeEthtoolDevice) -> Result<T, i32>,
    ) -> Result<T, EthtoolPortError> {
        let op = format!("{what} {dev}");
        self.sets.lock().unwrap().push(op.clone());
        let mut fail = self.fail_next.lock().unwrap();
        if let Some((failing, errno)) = *fail
            && failing == what
        {
            *fail = None;
            return Err(Self::error(op, errno));
        }
        drop(fail);
        self.with_device(op, dev, f)
    }
}

fn fits(values: [(&str, Option<u32>); 4], max: [(&str, Option<u32>); 4]) -> Result<(), i32> {
    for ((_, value), (_, max)) in values.into_iter().zip(max) {
        match (value, max) {
            (Some(_), None) => return Err(EOPNOTSUPP),
            (Some(v), Some(m)) if v > m => return Err(EINVAL),
            _ => {}
        }
    }
    Ok(())
}

impl EthtoolPort for FakeEthtool {
    fn features<'a>(
        &'a self,
        dev: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, FeatureState>, EthtoolPortError>> {
        let out = self.with_device(format!("features {dev}"), dev, |d| Ok(d.features.clone()));
        async move { out }.boxed()
    }

    fn set_features<'a>(
        &'a self,
        dev: &'a str,
        changes: &'a [(String, bool)],
    ) -> BoxFuture<'a, Result<(), EthtoolPortError>> {
        let out = self.set("features", dev, |d| {
            if changes.iter().any(|(n, _)| !d.features.contains_key(n)) {
                return Err(EINVAL);
            }
            for (name, on) in changes {
                let state = d.features.get_mut(name).expect("checked above");
                if state.changeable {
                    state.wanted = *on;
                    state.active = *on;
                }
            }
            // TSO needs scatter-gather (the kernel's netdev_fix_features).
            let sg = d.features.get("tx-scatter-gather").is_some_and(|s| s.active);
            if let Some(tso) = d.features.get_mut("tx-tcp-segmentation") {
                tso.active = tso.wanted && sg;
            }
            Ok(())
        });
        async move { out }.boxed()
    }

    fn rings<'a>(
        &'a self,
        dev: &'a str,
    ) -> BoxFuture<'a, Result<Limited<EthtoolRings>, EthtoolPortError>> {
        let out = self.with_device(format!("rings {dev}"), dev, |d| d.rings.ok_or(EOPNOTSUPP));
        async move { out }.boxed()
    }

    fn set_rings<'a>(
        &'a self,
        dev: &'a str,
        rings: EthtoolRings,
    ) -> BoxFuture<'a, Result<(), EthtoolPortError>> {
        let out = self.set("rings", dev, |d| {
            let found = d.rings.as_mut().ok_or(EOPNOTSUPP)?;
            fits(rings.fields(), found.max.fields())?;
            let c = &mut found.current;
            (c.rx, c.tx) = (rings.rx.or(c.rx), rings.tx.or(c.tx));
            (c.rx_mini, c.rx_jumbo) = (rings.rx_mini.or(c.rx_mini), rings.rx_jumbo.or(c.rx_jumbo));
            Ok(())
        });
        async move { out }.boxed()
    }

    fn channels<'a>(
        &'a self,
        dev: &'a str,
    ) -> BoxFuture<'a, Result<Limited<EthtoolChannels>, EthtoolPortError>> {
        let out =
            self.with_device(format!("channels {dev}"), dev, |d| d.channels.ok_or(EOPNOTSUPP));
        async move { out }.boxed()
    }

    fn set_channels<'a>(
        &'a self,
        dev: &'a str,
        channels: EthtoolChannels,
    ) -> BoxFuture<'a, Result<(), EthtoolPortError>> {
        let out = self.set("channels", dev, |d| {
            let found = d.channels.as_mut().ok_or(EOPNOTSUPP)?;
            fits(channels.fields(), found.max.fields())?;
            let c = &mut found.current;
            (c.rx, c.tx) = (channels.rx.or(c.rx), channels.tx.or(c.tx));
            (c.other, c.combined) = (channels.other.or(c.other), channels.combined.or(c.combined));
            Ok(())
        });
        async move { out }.boxed()
    }

    fn boot_id(&self) -> Result<String, EthtoolPortError> {
        Ok(self.boot_id.lock().unwrap().clone())
    }
}
