#!/usr/bin/env bash
# Build the project's OpenTelemetry Collector from collector-config/builder-manifest.yaml
# with the OpenTelemetry Collector Builder (ocb), into a cache outside the repository,
# or reuse the cached binary when the manifest has not changed. Then check every shipped
# collector config (collector-config/otelcol*.yaml) with `otelcol validate`.
# Prints the binary's path on the last line of stdout; everything else goes to stderr.
#
#   export SPEC_DECODE_OTEL_OTELCOL="$(bash scripts/install-collector.sh | tail -n 1)"
#
# Environment:
#   SPEC_DECODE_OTEL_CACHE    cache root (default: $HOME/.cache/spec-decode-otel)
#   GO                        go command (default: go on PATH, else /usr/local/go/bin/go)
#   OTELCOL_FORCE_REBUILD=1   ignore a cached binary
#
# Cache layout: <cache>/ocb-<version>/builder and
# <cache>/otelcol-<sha256 of manifest + ocb version>/otelcol-spec-decode.
set -euo pipefail

OCB_VERSION="v0.165.0" # == the core collector release pinned in the manifest

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG_DIR="${REPO_ROOT}/collector-config"
MANIFEST="${CONFIG_DIR}/builder-manifest.yaml"
CACHE_ROOT="${SPEC_DECODE_OTEL_CACHE:-${HOME}/.cache/spec-decode-otel}"
BIN_NAME="otelcol-spec-decode"

log() { printf '[install-collector] %s\n' "$*" >&2; }

GO="${GO:-$(command -v go || true)}"
if [[ -z "${GO}" && -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go; fi

HASH="$({ cat "${MANIFEST}"; echo "ocb ${OCB_VERSION}"; } | sha256sum | cut -c1-16)"
DEST_DIR="${CACHE_ROOT}/otelcol-${HASH}"
BIN="${DEST_DIR}/${BIN_NAME}"

mkdir -p "${CACHE_ROOT}"
# One build at a time per cache (two CI jobs or a test fixture racing this script).
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_ROOT}/.otelcol.lock"
  flock 9
fi

if [[ -x "${BIN}" && "${OTELCOL_FORCE_REBUILD:-0}" != "1" ]]; then
  log "cached: ${BIN}"
else
  if [[ -z "${GO}" ]]; then
    log "error: no Go toolchain found (set GO=/path/to/go)"
    exit 1
  fi
  # ocb runs `go` from PATH for `go mod tidy` and `go build`.
  GO_DIR="$(dirname "${GO}")"
  export PATH="${GO_DIR}:${PATH}"
  export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
  export GOFLAGS="${GOFLAGS:--buildvcs=false}"
  export CGO_ENABLED=0

  OCB_DIR="${CACHE_ROOT}/ocb-${OCB_VERSION}"
  OCB="${OCB_DIR}/builder"
  if [[ ! -x "${OCB}" ]]; then
    log "installing ocb ${OCB_VERSION}"
    GOBIN="${OCB_DIR}" "${GO}" install "go.opentelemetry.io/collector/cmd/builder@${OCB_VERSION}" >&2
  fi

  mkdir -p "${DEST_DIR}"
  WORK="$(mktemp -d "${DEST_DIR}/build.XXXXXX")"
  trap 'rm -rf "${WORK}"' EXIT
  # The manifest's output_path is relative to wherever ocb runs; build in WORK instead.
  sed -E "s#^([[:space:]]*output_path:).*#\\1 ${WORK}/src#" "${MANIFEST}" >"${WORK}/manifest.yaml"

  log "building ${BIN_NAME} with ocb ${OCB_VERSION} and $("${GO}" version) (manifest hash ${HASH})"
  start=$(date +%s)
  # ocb builds with -trimpath and -ldflags "-s -w" (no symbol table, no DWARF) by
  # default, which is also the fastest link; GOMAXPROCS is left at the core count.
  (cd "${WORK}" && "${OCB}" --config "${WORK}/manifest.yaml" >&2)
  mv -f "${WORK}/src/${BIN_NAME}" "${BIN}"
  log "built in $(($(date +%s) - start))s: ${BIN}"
fi

"${BIN}" --version >&2

# Every shipped collector config must load with exactly the components built in.
status=0
for cfg in "${CONFIG_DIR}"/otelcol*.yaml; do
  if "${BIN}" validate --config "${cfg}" >&2; then
    log "valid: ${cfg#"${REPO_ROOT}/"}"
  else
    log "INVALID: ${cfg#"${REPO_ROOT}/"}"
    status=1
  fi
done
if [[ "${status}" != 0 ]]; then exit "${status}"; fi

echo "${BIN}"
