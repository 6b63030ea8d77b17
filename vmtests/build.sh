#!/usr/bin/env bash
# Builds the VM test binary on the host (`cargo test --test vm --no-run`: tests/vm/main.rs, one
# module per suite) and prints one line per suite given, in the order given:
# `<binary>::<suite>`, which run.sh and guest.sh read as "this binary, only that suite's tests"
# (each suite in a process of its own, as when every suite was a binary). The guest runs this
# very file through the shared root file system.
# Usage: vmtests/build.sh <suite>...   (suites: the modules of tests/vm/, e.g. vm_kernel)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
    echo "usage: $0 <suite>... (a module of tests/vm/, e.g. vm_kernel)" >&2
    exit 2
fi
for suite in "$@"; do
    if [[ ! -f tests/vm/$suite.rs ]]; then
        echo "vmtests/build.sh: no suite $suite (tests/vm/$suite.rs)" >&2
        exit 2
    fi
done
# VM_CARGO_ARGS: extra arguments (`make test` passes nextest's features, so the binary it
# built is reused instead of building the crate a second time without them).
# shellcheck disable=SC2086 # split on purpose
out=$(${CARGO:-cargo} test --test vm ${VM_CARGO_ARGS:-} --no-run 2>&1) || {
    echo "$out" >&2
    exit 1
}
echo "$out" >&2
# cargo reports the binary as `Executable tests/vm/main.rs (target/debug/deps/vm-<hash>)`.
binary=$(echo "$out" | sed -n 's/.*Executable tests\/vm\/main.rs (\(.*\))$/\1/p')
if [[ -z $binary ]]; then
    echo "vmtests/build.sh: cargo named no binary for tests/vm/main.rs" >&2
    exit 1
fi
for suite in "$@"; do
    echo "$binary::$suite"
done
