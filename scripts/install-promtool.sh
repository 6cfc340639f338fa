#!/usr/bin/env bash
# Build promtool from Prometheus v3.5.0 (the version of docker-compose.yaml's
# prom/prometheus:v3.5.0) from its Go module into a cache outside the repository, or
# reuse the cached binary. Prints the binary's path on the last line of stdout;
# everything else goes to stderr.
#
#   bash scripts/install-promtool.sh            # -> .../promtool-v3.5.0/promtool
#   export SPEC_DECODE_OTEL_PROMTOOL_V3="$(bash scripts/install-promtool.sh | tail -n 1)"
#
# The e2e Prometheus is Debian's 2.42 (scripts/install-prometheus.sh), whose promtool
# checks collector-config/prometheus-rules.yml too; this one checks the rules with the
# PromQL of the Prometheus the compose stack runs (3.x range selectors are left-open,
# which moves the figures of some windows: see prometheus-rules.test.yml).
#
# Prometheus's Go module versions its v3 releases as v0.3xx: v0.305.0 is Prometheus
# v3.5.0. `go install pkg@version` refuses that module because its go.mod has replace and
# exclude directives, so the binary is built from a throw-away module that requires it
# and copies those directives (a main module's own replace/exclude are the only ones Go
# applies), so that the build resolves the same dependencies as Prometheus's own.
#
# Environment:
#   SPEC_DECODE_OTEL_CACHE    cache root (default: $HOME/.cache/spec-decode-otel)
#   GO                        go command (default: go on PATH, else /usr/local/go/bin/go)
#   PROMTOOL_FORCE_REBUILD=1  ignore a cached binary
set -euo pipefail

PROMETHEUS_MODULE_VERSION="v0.305.0" # == Prometheus v3.5.0
PROMETHEUS_VERSION="v3.5.0"

CACHE_ROOT="${SPEC_DECODE_OTEL_CACHE:-${HOME}/.cache/spec-decode-otel}"
DEST_DIR="${CACHE_ROOT}/promtool-${PROMETHEUS_VERSION}"
BIN="${DEST_DIR}/promtool"

log() { printf '[install-promtool] %s\n' "$*" >&2; }

# The version line of a binary built here: "promtool, version 3.5.0 (...)".
runs() { "${BIN}" --version 2>&1 | head -n 1 | grep -q "version ${PROMETHEUS_VERSION#v} "; }

mkdir -p "${CACHE_ROOT}"
# One build at a time per cache (two CI jobs or a test fixture racing this script).
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_ROOT}/.promtool.lock"
  flock 9
fi

if [[ -x "${BIN}" && "${PROMTOOL_FORCE_REBUILD:-0}" != "1" ]] && runs; then
  log "cached: ${BIN}"
  echo "${BIN}"
  exit 0
fi

GO="${GO:-$(command -v go || true)}"
if [[ -z "${GO}" && -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; fi
if [[ -z "${GO}" ]]; then
  log "error: no Go toolchain found (set GO=/path/to/go)"
  exit 1
fi
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
# No VCS stamping (the throw-away module is not a repository) and no cgo (pure Go,
# no C compiler needed, faster link).
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED=0

mkdir -p "${DEST_DIR}"
WORK="$(mktemp -d "${DEST_DIR}/build.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT

log "building promtool ${PROMETHEUS_VERSION} (module ${PROMETHEUS_MODULE_VERSION}) with $("${GO}" version)"
start=$(date +%s)
(
  cd "${WORK}"
  "${GO}" mod init spec-decode-otel/promtool-build >/dev/null 2>&1
  # The replace and exclude directives of prometheus's go.mod at v0.305.0.
  "${GO}" mod edit \
    -exclude=github.com/linode/linodego@v1.0.0 \
    -exclude=github.com/grpc-ecosystem/grpc-gateway@v1.14.7 \
    -exclude=google.golang.org/api@v0.30.0 \
    -replace=github.com/fsnotify/fsnotify@v1.8.0=github.com/fsnotify/fsnotify@v1.7.0
  # Requiring the package (not only the module) records every go.sum entry it needs.
  # No `go mod tidy` afterwards: it would resolve newer dependencies than the module's.
  "${GO}" get "github.com/prometheus/prometheus/cmd/promtool@${PROMETHEUS_MODULE_VERSION}" >&2
  # -trimpath and -s -w: no file paths, symbol table or DWARF; a smaller binary and a
  # faster link. The version is what `promtool --version` prints (a release build sets
  # it the same way, from the VERSION file).
  "${GO}" build -trimpath \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" \
    -o "${WORK}/promtool" github.com/prometheus/prometheus/cmd/promtool >&2
)
mv -f "${WORK}/promtool" "${BIN}"
log "built in $(($(date +%s) - start))s: ${BIN}"

"${BIN}" --version >&2 || {
  log "error: ${BIN} does not run"
  exit 1
}
runs || {
  log "error: ${BIN} does not say version ${PROMETHEUS_VERSION#v}"
  exit 1
}
echo "${BIN}"
