#!/usr/bin/env bash
# The last part of `make test`: runs the nextest command given, then the VM tests on both
# kernels, booted at once (never beside nextest: the machine has 2 cores and TCG takes one
# per vCPU), then
# prints nextest's summary line again, so that the run still ends with the test runner's
# summary (CI reads it). The VM tests' own results come before it, one line per kernel, and
# the exit status is non-zero when nextest or any VM run failed.
#
# Usage: vmtests/after-nextest.sh <nextest command...>
#   NETCLAIM_VMTESTS=0   skip the VM tests (a host without root or apt; counted as skipped,
#                        and a failure under CI)
#   VM_TESTS             the VM suites, modules of tests/vm/ run in this order (the Makefile
#                        passes its list)
#   VM_CARGO_ARGS        extra cargo arguments for building them (the Makefile passes
#                        nextest's features so the binaries are already built)
#   NETCLAIM_VM_TIMEOUT  seconds a guest may take (600); a guest that hangs or whose QEMU
#                        dies (no "done" line from guest.sh) is retried once
#   NETCLAIM_VM_SERIAL=1 boot the kernels one after the other instead of at once
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p target/vmtests
log=target/vmtests/nextest.log

"$@" 2>&1 | tee "$log"
nextest_rc=${PIPESTATUS[0]}

vm_rc=0
summaries=()
if [[ ${NETCLAIM_VMTESTS:-1} == 0 || $(id -u) != 0 ]]; then
    summaries+=("vmtests: skipped (NETCLAIM_VMTESTS=0 or not root)")
    [[ -n ${CI:-} ]] && vm_rc=1
else
    started=$(date +%s)
    if bash vmtests/install.sh && CARGO="${CARGO:-cargo}" bash vmtests/build.sh ${VM_TESTS:-vm_kernel} \
        >target/vmtests/binaries; then
        prepared=$(($(date +%s) - started))
        summaries+=("vmtests: install and build ${prepared} s")
        # Both kernels boot at once: a guest spends much of its run waiting (a ping that
        # must fail, udev, VF creation, a daemon's start), so two guests sharing the two
        # cores finish well before two guests one after the other would.
        # NETCLAIM_VM_SERIAL=1 boots them one after the other.
        kernels=(6.1 6.12)
        # One guest runs every suite of its kernel: 6-10 min with both kernels at once on two
        # cores (vmtests/README.md has the per-suite times). 900 s leaves room on a slow day;
        # splitting the suites over more guests per kernel is the lasting fix.
        timeout_s=${NETCLAIM_VM_TIMEOUT:-900}
        run_kernel() {
            local kernel=$1 rc
            NETCLAIM_VM_TIMEOUT=$timeout_s bash vmtests/run.sh "$kernel" \
                $(cat target/vmtests/binaries) >"target/vmtests/run-$kernel.out" 2>&1
            rc=$?
            # A guest that never reached guest.sh's last line hung (timeout: 124, 137) or its
            # QEMU died: retried once. A test that failed is never retried.
            if [[ $rc -ne 0 ]] && ! grep -aq '^vmtests/guest: done at uptime' "target/vmtests/run-$kernel.out"; then
                mv "target/vmtests/run-$kernel.out" "target/vmtests/run-$kernel.hung.out"
                echo "the guest did not finish (exit $rc, output in target/vmtests/run-$kernel.hung.out); retried once" \
                    >"target/vmtests/run-$kernel.retried"
                NETCLAIM_VM_TIMEOUT=$timeout_s bash vmtests/run.sh "$kernel" \
                    $(cat target/vmtests/binaries) >"target/vmtests/run-$kernel.out" 2>&1
                rc=$?
            fi
            echo "$rc $(date +%s)" >"target/vmtests/run-$kernel.rc"
        }
        kernels_started=$(date +%s)
        rm -f target/vmtests/run-*.rc target/vmtests/run-*.retried
        if [[ ${NETCLAIM_VM_SERIAL:-0} == 1 ]]; then
            for kernel in "${kernels[@]}"; do run_kernel "$kernel"; done
        else
            for kernel in "${kernels[@]}"; do run_kernel "$kernel" & done
            wait
        fi
        for kernel in "${kernels[@]}"; do
            read -r rc finished <"target/vmtests/run-$kernel.rc" || { rc=1; finished=$(date +%s); }
            if [[ -f target/vmtests/run-$kernel.retried ]]; then
                summaries+=("vmtests: kernel $kernel: $(cat "target/vmtests/run-$kernel.retried")")
            fi
            passed=$(grep -ao 'test result: [a-zA-Z]*\. [0-9]* passed; [0-9]* failed' \
                "target/vmtests/run-$kernel.out" | awk '{p+=$4; f+=$6} END {print p+0 " passed, " f+0 " failed"}')
            summaries+=("vmtests: kernel $kernel: exit $rc, $passed, $((finished - kernels_started)) s (log target/vmtests/$kernel.log)")
            # The failed tests by name, and the first line of each panic, so that the lines CI
            # keeps (the last few) say what failed without the guest's log.
            while read -r failed; do
                summaries+=("vmtests: kernel $kernel: FAILED $failed")
            done < <(grep -a '^test .* \.\.\. FAILED' "target/vmtests/run-$kernel.out" | awk '{print $2}' | sort -u)
            while read -r panic; do
                summaries+=("vmtests: kernel $kernel: ${panic:0:300}")
            done < <(grep -a -A1 "^thread '.*' panicked at" "target/vmtests/run-$kernel.out" | grep -av '^--$' | head -n 8)
            if [[ $rc -ne 0 ]]; then
                vm_rc=$rc
                tail -n 60 "target/vmtests/run-$kernel.out"
            fi
        done
        summaries+=("vmtests: both kernels $(($(date +%s) - kernels_started)) s")
    else
        summaries+=("vmtests: install or build failed")
        vm_rc=1
    fi
fi

printf '%s\n' "${summaries[@]}"
# nextest's last line is its summary (`Summary [ … ] N tests run: …`); print it again last.
summary=$(grep -a '^ *Summary \[' "$log" | tail -n 1)
if [[ -n $summary ]]; then
    echo "$summary"
else
    tail -n 1 "$log"
fi
if [[ $nextest_rc -ne 0 ]]; then
    exit "$nextest_rc"
fi
exit "$vm_rc"
