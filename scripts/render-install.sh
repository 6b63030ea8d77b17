#!/usr/bin/env bash
# Renders the one-file installs from the kustomizations, for `kubectl apply -f` without
# kustomize or a checkout of deploy/:
#   deploy/install.yaml          <- deploy/base              (Kubernetes 1.36+)
#   deploy/install-<overlay>.yaml <- deploy/overlays/<overlay> (one per overlay: k8s-1.34, slots)
# Run it after changing anything under deploy/base, deploy/crds or deploy/overlays (the image
# too: its one `images:` entry is in deploy/base/kustomization.yaml).
# tests/api/install_rendered.rs fails while a file differs from `kubectl kustomize <dir>`.
# kubectl: $KUBECTL, else the one on PATH, else scripts/setup/kubectl.sh's.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
kubectl="${KUBECTL:-$(command -v kubectl || echo /opt/netclaim-test/bin/kubectl)}"
if [ ! -x "$kubectl" ]; then
    echo "render-install: no kubectl (run scripts/setup/kubectl.sh or set KUBECTL)" >&2
    exit 1
fi

render() {
    local dir="$1" out="$2" what="$3"
    local tmp="$out.tmp"
    {
        echo "# netclaim, $what: rendered by scripts/render-install.sh from ${dir#"$root"/}"
        echo "# (\`kubectl kustomize ${dir#"$root"/}\`). Do not edit: change the kustomization and"
        echo "# run the script (tests/api/install_rendered.rs compares). docs/operations.md#install."
        "$kubectl" kustomize "$dir"
    } >"$tmp"
    mv "$tmp" "$out"
    echo "wrote ${out#"$root"/}"
}

render "$root/deploy/base" "$root/deploy/install.yaml" "Kubernetes 1.36+"
for overlay in "$root"/deploy/overlays/*/; do
    overlay="${overlay%/}"
    name="$(basename "$overlay")"
    render "$overlay" "$root/deploy/install-$name.yaml" "overlay $name"
done
