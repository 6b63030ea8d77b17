#!/usr/bin/env bash
# Prometheus' own Python client library, for its two exposition parsers (the text format 0.0.4
# and OpenMetrics 1.0): tests/netns/metrics_prometheus.rs reads the daemons' /metrics with
# them, as a scraper would, to check every family's type.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

apt_install python3 python3-prometheus-client
