"""Concurrent streaming with ``AsyncOpenAI``, and include-usage injection.

Shows: ``SpecDecodeInstrumentor().instrument(inject_include_usage=True)`` instruments every
client in the process; vLLM sends streaming spec-decode stats only on the final usage
chunk, which exists only when the request sets ``stream_options.include_usage``. With
injection on, the instrumentation adds it to streaming requests that did not set it and
hides that extra chunk from your code, so the app below is unchanged and still gets a
record per request. Six streams run concurrently; each prints its own acceptance,
read from its own span: ``spec_decode_otel.attributes(prompt=i)`` tags each task's call,
and the tag stays with its task across ``await`` (it never leaks into another stream).

Run:  python examples/async_streaming.py
"""

from __future__ import annotations

import asyncio

import openai
from _simulator import API_KEY, MODEL, openai_base_url
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import spec_decode_otel

PROMPTS = [f"Give me fact number {i} about speculative decoding." for i in range(6)]


async def ask(client: openai.AsyncOpenAI, number: int) -> int:
    """One streaming request, tagged with its prompt number; returns the chunks seen."""
    chunks = 0
    with spec_decode_otel.attributes(prompt=number):
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPTS[number]}],
            max_tokens=64,
            stream=True,  # no stream_options: the instrumentation adds include_usage
        )
        async for chunk in stream:
            chunks += 1
            # The injected usage chunk (it has no choices) is hidden from the app.
            if not chunk.choices:
                raise RuntimeError("saw the usage chunk the instrumentation asked for")
    return chunks


async def main() -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    spec_decode_otel.SpecDecodeInstrumentor().instrument(
        tracer_provider=tracer_provider, inject_include_usage=True
    )
    try:
        with openai_base_url() as base_url:
            client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY)
            chunks = await asyncio.gather(*(ask(client, n) for n in range(len(PROMPTS))))
            await client.close()
    finally:
        spec_decode_otel.SpecDecodeInstrumentor().uninstrument()

    finished = [s for s in spans.get_finished_spans() if "spec_decode.engine" in s.attributes]
    print(f"{len(chunks)} concurrent streams, {len(finished)} spans with a record")
    for span in sorted(finished, key=lambda s: s.attributes["prompt"]):
        a = span.attributes
        print(
            f"prompt {a['prompt']}: chunks={chunks[a['prompt']]} engine={a['spec_decode.engine']} "
            f"acceptance_length={a['spec_decode.mean_acceptance_length']:.3f} "
            f"draft_acceptance_rate={a['spec_decode.draft_acceptance_rate']:.3f} "
            f"steps={a['spec_decode.num_spec_steps']} "
            f"output_tokens={a.get('gen_ai.usage.output_tokens')}"
        )


if __name__ == "__main__":
    asyncio.run(main())
