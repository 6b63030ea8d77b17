#!/usr/bin/env bash
# Lays out the image's root file system: the binary, the shared objects `ldd` lists for it
# taken from the given Debian packages (with the symlinks that lead to them), and each
# package's copyright file. Nothing else of the packages goes in: no shell, no package
# manager, no gconv modules, no locales.
#
# usage: rootfs.sh BINARY DEBS_DIR OUT_DIR
#
# Run by the Dockerfile's `runtime-files` stage (Debian bookworm-slim) and by `make image`
# (scripts/image/build.py) on the build host, so both lay out the same tree. `ldd` runs on the
# machine that runs this script; the files come from the packages, never from that machine.
# Fails naming a library that none of the packages ship.
set -euo pipefail

if (($# != 3)); then
    echo "usage: $0 BINARY DEBS_DIR OUT_DIR" >&2
    exit 2
fi
binary=$1 debs=$2 out=$3

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
shopt -s nullglob
packages=("$debs"/*.deb)
if ((${#packages[@]} == 0)); then
    echo "rootfs.sh: no .deb files in $debs" >&2
    exit 1
fi
for deb in "${packages[@]}"; do
    dpkg-deb -x "$deb" "$staging"
done

rm -rf "$out"
mkdir -p "$out/usr/bin" "$out/etc" "$out/tmp"
chmod 1777 "$out/tmp"
install -m 0755 "$binary" "$out/usr/bin/netclaim"

# Copies $1 (a path in the image) from the unpacked packages, following symlinks: each link
# is kept as a link and its target copied too.
copy_from_packages() {
    local path=$1 hops=0
    while ((hops < 16)); do
        local source="$staging$path"
        if [[ -L "$source" ]]; then
            mkdir -p "$out$(dirname "$path")"
            cp -P "$source" "$out$path"
            local target
            target=$(readlink "$source")
            if [[ "$target" != /* ]]; then
                target="$(dirname "$path")/$target"
            fi
            path=$(realpath -m -s "$target")
            hops=$((hops + 1))
        elif [[ -f "$source" ]]; then
            mkdir -p "$out$(dirname "$path")"
            cp -p "$source" "$out$path"
            return 0
        else
            return 1
        fi
    done
    echo "rootfs.sh: too many symlinks at $1" >&2
    exit 1
}

# `ldd` prints `name => /path (addr)` for libraries and `/path (addr)` for the loader; the
# vDSO has no file. On a merged-/usr host it may name /usr/lib/... where the package ships
# /lib/... (or the reverse): both are tried.
libraries=$(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3; next } $1 ~ /^\// { print $1 }')
if [[ -z "$libraries" ]]; then
    echo "rootfs.sh: ldd lists no shared objects for $binary (a static binary needs no packages)" >&2
    exit 1
fi
for library in $libraries; do
    alternative=${library#/usr}
    [[ "$alternative" == "$library" ]] && alternative=/usr$library
    if ! copy_from_packages "$library" && ! copy_from_packages "$alternative"; then
        echo "rootfs.sh: ldd lists $library, which none of $(basename -a "${packages[@]}" | tr '\n' ' ')ship; add its package to RUNTIME_PACKAGES in the Dockerfile (dpkg -S $library names it)" >&2
        exit 1
    fi
done

# Copyright files (Debian's doc directories may be symlinks to another package's, as
# libgcc-s1's is to gcc-12-base's).
for deb in "${packages[@]}"; do
    package=$(dpkg-deb -f "$deb" Package)
    copyright="/usr/share/doc/$package/copyright"
    if [[ -e "$staging$copyright" ]]; then
        mkdir -p "$out/usr/share/doc/$package"
        cp -L "$staging$copyright" "$out$copyright"
        chmod 0644 "$out$copyright"
    fi
done
