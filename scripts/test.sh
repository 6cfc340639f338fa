#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install everything the tests use, then run
# them. README's test command and CI (.ci/run) both call exactly this script.
#
# What it installs: the package with its test extras (pip); the OpenTelemetry Collector
# built from collector-config/builder-manifest.yaml and Jaeger v2 (Go, cached outside the
# repo); Prometheus 3.16.0 and its promtool, the compose stack's version (Go, cached).
# Then: ruff, mypy, pytest (unit, integration, e2e), the version matrix
# (scripts/test-matrix.sh) and the overhead benchmark in --quick mode as a smoke run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
export PATH="$PATH:/usr/local/go/bin"
step() { printf '\n==> %s\n' "$*"; }

step "python packages"
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'

step "OpenTelemetry Collector (built with the Collector Builder; cached)"
# Assign, then export: `export X=$(...)` would hide a failing script from set -e.
OTELCOL="$(bash scripts/install-collector.sh | tail -n 1)"
export SPEC_DECODE_OTEL_OTELCOL="$OTELCOL"

step "Prometheus 3.16.0 and promtool, the compose stack's version (built from its Go module; cached)"
PROMETHEUS="$(bash scripts/install-prometheus.sh | tail -n 1)"
export SPEC_DECODE_OTEL_PROMETHEUS="$PROMETHEUS"

step "trace store (Jaeger v2; cached)"
JAEGER="$(bash scripts/install-jaeger.sh | tail -n 1)"
export SPEC_DECODE_OTEL_JAEGER="$JAEGER"

step "llama.cpp server with speculative decoding (built from source on CPU; cached)"
# The engine tests (tests/engines, marker engine) run it; its gguf package and tokenizer
# model stay beside the binary (share/), where the tests find them.
LLAMA_SERVER="$(bash scripts/install-llama-server.sh | tail -n 1)"
export SPEC_DECODE_OTEL_LLAMA_SERVER="$LLAMA_SERVER"

step "venvs of the other OpenAI instrumentations (coexistence matrix; cached)"
# genai-openai, OpenInference and OpenLLMetry, one per venv: see the script for why.
COEXISTENCE_VENVS="$(PYTHON="$PYTHON" bash scripts/install-coexistence-venvs.sh | tail -n 1)"
export SPEC_DECODE_OTEL_COEXISTENCE_VENVS="$COEXISTENCE_VENVS"

step "LiteLLM proxy venv (the real proxy in front of the simulator; cached)"
# litellm 1.110.2 and the modules its proxy server imports: see the script for why.
LITELLM_PROXY="$(PYTHON="$PYTHON" bash scripts/install-litellm-proxy.sh | tail -n 1)"
export SPEC_DECODE_OTEL_LITELLM_PROXY="$LITELLM_PROXY"

step "Rust model gateways venv (smg, sglang-router, vllm-router in front of the simulator; cached)"
# Exact pins, run with `python -m` from the venv's bin directory: see the script for why.
GATEWAYS="$(PYTHON="$PYTHON" bash scripts/install-gateways.sh | tail -n 1)"
export SPEC_DECODE_OTEL_GATEWAYS="$GATEWAYS"

step "Portkey AI Gateway (npm, two pinned trees; cached)"
# Node and npm from the machine: see the script for why two trees.
PORTKEY="$(bash scripts/install-portkey.sh | tail -n 1)"
export SPEC_DECODE_OTEL_PORTKEY="$PORTKEY"

step "ruff"
"$PYTHON" -m ruff check .
"$PYTHON" -m ruff format --check .

step "mypy (strict, src/)"
"$PYTHON" -m mypy

step "pytest"
set +e
"$PYTHON" -m pytest "$@"
status=$?
set -e
if [[ $status -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure here, not a pass" >&2
  exit 1
fi
if [[ $status -ne 0 ]]; then
  exit "$status"
fi

step "version matrix: oldest declared versions on Python 3.10, latest on 3.12 and 3.13 (cached venvs)"
PYTHON="$PYTHON" bash scripts/test-matrix.sh

step "overhead benchmark (smoke run; figures are not asserted)"
"$PYTHON" benchmarks/overhead.py --quick
