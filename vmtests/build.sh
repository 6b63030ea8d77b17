#!/usr/bin/env bash
# Builds the VM test binaries on the host (`cargo test --no-run`) and prints their paths, one
# per line: the guest runs these very files through the shared root file system.
# Usage: vmtests/build.sh <test target>...
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for target in "$@"; do
    args+=(--test "$target")
done
# VM_CARGO_ARGS: extra arguments (`make test` passes nextest's features, so the binaries it
# built are reused instead of building the crate a second time without them).
# shellcheck disable=SC2086 # split on purpose
out=$(${CARGO:-cargo} test "${args[@]}" ${VM_CARGO_ARGS:-} --no-run 2>&1) || {
    echo "$out" >&2
    exit 1
}
echo "$out" >&2
# cargo reports each binary as `Executable tests/<name>.rs (target/debug/deps/<name>-<hash>)`.
echo "$out" | sed -n 's/.*Executable .* (\(.*\))$/\1/p'
