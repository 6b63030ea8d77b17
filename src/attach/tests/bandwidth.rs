//! The `CreateContainer` gate's bandwidth ceilings over the fake kernel (issue 35): a fake
//! [`CeilingPort`] that keeps the "qdisc" of each pod interface the fake kernel has, and fails
//! on the interface a test names.

use std::collections::BTreeMap;

use super::*;
use crate::attach::bandwidth::{
    CeilingFuture, CeilingMechanism, CeilingPort, CeilingSupport, InterfaceCeiling,
};
use crate::model::bandwidth::IngressPolicy;
use crate::model::cause::cause;

/// Ceilings in place by interface, every call made, and the interface whose apply fails.
#[derive(Default)]
struct FakeCeilings {
    kernel: Option<Arc<FakeKernel>>,
    in_place: Mutex<BTreeMap<String, (u64, CeilingMechanism)>>,
    calls: Mutex<Vec<String>>,
    fail_on: Mutex<Option<String>>,
    /// Interfaces whose ingress was to be policed.
    policed: Mutex<Vec<String>>,
}

impl CeilingPort for FakeCeilings {
    fn apply<'a>(
        &'a self,
        _netns: &'a Path,
        _pod_uid: &'a str,
        ceiling: &'a InterfaceCeiling,
    ) -> CeilingFuture<'a> {
        Box::pin(async move {
            self.calls.lock().unwrap().push(format!("apply {}", ceiling.interface));
            let kernel = self.kernel.as_ref().unwrap();
            if kernel.get(Side::Pod, &ceiling.interface).is_none() {
                return Err(cause(std::io::Error::from_raw_os_error(19)));
            }
            if self.fail_on.lock().unwrap().as_deref() == Some(ceiling.interface.as_str()) {
                // The kernel without the qdisc module: ENOENT.
                return Err(cause(std::io::Error::from_raw_os_error(2)));
            }
            self.in_place
                .lock()
                .unwrap()
                .insert(ceiling.interface.clone(), (ceiling.rate.get(), ceiling.mechanism));
            if ceiling.ingress == IngressPolicy::Police {
                self.policed.lock().unwrap().push(ceiling.interface.clone());
            }
            Ok(())
        })
    }

    fn remove<'a>(
        &'a self,
        _netns: &'a Path,
        _pod_uid: &'a str,
        ceiling: &'a InterfaceCeiling,
    ) -> CeilingFuture<'a> {
        Box::pin(async move {
            self.calls.lock().unwrap().push(format!("remove {}", ceiling.interface));
            self.in_place.lock().unwrap().remove(&ceiling.interface);
            Ok(())
        })
    }
}

fn limited(address: &str, limit: &str) -> serde_json::Value {
    json!({"mode": "macvlan", "ipam": {"addresses": [address]}, "bandwidth": {"limit": limit}})
}

fn with_ceilings(world: &World, support: CeilingSupport) -> (Service, Arc<FakeCeilings>) {
    let port = Arc::new(FakeCeilings {
        kernel: Some(Arc::clone(&world.kernel)),
        ..FakeCeilings::default()
    });
    let service = world.service().with_ceilings(Arc::clone(&port) as Arc<dyn CeilingPort>, support);
    (service, port)
}

fn container() -> Container {
    Container { name: "app".into(), ..Container::default() }
}

/// `data.bandwidth` of the first entry of claim `name`.
fn bandwidth_status(world: &World, name: &str) -> serde_json::Value {
    let entries = world.status.last(name);
    entries[0].data.as_ref().unwrap().0["bandwidth"].clone()
}

#[tokio::test]
async fn the_ceiling_is_in_place_before_the_first_container_and_once() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", limited("10.0.1.5/24", "100M"))]));
    let (service, port) = with_ceilings(&world, CeilingSupport::default());
    run(&service, world.pod("p1")).await.unwrap();
    assert!(port.calls.lock().unwrap().is_empty(), "the sandbox's attach does no ceiling work");
    assert_eq!(
        bandwidth_status(&world, "a"),
        json!({"ceiling": "100M", "source": "bandwidth.limit", "mechanism": "tbf", "ingress": "none"})
    );

    service.create_container(world.pod("p1"), container()).await.unwrap();
    assert_eq!(
        *port.in_place.lock().unwrap(),
        BTreeMap::from([("net1".to_owned(), (100_000_000, CeilingMechanism::Tbf))])
    );
    service.create_container(world.pod("p1"), container()).await.unwrap();
    assert_eq!(port.calls.lock().unwrap().len(), 1, "a later container costs no kernel call");
}

#[tokio::test]
async fn a_node_with_fq_and_pacing_uses_edt() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", limited("10.0.1.5/24", "2G"))]));
    let (service, port) = with_ceilings(&world, CeilingSupport { fq: true, pacing: true });
    run(&service, world.pod("p1")).await.unwrap();
    assert_eq!(bandwidth_status(&world, "a")["mechanism"], "edt-fq");
    service.create_container(world.pod("p1"), container()).await.unwrap();
    assert_eq!(port.in_place.lock().unwrap()["net1"], (2_000_000_000, CeilingMechanism::EdtFq));
}

#[tokio::test]
async fn a_ceiling_that_cannot_be_set_refuses_the_container_and_leaves_nothing() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", limited("10.0.1.5/24", "100M"))]));
    world.add_claim(claim("b", "p1", &[("nic", "eth1", limited("10.0.1.6/24", "300M"))]));
    let (service, port) = with_ceilings(&world, CeilingSupport::default());
    run(&service, world.pod("p1")).await.unwrap();
    *port.fail_on.lock().unwrap() = Some("net2".to_owned());

    let err = service.create_container(world.pod("p1"), container()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("container app")
            && text.contains("bandwidth ceiling 300M")
            && text.contains("(tbf) on net2"),
        "{text}"
    );
    assert!(port.in_place.lock().unwrap().is_empty(), "net1's ceiling was taken back");
    assert_eq!(*port.calls.lock().unwrap(), ["apply net1", "apply net2", "remove net1"]);
    let metrics = world.metrics.encode();
    assert!(
        metrics.contains(r#"netclaim_nri_events_total{event="CreateContainer",result="error"} 1"#),
        "{metrics}"
    );

    // The kubelet's retry, once the kernel takes it, puts both in place.
    *port.fail_on.lock().unwrap() = None;
    service.create_container(world.pod("p1"), container()).await.unwrap();
    assert_eq!(port.in_place.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_daemon_without_ceiling_enforcement_refuses_a_ceiling_and_passes_the_rest() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", limited("10.0.1.5/24", "100M"))]));
    // The fake kernel has one pod netns: the second pod's interface needs its own name.
    let plain = json!({"mode": "macvlan", "interface": {"name": "net9"}, "ipam": {"addresses": ["10.0.2.5/24"]}});
    world.add_claim(claim("b", "p2", &[("nic", "eth1", plain)]));
    let service = world.service();
    run(&service, world.pod("p1")).await.unwrap();
    run(&service, world.pod("p2")).await.unwrap();
    let err = service.create_container(world.pod("p1"), container()).await.unwrap_err();
    assert!(err.to_string().contains("no ceiling enforcement"), "{err}");
    service.create_container(world.pod("p2"), container()).await.unwrap();
    assert!(world.status.last("b")[0].data.as_ref().unwrap().0.get("bandwidth").is_none());
}

#[tokio::test]
async fn a_pod_re_created_in_a_new_netns_gets_its_ceiling_again() {
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", limited("10.0.1.5/24", "100M"))]));
    let (service, port) = with_ceilings(&world, CeilingSupport::default());
    run(&service, world.pod("p1")).await.unwrap();
    service.create_container(world.pod("p1"), container()).await.unwrap();
    let mut again = world.pod("p1");
    again.id = "sandbox-p1-second".to_owned();
    again.netns_path = Some(PathBuf::from("/run/netns/p1-second"));
    world.netns.lock().unwrap().insert(PathBuf::from("/run/netns/p1-second"));
    run(&service, again.clone()).await.unwrap();
    service.create_container(again, container()).await.unwrap();
    let applies = port.calls.lock().unwrap().iter().filter(|c| c.starts_with("apply")).count();
    assert_eq!(applies, 2, "the new sandbox's interface is a new interface");
}

/// What the node offers decides the mechanism, the same in `data.bandwidth` and at the gate:
/// `fq` and the programs → edt-fq; either missing → tbf.
#[tokio::test]
async fn the_mechanism_follows_fq_and_the_programs() {
    for (fq, pacing, expected) in [
        (true, true, CeilingMechanism::EdtFq),
        (false, true, CeilingMechanism::Tbf),
        (true, false, CeilingMechanism::Tbf),
        (false, false, CeilingMechanism::Tbf),
    ] {
        let world = World::new();
        world.add_claim(claim("a", "p1", &[("nic", "eth1", limited("10.0.1.5/24", "300M"))]));
        let (service, port) = with_ceilings(&world, CeilingSupport { fq, pacing });
        run(&service, world.pod("p1")).await.unwrap();
        assert_eq!(bandwidth_status(&world, "a")["mechanism"], expected.as_str(), "{fq} {pacing}");
        service.create_container(world.pod("p1"), container()).await.unwrap();
        assert_eq!(port.in_place.lock().unwrap()["net1"], (300_000_000, expected));
    }
}

/// `bandwidth.ingress: police` needs the programs: without them the gate refuses the
/// container naming the field, before any kernel work; with them (tbf egress, no fq) the
/// policer goes to the port with the ceiling.
#[tokio::test]
async fn police_without_the_programs_is_refused_at_the_gate_naming_the_field() {
    let policed = json!({"mode": "macvlan", "ipam": {"addresses": ["10.0.1.5/24"]},
        "bandwidth": {"limit": "100M", "ingress": "police"}});
    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", policed.clone())]));
    let (service, port) = with_ceilings(&world, CeilingSupport { fq: true, pacing: false });
    run(&service, world.pod("p1")).await.unwrap();
    let err = service.create_container(world.pod("p1"), container()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("bandwidth.ingress: police on net1") && text.contains("cannot police"),
        "{text}"
    );
    assert!(port.calls.lock().unwrap().is_empty(), "no kernel work for a refused pod");

    let world = World::new();
    world.add_claim(claim("a", "p1", &[("nic", "eth1", policed)]));
    let (service, port) = with_ceilings(&world, CeilingSupport { fq: false, pacing: true });
    run(&service, world.pod("p1")).await.unwrap();
    assert_eq!(
        bandwidth_status(&world, "a"),
        json!({"ceiling": "100M", "source": "bandwidth.limit", "mechanism": "tbf", "ingress": "police"})
    );
    service.create_container(world.pod("p1"), container()).await.unwrap();
    assert_eq!(port.in_place.lock().unwrap()["net1"], (100_000_000, CeilingMechanism::Tbf));
    assert_eq!(*port.policed.lock().unwrap(), ["net1"]);
}
