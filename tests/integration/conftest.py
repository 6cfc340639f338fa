"""Telemetry fixtures for the instrumentation tests.

- ``otel``: a real OTel SDK TracerProvider (InMemorySpanExporter behind a
  SimpleSpanProcessor) and MeterProvider (InMemoryMetricReader), NOT yet instrumented:
  call ``otel.instrument(**options)`` after any un-instrumented baseline calls. The
  instrumentor is a process-wide singleton, so teardown always uninstruments.
- ``instrumented``: the same, instrumented with every metric on: the defaults plus the
  opt-in GenAI client metrics, so these tests see all the telemetry a call can emit
  (what the defaults leave out is pinned by ``test_instrumentation_defaults.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from instrumentation_helpers import Otel


@pytest.fixture
def otel() -> Iterator[Otel]:
    telemetry = Otel()
    try:
        yield telemetry
    finally:
        telemetry.close()


@pytest.fixture
def instrumented(otel: Otel) -> Otel:
    otel.instrument(genai_metrics=True)
    return otel
