#!/usr/bin/env bash
# Boots one Debian kernel under QEMU TCG with virtme-ng (the host's root file system shared
# read-only, /tmp a writable overlay), with two emulated Intel 82576 NICs (QEMU `igb`: a PF
# with SR-IOV, driver igb, VFs driver igbvf), and runs host-built test binaries inside as root
# (vmtests/guest.sh). The guest's output comes back on stdout and in the log; the exit status
# is the guest's (0 only when every binary passed).
#
# Usage: vmtests/run.sh <6.1|6.12> <test binary>[::<suite>] [<test binary>[::<suite>]...]
#   (what build.sh prints: the `vm` test binary and the suite, a module of tests/vm/, to run)
#   NETCLAIM_VM_PREFIX  where vmtests/install.sh put QEMU, virtme-ng and the kernels
#                       (default /opt/netclaim-vm)
#   NETCLAIM_VM_LOG     the log file (default target/vmtests/<kernel>.log)
#   NETCLAIM_VM_TIMEOUT seconds before the VM is killed (default 600)
#   NETCLAIM_VM_BENCH_ROUNDS  passed into the guest: rounds of tests/vm/vm_attach_bench.rs
#                       (default 10, what CI runs)
#   NETCLAIM_RELEASE_BIN  a release build of netclaim (`make test` sets it): passed into the
#                       guest as NETCLAIM_VM_DAEMON_BIN, the daemon tests/vm/vm_daemon.rs runs
#   NETCLAIM_VM_SHARE   a host directory mounted writable in the guest at the same path
#                       (virtme-ng's --rwdir, 9p), passed into the guest: what survives a
#                       reboot in tests/vm/vm_reboot.rs (the guest's /tmp dies with the boot)
#   NETCLAIM_VM_REBOOT_PHASE  passed into the guest: which boot of vm_reboot this is (1, 2)
#   NETCLAIM_VM_IOMMU   an emulated Intel IOMMU for the vfio suites (guests.sh sets it from
#                       the guest's suites): `isolated` (each igb and each VF in an IOMMU group
#                       of its own) or `shared` (the first igb's root port without ACS, so its
#                       PF and VFs share one group); the guest boots with intel_iommu=on and
#                       sees it as NETCLAIM_VM_IOMMU
set -euo pipefail

PREFIX="${NETCLAIM_VM_PREFIX:-/opt/netclaim-vm}"
HERE="$(cd "$(dirname "$0")" && pwd)"
if [[ $# -lt 2 ]]; then
    echo "usage: $0 <6.1|6.12> <test binary>[::<suite>]..." >&2
    exit 2
fi
kernel=$1
shift
kdir="$PREFIX/kernel-$kernel"
if [[ ! -f $kdir/release ]]; then
    echo "no kernel $kernel under $PREFIX: run vmtests/install.sh first" >&2
    exit 2
fi
release=$(cat "$kdir/release")
binaries=()
for binary in "$@"; do
    # The guest sees the host's root file system: absolute paths resolve the same there.
    suite=""
    if [[ $binary == *::* ]]; then
        suite="::${binary#*::}"
        binary=${binary%%::*}
    fi
    binaries+=("$(realpath "$binary")$suite")
done
log="${NETCLAIM_VM_LOG:-$HERE/../target/vmtests/$kernel.log}"
mkdir -p "$(dirname "$log")"

# Each igb sits behind a PCIe root port of its own: its VFs take device numbers on the PF's
# bus (VF offset 0x80, stride 2), and two PFs on the root bus would claim the same slots. q35
# is the PCIe machine (with `pc` the PF has no sriov_totalvfs); user networking with
# `restrict=on` keeps the guest off any outside network; `ipv6=off`: otherwise QEMU's user
# network sends router advertisements (prefix fec0::/64), and a PF that is up gets a global
# address and a default route some seconds later, which correctly keeps it off the published
# devices (a node address) and failed the SR-IOV facts test whenever the RA came first;
# `romfile=` skips the boot ROM.
# Multi-threaded TCG (a host thread per vCPU), QEMU's default. QEMU 10.0 aborted once under
# it in the SR-IOV suite on 6.12 (`iotlb_to_section: Assertion 'section_index <
# d->map.sections_nb' failed`: a vCPU racing a memory-map update as VF BARs moved);
# after-nextest.sh retries a guest that never reported its end. Single-threaded TCG
# (NETCLAIM_VM_TCG_THREAD=single) ran both kernels at once in half the time, but changed
# timings enough to fail two igb tests on 6.1 (a VF's address read right after the attach,
# and a VF's rename racing udev), so it is not the default.
accel="-accel tcg,thread=${NETCLAIM_VM_TCG_THREAD:-multi}"
rp0_opts=""
iommu="" append=()
case ${NETCLAIM_VM_IOMMU:-} in
    "") ;;
    isolated | shared)
        # QEMU's VT-d, placed before the PCI devices it translates for; interrupt remapping
        # on (the kernel wants it for x2APIC and vfio's MSI). With KVM it needs the split
        # irqchip (`kernel-irqchip=on` is refused); under TCG the option is accepted and
        # changes nothing, and it keeps the line right should these guests ever get KVM.
        iommu="-machine kernel-irqchip=split -device intel-iommu,intremap=on"
        append=(--append "intel_iommu=on")
        # Without ACS on the root port the kernel cannot isolate what sits below it: the
        # PF and its VFs land in one IOMMU group (pci_device_group, drivers/iommu/iommu.c).
        [[ $NETCLAIM_VM_IOMMU == shared ]] && rp0_opts=",disable-acs=on"
        ;;
    *)
        echo "NETCLAIM_VM_IOMMU: isolated or shared, not $NETCLAIM_VM_IOMMU" >&2
        exit 2
        ;;
esac
nics="-device pcie-root-port,id=rp0,bus=pcie.0,chassis=1,slot=1$rp0_opts"
nics+=" -device pcie-root-port,id=rp1,bus=pcie.0,chassis=2,slot=2"
nics+=" -netdev user,id=n0,restrict=on,ipv6=off -device igb,netdev=n0,bus=rp0,romfile="
nics+=" -netdev user,id=n1,restrict=on,ipv6=off -device igb,netdev=n1,bus=rp1,romfile="

# The guest gets only what the command line sets.
guest_env=""
if [[ -n ${NETCLAIM_VM_BENCH_ROUNDS:-} ]]; then
    guest_env+="NETCLAIM_VM_BENCH_ROUNDS=$NETCLAIM_VM_BENCH_ROUNDS "
fi
if [[ -n ${NETCLAIM_RELEASE_BIN:-} ]]; then
    guest_env+="NETCLAIM_VM_DAEMON_BIN=$(realpath "$NETCLAIM_RELEASE_BIN") "
fi
share=()
if [[ -n ${NETCLAIM_VM_SHARE:-} ]]; then
    NETCLAIM_VM_SHARE=$(realpath "$NETCLAIM_VM_SHARE")
    share=("--rwdir=$NETCLAIM_VM_SHARE")
    guest_env+="NETCLAIM_VM_SHARE=$NETCLAIM_VM_SHARE "
fi
if [[ -n ${NETCLAIM_VM_REBOOT_PHASE:-} ]]; then
    guest_env+="NETCLAIM_VM_REBOOT_PHASE=$NETCLAIM_VM_REBOOT_PHASE "
fi
if [[ -n ${NETCLAIM_VM_IOMMU:-} ]]; then
    guest_env+="NETCLAIM_VM_IOMMU=$NETCLAIM_VM_IOMMU "
fi
if [[ -n $guest_env ]]; then
    guest_env="env $guest_env"
fi

# vng runs virtme-run from PATH; the wrapper from install.sh points QEMU at its firmware.
export PATH="$PREFIX/venv/bin:$PATH"
started=$(date +%s%N)
set +e
# /dev/kvm on this machine kind cannot run stock kernels (node-stack.md): TCG. Output goes
# through a pipe: vng hands QEMU /proc/self/fd/1 and 2, which a plain `>` redirection would
# make overwrite each other.
timeout --kill-after=10 "${NETCLAIM_VM_TIMEOUT:-600}" \
    vng --disable-kvm --run "$kdir/boot/vmlinuz-$release" --qemu "$PREFIX/bin/qemu-system-x86_64" \
    --memory 1G --cpus 2 "${share[@]}" "${append[@]}" \
    --exec "${guest_env}bash $HERE/guest.sh ${binaries[*]}" \
    --qemu-opts="$accel $iommu $nics" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
wall_ms=$((($(date +%s%N) - started) / 1000000))
echo "vmtests: kernel $release: exit $rc, $((wall_ms / 1000)).$(printf '%03d' $((wall_ms % 1000))) s wall for the whole boot and run" | tee -a "$log"
exit "$rc"
