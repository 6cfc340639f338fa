#!/usr/bin/env bash
# Build Jaeger v2 (the trace store the e2e tests query) from its Go module into a cache
# outside the repository, or reuse the cached binary. Prints the binary's path on the
# last line of stdout; everything else goes to stderr.
#
#   bash scripts/install-jaeger.sh            # -> .../jaeger-v2.12.0/jaeger
#   export SPEC_DECODE_OTEL_JAEGER="$(bash scripts/install-jaeger.sh | tail -n 1)"
#
# Jaeger v2 lives in the module github.com/jaegertracing/jaeger (no /v2 suffix); each
# v2.N release is also tagged v1.(N+63), the tag Go modules see: v1.75.0 is Jaeger
# v2.12.0. `go install pkg@version` refuses that module because its go.mod has a replace
# directive, so the binary is built from a throw-away module that requires it.
#
# Environment:
#   SPEC_DECODE_OTEL_CACHE  cache root (default: $HOME/.cache/spec-decode-otel)
#   GO                      go command (default: go on PATH, else /usr/local/go/bin/go)
#   JAEGER_FORCE_REBUILD=1  ignore a cached binary
set -euo pipefail

JAEGER_MODULE_VERSION="v1.75.0" # == Jaeger v2.12.0
JAEGER_VERSION="v2.12.0"

CACHE_ROOT="${SPEC_DECODE_OTEL_CACHE:-${HOME}/.cache/spec-decode-otel}"
DEST_DIR="${CACHE_ROOT}/jaeger-${JAEGER_VERSION}"
BIN="${DEST_DIR}/jaeger"

log() { printf '[install-jaeger] %s\n' "$*" >&2; }

mkdir -p "${CACHE_ROOT}"
# One build at a time per cache (two CI jobs or a test fixture racing this script).
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_ROOT}/.jaeger.lock"
  flock 9
fi

if [[ -x "${BIN}" && "${JAEGER_FORCE_REBUILD:-0}" != "1" ]] && "${BIN}" version >/dev/null 2>&1; then
  log "cached: ${BIN}"
  echo "${BIN}"
  exit 0
fi

# shellcheck source=go-build-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build-env.sh"

log "building Jaeger ${JAEGER_VERSION} (module ${JAEGER_MODULE_VERSION}) with $("${GO}" version)"
start=$(date +%s)
(
  cd "${WORK}"
  "${GO}" mod init spec-decode-otel/jaeger-build >/dev/null 2>&1
  # Requiring the package (not only the module) records every go.sum entry it needs.
  "${GO}" get "github.com/jaegertracing/jaeger/cmd/jaeger@${JAEGER_MODULE_VERSION}" >&2
  # -trimpath and -s -w: no file paths, symbol table or DWARF; a smaller binary and a
  # faster link. The UI assets are not part of the module, so the query service serves
  # a placeholder page; its HTTP/gRPC APIs (/api/traces/..., /api/v3/...) are complete.
  "${GO}" build -trimpath \
    -ldflags "-s -w -X github.com/jaegertracing/jaeger/internal/version.latestVersion=${JAEGER_VERSION}" \
    -o "${WORK}/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger >&2
)
mv -f "${WORK}/jaeger" "${BIN}"
log "built in $(($(date +%s) - start))s: ${BIN}"

"${BIN}" version >&2 || {
  log "error: ${BIN} does not run"
  exit 1
}
echo "${BIN}"
