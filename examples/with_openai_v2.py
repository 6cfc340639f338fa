"""Coexisting with opentelemetry-instrumentation-openai-v2: one span, both attribute sets.

Shows: with the OpenTelemetry GenAI instrumentation for openai (``openai-v2``) also
active, spec-decode-otel (in its default ``mode="auto"``) does not make a second span
for the same call: it adds its ``spec_decode.*`` attributes to the span openai-v2 made,
so GenAI dashboards are not doubled. The script prints each span's instrumentation scope
and attribute keys, one call non-streaming and one streaming.

Run:  python examples/with_openai_v2.py
"""

from __future__ import annotations

import openai
from _simulator import API_KEY, MODEL, openai_base_url
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import spec_decode_otel

MESSAGES = [{"role": "user", "content": "Name three drafting methods."}]


def main() -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    OpenAIInstrumentor().instrument(tracer_provider=tracer_provider)
    spec_decode_otel.SpecDecodeInstrumentor().instrument(tracer_provider=tracer_provider)
    try:
        with openai_base_url() as base_url:
            client = openai.OpenAI(base_url=base_url, api_key=API_KEY)
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=48)
            stream = client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=48,
                stream=True,
                stream_options={"include_usage": True},
            )
            for _ in stream:
                pass
            client.close()
    finally:
        spec_decode_otel.SpecDecodeInstrumentor().uninstrument()
        OpenAIInstrumentor().uninstrument()

    finished = spans.get_finished_spans()
    print(f"2 calls, {len(finished)} spans")
    for span in finished:
        keys = sorted(span.attributes)
        print(f"span {span.name!r} from scope {span.instrumentation_scope.name}")
        print("  others:        " + ", ".join(k for k in keys if "spec_decode" not in k))
        print("  spec_decode.*: " + ", ".join(k for k in keys if k.startswith("spec_decode.")))


if __name__ == "__main__":
    main()
