#!/usr/bin/env bash
# Debian packages the integration tests run as real daemons and tools, installed once:
#   slurm-wlm, munge        tests/scheduler: a real slurmctld and two slurmd
#   rsyslog, rsyslog-kafka  tests/deploy/test_rsyslog_shipper.py (imfile + omkafka)
#   kcat                    the librdkafka client test (which brokers Debian's librdkafka reaches)
#   prometheus, chromium    tests/integration/test_operators.py (promtool, headless Chromium)
# Nothing is started: there is no systemd, the tests start daemons as plain processes.
# Without apt-get (not Debian) it installs nothing, and those tests skip saying why.
set -euo pipefail
PACKAGES=(slurm-wlm munge rsyslog rsyslog-kafka kcat prometheus chromium)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "no apt-get: tests needing ${missing[*]} will be skipped" >&2
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
