//! Mode `vfio` through the claim service, on a fake of the sysfs port: the binding is
//! durable before the first sysfs write, the function bound and its CDI spec written at
//! prepare, given back (after the VF settings) at unprepare; what cannot be bound is refused
//! naming the fact and holds nothing; a prepare or an unprepare cut short (the daemon killed:
//! the future dropped mid-step, the service loaded again from its state dir) is completed at
//! start.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;

use futures::FutureExt as _;
use futures::future::BoxFuture;

use super::*;
use crate::cdi::LocalFiles;
use crate::claims::metadata::{DeviceMetadata, MetadataLayout};
use crate::claims::vf::tests::{FAKE_PF_VF, FakePf, fresh};
use crate::claims::vfio::{VFIO_PCI, VfioBindingStore, VfioPort, VfioPortError, VfioTarget};
use crate::model::device::{AttributeValue, PciAddress};

const UID: &str = "uid-dpdk";
const GROUP: u32 = 12;

/// The kernel's side of one function as the fake sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Function {
    driver: Option<String>,
    netdev: bool,
    group: Option<u32>,
    peers: Vec<PciAddress>,
}

/// A fake of the sysfs port: one function (the VF `eth9v1` at [`FAKE_PF_VF`]) on `igbvf`.
#[derive(Default)]
struct FakeVfio {
    function: Mutex<Option<Function>>,
    vfio_pci_loaded: Mutex<bool>,
    /// The calls, in order: `bind` and `rebind <driver>`.
    calls: Mutex<Vec<String>>,
    /// A bind or rebind that never ends once it unbound the function (the daemon killed
    /// mid-step when the test drops the future).
    hang: Mutex<bool>,
    /// The store, to check the binding is durable when a sysfs step starts.
    store: Mutex<Option<Arc<Store>>>,
    boot: Mutex<String>,
}

impl FakeVfio {
    fn new() -> Arc<Self> {
        let fake = Self::default();
        *fake.function.lock().unwrap() = Some(Function {
            driver: Some("igbvf".into()),
            netdev: true,
            group: Some(GROUP),
            peers: Vec::new(),
        });
        *fake.vfio_pci_loaded.lock().unwrap() = true;
        *fake.boot.lock().unwrap() = "boot-0".into();
        Arc::new(fake)
    }

    fn function(&self) -> Function {
        self.function.lock().unwrap().clone().unwrap()
    }

    fn edit(&self, change: impl FnOnce(&mut Function)) {
        change(self.function.lock().unwrap().as_mut().unwrap());
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn durable(&self) -> bool {
        let store = self.store.lock().unwrap().clone().expect("the test hands the store over");
        store.load_vfio_bindings().unwrap().iter().any(|b| b.pci == FAKE_PF_VF)
    }
}

impl VfioPort for FakeVfio {
    fn inspect(&self, pci: PciAddress) -> BoxFuture<'_, Result<Option<VfioTarget>, VfioPortError>> {
        let target = (pci == FAKE_PF_VF).then(|| {
            let f = self.function();
            VfioTarget {
                driver: f.driver,
                group: f.group,
                group_peers: f.peers,
                vfio_pci_loaded: *self.vfio_pci_loaded.lock().unwrap(),
                netdev: f.netdev.then(|| "eth9v1".to_owned()),
                enabled_vfs: 0,
            }
        });
        async move { Ok(target) }.boxed()
    }

    fn bind(&self, pci: PciAddress, group: u32) -> BoxFuture<'_, Result<(), VfioPortError>> {
        assert_eq!((pci, group), (FAKE_PF_VF, GROUP));
        assert!(self.durable(), "the binding is durable before the first sysfs write");
        self.calls.lock().unwrap().push("bind".into());
        self.edit(|f| (f.driver, f.netdev) = (None, false));
        let hang = *self.hang.lock().unwrap();
        async move {
            if hang {
                futures::future::pending::<()>().await;
            }
            self.edit(|f| f.driver = Some(VFIO_PCI.into()));
            Ok(())
        }
        .boxed()
    }

    fn rebind<'a>(
        &'a self,
        pci: PciAddress,
        driver: Option<&'a str>,
        netdev: bool,
    ) -> BoxFuture<'a, Result<(), VfioPortError>> {
        assert_eq!(pci, FAKE_PF_VF);
        assert!(self.durable(), "the binding stays durable until the function is back");
        self.calls.lock().unwrap().push(format!("rebind {}", driver.unwrap_or("none")));
        self.edit(|f| f.driver = None);
        let hang = *self.hang.lock().unwrap();
        async move {
            if hang {
                futures::future::pending::<()>().await;
            }
            self.edit(|f| (f.driver, f.netdev) = (driver.map(str::to_owned), netdev));
            Ok(())
        }
        .boxed()
    }

    fn boot_id(&self) -> Result<String, VfioPortError> {
        Ok(self.boot.lock().unwrap().clone())
    }
}

/// The state dir, kubelet's plugin dir and the CDI dir of one test.
struct Dirs {
    _temp: tempfile::TempDir,
    state: PathBuf,
    plugin: PathBuf,
    cdi: PathBuf,
}

fn dirs() -> Dirs {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().to_owned();
    Dirs {
        state: root.join("state"),
        plugin: root.join("plugin"),
        cdi: root.join("cdi"),
        _temp: temp,
    }
}

/// `eth9v1` (VF 1 of `eth9`) published with its PCI address, and `veth1` without one.
fn devices() -> FixedDevices {
    let mut vf = if_name_attribute("eth9v1");
    vf.insert("netclaim.dev/pfName".into(), AttributeValue::String("eth9".into()));
    vf.insert("netclaim.dev/vfIndex".into(), AttributeValue::Int(1));
    vf.insert("netclaim.dev/pciAddress".into(), AttributeValue::String(FAKE_PF_VF.to_string()));
    FixedDevices::new().device("eth9v1", physical_nic("eth9v1").vf(9000), vf).device(
        "eth1",
        physical_nic("eth1"),
        if_name_attribute("eth1"),
    )
}

type VfioService = ClaimService<Arc<MapClaims>, FixedDevices, Arc<Store>>;

/// The service on `dirs` with device metadata (CDI), the fake PF and `fake`.
fn vfio_service(
    api: &Arc<MapClaims>,
    dirs: &Dirs,
    pf: &Arc<FakePf>,
    fake: &Arc<FakeVfio>,
) -> VfioService {
    // The fake's handle of an earlier service's store goes first (the state dir is locked).
    *fake.store.lock().unwrap() = None;
    let store = Arc::new(Store::open(&dirs.state).unwrap());
    *fake.store.lock().unwrap() = Some(Arc::clone(&store));
    let layout = MetadataLayout::new(DRIVER, &dirs.plugin, &dirs.cdi);
    let metadata = Arc::new(DeviceMetadata::new(layout, LocalFiles));
    ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        Arc::clone(api),
        devices(),
        store,
    )
    .unwrap()
    .with_metadata(metadata)
    .unwrap()
    .with_vf_port(Arc::clone(pf) as Arc<dyn crate::claims::vf::VfPort>)
    .with_vfio_port(Arc::clone(fake) as Arc<dyn VfioPort>)
}

fn vfio_claim(device: &str, body: Value) -> ResourceClaim {
    let mut body = body;
    body["mode"] = json!("vfio");
    claim(
        "dpdk",
        UID,
        vec![result("nic", DRIVER, NODE, device)],
        vec![config("FromClaim", DRIVER, &[], params(body))],
    )
}

fn spec_path(dirs: &Dirs) -> std::path::PathBuf {
    dirs.cdi.join(format!("{DRIVER}_vfio_{UID}.json"))
}

#[tokio::test]
async fn a_vf_is_bound_with_its_vf_settings_and_its_cdi_spec_and_given_back_in_order() {
    let (api, dirs, fake) = (Arc::new(MapClaims::default()), dirs(), FakeVfio::new());
    let pf = Arc::new(FakePf::new(fresh()));
    api.put(vfio_claim("eth9v1", json!({"vlan": 100, "sriov": {"trust": true}})));
    let service = vfio_service(&api, &dirs, &pf, &fake);
    let mut bound = service.vfio_bound();
    let answer = prepare_one(&service, &reference("dpdk", UID)).await.unwrap();
    assert_eq!(fake.calls(), ["bind"]);
    assert_eq!(fake.function().driver.as_deref(), Some(VFIO_PCI));
    assert_eq!((pf.state().vlan, pf.state().trust), (100, Some(true)), "VF settings on the PF");
    let device = &service.prepared(UID).unwrap().devices[0];
    assert_eq!(
        device.vfio,
        Some(crate::claims::vfio::PreparedVfio { pci: FAKE_PF_VF, group: GROUP })
    );
    let id = format!("{DRIVER}/vfio={UID}_eth9v1");
    assert!(answer[0].cdi_device_ids.contains(&id), "{:?}", answer[0].cdi_device_ids);
    let spec: Value = serde_json::from_slice(&std::fs::read(spec_path(&dirs)).unwrap()).unwrap();
    assert_eq!(spec["kind"], format!("{DRIVER}/vfio"));
    assert_eq!(spec["devices"][0]["name"], format!("{UID}_eth9v1"));
    assert_eq!(
        spec["devices"][0]["containerEdits"]["deviceNodes"],
        json!([{"path": "/dev/vfio/vfio"}, {"path": format!("/dev/vfio/{GROUP}")}])
    );
    assert!(bound.has_changed().unwrap());
    assert_eq!(*bound.borrow_and_update(), BTreeSet::from(["eth9v1".to_owned()]), "kept published");
    // The attach sees no interface to make.
    assert!(crate::claims::vfio::with_interfaces(service.all_prepared()).is_empty());

    // A restart keeps it bound; unprepare sets the VF back, then gives it back.
    drop(service);
    let service = vfio_service(&api, &dirs, &pf, &fake);
    assert_eq!(service.restore_vfio_bindings().await.unwrap(), 0);
    assert_eq!(fake.calls(), ["bind"], "nothing to complete");
    assert!(service.unprepare(vec![reference("dpdk", UID)]).await[UID].is_ok());
    assert_eq!(fake.calls(), ["bind", "rebind igbvf"]);
    assert_eq!(
        fake.function(),
        Function { driver: Some("igbvf".into()), netdev: true, group: Some(GROUP), peers: vec![] }
    );
    assert_eq!(pf.state(), fresh(), "VF settings set back");
    assert!(service.vfio_bindings().is_empty());
    assert!(!spec_path(&dirs).exists(), "the CDI spec is removed");
    assert!(service.vfio_bound().borrow().is_empty());
}

/// How a refusal case prepares the fake function.
type Setup = dyn Fn(&FakeVfio);

#[tokio::test]
async fn what_cannot_be_bound_is_refused_naming_the_fact_and_holds_nothing() {
    let peer: PciAddress = "0000:09:00.3".parse().unwrap();
    let cases: [(&str, Box<Setup>, &str); 5] = [
        (
            "eth9v1",
            Box::new(move |f: &FakeVfio| f.edit(|f| f.peers = vec![peer])),
            "mode \"vfio\": IOMMU group 12 of 0000:09:00.1 also holds 0000:09:00.3: vfio hands",
        ),
        ("eth9v1", Box::new(|f: &FakeVfio| f.edit(|f| f.group = None)), "intel_iommu=on"),
        (
            "eth9v1",
            Box::new(|f: &FakeVfio| *f.vfio_pci_loaded.lock().unwrap() = false),
            "run modprobe vfio-pci",
        ),
        (
            "eth9v1",
            Box::new(|f: &FakeVfio| f.edit(|f| f.driver = Some(VFIO_PCI.into()))),
            "already bound to vfio-pci, not by this driver",
        ),
        ("eth1", Box::new(|_: &FakeVfio| {}), "only a PCI function can be bound to vfio-pci"),
    ];
    for (device, setup, message) in cases {
        let (api, dirs, fake) = (Arc::new(MapClaims::default()), dirs(), FakeVfio::new());
        let pf = Arc::new(FakePf::new(fresh()));
        setup(&fake);
        let before = fake.function();
        api.put(vfio_claim(device, json!({})));
        let service = vfio_service(&api, &dirs, &pf, &fake);
        let err = prepare_one(&service, &reference("dpdk", UID)).await.unwrap_err();
        assert!(err.contains(message), "{message:?} missing in {err}");
        assert!(err.contains("request nic, device"), "{err}");
        assert!(fake.calls().is_empty(), "no sysfs write: {:?}", fake.calls());
        assert_eq!(fake.function(), before);
        assert_eq!(pf.state(), fresh(), "VF settings set back");
        assert!(service.prepared(UID).is_none());
        assert!(service.vfio_bindings().is_empty());
        drop(service);
        *fake.store.lock().unwrap() = None;
        let store = Arc::new(Store::open(&dirs.state).unwrap());
        assert!(store.load_vfio_bindings().unwrap().is_empty(), "no record");
        assert!(!spec_path(&dirs).exists());
    }
}

#[tokio::test]
async fn a_prepare_killed_mid_bind_is_given_back_at_start() {
    let (api, dirs, fake) = (Arc::new(MapClaims::default()), dirs(), FakeVfio::new());
    let pf = Arc::new(FakePf::new(fresh()));
    api.put(vfio_claim("eth9v1", json!({"sriov": {"spoofCheck": false}})));
    *fake.hang.lock().unwrap() = true;
    let service = vfio_service(&api, &dirs, &pf, &fake);
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        prepare_one(&service, &reference("dpdk", UID)),
    )
    .await;
    assert!(cut.is_err(), "the bind hangs: the prepare is cut there");
    // Killed: the function is off igbvf and not on vfio-pci, the VF's settings changed.
    assert_eq!(fake.function().driver, None);
    assert_eq!(pf.state().spoof_check, Some(false));
    drop(service);

    *fake.hang.lock().unwrap() = false;
    let service = vfio_service(&api, &dirs, &pf, &fake);
    service.restore_unrecorded_vfs().await.unwrap();
    assert_eq!(service.restore_vfio_bindings().await.unwrap(), 1);
    assert_eq!(fake.calls(), ["bind", "rebind igbvf"]);
    assert_eq!(fake.function().driver.as_deref(), Some("igbvf"));
    assert!(fake.function().netdev, "its netdev is back");
    assert_eq!(pf.state(), fresh(), "the VF settings of the cut prepare are set back");
    assert!(service.vfio_bindings().is_empty(), "record removed");
    // kubelet's repeated prepare starts afresh.
    prepare_one(&service, &reference("dpdk", UID)).await.unwrap();
    assert_eq!(fake.function().driver.as_deref(), Some(VFIO_PCI));
}

#[tokio::test]
async fn an_unprepare_killed_mid_rebind_is_completed_at_start() {
    let (api, dirs, fake) = (Arc::new(MapClaims::default()), dirs(), FakeVfio::new());
    let pf = Arc::new(FakePf::new(fresh()));
    api.put(vfio_claim("eth9v1", json!({})));
    let service = vfio_service(&api, &dirs, &pf, &fake);
    prepare_one(&service, &reference("dpdk", UID)).await.unwrap();
    *fake.hang.lock().unwrap() = true;
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        service.unprepare(vec![reference("dpdk", UID)]),
    )
    .await;
    assert!(cut.is_err(), "the rebind hangs: the unprepare is cut there");
    assert_eq!(fake.function().driver, None, "off vfio-pci, not on igbvf");
    drop(service);

    *fake.hang.lock().unwrap() = false;
    let service = vfio_service(&api, &dirs, &pf, &fake);
    assert!(service.prepared(UID).is_some(), "the claim's record is still there");
    assert_eq!(service.restore_vfio_bindings().await.unwrap(), 1, "the releasing one is completed");
    assert_eq!(fake.function().driver.as_deref(), Some("igbvf"));
    // kubelet's retry of the unprepare finds nothing left to give back.
    assert!(service.unprepare(vec![reference("dpdk", UID)]).await[UID].is_ok());
    assert_eq!(fake.calls(), ["bind", "rebind igbvf", "rebind igbvf"]);
    assert!(service.prepared(UID).is_none());
}

#[tokio::test]
async fn after_a_reboot_a_prepared_claims_function_is_bound_again() {
    let (api, dirs, fake) = (Arc::new(MapClaims::default()), dirs(), FakeVfio::new());
    let pf = Arc::new(FakePf::new(fresh()));
    api.put(vfio_claim("eth9v1", json!({})));
    let service = vfio_service(&api, &dirs, &pf, &fake);
    prepare_one(&service, &reference("dpdk", UID)).await.unwrap();
    drop(service);
    // The reboot: a new boot id, the function on its boot driver, the CDI dir emptied.
    *fake.boot.lock().unwrap() = "boot-1".into();
    fake.edit(|f| (f.driver, f.netdev) = (Some("igbvf".into()), true));
    std::fs::remove_file(spec_path(&dirs)).unwrap();
    let service = vfio_service(&api, &dirs, &pf, &fake);
    assert_eq!(service.restore_vfio_bindings().await.unwrap(), 0);
    assert_eq!(fake.calls(), ["bind", "bind"]);
    assert_eq!(fake.function().driver.as_deref(), Some(VFIO_PCI));
    assert_eq!(service.vfio_bindings()[0].boot_id, "boot-1");
    assert!(spec_path(&dirs).exists(), "the CDI spec is written again");
    // Given back to the boot's driver at unprepare.
    assert!(service.unprepare(vec![reference("dpdk", UID)]).await[UID].is_ok());
    assert_eq!(fake.function().driver.as_deref(), Some("igbvf"));
}

#[tokio::test]
async fn a_leftover_cdi_spec_of_no_claim_is_removed_at_start() {
    let (api, dirs, fake) = (Arc::new(MapClaims::default()), dirs(), FakeVfio::new());
    let pf = Arc::new(FakePf::new(fresh()));
    std::fs::create_dir_all(&dirs.cdi).unwrap();
    let stale = dirs.cdi.join(format!("{DRIVER}_vfio_gone-uid.json"));
    let other = dirs.cdi.join("vendor.com_gpu.json");
    std::fs::write(&stale, "{}").unwrap();
    std::fs::write(&other, "{}").unwrap();
    let service = vfio_service(&api, &dirs, &pf, &fake);
    service.restore_vfio_bindings().await.unwrap();
    assert!(!stale.exists());
    assert!(other.exists(), "another driver's spec is not ours");
}
