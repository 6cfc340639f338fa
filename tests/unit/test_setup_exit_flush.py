"""A short script's spans and metrics are flushed when it exits, however it exits.

``setup()`` registers ``Providers.shutdown`` with ``atexit``; the script below hands
``setup()`` console exporters behind a batch processor and a reader whose interval is an
hour, so anything printed was printed by that exit flush. Each run is a process of its
own on this interpreter (the version matrix runs this module on 3.10, 3.12 and 3.13).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import sys
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
import spec_decode_otel

spec_decode_otel.setup(
    "exit-flush",
    span_processors=[BatchSpanProcessor(ConsoleSpanExporter(), schedule_delay_millis=3600000)],
    metric_readers=[
        PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=3600000)
    ],
)
trace.get_tracer("app").start_span("short-script-span").end()
metrics.get_meter("app").create_counter("short_script_runs").add(1)
how = sys.argv[1]
if how == "exit-3":
    sys.exit(3)
if how == "raise":
    raise RuntimeError("the script failed")
"""


@pytest.mark.parametrize(("how", "status"), [("return", 0), ("exit-3", 3), ("raise", 1)])
def test_a_short_scripts_spans_and_metrics_are_flushed_at_exit(how: str, status: int) -> None:
    """``Providers.shutdown`` flushed both providers on two daemon threads it started from
    the ``atexit`` handler. CPython 3.12.0 and 3.12.1 refuse to start a thread there
    ("RuntimeError: can't create new thread at interpreter shutdown", CPython gh-113964,
    allowed again in 3.12.2): the handler failed before flushing anything, and a short
    script on those versions exported none of its spans and metrics. They are flushed on
    every supported version, whether the script returns, calls ``sys.exit`` or raises."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPEC_DECODE_"))}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, how],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == status, done.stderr
    assert '"name": "short-script-span"' in done.stdout, done.stderr
    assert '"name": "short_script_runs"' in done.stdout, done.stderr
    assert "Exception ignored in atexit" not in done.stderr, done.stderr
