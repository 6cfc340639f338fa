#!/usr/bin/env bash
# Install (or reuse) the Portkey AI Gateway, @portkey-ai/gateway 1.15.2 from the npm
# registry, for tests/integration/test_gateway_portkey.py: the real gateway runs as a Node
# process in front of the simulator and the instrumented `openai` client calls it. Prints
# the install directory on the last line of stdout; everything else goes to stderr.
#
#   export SPEC_DECODE_OTEL_PORTKEY="$(bash scripts/install-portkey.sh | tail -n 1)"
#
# Two trees of the same gateway, each `npm install --prefix` (never global):
#   locked/  @portkey-ai/gateway 1.15.2 with npm `overrides` @hono/node-server 1.13.5 and
#            @hono/node-ws 1.2.0: the HTTP server Portkey's own package-lock resolves, so
#            what the repository's `npm run start:node` and its image run.
#   npm/     @portkey-ai/gateway 1.15.2 with what a plain `npm install` (or `npx
#            @portkey-ai/gateway`) resolved on 2026-12-04, pinned so that the tests do not
#            change with the registry: @hono/node-server 1.19.19 and @hono/node-ws 1.3.1
#            (its `^1.3.3`). That server's lightweight Response keeps the upstream fetch
#            response's immutable Headers; Portkey's ResponseService.updateHeaders appends
#            to them, so every streamed answer is a 500 (Portkey-AI/gateway#1389). The
#            tests pin that too.
# Start either with `node <tree>/node_modules/@portkey-ai/gateway/build/start-server.js
# --port=P --headless` (the package's `bin`; `--port=` and `--headless` are the only
# flags it reads, and it binds every interface: the tests preload a loopback bind).
#
# Install scripts are not run (--ignore-scripts): the package's one, `patch-package`, has
# no patches/ directory to apply in the published tarball.
#
# Environment:
#   SPEC_DECODE_OTEL_CACHE  cache root (default: $HOME/.cache/spec-decode-otel)
#   NPM, NODE               the npm and node to use (default: from PATH)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

NPM="${NPM:-npm}"
NODE="${NODE:-node}"
CACHE_ROOT="${SPEC_DECODE_OTEL_CACHE:-${HOME}/.cache/spec-decode-otel}"
GATEWAY="@portkey-ai/gateway@1.15.2"
OVERRIDES='{"@hono/node-server": "1.13.5", "@hono/node-ws": "1.2.0"}'
NPM_OVERRIDES='{"@hono/node-server": "1.19.19", "@hono/node-ws": "1.3.1"}'
log() { printf '[install-portkey] %s\n' "$*" >&2; }

command -v "$NODE" >/dev/null || { log "no node on PATH (Node 18 or later is needed)"; exit 1; }
command -v "$NPM" >/dev/null || { log "no npm on PATH"; exit 1; }

key="$(printf '%s\n' "$("$NODE" --version)" "$("$NPM" --version)" "$GATEWAY" "$OVERRIDES" "$NPM_OVERRIDES" \
  | sha256sum | cut -c1-16)"
DIR="${CACHE_ROOT}/portkey-${key}"

mkdir -p "${CACHE_ROOT}"
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_ROOT}/.portkey.lock"
  flock 9
fi

npm_install() {
  "$NPM" install --prefix "$1" --ignore-scripts --no-audit --no-fund --loglevel=error \
    "${@:2}" >&2
}

if [[ -f "${DIR}/.complete" ]]; then
  log "cached: ${DIR}"
else
  log "installing ${GATEWAY} into ${DIR}"
  rm -rf "${DIR}"
  mkdir -p "${DIR}/locked" "${DIR}/npm"
  for tree in locked npm; do
    overrides="$OVERRIDES"
    [[ "$tree" == npm ]] && overrides="$NPM_OVERRIDES"
    cat >"${DIR}/${tree}/package.json" <<EOF
{
  "private": true,
  "dependencies": {"@portkey-ai/gateway": "${GATEWAY##*@}"},
  "overrides": ${overrides}
}
EOF
    npm_install "${DIR}/${tree}"
  done
  for tree in locked npm; do
    entry="${DIR}/${tree}/node_modules/@portkey-ai/gateway/build/start-server.js"
    [[ -f "$entry" ]] || { log "no ${entry}"; exit 1; }
    "$NPM" ls --prefix "${DIR}/${tree}" --all @portkey-ai/gateway @hono/node-server >&2
  done
  touch "${DIR}/.complete"
fi
# Installs for another Node, npm or pin are of no more use.
find "${CACHE_ROOT}" -maxdepth 1 -name 'portkey-*' ! -path "${DIR}" -exec rm -rf {} +
echo "${DIR}"
