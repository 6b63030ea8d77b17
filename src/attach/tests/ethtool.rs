//! `data.ethtool` (issue 34 item 6): a device whose prepare applied ethtool settings reports
//! them in its Ready status; one without, or whose values were never applied, has no field.

use super::*;
use crate::claims::ethtool::{EthtoolBefore, PreparedEthtool};
use crate::model::network_config::{EthtoolChannels, EthtoolRings, EthtoolSettings};

fn with_ethtool(mut prepared: PreparedClaim, before: Option<EthtoolBefore>) -> PreparedClaim {
    prepared.devices[0].ethtool = Some(PreparedEthtool {
        if_name: "eth1".to_owned(),
        settings: EthtoolSettings {
            features: [("rx-gro".to_owned(), false)].into(),
            rings: EthtoolRings { rx: Some(1024), ..EthtoolRings::default() },
            channels: EthtoolChannels { combined: Some(2), ..EthtoolChannels::default() },
        },
        boot_id: Some("boot-1".to_owned()),
        before,
    });
    prepared
}

fn host_device(address: &str) -> serde_json::Value {
    json!({"mode": "host-device", "ipam": {"addresses": [address]}})
}

#[tokio::test]
async fn the_ready_status_lists_the_applied_ethtool_values() {
    let world = World::new();
    let prepared = claim("a", "p1", &[("nic", "eth1", host_device("10.0.1.5/24"))]);
    world.add_claim(with_ethtool(prepared, Some(EthtoolBefore::default())));
    run(&world.service(), world.pod("p1")).await.unwrap();
    let entries = world.status.last("a");
    assert_eq!(
        entries[0].data.as_ref().unwrap().0["ethtool"],
        json!({"features": {"rx-gro": false}, "rings": {"rx": 1024}, "channels": {"combined": 2}})
    );
}

#[tokio::test]
async fn no_ethtool_field_without_applied_values() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", host_device("10.0.1.5/24"))]));
    let prepared = claim("b", "p1", &[("nic", "eth2", macvlan("10.0.2.5/24"))]);
    world.add_claim(with_ethtool(prepared, None));
    run(&world.service(), world.pod("p1")).await.unwrap();
    for name in ["a", "b"] {
        let data = world.status.last(name)[0].data.clone().unwrap().0;
        assert!(data.get("mode").is_some() && data.get("ethtool").is_none(), "{name}: {data}");
    }
}
