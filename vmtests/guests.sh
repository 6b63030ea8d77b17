#!/usr/bin/env bash
# Boots the VM guests of each kernel given: the suites are split over several guests per
# kernel (VM_GUESTS), so that no guest comes near its timeout; NETCLAIM_VM_PARALLEL guests run
# at once (a guest spends much of its run waiting: pings that must fail, udev, VF creation, a
# daemon's start, so two guests overlap those waits on two cores). A guest whose suites
# include vm_reboot is booted twice with a host directory shared by both boots
# (tests/vm/vm_reboot.rs): the first boot runs its suites with NETCLAIM_VM_REBOOT_PHASE=1, the
# second, only when the first passed, vm_reboot alone with phase 2. A guest whose suites
# include vm_vfio boots with an emulated IOMMU (NETCLAIM_VM_IOMMU=isolated), one with
# vm_vfio_acs with its first root port's ACS off (shared): each needs a guest of its own.
#
# Usage: vmtests/guests.sh <6.1|6.12>...   (after build.sh wrote target/vmtests/binaries)
#   VM_GUESTS            the guests, space-separated, each a comma-separated list of suites
#                        (modules of tests/vm/) run in that order (the Makefile passes its list)
#   NETCLAIM_VM_PARALLEL guests booted at once (2)
#   NETCLAIM_VM_TIMEOUT  seconds a guest may take (600); a guest that hangs or whose QEMU dies
#                        (no "done" line from guest.sh) is retried once, a reboot pair from its
#                        first boot
#   NETCLAIM_VM_BOOT_TIMEOUT  seconds until guest.sh's first line (240): a boot that stalls is
#                        ended then (and retried once), not after the whole timeout
# Writes one summary line per guest and per kernel to target/vmtests/summary (after-nextest.sh
# prints them last), prints the tail of each failed guest's output, and exits non-zero when a
# guest failed.
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
    echo "usage: $0 <6.1|6.12>..." >&2
    exit 2
fi
out=target/vmtests
binary=$(sed -n '1s/::.*//p' $out/binaries)
if [[ -z $binary ]]; then
    echo "vmtests/guests.sh: no binary in $out/binaries (run vmtests/build.sh first)" >&2
    exit 2
fi
read -r -a guests <<<"${VM_GUESTS:-vm_kernel}"
parallel=${NETCLAIM_VM_PARALLEL:-2}
timeout_s=${NETCLAIM_VM_TIMEOUT:-600}
boot_timeout=${NETCLAIM_VM_BOOT_TIMEOUT:-240}

# One boot: run.sh with the suites given; retried once when the guest never reported its end.
# A boot that stalls (it happened about once in 20 boots, on both kernels: not even guest.sh's
# first line) is ended after NETCLAIM_VM_BOOT_TIMEOUT instead of the guest's whole timeout.
boot() {
    local name=$1 rc pid waited=0
    shift
    NETCLAIM_VM_TIMEOUT=$timeout_s NETCLAIM_VM_LOG=$out/$name.log bash vmtests/run.sh "$@" \
        >"$out/$name.out" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if [[ $waited -ge $boot_timeout ]] && ! grep -aq '^vmtests/guest: kernel' "$out/$name.out"; then
            echo "vmtests: no line from the guest after $boot_timeout s: ended" >>"$out/$name.out"
            # run.sh's `timeout` passes the signal on to vng and QEMU.
            pkill -TERM -P "$pid" timeout
            break
        fi
        sleep 5
        waited=$((waited + 5))
    done
    wait "$pid"
    rc=$?
    # A guest that never reached guest.sh's last line hung (timeout: 124, 137) or its QEMU
    # died. A test that failed is never retried.
    if [[ $rc -ne 0 ]] && ! grep -aq '^vmtests/guest: done at uptime' "$out/$name.out"; then
        return 200
    fi
    return "$rc"
}

# One guest of one kernel (a reboot pair: both boots). Writes `<rc> <end time>` to .rc.
run_guest() {
    local kernel=$1 index=$2 name="$1-$2" suites=() phase1=() rc=0 attempt
    IFS=, read -r -a suites <<<"${guests[$index]}"
    local args=()
    for suite in "${suites[@]}"; do args+=("$binary::$suite"); done
    for attempt in 1 2; do
        if [[ " ${suites[*]} " == *" vm_reboot "* ]]; then
            local share=$out/share-$name
            rm -rf "$share" && mkdir -p "$share"
            NETCLAIM_VM_SHARE=$share NETCLAIM_VM_REBOOT_PHASE=1 boot "$name" "$kernel" "${args[@]}"
            rc=$?
            if [[ $rc -eq 0 ]]; then
                NETCLAIM_VM_SHARE=$share NETCLAIM_VM_REBOOT_PHASE=2 boot "$name-boot2" "$kernel" \
                    "$binary::vm_reboot"
                rc=$?
            fi
        else
            local iommu=""
            [[ " ${suites[*]} " == *" vm_vfio "* ]] && iommu=isolated
            [[ " ${suites[*]} " == *" vm_vfio_acs "* ]] && iommu=shared
            NETCLAIM_VM_IOMMU=$iommu boot "$name" "$kernel" "${args[@]}"
            rc=$?
        fi
        [[ $rc -ne 200 ]] && break
        for file in "$out/$name.out" "$out/$name-boot2.out"; do
            [[ -f $file ]] && mv "$file" "${file%.out}.hung.out"
        done
        echo "the guest did not finish (output in $out/$name*.hung.out); retried once" \
            >"$out/$name.retried"
    done
    echo "$rc $(date +%s)" >"$out/$name.rc"
}

started=$(date +%s)
rm -f $out/*.rc $out/*.retried $out/*-boot2.out
# Longest guests first (VM_GUESTS lists them so), the kernels interleaved.
for index in "${!guests[@]}"; do
    for kernel in "$@"; do
        while [[ $(jobs -rp | wc -l) -ge $parallel ]]; do wait -n; done
        run_guest "$kernel" "$index" &
    done
done
wait

status=0
summary=()
for kernel in "$@"; do
    last=$started kernel_passed=0 kernel_failed=0
    for index in "${!guests[@]}"; do
        name="$kernel-$index"
        read -r rc finished <"$out/$name.rc" || { rc=1; finished=$(date +%s); }
        [[ $finished -gt $last ]] && last=$finished
        [[ -f $out/$name.retried ]] && summary+=("vmtests: kernel $kernel guest $index: $(cat "$out/$name.retried")")
        outputs=("$out/$name.out")
        [[ -f $out/$name-boot2.out ]] && outputs+=("$out/$name-boot2.out")
        read -r passed failed < <(cat "${outputs[@]}" |
            grep -ao 'test result: [a-zA-Z]*\. [0-9]* passed; [0-9]* failed' |
            awk '{p+=$4; f+=$6} END {print p+0, f+0}')
        kernel_passed=$((kernel_passed + passed)) kernel_failed=$((kernel_failed + failed))
        walls=$(cat "${outputs[@]}" | sed -n 's/^vmtests: kernel .*: exit .*, \([0-9.]*\) s wall.*/\1/p' |
            paste -sd+ -)
        summary+=("vmtests: kernel $kernel guest $index (${guests[$index]//,/ }): exit $rc, $passed passed, $failed failed, ${walls:-?} s wall")
        # The failed tests by name, and the first line of each panic, so that the lines CI
        # keeps (the last few) say what failed without the guest's log.
        while read -r test; do
            summary+=("vmtests: kernel $kernel: FAILED $test")
        done < <(cat "${outputs[@]}" | grep -a '^test .* \.\.\. FAILED' | awk '{print $2}' | sort -u)
        while read -r panic; do
            summary+=("vmtests: kernel $kernel: ${panic:0:300}")
        done < <(cat "${outputs[@]}" | grep -a -A1 "^thread '.*' panicked at" | grep -av '^--$' | head -n 8)
        if [[ $rc -ne 0 ]]; then
            status=$rc
            tail -n 60 "${outputs[-1]}"
        fi
    done
    summary+=("vmtests: kernel $kernel: $kernel_passed passed, $kernel_failed failed, ${#guests[@]} guests, done after $((last - started)) s")
done
summary+=("vmtests: all guests $(($(date +%s) - started)) s, $parallel at once")
printf '%s\n' "${summary[@]}" >$out/summary
exit "$status"
