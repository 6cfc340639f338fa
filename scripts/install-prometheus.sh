#!/usr/bin/env bash
# Install Prometheus (Debian's package) for the e2e tests, unless a `prometheus` binary
# is already on PATH. Prints the binary's path on the last line of stdout.
#
#   export SPEC_DECODE_OTEL_PROMETHEUS="$(bash scripts/install-prometheus.sh | tail -n 1)"
#
# The tests run their own Prometheus on a loopback port with a temporary data directory,
# so the package's system service must not run: it is kept from starting during the
# install (policy-rc.d), and stopped and disabled if it runs anyway. Recommended
# packages (node exporter, another service) are left out.
set -euo pipefail

log() { printf '[install-prometheus] %s\n' "$*" >&2; }

if BIN="$(command -v prometheus)"; then
  log "found: ${BIN} ($("${BIN}" --version 2>&1 | head -n 1))"
  echo "${BIN}"
  exit 0
fi

SUDO=""
if [[ "$(id -u)" != "0" ]]; then SUDO="sudo"; fi

# invoke-rc.d consults /usr/sbin/policy-rc.d: exit code 101 means "do not start".
POLICY=/usr/sbin/policy-rc.d
added_policy=0
if [[ ! -e "${POLICY}" ]]; then
  printf '#!/bin/sh\nexit 101\n' | ${SUDO} tee "${POLICY}" >/dev/null
  ${SUDO} chmod 755 "${POLICY}"
  added_policy=1
fi
cleanup() { if [[ "${added_policy}" == 1 ]]; then ${SUDO} rm -f "${POLICY}"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show prometheus >/dev/null 2>&1; then
  ${SUDO} apt-get update >&2
fi
${SUDO} apt-get install -y --no-install-recommends prometheus >&2

# Belt and braces: if a service manager started it anyway, stop it and keep it off.
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
  ${SUDO} systemctl disable --now prometheus >&2 2>/dev/null || true
elif [[ -x /etc/init.d/prometheus ]]; then
  ${SUDO} /etc/init.d/prometheus stop >&2 2>/dev/null || true
  ${SUDO} update-rc.d prometheus disable >&2 2>/dev/null || true
fi

BIN="$(command -v prometheus || echo /usr/bin/prometheus)"
"${BIN}" --version 2>&1 | head -n 1 >&2
echo "${BIN}"
