#!/usr/bin/env bash
# Installs what the VM tests need on a fresh Debian 12 (bookworm) x86_64 machine, everything
# fetched from Debian and PyPI (nothing downloaded is committed):
#   - a few bookworm packages, natively: kmod (depmod), iproute2, python3-venv, busybox-static
#     (virtme-ng's initramfs), udev, and the libraries QEMU 10 links against;
#   - QEMU >= 8.0 for `-device igb` (SR-IOV): bookworm has 7.2, so qemu-system-x86 and its data
#     come from bookworm-backports, unpacked into the private prefix with a wrapper that sets
#     the library and firmware paths;
#   - virtme-ng from PyPI in a venv (its wheel carries the Rust virtme-ng-init, which boots
#     ~8 s faster than the Debian package's shell init; it still needs the host's udevd to
#     name the virtio ports that carry the guest's output and exit status);
#   - the Debian kernels 6.1 (bookworm) and 6.12 (trixie), unpacked and depmod'ed.
# The system's apt sources stay as they are: backports and trixie are read through a private
# apt state under the prefix. Idempotent: each step leaves a marker and is skipped when it is
# there; a rerun on a machine that has everything takes about a second.
#
# Usage: vmtests/install.sh            (as root; NETCLAIM_VM_PREFIX overrides /opt/netclaim-vm)
set -euo pipefail

PREFIX="${NETCLAIM_VM_PREFIX:-/opt/netclaim-vm}"
VNG_VERSION=1.42
APT_DIR="$PREFIX/apt"
DEBS="$PREFIX/debs"
MARKS="$PREFIX/.installed"
# A private apt state over the private sources list; the dpkg status is the system's.
A=(-o "Dir::Etc::SourceList=$APT_DIR/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
   -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
   -o "APT::Sandbox::User=root")

log() { printf '[vmtests/install %(%T)T] %s\n' -1 "$*" >&2; }

# apt can meet a dpkg lock held by another apt run, or a mirror hiccup: retry a few times.
retry() {
    local attempt
    for attempt in 1 2 3 4 5; do
        "$@" && return 0
        log "attempt $attempt failed: $*"
        sleep $((attempt * 5))
    done
    "$@"
}

done_mark() { [[ -e "$MARKS/$1" ]]; }
mark() { mkdir -p "$MARKS" && touch "$MARKS/$1"; }

if [[ $(id -u) != 0 ]]; then
    echo "vmtests/install.sh: run as root (it installs packages and writes $PREFIX)" >&2
    exit 1
fi
mkdir -p "$PREFIX" "$DEBS"

if ! done_mark host-packages; then
    log "bookworm packages: kmod iproute2 python3-venv busybox-static udev"
    retry apt-get -q update
    DEBIAN_FRONTEND=noninteractive retry apt-get install -y -q --no-install-recommends \
        kmod iproute2 python3-venv busybox-static udev
    mark host-packages
fi

# ethtool (about 0.7 MB): vm_ethtool reads rings, channels and features back with it, not only
# with the code under test (the guest's root is the host's).
if ! done_mark ethtool-package; then
    log "bookworm package: ethtool"
    DEBIAN_FRONTEND=noninteractive retry apt-get install -y -q --no-install-recommends ethtool
    mark ethtool-package
fi

if ! done_mark private-apt; then
    log "private apt state for bookworm, bookworm-backports and trixie"
    mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial"
    cat > "$APT_DIR/sources.list" <<'EOF'
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
EOF
    retry apt-get "${A[@]}" -q update
    mark private-apt
fi

# The newest backports build of a package (trixie's builds are not made for bookworm's libc).
bpo_version() {
    apt-cache "${A[@]}" madison "$1" | awk -F'|' '$2 ~ /bpo12/ { gsub(/ /, "", $2); print $2; exit }'
}

# `apt-get download` into $DEBS and `dpkg -x` into $2.
fetch_and_unpack() {
    local spec=$1 target=$2 deb
    (cd "$DEBS" && retry apt-get "${A[@]}" -q download "$spec")
    deb=$(ls -t "$DEBS"/"${spec%%=*}"_*.deb | head -n 1)
    mkdir -p "$target"
    dpkg -x "$deb" "$target"
}

if ! done_mark qemu; then
    QEMU_VERSION=$(bpo_version qemu-system-x86)
    SEABIOS_VERSION=$(bpo_version seabios)
    [[ -n $QEMU_VERSION && -n $SEABIOS_VERSION ]] || {
        echo "no qemu-system-x86/seabios in bookworm-backports" >&2
        exit 1
    }
    log "QEMU $QEMU_VERSION and seabios $SEABIOS_VERSION from bookworm-backports"
    rm -rf "$PREFIX/qemu"
    for pkg in qemu-system-x86 qemu-system-common qemu-system-data; do
        fetch_and_unpack "$pkg=$QEMU_VERSION" "$PREFIX/qemu"
    done
    fetch_and_unpack "seabios=$SEABIOS_VERSION" "$PREFIX/qemu"
    # The libraries it links against, from bookworm itself (installed natively: they are
    # ordinary bookworm libraries); the first of each set of alternatives; the qemu and
    # firmware packages just unpacked are left out.
    deps=$(dpkg-deb -f "$(ls -t "$DEBS"/qemu-system-x86_*.deb | head -n 1)" Depends |
        tr ',' '\n' | sed -E 's/\|.*//; s/\(.*\)//; s/[[:space:]]//g' |
        grep -vE '^(qemu-|seabios|ipxe-qemu|$)' | sort -u)
    log "QEMU's libraries from bookworm: $(echo $deps)"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive retry apt-get install -y -q --no-install-recommends $deps ipxe-qemu
    mkdir -p "$PREFIX/bin"
    # vng execs the binary it is given: the wrapper points QEMU at its private firmware.
    cat > "$PREFIX/bin/qemu-system-x86_64" <<EOF
#!/bin/sh
exec "$PREFIX/qemu/usr/bin/qemu-system-x86_64" -L "$PREFIX/qemu/usr/share/qemu" \\
    -L "$PREFIX/qemu/usr/share/seabios" -L /usr/share/qemu "\$@"
EOF
    chmod +x "$PREFIX/bin/qemu-system-x86_64"
    "$PREFIX/bin/qemu-system-x86_64" -device help | grep -q '"igb"' || {
        echo "the unpacked QEMU has no igb device" >&2
        exit 1
    }
    mark qemu
fi


if ! done_mark vng; then
    log "virtme-ng $VNG_VERSION from PyPI"
    /usr/bin/python3 -m venv "$PREFIX/venv"
    retry "$PREFIX/venv/bin/pip" install -q "virtme-ng==$VNG_VERSION"
    mark vng
fi

# Unpacks the image package the suite's `linux-image-amd64` depends on into
# $PREFIX/kernel-<name>, runs depmod, and records the release in kernel-<name>/release.
install_kernel() {
    local name=$1 suite=$2 pkg release dir="$PREFIX/kernel-$1"
    pkg=$(apt-cache "${A[@]}" show "linux-image-amd64/$suite" 2>/dev/null |
        awk -F': ' '/^Depends:/ { print $2; exit }' | tr ',' '\n' |
        sed -E 's/\(.*\)//; s/[[:space:]]//g' | grep -m 1 '^linux-image-')
    if [[ -z $pkg ]]; then
        echo "no linux-image-amd64 in $suite" >&2
        exit 1
    fi
    release=${pkg#linux-image-}
    release=${release%-unsigned}
    log "kernel $name: $pkg ($suite)"
    rm -rf "$dir"
    (cd "$DEBS" && retry apt-get "${A[@]}" -q download "$pkg/$suite")
    mkdir -p "$dir"
    dpkg -x "$(ls -t "$DEBS"/"$pkg"_*.deb | head -n 1)" "$dir"
    # trixie's package is usr-merged (usr/lib/modules): vng looks for lib/modules next to
    # the image's parent directory.
    if [[ ! -d $dir/lib/modules && -d $dir/usr/lib/modules ]]; then
        ln -sfn usr/lib "$dir/lib"
    fi
    depmod -a -b "$dir" "$release"
    echo "$release" > "$dir/release"
}

if ! done_mark kernel-6.1; then
    install_kernel 6.1 bookworm
    mark kernel-6.1
fi
if ! done_mark kernel-6.12; then
    install_kernel 6.12 trixie
    mark kernel-6.12
fi

log "ready: $(cat "$PREFIX/kernel-6.1/release") and $(cat "$PREFIX/kernel-6.12/release"), $("$PREFIX/bin/qemu-system-x86_64" --version | head -n 1)"
