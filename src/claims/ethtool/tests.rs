//! The ethtool core against the fake kernel (`testing::ethtool`): every check before the
//! first change, a failure at each step setting back what changed, and the restore.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use super::*;
use crate::testing::ethtool::{FakeEthtool, FakeEthtoolDevice};

const DEV: &str = "eth1";

fn fake() -> FakeEthtool {
    FakeEthtool::default().with(DEV, FakeEthtoolDevice::nic())
}

fn settings(features: &[(&str, bool)], rx: Option<u32>, combined: Option<u32>) -> EthtoolSettings {
    EthtoolSettings {
        features: features.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect(),
        rings: EthtoolRings { rx, ..EthtoolRings::default() },
        channels: EthtoolChannels { combined, ..EthtoolChannels::default() },
    }
}

#[tokio::test]
async fn apply_then_restore_gives_the_device_back_as_found() {
    let kernel = fake();
    let wanted = settings(&[("rx-gro", false), ("loopback", true)], Some(1024), Some(2));
    let before = check(&kernel, DEV, &wanted).await.unwrap();
    assert_eq!(before.features, [("loopback".into(), false), ("rx-gro".into(), true)].into());
    assert_eq!((before.rings.rx, before.rings.tx), (Some(256), None), "only the fields set");
    assert_eq!(before.channels.combined, Some(4));
    apply(&kernel, DEV, &wanted, &before).await.unwrap();
    let now = kernel.device(DEV);
    assert!(!now.features["rx-gro"].active && now.features["loopback"].active);
    assert_eq!(now.rings.unwrap().current.rx, Some(1024));
    assert_eq!(now.rings.unwrap().current.tx, Some(256), "tx left alone");
    assert_eq!(now.channels.unwrap().current.combined, Some(2));
    restore(&kernel, DEV, &before).await.unwrap();
    assert_eq!(kernel.device(DEV), FakeEthtoolDevice::nic());
}

#[tokio::test]
async fn what_the_device_cannot_take_is_refused_before_any_change() {
    for (wanted, message) in [
        (
            settings(&[("rx-checksum", false), ("rx-chksum", false)], None, None),
            "ethtool.features[\"rx-chksum\"]: false: the node's kernel has no such feature",
        ),
        (
            settings(&[("rx-vlan-filter", false)], None, None),
            "ethtool.features[\"rx-vlan-filter\"]: false: fixed at true on eth1",
        ),
        (
            settings(&[], Some(8192), None),
            "ethtool.rings.rx: 8192: above the maximum of eth1, 4096",
        ),
        (
            EthtoolSettings {
                rings: EthtoolRings { rx_jumbo: Some(64), ..EthtoolRings::default() },
                ..EthtoolSettings::default()
            },
            "ethtool.rings.rxJumbo: 64: eth1 has no such ring",
        ),
        (
            EthtoolSettings {
                channels: EthtoolChannels { rx: Some(2), ..EthtoolChannels::default() },
                ..EthtoolSettings::default()
            },
            "ethtool.channels.rx: 2: eth1 has no such channel kind",
        ),
        (
            settings(&[], None, Some(9)),
            "ethtool.channels.combined: 9: above the maximum of eth1, 8",
        ),
    ] {
        let kernel = fake();
        let err = check(&kernel, DEV, &wanted).await.unwrap_err().to_string();
        assert!(err.contains(message), "{message:?} missing in {err}");
        assert!(kernel.sets.lock().unwrap().is_empty(), "nothing sent for {message}");
    }
    // A fixed feature asked at its value is no change: accepted.
    check(&fake(), DEV, &settings(&[("rx-vlan-filter", true)], None, None)).await.unwrap();
    // A driver without rings: named, from the read.
    let mut bare = FakeEthtoolDevice::nic();
    bare.rings = None;
    let kernel = FakeEthtool::default().with(DEV, bare);
    let err = check(&kernel, DEV, &settings(&[], Some(512), None)).await.unwrap_err().to_string();
    assert!(err.starts_with("ethtool.rings: eth1 has no such settings"), "{err}");
}

#[tokio::test]
async fn a_failure_at_each_step_sets_back_every_section_already_changed() {
    let wanted = settings(&[("rx-gro", false)], Some(1024), Some(2));
    for (failing, field) in [
        ("features", "ethtool.features"),
        ("rings", "ethtool.rings"),
        ("channels", "ethtool.channels"),
    ] {
        let kernel = fake();
        let before = check(&kernel, DEV, &wanted).await.unwrap();
        kernel.fail_next(failing, 22);
        let err = apply(&kernel, DEV, &wanted, &before).await.unwrap_err().to_string();
        assert!(err.starts_with(&format!("{field}: ")), "{err}");
        assert!(err.contains("eth1 refused it"), "{err}");
        assert_eq!(kernel.device(DEV), FakeEthtoolDevice::nic(), "after {failing} failed");
    }
}

#[tokio::test]
async fn a_feature_a_dependency_holds_off_fails_naming_it_and_is_set_back() {
    let kernel = fake();
    let wanted =
        settings(&[("tx-scatter-gather", false), ("tx-tcp-segmentation", true)], Some(512), None);
    let before = check(&kernel, DEV, &wanted).await.unwrap();
    let err = apply(&kernel, DEV, &wanted, &before).await.unwrap_err().to_string();
    assert!(
        err.starts_with("ethtool.features[\"tx-tcp-segmentation\"]: true: eth1 kept it false"),
        "{err}"
    );
    assert_eq!(kernel.device(DEV), FakeEthtoolDevice::nic());
    assert!(
        !kernel.sets.lock().unwrap().iter().any(|s| s.starts_with("rings")),
        "rings never sent"
    );
}

#[tokio::test]
async fn restore_tries_every_section_and_returns_the_first_failure() {
    let kernel = fake();
    let wanted = settings(&[("rx-gro", false)], Some(1024), Some(2));
    let before = check(&kernel, DEV, &wanted).await.unwrap();
    apply(&kernel, DEV, &wanted, &before).await.unwrap();
    kernel.fail_next("rings", 16);
    let err = restore(&kernel, DEV, &before).await.unwrap_err().to_string();
    assert!(err.starts_with("eth1: restoring ethtool.rings to {\"rx\":256}"), "{err}");
    let now = kernel.device(DEV);
    assert_eq!(now.channels, FakeEthtoolDevice::nic().channels, "channels set back");
    assert_eq!(now.features, FakeEthtoolDevice::nic().features, "features set back");
    // kubelet's retry of the unprepare finishes it.
    restore(&kernel, DEV, &before).await.unwrap();
    assert_eq!(kernel.device(DEV), FakeEthtoolDevice::nic());
}
