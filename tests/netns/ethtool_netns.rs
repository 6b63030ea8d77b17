//! Root tests of `ethtool` (issue 34) on this host's kernel, on a veth pair in a throwaway
//! netns, through the real port (`host::ethtool` over `crates/ethtool-genl`) and the claims'
//! core (`claims::ethtool`): features by their netlink names and channel counts set and set
//! back exactly; what veth cannot take refused before any change (no rings: `EOPNOTSUPP`; a
//! fixed feature; a name the kernel does not know; a channel count above its maximum); a
//! count the kernel refuses mid-way (no receive channel) fails naming `ethtool.channels` with
//! the features already changed set back. Values are read back with the port and, where the
//! kernel shows them elsewhere, independently: the channel counts as the `queues/rx-N` and
//! `tx-N` directories in the netns's sysfs, the features with `ethtool -k` when the host has
//! it.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::BTreeMap;
use std::path::PathBuf;

use netclaim::claims::ethtool::{self, EthtoolPort, FeatureState};
use netclaim::host::ethtool::NetlinkEthtool;
use netclaim::model::network_config::{EthtoolChannels, EthtoolRings, EthtoolSettings};

use crate::kit::netns::{Netns, require_root};

fn veth(netns: &Netns) -> (String, NetlinkEthtool) {
    let (a, b) = (netns.ifname("a"), netns.ifname("b"));
    netns.ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
    let port = NetlinkEthtool::in_netns(PathBuf::from(format!("/run/netns/{}", netns.name)), None);
    (a, port)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// The `rx-N` and `tx-N` queue directories of `dev` in the netns's own sysfs.
fn queues(netns: &Netns, dev: &str) -> (usize, usize) {
    let out = netns.exec("ls", &[&format!("/sys/class/net/{dev}/queues")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let count = |prefix: &str| text.split_whitespace().filter(|q| q.starts_with(prefix)).count();
    (count("rx-"), count("tx-"))
}

/// `ethtool -k` of `dev`, when the host has ethtool: feature (legacy name) → on.
fn ethtool_k(netns: &Netns, dev: &str) -> Option<BTreeMap<String, bool>> {
    let out = netns.exec("ethtool", &["-k", dev]);
    if !out.status.success() {
        println!("no ethtool on this host: features read with the port only");
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.trim().split_once(": ")?;
                Some((name.to_owned(), rest.starts_with("on")))
            })
            .collect(),
    )
}

fn settings(features: &[(&str, bool)], channels: EthtoolChannels) -> EthtoolSettings {
    EthtoolSettings {
        features: features.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect(),
        rings: EthtoolRings::default(),
        channels,
    }
}

#[test]
#[ignore = "needs root"]
fn features_and_channels_of_a_veth_are_set_and_set_back_exactly() {
    require_root("features_and_channels_of_a_veth_are_set_and_set_back_exactly");
    let netns = Netns::new();
    let (dev, port) = veth(&netns);
    runtime().block_on(async {
        let found = port.features(&dev).await.unwrap();
        let changeable = |name: &str| found.get(name).is_some_and(|f| f.changeable);
        assert!(changeable("rx-gro") && changeable("tx-checksum-ip-generic"), "{found:?}");
        let start_channels = port.channels(&dev).await.unwrap();
        assert_eq!(start_channels.current.rx, Some(1), "veth starts with one queue each way");
        let max_rx = start_channels.max.rx.unwrap();
        assert!(max_rx >= 2, "veth allows a queue per CPU: {start_channels:?}");
        let start_queues = queues(&netns, &dev);
        let start_k = ethtool_k(&netns, &dev);

        let gro = found["rx-gro"].active;
        let wanted = settings(
            &[("rx-gro", !gro), ("tx-checksum-ip-generic", false)],
            EthtoolChannels { rx: Some(2), tx: Some(2), ..EthtoolChannels::default() },
        );
        let before = ethtool::check(&port, &dev, &wanted).await.unwrap();
        ethtool::apply(&port, &dev, &wanted, &before).await.unwrap();
        let now = port.features(&dev).await.unwrap();
        assert_eq!(now["rx-gro"].active, !gro);
        assert!(!now["tx-checksum-ip-generic"].active);
        let channels = port.channels(&dev).await.unwrap();
        assert_eq!((channels.current.rx, channels.current.tx), (Some(2), Some(2)));
        assert_eq!(queues(&netns, &dev), (2, 2), "sysfs shows the new queue counts");
        if let Some(k) = ethtool_k(&netns, &dev) {
            // `ethtool -k` prints generic-receive-offload for rx-gro.
            assert_eq!(k["generic-receive-offload"], !gro, "{k:?}");
            assert!(!k["tx-checksum-ip-generic"], "{k:?}");
        }

        ethtool::restore(&port, &dev, &before).await.unwrap();
        assert_eq!(port.features(&dev).await.unwrap(), found, "every feature as found");
        assert_eq!(port.channels(&dev).await.unwrap(), start_channels);
        assert_eq!(queues(&netns, &dev), start_queues);
        assert_eq!(ethtool_k(&netns, &dev), start_k);
    });
}

#[test]
#[ignore = "needs root"]
fn what_a_veth_cannot_take_is_refused_naming_the_field_and_changes_nothing() {
    require_root("what_a_veth_cannot_take_is_refused_naming_the_field_and_changes_nothing");
    let netns = Netns::new();
    let (dev, port) = veth(&netns);
    runtime().block_on(async {
        let found = port.features(&dev).await.unwrap();
        let fixed: Vec<(&String, &FeatureState)> =
            found.iter().filter(|(_, f)| !f.changeable).collect();
        let (fixed_name, fixed_state) = *fixed.first().expect("veth has fixed features");
        let start_channels = port.channels(&dev).await.unwrap();
        let max_rx = start_channels.max.rx.unwrap();
        let cases = [
            (
                EthtoolSettings {
                    rings: EthtoolRings { rx: Some(512), ..EthtoolRings::default() },
                    ..settings(&[("rx-gro", true)], EthtoolChannels::default())
                },
                format!("ethtool.rings: {dev} has no such settings (its driver answers EOPNOTSUPP"),
            ),
            (
                settings(&[("rx-gro", true), ("rx-checksumming", false)], EthtoolChannels::default()),
                "ethtool.features[\"rx-checksumming\"]: false: the node's kernel has no such feature".to_owned(),
            ),
            (
                settings(&[(fixed_name.as_str(), !fixed_state.active)], EthtoolChannels::default()),
                format!(
                    "ethtool.features[{fixed_name:?}]: {}: fixed at {} on {dev}",
                    !fixed_state.active, fixed_state.active
                ),
            ),
            (
                settings(&[], EthtoolChannels { rx: Some(max_rx + 1), ..EthtoolChannels::default() }),
                format!("ethtool.channels.rx: {}: above the maximum of {dev}, {max_rx}", max_rx + 1),
            ),
            (
                settings(&[], EthtoolChannels { combined: Some(1), ..EthtoolChannels::default() }),
                format!("ethtool.channels.combined: 1: {dev} has no such channel kind"),
            ),
        ];
        for (wanted, message) in cases {
            let err = ethtool::check(&port, &dev, &wanted).await.unwrap_err().to_string();
            assert!(err.contains(&message), "{message:?} missing in {err}");
        }
        assert_eq!(port.features(&dev).await.unwrap(), found);
        assert_eq!(port.channels(&dev).await.unwrap(), start_channels);

        // Refused by the kernel mid-way: no receive channel left. The features changed before
        // are set back.
        let gro = found["rx-gro"].active;
        let wanted = settings(
            &[("rx-gro", !gro)],
            EthtoolChannels { rx: Some(0), ..EthtoolChannels::default() },
        );
        let before = ethtool::check(&port, &dev, &wanted).await.unwrap();
        let err = ethtool::apply(&port, &dev, &wanted, &before).await.unwrap_err().to_string();
        assert!(err.starts_with(&format!("ethtool.channels: {{\"rx\":0}}: {dev} refused it")), "{err}");
        assert!(err.contains("Invalid argument"), "the kernel's EINVAL: {err}");
        assert_eq!(port.features(&dev).await.unwrap(), found, "rx-gro set back");
        assert_eq!(port.channels(&dev).await.unwrap(), start_channels);
    });
}
