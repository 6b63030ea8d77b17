//! Ceilings of exclusive devices (issue 35): a VF's ceiling is its hardware `max_tx_rate`,
//! set through the PF with its other settings before the move, so the `CreateContainer` gate
//! puts no qdisc on it and the claim status says `vf-max-tx-rate`; a whole NIC (host-device)
//! has no hardware rate of its own and gets the qdisc the node chooses, like a shared child.

use std::collections::BTreeMap;

use super::*;
use crate::attach::bandwidth::{
    CeilingFuture, CeilingMechanism, CeilingPort, CeilingSupport, InterfaceCeiling,
};

/// Records each ceiling asked of the kernel, by interface.
#[derive(Default)]
struct RecordedCeilings {
    applied: Mutex<BTreeMap<String, (u64, CeilingMechanism)>>,
}

impl CeilingPort for RecordedCeilings {
    fn apply<'a>(
        &'a self,
        _netns: &'a Path,
        _pod_uid: &'a str,
        ceiling: &'a InterfaceCeiling,
    ) -> CeilingFuture<'a> {
        Box::pin(async move {
            self.applied
                .lock()
                .unwrap()
                .insert(ceiling.interface.clone(), (ceiling.rate.get(), ceiling.mechanism));
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
            self.applied.lock().unwrap().remove(&ceiling.interface);
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_vfs_ceiling_is_its_max_tx_rate_and_a_whole_nics_is_the_gates_qdisc() {
    let world = World::new();
    world.kernel.add_host_link("eth9v1", 1500, None);
    *world.claims.kernel.lock().unwrap() = Some(Arc::clone(&world.kernel));
    let config = json!({"mode": "host-device", "interface": {"name": "vf0"},
        "bandwidth": {"limit": "300M"}});
    let mut vf_claim = claim("vf", "p1", &[("vf", "eth9v1", config)]);
    vf_claim.devices[0].config.mode = crate::model::network_config::ResolvedMode::SriovVf;
    vf_claim.devices[0].kind = Some(DeviceKind::SriovVf);
    world.add_claim(vf_claim);
    let nic = json!({"mode": "host-device", "interface": {"name": "nic0"},
        "bandwidth": {"limit": "500M"}});
    world.add_claim(claim("nic", "p1", &[("nic", "eth1", nic)]));
    let port = Arc::new(RecordedCeilings::default());
    let support = CeilingSupport { fq: false, pacing: false };
    let service = world.service().with_ceilings(Arc::clone(&port) as Arc<dyn CeilingPort>, support);
    run(&service, world.pod("p1")).await.unwrap();
    let status =
        |name: &str| world.status.last(name)[0].data.as_ref().unwrap().0["bandwidth"].clone();
    assert_eq!(
        status("vf"),
        json!({"ceiling": "300M", "source": "bandwidth.limit", "mechanism": "vf-max-tx-rate",
            "ingress": "none"})
    );
    assert_eq!(status("nic")["mechanism"], "tbf");

    service.create_container(world.pod("p1"), container()).await.unwrap();
    assert_eq!(
        *port.applied.lock().unwrap(),
        BTreeMap::from([("nic0".to_owned(), (500_000_000, CeilingMechanism::Tbf))]),
        "the VF's rate was set on its PF before the move: no qdisc on vf0"
    );
}

fn container() -> Container {
    Container { name: "app".into(), ..Container::default() }
}
