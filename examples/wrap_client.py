"""Instrument one ``openai.OpenAI`` client with one line, then read the record off its span.

Shows: ``spec_decode_otel.instrument_client(client)`` on a plain client, a non-streaming
and a streaming chat completion, and the ``spec_decode.*`` attributes each call's span
carries (read here through an in-memory span exporter; in production the same span goes
to your OTLP collector). Streaming vLLM sends its stats on the final usage chunk, so the
streaming call asks for it with ``stream_options={"include_usage": True}``.

Run:  python examples/wrap_client.py
"""

from __future__ import annotations

import openai
from _simulator import API_KEY, MODEL, openai_base_url
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import spec_decode_otel

MESSAGES = [{"role": "user", "content": "Write a haiku about draft tokens."}]


def show(label: str, spans: InMemorySpanExporter) -> None:
    """Print the spec-decode attributes of the span the last call produced."""
    span = spans.get_finished_spans()[-1]
    attrs = {k: v for k, v in span.attributes.items() if k.startswith("spec_decode.")}
    print(f"{label}: span {span.name!r}")
    for key in sorted(attrs):
        value = attrs[key]
        print(f"  {key} = {list(value) if isinstance(value, tuple) else value}")


def main() -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))

    with openai_base_url() as base_url:
        client = openai.OpenAI(base_url=base_url, api_key=API_KEY)
        # The one line: every chat/completions call on this client now records acceptance.
        spec_decode_otel.instrument_client(client, tracer_provider=tracer_provider)

        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=64)
        show("non-streaming", spans)

        stream = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        print(f"(streamed {len(text)} characters)")
        show("streaming", spans)
        client.close()


if __name__ == "__main__":
    main()
