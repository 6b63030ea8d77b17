//! The VM tier: the suites that need a kernel with ipvlan, 8021q and SR-IOV NICs, run inside
//! a QEMU guest by `vmtests/` (`make vmtest`, decision 0012), one module per suite. Their
//! tests fail outside the VM; nextest leaves this binary out (`.config/nextest.toml`) and
//! `vmtests/guest.sh` runs each suite in a process of its own, in the order of `VM_TESTS`.

use netclaim_testkit as kit;

mod vm_attach_bench;
mod vm_bandwidth;
mod vm_daemon;
mod vm_ethtool;
mod vm_ipvlan;
mod vm_kernel;
mod vm_pf_move;
mod vm_rdma;
mod vm_rdma_pod;
mod vm_reboot;
mod vm_routing;
mod vm_sriov;
mod vm_stats;
mod vm_vfio;
mod vm_vfio_acs;
mod vm_vlan;
