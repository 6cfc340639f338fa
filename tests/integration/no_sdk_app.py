"""An ``openai`` application for ``test_no_sdk_hint.py``: configures the OpenTelemetry SDK
as ``NO_SDK_CASE`` says (or not at all), makes two chat calls to ``SIMULATOR_URL`` and
logs at WARNING to stdout, where the test reads the instrumentation's hints.

Cases: ``none`` (no SDK), ``tracing`` (a TracerProvider only, as a tracing-only set-up
leaves it), ``late`` (both providers set after ``instrument()``, before the first call),
``passed`` (providers passed to ``instrument()``, none set globally), ``zero-code`` (the
app instruments nothing itself: run it under ``opentelemetry-instrument``), ``clients``
(one client instrumented before the providers are set, a second after; the calls go to
both, and it prints the metrics its reader collected).
"""

from __future__ import annotations

import json
import logging
import os
import sys

import openai
from app_probes import metric_totals
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from spec_decode_otel import SpecDecodeInstrumentor, instrument_client


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(name)s: %(message)s")
    case = os.environ["NO_SDK_CASE"]
    if case == "tracing":
        trace.set_tracer_provider(TracerProvider())
    clients = [_client()]
    if case == "passed":
        providers = {"tracer_provider": TracerProvider(), "meter_provider": MeterProvider()}
        SpecDecodeInstrumentor().instrument(**providers)
    elif case == "clients":
        instrument_client(clients[0])
    elif case != "zero-code":
        SpecDecodeInstrumentor().instrument()
    reader = InMemoryMetricReader()
    if case in ("late", "clients"):
        trace.set_tracer_provider(TracerProvider())
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    if case == "clients":
        clients.append(instrument_client(_client()))
    for client in clients:
        for _ in range(2):
            client.chat.completions.create(
                model="spec-sim", messages=[{"role": "user", "content": "Say hello."}]
            )
        client.close()
    print("calls done")
    if case == "clients":
        print("metrics:", json.dumps(metric_totals(reader)))


def _client() -> openai.OpenAI:
    return openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)


if __name__ == "__main__":
    main()
