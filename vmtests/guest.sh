#!/usr/bin/env bash
# Runs inside the VM (vmtests/run.sh), as root: loads the modules the suites need, waits for
# the two igb PFs, then runs each test binary given (host-built cargo test binaries: they link
# only libc and libgcc_s, which the guest sees through the shared root) with its ignored
# tests included, one thread at a time. An argument `<binary>::<suite>` (what build.sh
# prints) runs only the tests of that module, in a process of its own: the suites run one
# after the other in the order given, each starting from the NIC state the previous one left
# (the VF guard of testkit/src/vm.rs gives it back). Exit status: 0 when every run passed, else
# the first failing run's.
set -uo pipefail

echo "vmtests/guest: kernel $(uname -r), uptime $(cut -d' ' -f1 /proc/uptime) s at start"
export NETCLAIM_VM=1

# No udev rule loads NIC drivers here (virtme-ng's init only starts udevd for the virtio
# ports); ipvlan, 8021q, dummy and vrf would autoload on first use, loading them now makes a
# missing one fail here with modprobe's message.
modprobe -a igb igbvf ipvlan 8021q dummy vrf || echo "vmtests/guest: modprobe failed"

# The PFs register their netdevs asynchronously after the driver binds.
for _ in $(seq 50); do
    pfs=$(for d in /sys/class/net/*; do
        [[ $(readlink "$d/device/driver" 2>/dev/null) == */igb ]] && echo "${d##*/}"
    done)
    [[ $(echo "$pfs" | grep -c .) -ge 2 ]] && break
    sleep 0.1
done
echo "vmtests/guest: igb PFs: $(echo $pfs)"

rc=0
for arg in "$@"; do
    binary=${arg%%::*}
    filter=()
    name=${binary##*/}
    if [[ $arg == *::* ]]; then
        # libtest's filter matches a substring of `<suite>::<test>`.
        filter=("${arg#*::}::")
        name="$name ${arg#*::}"
    fi
    echo "vmtests/guest: running $name"
    started=$(cut -d' ' -f1 /proc/uptime)
    "$binary" --include-ignored --test-threads=1 "${filter[@]}"
    status=$?
    # The suite's own time, for the ledger in vmtests/README.md.
    took=$(awk -v s="$started" '{printf "%.1f", $1 - s}' /proc/uptime)
    echo "vmtests/guest: $name exit $status in $took s"
    if [[ $status -ne 0 && $rc -eq 0 ]]; then
        rc=$status
        dmesg | tail -n 40
    fi
done
echo "vmtests/guest: done at uptime $(cut -d' ' -f1 /proc/uptime) s"
exit "$rc"
