#!/usr/bin/env bash
# Tools the podnet tier uses from outside the code under test: `ping` (iputils) proves traffic
# flows from a pod namespace to its parent's peer in tests/netns/podnet_netns.rs, and Debian's CNI
# plugins (macvlan + host-local, in /usr/lib/cni) are the comparison group of benches/attach.rs;
# iperf3 measures bandwidth ceilings with TCP between pods (tests/netns/bandwidth_ceilings.rs).
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

apt_install iputils-ping containernetworking-plugins iperf3
