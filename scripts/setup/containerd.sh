#!/usr/bin/env bash
# Installs what the containerd tests need: containerd 1.7 and 2.1 with NRI (Debian trixie's and
# forky's debs, unpacked into private prefixes so the system's apt sources and libc stay as they
# are), runc and the CNI plugins (bookworm), and a tiny local pause image (a static C program in
# an OCI layout tar, imported by the test without any registry).
#
# Result:
#   /opt/netclaim-test/containerd/usr/bin/{containerd,ctr,containerd-shim-runc-v2}      (1.7.24)
#   /opt/netclaim-test/containerd-2.1/usr/bin/{containerd,ctr,containerd-shim-runc-v2}  (2.1.9)
#   /opt/netclaim-test/images/pause.tar        (image localhost/netclaim/pause:1.0: /pause, /cat)
# The tests find them there, or under NETCLAIM_CONTAINERD_PREFIX, NETCLAIM_CONTAINERD21_PREFIX,
# NETCLAIM_TEST_IMAGES.
# Idempotent: each step is skipped when its result exists.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
base=/opt/netclaim-test
prefix="$base/containerd"
prefix21="$base/containerd-2.1"
images="$base/images"

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
# openssl: tests/daemonset_containerd makes a throwaway CA for the daemon's in-cluster HTTPS.
for pkg in runc containernetworking-plugins iproute2 gcc libc6-dev debian-archive-keyring openssl; do
    installed "$pkg" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    retry apt-get update -qq
    retry env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

# Downloads Debian suite $1's containerd deb (version $3, or the suite's) with a private apt
# state and unpacks it into $2.
unpack_containerd() {
    local suite="$1" target="$2" version="${3:-}" dir="$base/apt-$1-containerd"
    if [[ -x "$target/usr/bin/containerd" ]]; then return 0; fi
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
        > "$dir/sources.list"
    local A=(-o "Dir::Etc::sourcelist=$dir/sources.list" -o Dir::Etc::sourceparts=/dev/null
       -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache")
    retry apt-get "${A[@]}" update -qq
    rm -f "$dir"/debs/containerd_*.deb
    (cd "$dir/debs" && retry apt-get "${A[@]}" download "containerd${version:+=$version}")
    rm -rf "$target.tmp" && mkdir -p "$target.tmp"
    dpkg -x "$dir"/debs/containerd_*.deb "$target.tmp"
    rm -rf "$target" && mv "$target.tmp" "$target"
}

# 1.7 from trixie; 2.1 from forky (it runs with bookworm's libc and runc: the e2e suite runs on
# both).
unpack_containerd trixie "$prefix"
unpack_containerd forky "$prefix21" 2.1.9+ds1-5
"$prefix/usr/bin/containerd" --version
"$prefix21/usr/bin/containerd" --version

# The image also holds /cat, for tests that read a file inside a container (ExecSync).
if [[ ! -s "$images/pause.tar" || "$here/oci_image.py" -nt "$images/pause.tar" \
      || "${BASH_SOURCE[0]}" -nt "$images/pause.tar" ]]; then
    mkdir -p "$images/src"
    cat > "$images/src/cat.c" <<'C'
/* cat FILE...: copies each file to stdout; exits 1 naming the file it could not read. */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char buf[4096];
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDONLY);
        if (fd < 0) { perror(argv[i]); return 1; }
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0)
            if (write(1, buf, (size_t)n) != n) return 1;
        if (n < 0) { perror(argv[i]); return 1; }
        close(fd);
    }
    return 0;
}
C
    gcc -static -Os -s -o "$images/src/cat" "$images/src/cat.c"
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
        "$images/src/pause=/pause" "$images/src/cat=/cat"
    mv "$images/pause.tar.tmp" "$images/pause.tar"
fi
echo "containerd.sh: ready ($prefix, $prefix21, $images/pause.tar)"
