//! Bandwidth at prepare (issue 35): the allocation's consumed `netclaim.dev/bandwidth` becomes
//! the recorded egress ceiling; what the scheduler cannot check is refused, naming the field.

use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::model::bandwidth::{BitsPerSecond, CeilingSource, EgressCeiling, IngressPolicy};
use crate::model::device::AttributeValue;

const G: u64 = 1_000_000_000;
const M: u64 = 1_000_000;

/// `eth2` a shared parent publishing 10G, `eth2-s0` a slot of it, `eth1` an exclusive NIC
/// whose link runs at 1000 Mb/s.
fn service(api: &Arc<MapClaims>, dir: &std::path::Path) -> Service {
    let mut eth1 = if_name_attribute("eth1");
    eth1.insert("netclaim.dev/speedMbps".into(), AttributeValue::Int(1000));
    let devices = FixedDevices::new()
        .device("eth1", physical_nic("eth1"), eth1)
        .device("eth2", physical_nic("eth2").shared(), if_name_attribute("eth2"))
        .device("eth2-s0", physical_nic("eth2").slot(), if_name_attribute("eth2-s0"))
        .parent_bandwidth("eth2", BitsPerSecond(10 * G));
    let store = Arc::new(Store::open(dir).unwrap());
    ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        Arc::clone(api),
        devices,
        store,
    )
    .unwrap()
}

/// A claim `name` whose request `nic` got `device` with `consumed` bandwidth (a share when
/// `Some`), asked for `requested` in its spec, with config `extra`.
fn bandwidth_claim(
    name: &str,
    device: &str,
    requested: Option<&str>,
    consumed: Option<&str>,
    extra: Value,
) -> ResourceClaim {
    let mut allocated = result("nic", DRIVER, NODE, device);
    if let Some(consumed) = consumed {
        allocated.share_id = Some(format!("3f1c0c3e-0000-4000-8000-{:0>12}", name.len()));
        allocated.consumed_capacity = Some(
            [
                ("netclaim.dev/interfaces".to_owned(), Quantity("1".into())),
                ("netclaim.dev/bandwidth".to_owned(), Quantity(consumed.into())),
            ]
            .into(),
        );
    }
    let mut object = claim(
        name,
        &format!("uid-{name}"),
        vec![allocated],
        vec![config("FromClaim", DRIVER, &[], params(extra))],
    );
    object.spec = Some(ResourceClaimSpec {
        devices: Some(DeviceClaim {
            requests: Some(vec![DeviceRequest {
                name: "nic".into(),
                exactly: Some(ExactDeviceRequest {
                    device_class_name: "netclaim".into(),
                    capacity: requested.map(|amount| CapacityRequirements {
                        requests: Some(
                            [("netclaim.dev/bandwidth".to_owned(), Quantity(amount.into()))].into(),
                        ),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    });
    object
}

fn ceiling_of(service: &Service, name: &str) -> Option<EgressCeiling> {
    let stored = service.prepared(&format!("uid-{name}")).unwrap();
    stored.devices[0].config.bandwidth.and_then(|b| b.ceiling)
}

async fn prepare(service: &Service, name: &str) -> Result<Vec<PreparedDevice>, String> {
    prepare_one(service, &reference(name, &format!("uid-{name}"))).await
}

#[tokio::test]
async fn the_consumed_bandwidth_is_the_ceiling_and_a_lower_limit_lowers_it() {
    let api = Arc::new(MapClaims::default());
    let macvlan = || json!({"mode": "macvlan"});
    api.put(bandwidth_claim("asked", "eth2", Some("500M"), Some("500M"), macvlan()));
    api.put(bandwidth_claim(
        "lowered",
        "eth2",
        Some("500M"),
        Some("500M"),
        json!({"bandwidth": {"limit": "100M", "ingress": "police"}}),
    ));
    api.put(bandwidth_claim(
        "own",
        "eth2",
        None,
        Some("0"),
        json!({"bandwidth": {"limit": "50M"}}),
    ));
    api.put(bandwidth_claim("none", "eth2", None, Some("0"), macvlan()));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    for name in ["asked", "lowered", "own", "none"] {
        prepare(&service, name).await.unwrap();
    }
    let ceiling = |rate, source| Some(EgressCeiling { rate: BitsPerSecond(rate), source });
    assert_eq!(ceiling_of(&service, "asked"), ceiling(500 * M, CeilingSource::ConsumedCapacity));
    assert_eq!(ceiling_of(&service, "lowered"), ceiling(100 * M, CeilingSource::ConfigLimit));
    assert_eq!(ceiling_of(&service, "own"), ceiling(50 * M, CeilingSource::ConfigLimit));
    assert_eq!(ceiling_of(&service, "none"), None, "best effort without a limit");
    let lowered = service.prepared("uid-lowered").unwrap().devices[0].config.bandwidth.unwrap();
    assert_eq!(lowered.ingress, IngressPolicy::Police);
    assert_eq!(lowered.consumed, Some(BitsPerSecond(500 * M)), "what the scheduler counted");
    // The record keeps it across a restart.
    drop(service);
    let again = super::service(&api, dir.path());
    let kept = again.prepared("uid-asked").unwrap().devices[0].config.bandwidth.unwrap();
    assert_eq!(kept.ceiling.unwrap().rate, BitsPerSecond(500 * M));
}

#[tokio::test]
async fn bandwidth_above_what_the_device_carries_is_refused_naming_the_field() {
    let api = Arc::new(MapClaims::default());
    let macvlan = json!({"mode": "macvlan"});
    api.put(bandwidth_claim("huge", "eth2", Some("20G"), Some("20G"), macvlan));
    api.put(bandwidth_claim("limit", "eth2", None, None, json!({"bandwidth": {"limit": "11G"}})));
    api.put(bandwidth_claim("nic", "eth1", None, None, json!({"bandwidth": {"limit": "2G"}})));
    api.put(bandwidth_claim("fits", "eth1", None, None, json!({"bandwidth": {"limit": "1G"}})));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let err = prepare(&service, "huge").await.unwrap_err();
    assert!(
        err.contains("capacity.requests[netclaim.dev/bandwidth]: 20G: above the 10G bit/s"),
        "{err}"
    );
    let err = prepare(&service, "limit").await.unwrap_err();
    assert!(err.contains("bandwidth.limit: 11G: above the 10G bit/s"), "{err}");
    assert!(err.contains("parent eth2"), "{err}");
    let err = prepare(&service, "nic").await.unwrap_err();
    assert!(err.contains("bandwidth.limit: 2G: above the 1G bit/s link speed of eth1"), "{err}");
    prepare(&service, "fits").await.unwrap();
    assert!(service.prepared("uid-huge").is_none() && service.prepared("uid-limit").is_none());
}

#[tokio::test]
async fn consumed_bandwidth_on_one_parent_adds_up_across_claims() {
    // Two networks on one parent publish a device each, with the parent's capacity: the
    // scheduler counts each device alone, so 6G + 6G can be allocated on a 10G parent.
    let api = Arc::new(MapClaims::default());
    let macvlan = || json!({"mode": "macvlan"});
    api.put(bandwidth_claim("first", "eth2", Some("6G"), Some("6G"), macvlan()));
    api.put(bandwidth_claim("second", "eth2", Some("6G"), Some("6G"), macvlan()));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    prepare(&service, "first").await.unwrap();
    let err = prepare(&service, "second").await.unwrap_err();
    assert!(err.contains("together with the 6G already allocated on it"), "{err}");
    service.unprepare(vec![reference("first", "uid-first")]).await;
    prepare(&service, "second").await.unwrap();
}

#[tokio::test]
async fn slots_mode_refuses_bandwidth_naming_the_mode() {
    let api = Arc::new(MapClaims::default());
    api.put(bandwidth_claim("asks", "eth2-s0", Some("100M"), None, json!({"mode": "macvlan"})));
    api.put(bandwidth_claim(
        "limits",
        "eth2-s0",
        None,
        None,
        json!({"bandwidth": {"limit": "1G"}}),
    ));
    api.put(bandwidth_claim("plain", "eth2-s0", None, None, json!({"mode": "macvlan"})));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let err = prepare(&service, "asks").await.unwrap_err();
    assert!(err.contains("capacity.requests[netclaim.dev/bandwidth]: \"100M\""), "{err}");
    assert!(err.contains("slots mode"), "{err}");
    let err = prepare(&service, "limits").await.unwrap_err();
    assert!(err.contains("bandwidth: slots:") && err.contains("slots mode"), "{err}");
    prepare(&service, "plain").await.unwrap();
}

#[tokio::test]
async fn a_non_quantity_and_police_without_a_ceiling_are_refused_naming_the_field() {
    let api = Arc::new(MapClaims::default());
    api.put(bandwidth_claim("word", "eth2", None, None, json!({"bandwidth": {"limit": "fast"}})));
    api.put(bandwidth_claim("milli", "eth2", None, None, json!({"bandwidth": {"limit": "500m"}})));
    api.put(bandwidth_claim("zero", "eth2", None, None, json!({"bandwidth": {"limit": "0"}})));
    api.put(bandwidth_claim(
        "police",
        "eth2",
        None,
        Some("0"),
        json!({"bandwidth": {"ingress": "police"}}),
    ));
    api.put(bandwidth_claim(
        "fraction",
        "eth1",
        None,
        None,
        json!({"bandwidth": {"limit": "1500k"}, "mode": "host-device"}),
    ));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let cases = [
        ("word", "bandwidth.limit: \"fast\": not a quantity"),
        ("milli", "bandwidth.limit: \"500m\": not a whole number of bits per second"),
        ("zero", "bandwidth.limit: \"0\": must be above 0"),
        ("police", "bandwidth.ingress: police: police needs a ceiling"),
    ];
    for (name, expected) in cases {
        let err = prepare(&service, name).await.unwrap_err();
        assert!(err.contains(expected), "{name}: {err}");
    }
    // Not a VF: a qdisc takes any whole number of bits per second.
    prepare(&service, "fraction").await.unwrap();
}
