"""An ``openai`` application that instruments OpenInference and spec-decode-otel in the
order given, then uninstruments OpenInference only and makes one call, for
``test_uninstrument_theirs.py``: run in the ``openinference`` coexistence venv.

Arguments: ``theirs-first`` or ``ours-first``, then optionally ``then-ours-again``
(uninstrument and instrument ours after theirs is gone). Environment: ``SIMULATOR_URL``.
Prints one JSON line: the instrumentation scope and ``spec_decode.outcome`` of each span
exported.
"""

from __future__ import annotations

import json
import os
import sys

import openai
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spec_decode_otel import SpecDecodeInstrumentor


def main() -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    theirs, ours = OpenAIInstrumentor(), SpecDecodeInstrumentor()
    steps = [
        lambda: theirs.instrument(tracer_provider=tracer_provider),
        lambda: ours.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider()),
    ]
    for step in steps if sys.argv[1] == "theirs-first" else reversed(steps):
        step()
    theirs.uninstrument()
    if sys.argv[2:] == ["then-ours-again"]:
        ours.uninstrument()
        ours.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider())
    client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
    client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Name three prime numbers."}],
        max_tokens=16,
        extra_headers={"x-spec-decode-engine": "vllm"},
    )
    client.close()
    spans = [
        [
            s.instrumentation_scope.name if s.instrumentation_scope else None,
            (s.attributes or {}).get("spec_decode.outcome"),
        ]
        for s in exporter.get_finished_spans()
    ]
    print(json.dumps(spans))


if __name__ == "__main__":
    main()
