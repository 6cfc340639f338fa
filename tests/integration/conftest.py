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
from typing import TYPE_CHECKING

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from instrumentation_helpers import Otel

if TYPE_CHECKING:
    from reliability.reliability_helpers import SpanCounter

#: Frameworks whose releases require openai < 3 (Instructor 1.17.0 through jiter,
#: LlamaIndex's OpenAILike 0.8.1): their modules run in the version matrix's openai 2
#: venv (scripts/test-matrix.sh, which installs them there), not where openai 3 is.
OPENAI_2_ONLY = ["test_instructor.py", "test_llamaindex.py"]
collect_ignore = OPENAI_2_ONLY if int(openai.__version__.split(".")[0]) >= 3 else []


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


# reliability_helpers imports httpx2 (openai 3's transport): imported where used, so the
# version matrix's openai 1 and 2 runs, which load this file too, do not need it.


@pytest.fixture
def span_counter(otel: Otel) -> SpanCounter:
    """Every span started and ended on ``otel``'s provider (other libraries' too), to see
    any left open."""
    from reliability.reliability_helpers import SpanCounter

    counter = SpanCounter()
    otel.tracer_provider.add_span_processor(counter)
    return counter


@pytest.fixture
def no_internal_errors() -> Iterator[None]:
    """Fails the test if the instrumentation reports an internal error of its own."""
    from reliability.reliability_helpers import internal_errors

    with internal_errors() as errors:
        yield
    assert errors == []
