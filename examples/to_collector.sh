#!/usr/bin/env bash
# The demo, exported over OTLP into the local observability stack of collector-config/
# (OpenTelemetry Collector -> Prometheus + Jaeger -> Grafana). Start the stack first:
#
#   docker compose -f collector-config/docker-compose.yaml up -d
#
# then run this script and open Grafana at http://localhost:3000 (dashboard
# "Speculative decoding — per request") and Jaeger at http://localhost:16686.
#
# It runs `OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 spec-decode-otel demo`.
# An OTEL_EXPORTER_OTLP_ENDPOINT (and OTEL_EXPORTER_OTLP_PROTOCOL) already set in the
# environment wins, e.g. OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318
# OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf. Arguments go to the demo (default:
# --requests 200); --dry-run prints the command instead of running it.
#
# Run:  bash examples/to_collector.sh
set -euo pipefail

dry_run=false
if [[ "${1:-}" == "--dry-run" ]]; then
  dry_run=true
  shift
fi
if [[ $# -eq 0 ]]; then
  set -- --requests 200
fi

export OTEL_EXPORTER_OTLP_ENDPOINT="${OTEL_EXPORTER_OTLP_ENDPOINT:-http://localhost:4317}"
export OTEL_EXPORTER_OTLP_PROTOCOL="${OTEL_EXPORTER_OTLP_PROTOCOL:-grpc}"

if $dry_run; then
  echo "OTEL_EXPORTER_OTLP_ENDPOINT=$OTEL_EXPORTER_OTLP_ENDPOINT" \
    "OTEL_EXPORTER_OTLP_PROTOCOL=$OTEL_EXPORTER_OTLP_PROTOCOL" \
    "spec-decode-otel demo $*"
  exit 0
fi
exec spec-decode-otel demo "$@"
