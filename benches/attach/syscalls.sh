#!/bin/sh
# Syscalls per attach of each sequence of benches/attach (issue 36): runs the bench's rounds
# (criterion's groups filtered out) under `strace -f` with NETCLAIM_BENCH_MARK=1, and counts the
# syscalls of every thread and child process between each timed span's two markers (a `stat`
# of /netclaim-bench-mark/<sequence>/start and /end). Counts only: strace slows every syscall,
# so the bench's times from this run mean nothing. Needs root, like the bench.
#
#   cargo bench --features netclaim/failpoints --bench attach --no-run   # prints the binary
#   benches/attach/syscalls.sh target/release/deps/attach-<hash> [rounds]
set -eu
bin=$1
rounds=${2:-20}
trace=$(mktemp)
trap 'rm -f "$trace"' EXIT
NETCLAIM_BENCH_MARK=1 NETCLAIM_BENCH_ROUNDS=$rounds strace -f -qq -o "$trace" "$bin" --bench '^$' >/dev/null
awk '
/\/netclaim-bench-mark\// {
    match($0, /\/netclaim-bench-mark\/[^"]*/)
    split(substr($0, RSTART + 21, RLENGTH - 21), part, "/")
    if (part[2] == "start") { current = part[1]; spans[current]++ } else { current = "" }
    next
}
current != "" && /^[0-9]+ +[a-z_0-9]+\(/ {
    name = $2; sub(/\(.*/, "", name)
    all[current]++
    if (name ~ /^(sendto|sendmsg|recvfrom|recvmsg)$/) netlink[current]++
    if (name ~ /^(futex|epoll_wait|epoll_pwait|epoll_pwait2)$/) wake[current]++
}
END {
    printf "%-28s %6s %14s %22s %18s\n", "sequence", "spans", "syscalls/span", "send+recv(msg|to|from)", "futex+epoll_wait"
    for (s in spans) printf "%-28s %6d %14.1f %22.1f %18.1f\n", s, spans[s], all[s] / spans[s], netlink[s] / spans[s], wake[s] / spans[s]
}' "$trace" | sort
