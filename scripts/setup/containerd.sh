#!/usr/bin/env bash
# Installs what the NRI e2e test (tests/nri_containerd.rs) needs: containerd 1.7 with NRI
# (Debian trixie's deb, unpacked into a private prefix so the system's apt sources and libc stay
# as they are), runc and the CNI plugins (bookworm), and a tiny local pause image (a static C
# program in an OCI layout tar, imported by the test without any registry).
#
# Result:
#   /opt/netclaim-test/containerd/usr/bin/{containerd,ctr,containerd-shim-runc-v2}
#   /opt/netclaim-test/images/pause.tar        (image localhost/netclaim/pause:1.0)
# The test finds them there, or under NETCLAIM_CONTAINERD_PREFIX / NETCLAIM_TEST_IMAGES.
# Idempotent: each step is skipped when its result exists.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
base=/opt/netclaim-test
prefix="$base/containerd"
images="$base/images"
apt_dir="$base/apt-trixie-containerd"

# apt with a retry loop: another process may hold the dpkg/apt lock for a moment.
retry() {
    local attempt
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
        if "$@"; then return 0; fi
        echo "containerd.sh: attempt $attempt of '$*' failed, retrying in 3 s" >&2
        sleep 3
    done
    return 1
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

missing=()
for pkg in runc containernetworking-plugins iproute2 gcc libc6-dev debian-archive-keyring; do
    installed "$pkg" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    retry apt-get update -qq
    retry env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

if [[ ! -x "$prefix/usr/bin/containerd" ]]; then
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
        > "$apt_dir/sources.list"
    A=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o Dir::Etc::sourceparts=/dev/null
       -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
    retry apt-get "${A[@]}" update -qq
    (cd "$apt_dir/debs" && retry apt-get "${A[@]}" download containerd)
    rm -rf "$prefix.tmp" && mkdir -p "$prefix.tmp"
    dpkg -x "$apt_dir"/debs/containerd_*.deb "$prefix.tmp"
    rm -rf "$prefix" && mv "$prefix.tmp" "$prefix"
fi
"$prefix/usr/bin/containerd" --version

if [[ ! -s "$images/pause.tar" || "$here/oci_image.py" -nt "$images/pause.tar" ]]; then
    mkdir -p "$images/src"
    cat > "$images/src/pause.c" <<'C'
/* Sandbox holder: sleeps until SIGINT or SIGTERM, then exits 0. */
#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
    for (;;) pause();
}
C
    gcc -static -Os -s -o "$images/src/pause" "$images/src/pause.c"
    python3 "$here/oci_image.py" "$images/pause.tar.tmp" localhost/netclaim/pause:1.0 /pause \
        "$images/src/pause=/pause"
    mv "$images/pause.tar.tmp" "$images/pause.tar"
fi
echo "containerd.sh: ready ($prefix, $images/pause.tar)"
