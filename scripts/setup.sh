#!/usr/bin/env bash
# Installs everything the build and the whole test suite need on a fresh machine of our kind
# (Debian 12, root, Rust stable). Idempotent: each topic script skips what is present.
set -euo pipefail
cd "$(dirname "$0")/.."
for script in scripts/setup/*.sh; do
    echo "== setup: ${script#scripts/setup/}"
    bash "$script"
done
