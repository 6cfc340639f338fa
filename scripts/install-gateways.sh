#!/usr/bin/env bash
# Build (or reuse) one virtual environment holding the Rust model gateways that install
# from wheels, for tests/integration/test_gateways.py: each real gateway runs as a
# process in front of the simulator and the instrumented `openai` client calls it (and,
# for test_gateway_smg_grpc.py, smg in front of a fake gRPC engine). Prints the venv's
# bin directory on the last line of stdout; everything else goes to stderr.
#
#   export SPEC_DECODE_OTEL_GATEWAYS="$(bash scripts/install-gateways.sh | tail -n 1)"
#
# The gateways, at exact pins (each wheel carries its compiled Rust core):
#   smg 1.13.0            the SGLang Model Gateway (smg-project/smg; core `smg.smg_rs`)
#   sglang-router 0.3.2   its predecessor (core `sglang_router.sglang_router_rs`)
#   vllm-router 0.1.17    vllm-project's Rust router (a fork of the SGLang router; core
#                         `vllm_router_rs`, a top-level module in the same wheel). Not the
#                         vLLM production-stack router, which is a different (Python) project.
#
# And what tests/integration/grpc_engine.py (a fake engine behind smg's gRPC router, for
# tests/integration/test_gateway_smg_grpc.py) needs, also at exact pins:
#   smg-grpc-proto 0.4.28 the engines' gRPC contract as smg-project publishes it (generated
#                         stubs of the SGLang, vLLM, TokenSpeed and TensorRT-LLM services;
#                         grpcio and protobuf come with smg)
#   tokenizers 0.23.3     writes the tiny tokenizer.json smg tokenizes with in gRPC mode
#
# Why one venv for the three: their dependencies are small and do not conflict. One
# thing clashes: sglang-router 0.3.2 also declares an `smg` console script, so which
# package owns bin/smg depends on install order; the tests start every gateway with
# `python -m` (`smg`, `sglang_router.launch_router`, `vllm_router.launch_router`), never
# through bin/smg. Why not the test environment: nothing of the gateways is imported by
# the tests, and their pins must not constrain or upgrade it.
#
# Environment:
#   SPEC_DECODE_OTEL_CACHE  cache root (default: $HOME/.cache/spec-decode-otel)
#   PYTHON                  interpreter that creates the venv (default: python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
CACHE_ROOT="${SPEC_DECODE_OTEL_CACHE:-${HOME}/.cache/spec-decode-otel}"
REQUIREMENTS=(
  "smg==1.13.0" "sglang-router==0.3.2" "vllm-router==0.1.17"
  "smg-grpc-proto==0.4.28" "tokenizers==0.23.3"
)
log() { printf '[install-gateways] %s\n' "$*" >&2; }

key="$(printf '%s\n' "$("$PYTHON" -VV)" "${REQUIREMENTS[@]}" | sha256sum | cut -c1-16)"
VENV="${CACHE_ROOT}/gateways-${key}"

mkdir -p "${CACHE_ROOT}"
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_ROOT}/.gateways.lock"
  flock 9
fi

if [[ -f "${VENV}/.complete" ]]; then
  log "cached: ${VENV}"
else
  log "building ${VENV}: ${REQUIREMENTS[*]}"
  rm -rf "${VENV}"
  "$PYTHON" -m venv "${VENV}"
  "${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}"
  # Fail here, not in the first test, when a wheel lacks its Rust core.
  "${VENV}/bin/python" -c 'import smg.smg_rs, sglang_router.sglang_router_rs, vllm_router_rs' >&2
  "${VENV}/bin/python" -c 'import smg_grpc_proto.generated.sglang_scheduler_pb2_grpc, tokenizers' >&2
  "${VENV}/bin/python" -m smg --version >&2
  "${VENV}/bin/python" -m sglang_router --version >&2
  touch "${VENV}/.complete"
fi
# Venvs built for another interpreter or other pins are of no more use.
find "${CACHE_ROOT}" -maxdepth 1 -name 'gateways-*' ! -path "${VENV}" -exec rm -rf {} +
echo "${VENV}/bin"
