"""Concurrent async streams on uvloop, the event loop uvicorn, vLLM's own API server and
many async services run on, against the simulator SUBPROCESS.

Our stream proxies keep the caller's context untouched between chunks (contextvars),
finish a span exactly once on exhaustion, ``aclose()``, cancellation or garbage
collection, and defer the last to a thread of ours: all of it written against asyncio's
semantics, which uvloop (uvloop 0.23, a libuv loop in Cython) implements anew. Here 300
concurrent streams on one ``AsyncOpenAI`` client, each under its own parent span and
``spec_decode_otel.attributes(task=i)``, are read to the end, left early and closed,
cancelled mid-stream, or dropped unread, on both of the SDK's async transports. Each
must give exactly one finalized span, under its own parent, not an error, marked as read
to the end or not as it was; and nothing may stay open.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import openai
import pytest
import uvloop
from opentelemetry.trace import StatusCode
from reliability_helpers import Otel, async_client, canary_messages, instrumented

import spec_decode_otel

REQUESTS = 300
CONCURRENCY = 100
ENGINES = ("vllm", "sglang", "trtllm", "llamacpp")
#: How task i ends its stream, by i % 4 (and its engine by i // 4 % 4: every pair occurs).
WAYS = ("read", "left", "cancelled", "dropped")


def kwargs_for(i: int) -> dict[str, Any]:
    engine = ENGINES[i // len(WAYS) % len(ENGINES)]
    extra = {"return_spec_tokens_details": True} if engine == "sglang" else {}
    return {
        "model": "spec-sim",
        "messages": canary_messages(),
        "max_tokens": 24,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_headers": {"x-spec-decode-engine": engine},
        "extra_body": extra,
    }


async def run_all(client: openai.AsyncOpenAI, otel: Otel) -> dict[int, int]:
    """Every task's parent span id, by task."""
    tracer = otel.tracer_provider.get_tracer("uvloop-test")
    sem = asyncio.Semaphore(CONCURRENCY)
    parents: dict[int, int] = {}

    async def one(i: int) -> None:
        way = WAYS[i % len(WAYS)]
        async with sem:
            with (
                tracer.start_as_current_span(f"task-{i}") as parent,
                spec_decode_otel.attributes(task=i),
            ):
                parents[i] = parent.get_span_context().span_id
                stream = await client.chat.completions.create(**kwargs_for(i))
                if way == "dropped":
                    del stream
                    return
                seen = 0
                async for _ in stream:
                    seen += 1
                    await asyncio.sleep(0)  # interleave the tasks mid-stream
                    if way == "left" and seen == 2:
                        await stream.close()
                        return
                    if way == "cancelled" and seen == 2:
                        asyncio.current_task().cancel()  # type: ignore[union-attr]
                        await asyncio.sleep(0)

    results = await asyncio.gather(*(one(i) for i in range(REQUESTS)), return_exceptions=True)
    cancelled = [i for i, r in enumerate(results) if isinstance(r, asyncio.CancelledError)]
    others = [r for r in results if isinstance(r, BaseException)]
    assert len(cancelled) == len(others) == REQUESTS // len(WAYS), others[:3]
    assert all(WAYS[i % len(WAYS)] == "cancelled" for i in cancelled)
    return parents


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
def test_concurrent_streams_on_uvloop_end_once_each_with_their_outcome(
    simulator_url: str, transport: str
) -> None:
    otel = Otel()

    async def main() -> dict[int, int]:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        client = async_client(simulator_url, transport)
        try:
            parents = await run_all(client, otel)
            # dropped streams end on the finalizer's thread, a moment after they go
            assert await otel.counter.open_after_async(10) == 0
            return parents
        finally:
            await client.close()

    with instrumented(otel):
        parents = uvloop.run(main())
    spans = otel.spans()
    assert Counter(s.attributes["task"] for s in spans if s.attributes) == Counter(range(REQUESTS))
    for span in spans:
        assert span.attributes is not None
        i = span.attributes["task"]
        way = WAYS[i % len(WAYS)]
        assert span.status.status_code is StatusCode.UNSET, (i, way)  # a cancel is no error
        assert span.parent is not None and span.parent.span_id == parents[i]
        if way == "read":
            assert span.attributes["spec_decode.outcome"] in {"recorded", "partial"}, i
            assert "spec_decode.read_to_end" not in span.attributes
        else:  # whatever stats had come: a record, or the outcome not_read_to_end
            assert span.attributes["spec_decode.read_to_end"] is False, (i, way)
    otel.shutdown()
