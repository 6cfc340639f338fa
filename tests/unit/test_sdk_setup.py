"""``setup()``'s OTLP variables: a signal is exported only when an endpoint is set for it,
over gRPC unless ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the signal's own ``_PROTOCOL``, which
wins) names another protocol; ``OTEL_SERVICE_NAME`` wins over the ``service_name``
argument.

Each case runs in its own process (``setup()`` installs process-wide state) and reports
which OTLP exporter modules it imported: they are imported only when used. The process
leaves with ``os._exit``, so no final flush waits on an endpoint that is not there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, sys
import spec_decode_otel

built = spec_decode_otel.setup("from-argument", set_global=False)
print(json.dumps({
    "exporting": built.exporting,
    "service": built.tracer_provider.resource.attributes["service.name"],
    "exporters": sorted(
        name.removeprefix("opentelemetry.exporter.otlp.proto.")
        for name in sys.modules
        if name.endswith(("trace_exporter", "metric_exporter"))
    ),
}))
sys.stdout.flush()
os._exit(0)
"""

ENDPOINT = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("env", "exporters"),
    [
        ({}, []),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT},
            ["grpc.metric_exporter", "grpc.trace_exporter"],
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            ["http.metric_exporter", "http.trace_exporter"],
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            ["grpc.metric_exporter", "http.trace_exporter"],
        ),
        (
            {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": ENDPOINT + "/v1/metrics"},
            ["grpc.metric_exporter"],
        ),
    ],
    ids=["no-endpoint", "grpc-default", "http", "traces-protocol-wins", "metrics-only"],
)
def test_each_signal_exports_where_and_how_its_variables_say(
    env: dict[str, str], exporters: list[str]
) -> None:
    report = _setup_in_a_process(env)
    assert report["exporters"] == exporters
    assert report["exporting"] is bool(exporters)
    assert report["service"] == "from-argument"


def test_otel_service_name_wins_over_the_argument() -> None:
    assert _setup_in_a_process({"OTEL_SERVICE_NAME": "from-env"})["service"] == "from-env"


def _setup_in_a_process(env: dict[str, str]) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPEC_DECODE_"))}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    return report
