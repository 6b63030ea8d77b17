#!/usr/bin/env bash
# The last part of `make test`: runs the nextest command given, then the VM tests on both
# kernels (vmtests/guests.sh: several guests per kernel, two at once; never beside nextest:
# the machine has 2 cores and TCG takes one per vCPU), then prints nextest's summary line
# again, so that the run still ends with the test runner's summary (CI reads it). The VM
# tests' own results come before it, one line per guest and per kernel, and the exit status
# is non-zero when nextest or any VM run failed.
#
# Usage: vmtests/after-nextest.sh <nextest command...>
#   NETCLAIM_VMTESTS=0   skip the VM tests (a host without root or apt; counted as skipped,
#                        and a failure under CI)
#   VM_GUESTS            the VM guests, each a comma-separated list of suites (modules of
#                        tests/vm/) run in that order (the Makefile passes its list; see
#                        vmtests/guests.sh)
#   VM_CARGO_ARGS        extra cargo arguments for building them (the Makefile passes
#                        nextest's features so the binaries are already built)
#   NETCLAIM_VM_PARALLEL, NETCLAIM_VM_TIMEOUT  see vmtests/guests.sh
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
    export VM_GUESTS=${VM_GUESTS:-vm_kernel}
    if bash vmtests/install.sh && CARGO="${CARGO:-cargo}" bash vmtests/build.sh ${VM_GUESTS//,/ } \
        >target/vmtests/binaries; then
        prepared=$(($(date +%s) - started))
        summaries+=("vmtests: install and build ${prepared} s")
        # Every guest of both kernels, NETCLAIM_VM_PARALLEL at once (vmtests/guests.sh; the
        # split and the per-suite times are in vmtests/README.md).
        rm -f target/vmtests/summary
        bash vmtests/guests.sh 6.1 6.12
        vm_rc=$?
        if [[ -f target/vmtests/summary ]]; then
            mapfile -t -O "${#summaries[@]}" summaries <target/vmtests/summary
        else
            summaries+=("vmtests: guests.sh wrote no summary (exit $vm_rc)")
            [[ $vm_rc -eq 0 ]] && vm_rc=1
        fi
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
