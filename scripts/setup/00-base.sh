#!/usr/bin/env bash
# Base tools every tier needs: iproute2 (tests build topologies with `ip`), a C toolchain for
# -sys crates, clang and libbpf's headers (build.rs compiles bpf/ for the BPF target), and
# cargo-nextest (the test runner).
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

apt_install iproute2 gcc libc6-dev pkg-config make ca-certificates clang libbpf-dev
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install cargo-nextest --locked
fi
