#!/usr/bin/env bash
# Build (or reuse) a virtual environment holding the LiteLLM proxy server, for the
# gateway tests (tests/integration/test_litellm_proxy.py): the real proxy runs in front
# of the simulator and the instrumented `openai` client calls the proxy. Prints the path
# of the venv's `litellm` executable on the last line of stdout; everything else goes to
# stderr.
#
#   export SPEC_DECODE_OTEL_LITELLM_PROXY="$(bash scripts/install-litellm-proxy.sh | tail -n 1)"
#
# Why a separate environment: the proxy's dependencies (a web server, auth, scheduling,
# MCP) must not be added to or upgrade the test environment; the proxy runs as a
# process, the way users run it, so nothing of it is imported by the tests. The version
# is the one pyproject's `litellm` extra pins, so README's claims about the proxy are
# about the LiteLLM the callback is tested with.
#
# Why not `litellm[proxy]==1.110.2`: that extra requires `litellm-proxy==1.110.2`, which
# no reachable package index has ("No matching distribution found"), so pip refuses the
# whole extra. The proxy server itself ships inside the `litellm` wheel
# (litellm/proxy/proxy_server.py, the `litellm` console script); what it lacks are the
# modules it imports. REQUIREMENTS below is `litellm==1.110.2` plus exactly the modules
# that `litellm --config` imports before it answers /health/readiness (found by starting
# it and adding each missing module in turn: websockets, fastapi, orjson, backoff, redis,
# apscheduler, jwt, cryptography, semver, uvicorn, multipart, expression, fastapi_sso,
# mcp, soundfile, uvloop), with the version ranges the `proxy` extra declares for them
# (redis is not in the extra: the missing `litellm-proxy` must be what brings it), and
# pynacl, which the proxy imports only when it answers /v1/responses (it encrypts the
# response ids it hands out: litellm/proxy/hooks/responses_id_security.py), so that call
# fails with HTTP 500 without it.
#
# The venv also holds spec-decode-otel's own requirements with the extras an in-proxy
# set-up uses (`instruments`: openai; `otlp`: the OpenTelemetry SDK and exporters), read
# from pyproject.toml, so tests/integration/test_litellm_proxy_callback.py can load
# examples/litellm_proxy/'s callback module inside the proxy. The package itself is not
# installed: that test puts the work tree's src/ on the proxy's PYTHONPATH, so the proxy
# runs the code under test, and the cache key (which covers these requirements) changes
# only when they do.
#
# Environment:
#   SPEC_DECODE_OTEL_CACHE  cache root (default: $HOME/.cache/spec-decode-otel)
#   PYTHON                  interpreter that creates the venv (default: python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
CACHE_ROOT="${SPEC_DECODE_OTEL_CACHE:-${HOME}/.cache/spec-decode-otel}"
REQUIREMENTS=(
  "litellm==1.110.2"
  "websockets>=15.0.1,<16.0" "fastapi>=0.136.3,<1.0" "starlette>=1.0.1,<2.0"
  "uvicorn>=0.33.0,<1.0" "uvloop>=0.22.1,<1.0" "orjson>=3.11.6,<4.0" "backoff>=2.2.1,<3.0"
  "redis" "apscheduler>=3.11.2,<4.0" "pyjwt>=2.13.0,<3.0" "cryptography>=49.0.0,<51.0"
  "semver>=3.0.4,<4" "python-multipart>=0.0.27,<1.0" "expression>=5.6.0,<6.0"
  "fastapi-sso>=0.19.0,<1.0" "mcp>=2.3.0,<3" "soundfile>=0.12.1,<1.0" "pynacl>=1.6.2,<2.0"
)
# spec-decode-otel's requirements (core + instruments + otlp), one per line.
mapfile -t PROJECT_REQUIREMENTS < <("$PYTHON" -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; x = p["optional-dependencies"]; print("\n".join(p["dependencies"] + x["instruments"] + x["otlp"]))')
log() { printf '[install-litellm-proxy] %s\n' "$*" >&2; }

key="$(printf '%s\n' "$("$PYTHON" -VV)" "${REQUIREMENTS[@]}" "${PROJECT_REQUIREMENTS[@]}" | sha256sum | cut -c1-16)"
VENV="${CACHE_ROOT}/litellm-proxy-${key}"

mkdir -p "${CACHE_ROOT}"
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_ROOT}/.litellm-proxy.lock"
  flock 9
fi

if [[ -f "${VENV}/.complete" ]]; then
  log "cached: ${VENV}"
else
  log "building ${VENV}: ${REQUIREMENTS[*]} ${PROJECT_REQUIREMENTS[*]}"
  rm -rf "${VENV}"
  "$PYTHON" -m venv "${VENV}"
  "${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check \
    "${REQUIREMENTS[@]}" "${PROJECT_REQUIREMENTS[@]}"
  # Fail here, not in the first test, when one of the modules the proxy needs is missing.
  LITELLM_LOCAL_MODEL_COST_MAP=True "${VENV}/bin/python" -c \
    'import litellm.proxy.proxy_server, uvicorn, uvloop, expression, fastapi_sso, mcp, soundfile' >&2
  "${VENV}/bin/python" -c 'import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter, opentelemetry.instrumentation.instrumentor, wrapt, pydantic' >&2
  touch "${VENV}/.complete"
fi
# Venvs built for another interpreter or version are of no more use.
find "${CACHE_ROOT}" -maxdepth 1 -name 'litellm-proxy-*' ! -path "${VENV}" -exec rm -rf {} +
echo "${VENV}/bin/litellm"
