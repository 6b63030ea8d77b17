//! Mode `vfio` refused for a VF whose IOMMU group holds other functions (issue 33 item 5):
//! the guest's first igb sits behind a root port without ACS (`vmtests/run.sh`
//! `NETCLAIM_VM_IOMMU=shared`, QEMU's `disable-acs=on`), so the kernel puts the PF and its
//! VFs in one group. The prepare names the group and the other functions, and nothing moves.
//!
//! Runs only inside the VM (`NETCLAIM_VM=1`); nextest leaves the binary out.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::sync::Arc;

use serde_json::json;

use crate::kit::testing::claims::MapClaims;
use crate::kit::vm::{Vfs, require_vm};
use crate::vm_vfio::{
    device_name, dirs, driver, group, modprobe_vfio_pci, prepare, put_claim, service,
};

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn a_vf_sharing_its_iommu_group_is_refused_naming_the_group_and_the_others() {
    require_vm("a_vf_sharing_its_iommu_group_is_refused_naming_the_group_and_the_others");
    let vfs = Vfs::create(2);
    let pci = vfs.pci[0].clone();
    let pf_pci = std::fs::read_link(format!("/sys/class/net/{}/device", vfs.pf)).unwrap();
    let pf_pci = pf_pci.file_name().unwrap().to_string_lossy().into_owned();
    let group = group(&pci);
    assert_eq!(self::group(&pf_pci), group, "the PF shares the VF's group without ACS");
    modprobe_vfio_pci();
    let claims = Arc::new(MapClaims::default());
    let dirs = dirs();
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let service = service(&claims, &dirs);
        let claim = put_claim(&claims, "shared", &device_name(&pci), json!({}));
        let err = prepare(&service, &claim).await.unwrap_err();
        println!("refused: {err}");
        assert!(err.contains(&format!("IOMMU group {group} of {pci} also holds")), "{err}");
        assert!(err.contains(&pf_pci) && err.contains(&vfs.pci[1]), "names the others: {err}");
        assert_eq!(driver(&pci).as_deref(), Some("igbvf"), "nothing moved");
        assert!(service.vfio_bindings().is_empty());
    });
    drop(vfs);
}
