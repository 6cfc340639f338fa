"""An ``openai`` application for ``test_no_sdk_hint.py``: configures the OpenTelemetry SDK
as ``NO_SDK_CASE`` says (or not at all), makes two chat calls to ``SIMULATOR_URL`` and
logs at WARNING to stdout, where the test reads the instrumentation's hints.

Cases: ``none`` (no SDK), ``tracing`` (a TracerProvider only, as a tracing-only set-up
leaves it), ``late`` (both providers set after ``instrument()``, before the first call),
``passed`` (providers passed to ``instrument()``, none set globally), ``zero-code`` (the
app instruments nothing itself: run it under ``opentelemetry-instrument``).
"""

from __future__ import annotations

import logging
import os
import sys

import openai
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from spec_decode_otel import SpecDecodeInstrumentor


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(name)s: %(message)s")
    case = os.environ["NO_SDK_CASE"]
    if case == "tracing":
        trace.set_tracer_provider(TracerProvider())
    if case == "passed":
        providers = {"tracer_provider": TracerProvider(), "meter_provider": MeterProvider()}
        SpecDecodeInstrumentor().instrument(**providers)
    elif case != "zero-code":
        SpecDecodeInstrumentor().instrument()
    if case == "late":
        trace.set_tracer_provider(TracerProvider())
        metrics.set_meter_provider(MeterProvider())
    client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
    for _ in range(2):
        client.chat.completions.create(
            model="spec-sim", messages=[{"role": "user", "content": "Say hello."}]
        )
    client.close()
    print("calls done")


if __name__ == "__main__":
    main()
