#!/usr/bin/env bash
# Build Prometheus v3.16.0 (the version of docker-compose.yaml's prom/prometheus:v3.16.0),
# server and promtool, from its Go module into a cache outside the repository, or reuse
# the cached binaries. Prints the server's path on the last line of stdout (promtool is
# beside it); everything else goes to stderr.
#
#   bash scripts/install-prometheus.sh          # -> .../prometheus-v3.16.0/prometheus
#   export SPEC_DECODE_OTEL_PROMETHEUS="$(bash scripts/install-prometheus.sh | tail -n 1)"
#
# The e2e tests run this server (the compose stack's version: what a user of the stack
# runs) and check the rules with its promtool. Built without the web UI's assets (the
# `builtinassets` tag needs the UI built with npm): the HTTP API, which is all the tests
# and Grafana use, is the same.
#
# Prometheus's Go module versions its v3 releases as v0.3xx: v0.316.0 is Prometheus
# v3.16.0. `go install pkg@version` refuses a module whose go.mod has replace or exclude
# directives (some releases' do), so the binaries are built from a throw-away module that
# requires it: a main module's own directives are the only ones Go applies, and v0.316.0
# has none to copy.
#
# Environment:
#   SPEC_DECODE_OTEL_CACHE      cache root (default: $HOME/.cache/spec-decode-otel)
#   GO                          go command (default: go on PATH, else /usr/local/go/bin/go)
#   PROMETHEUS_FORCE_REBUILD=1  ignore cached binaries
set -euo pipefail

PROMETHEUS_MODULE_VERSION="v0.316.0" # == Prometheus v3.16.0
PROMETHEUS_VERSION="v3.16.0"

CACHE_ROOT="${SPEC_DECODE_OTEL_CACHE:-${HOME}/.cache/spec-decode-otel}"
DEST_DIR="${CACHE_ROOT}/prometheus-${PROMETHEUS_VERSION}"
BIN="${DEST_DIR}/prometheus"
PROMTOOL="${DEST_DIR}/promtool"

log() { printf '[install-prometheus] %s\n' "$*" >&2; }

# The version line of a binary built here: "prometheus, version 3.16.0 (...)".
runs() { "$1" --version 2>&1 | head -n 1 | grep -q "version ${PROMETHEUS_VERSION#v} "; }

mkdir -p "${CACHE_ROOT}"
# One build at a time per cache (two CI jobs or a test fixture racing this script).
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_ROOT}/.prometheus.lock"
  flock 9
fi

if [[ -x "${BIN}" && -x "${PROMTOOL}" && "${PROMETHEUS_FORCE_REBUILD:-0}" != "1" ]] \
  && runs "${BIN}" && runs "${PROMTOOL}"; then
  log "cached: ${BIN}"
  echo "${BIN}"
  exit 0
fi

# shellcheck source=go-build-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build-env.sh"

log "building prometheus and promtool ${PROMETHEUS_VERSION} (module ${PROMETHEUS_MODULE_VERSION}) with $("${GO}" version)"
start=$(date +%s)
(
  cd "${WORK}"
  "${GO}" mod init spec-decode-otel/prometheus-build >/dev/null 2>&1
  # Requiring the packages (not only the module) records every go.sum entry they need.
  # No `go mod tidy` afterwards: it would resolve newer dependencies than the module's.
  "${GO}" get "github.com/prometheus/prometheus/cmd/prometheus@${PROMETHEUS_MODULE_VERSION}" \
    "github.com/prometheus/prometheus/cmd/promtool@${PROMETHEUS_MODULE_VERSION}" >&2
  # -trimpath and -s -w: no file paths, symbol table or DWARF; smaller binaries and a
  # faster link. The version is what `--version` prints (a release build sets it the
  # same way, from the VERSION file).
  "${GO}" build -trimpath \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" \
    -o "${WORK}/" github.com/prometheus/prometheus/cmd/prometheus \
    github.com/prometheus/prometheus/cmd/promtool >&2
)
mv -f "${WORK}/promtool" "${PROMTOOL}"
mv -f "${WORK}/prometheus" "${BIN}"
log "built in $(($(date +%s) - start))s: ${BIN} and ${PROMTOOL}"

for binary in "${BIN}" "${PROMTOOL}"; do
  "${binary}" --version >&2 || {
    log "error: ${binary} does not run"
    exit 1
  }
  runs "${binary}" || {
    log "error: ${binary} does not say version ${PROMETHEUS_VERSION#v}"
    exit 1
  }
done
echo "${BIN}"
