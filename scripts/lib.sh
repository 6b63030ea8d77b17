# Shared shell helpers for setup scripts (sourced, not run).

# apt_install PKG...: installs the packages that are missing, retrying while another process
# holds the dpkg lock or a mirror hiccups.
apt_install() {
    local missing=()
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
            || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    local attempt
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
        if apt-get update -qq \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                "${missing[@]}"; then
            return 0
        fi
        echo "apt-get failed (attempt $attempt), retrying in 6 s" >&2
        sleep 6
    done
    echo "could not install: ${missing[*]}" >&2
    return 1
}
