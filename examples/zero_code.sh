#!/usr/bin/env bash
# Zero-code instrumentation: the plain openai app (examples/plain_app.py) records
# per-request spec-decode acceptance with no code change, through opentelemetry-instrument
# (which finds spec-decode-otel by its `opentelemetry_instrumentor` entry point) and the
# standard OTEL_* variables plus SPEC_DECODE_OTEL_* ones.
#
# Spans go to the console by default; with OTEL_EXPORTER_OTLP_ENDPOINT set, spans and
# metrics go over OTLP to that endpoint instead. Without OPENAI_BASE_URL the script starts
# the project's simulator (`spec-decode-otel simulate --port 0`) and points the app at it.
#
# Run:  bash examples/zero_code.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"

if [[ -z "${OPENAI_BASE_URL:-}" ]]; then
  log="$(mktemp)"
  spec-decode-otel simulate --port 0 --seed 7 --min-length 32 --max-length 96 \
    --model llama-3.1-8b-eagle3=0.9,0.85,0.75,0.65 >"$log" 2>&1 &
  simulator=$!
  trap 'kill "$simulator" 2>/dev/null; wait "$simulator" 2>/dev/null; rm -f "$log"' EXIT
  for _ in $(seq 200); do
    grep -q '^serving ' "$log" && break
    kill -0 "$simulator" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.05
  done
  OPENAI_BASE_URL="$(sed -n 's/^serving //p' "$log" | head -n 1)"
  [[ -n "$OPENAI_BASE_URL" ]] || { echo "the simulator did not start" >&2; exit 1; }
  export OPENAI_BASE_URL
  echo "simulator at $OPENAI_BASE_URL" >&2
fi

export OTEL_SERVICE_NAME="${OTEL_SERVICE_NAME:-plain-app}"
if [[ -n "${OTEL_EXPORTER_OTLP_ENDPOINT:-}" ]]; then
  export OTEL_TRACES_EXPORTER="${OTEL_TRACES_EXPORTER:-otlp}"
  export OTEL_METRICS_EXPORTER="${OTEL_METRICS_EXPORTER:-otlp}"
else
  export OTEL_TRACES_EXPORTER="${OTEL_TRACES_EXPORTER:-console}"
  export OTEL_METRICS_EXPORTER="${OTEL_METRICS_EXPORTER:-none}"
fi
export OTEL_LOGS_EXPORTER="${OTEL_LOGS_EXPORTER:-none}"
# vLLM streams its stats on the usage chunk: ask for it, and hide it from the app.
export SPEC_DECODE_OTEL_INJECT_INCLUDE_USAGE="${SPEC_DECODE_OTEL_INJECT_INCLUDE_USAGE:-true}"

opentelemetry-instrument "$PYTHON" "$here/plain_app.py"
