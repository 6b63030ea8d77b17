#!/usr/bin/env bash
# Builds the kubelet-style grpc-go test client (tests/kubelet-client/main.go) offline from
# Debian trixie packages: the Go 1.24 toolchain and golang-google-grpc-dev with its Go
# dependency closure, unpacked into a private prefix (the system's apt sources and libc stay
# as they are), built in GOPATH mode without any module proxy.
#
# Result: /opt/netclaim-test/bin/kubelet-client (the kubelet tests find it there, or via
# NETCLAIM_KUBELET_CLIENT). Idempotent: the debs are fetched once (marker file), the binary is
# rebuilt only when its source changes.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
base="${NETCLAIM_TEST_PREFIX:-/opt/netclaim-test}"   # overridable for trying the script
prefix="$base/go-grpc"             # unpacked debs
apt_dir="$base/apt-trixie"         # private apt state (sources list, package lists, debs)
gopath="$base/go-build"            # GOPATH for our own package
bin="$base/bin/kubelet-client"
src="$repo_root/tests/kubelet-client/main.go"
go_version=1.24

# apt with a retry loop: another process may hold the dpkg/apt lock for a moment.
retry() {
    local attempt
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
        if "$@"; then return 0; fi
        echo "grpc-go-client.sh: attempt $attempt of '$*' failed, retrying in 3 s" >&2
        sleep 3
    done
    return 1
}

mkdir -p "$base/bin" "$apt_dir/lists/partial" "$apt_dir/debs" "$prefix"
A=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o Dir::Etc::sourceparts=/dev/null
   -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")

if [[ ! -f "$prefix/.unpacked" ]]; then
    # debian-archive-keyring holds the trixie signing keys on a bookworm machine.
    if ! dpkg -s debian-archive-keyring >/dev/null 2>&1; then
        retry apt-get update -qq
        retry env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            debian-archive-keyring >/dev/null
    fi
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
        > "$apt_dir/sources.list"
    mkdir -p "$apt_dir/cache/archives/partial"
    retry apt-get "${A[@]}" update -qq
    closure=$(apt-cache "${A[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances golang-google-grpc-dev \
        | grep -E '^golang-' | grep -vE '^golang-(go|src|any)$' | sort -u)
    cd "$apt_dir/debs"
    # shellcheck disable=SC2086 # the closure is a whitespace-separated package list
    retry apt-get "${A[@]}" download "golang-$go_version-go" "golang-$go_version-src" \
        golang-google-grpc-dev $closure
    for deb in ./*.deb; do dpkg -x "$deb" "$prefix"; done
    touch "$prefix/.unpacked"
fi

goroot="$prefix/usr/lib/go-$go_version"
pkg_dir="$gopath/src/netclaim.dev/kubelet-client"
stamp="$base/bin/.kubelet-client.sha256"
want="$(sha256sum "$src" | cut -d' ' -f1)"
if [[ -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "grpc-go-client.sh: $bin is up to date"
    exit 0
fi
mkdir -p "$pkg_dir" "$base/gocache"
cp "$src" "$pkg_dir/main.go"
(
    cd "$pkg_dir"
    GOROOT="$goroot" PATH="$goroot/bin:$PATH" GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local \
        CGO_ENABLED=0 GOFLAGS= GOCACHE="$base/gocache" GOPATH="$gopath:$prefix/usr/share/gocode" \
        go build -o "$bin.tmp" .
)
mv "$bin.tmp" "$bin"
echo "$want" > "$stamp"
echo "grpc-go-client.sh: built $bin"
