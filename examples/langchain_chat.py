"""LangChain's ``ChatOpenAI``, instrumented: acceptance for every model call of a chain.

Shows: ``SpecDecodeInstrumentor().instrument()`` covers clients that a framework creates for
you. ``ChatOpenAI`` builds its own ``openai`` client and calls it through
``with_raw_response`` (always for ``invoke``; for ``stream`` too with
``include_response_headers=True``, used here). The instrumentation wraps the client's
request path, so those calls still get a record on their span, and LangChain still gets
the response headers (printed below).
``stream_usage=True`` makes LangChain ask for the final usage chunk, on which vLLM sends
its streaming stats.

Needs ``pip install langchain-openai``.

Run:  python examples/langchain_chat.py
"""

from __future__ import annotations

from _simulator import API_KEY, MODEL, openai_base_url
from langchain_openai import ChatOpenAI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import spec_decode_otel


def main() -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    spec_decode_otel.SpecDecodeInstrumentor().instrument(tracer_provider=tracer_provider)
    try:
        with openai_base_url() as base_url:
            llm = ChatOpenAI(
                model=MODEL,
                base_url=base_url,
                api_key=API_KEY,
                max_tokens=64,
                stream_usage=True,
                include_response_headers=True,
            )
            answer = llm.invoke("What does a draft model do?")
            headers = answer.response_metadata.get("headers", {})
            print(f"invoke: {len(answer.content)} characters, {len(headers)} response headers")
            streamed = "".join(str(part.content) for part in llm.stream("And a target model?"))
            print(f"stream: {len(streamed)} characters")
    finally:
        spec_decode_otel.SpecDecodeInstrumentor().uninstrument()

    for call, span in zip(("invoke", "stream"), spans.get_finished_spans(), strict=True):
        a = span.attributes
        print(
            f"{call}: span {span.name!r} engine={a.get('spec_decode.engine')} "
            f"acceptance_length={a.get('spec_decode.mean_acceptance_length', 0.0):.3f} "
            f"draft_acceptance_rate={a.get('spec_decode.draft_acceptance_rate', 0.0):.3f}"
        )


if __name__ == "__main__":
    main()
