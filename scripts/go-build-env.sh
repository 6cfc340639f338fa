# Sourced by the install scripts that build a Go binary from a throw-away module
# (install-jaeger.sh, install-prometheus.sh): finds Go, sets the build environment, and
# makes the work directory. Needs `log` and DEST_DIR from the sourcing script; sets GO
# and WORK (removed on exit).

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
