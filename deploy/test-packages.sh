#!/usr/bin/env bash
# Debian packages the integration tests run as real daemons and tools, installed once:
#   slurm-wlm, munge        tests/scheduler: a real slurmctld and two slurmd
#   rsyslog, rsyslog-kafka  tests/deploy/test_file_shippers.py (imfile + omkafka)
#   kcat                    the librdkafka client test (which brokers Debian's librdkafka reaches)
#   prometheus, chromium    tests/integration/test_operators.py (promtool, headless Chromium)
#   syslog-ng-core, syslog-ng-mod-rdkafka   tests/deploy/test_file_shippers.py (wildcard-file +
#                           kafka-c). Debian's syslog-ng and rsyslog exclude each other, so these
#                           two are unpacked under SYSLOG_NG_ROOT, not installed; the libraries
#                           they need are installed.
# Nothing is started: there is no systemd, the tests start daemons as plain processes.
# Without apt-get (not Debian) it installs nothing, and those tests skip saying why.
set -euo pipefail
PACKAGES=(slurm-wlm munge rsyslog rsyslog-kafka kcat prometheus chromium
          libpcre3 libivykis0 libnet1 libjson-c5 libwrap0)
SYSLOG_NG=(syslog-ng-core syslog-ng-mod-rdkafka)
SYSLOG_NG_ROOT=/opt/sibylla-test/syslog-ng
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
unpacked=no
compgen -G "$SYSLOG_NG_ROOT/usr/lib/syslog-ng/*/libkafka.so" >/dev/null && unpacked=yes
[ ${#missing[@]} -eq 0 ] && [ "$unpacked" = yes ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "no apt-get: tests needing ${missing[*]} will be skipped" >&2
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$unpacked" = no ]; then
  debs=$(mktemp -d)
  if (cd "$debs" && $SUDO apt-get download -qq "${SYSLOG_NG[@]}" 2>/dev/null); then
    $SUDO mkdir -p "$SYSLOG_NG_ROOT"
    for deb in "$debs"/*.deb; do $SUDO dpkg-deb -x "$deb" "$SYSLOG_NG_ROOT"; done
  else
    echo "could not download ${SYSLOG_NG[*]}: the syslog-ng tailer test will be skipped" >&2
  fi
  rm -rf "$debs"
fi
