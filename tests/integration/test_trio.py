"""The async client under trio, anyio's other event loop: the instrumentation uses no
asyncio API (its stream ends and deferred finalization run on the caller's task or on a
thread), so every call ends once, as under asyncio.

Real parts: ``openai.AsyncOpenAI`` (its ``httpx2`` transport runs on trio through anyio),
trio itself, the simulator subprocess over loopback HTTP (vLLM's merged shape), and the
OTel SDK. A trio cancel scope that closes over a stream mid-way raises ``trio.Cancelled``
(a ``BaseException``) inside the stream: the caller stopped reading, the call did not
fail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest
import trio
from instrumentation_helpers import MESSAGES, MODEL, Otel

from spec_decode_otel import record_from_json

if TYPE_CHECKING:
    from reliability.reliability_helpers import SpanCounter

USAGE = {"include_usage": True}


async def _calls(base_url: str) -> None:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16)
        stream = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=16, stream=True, stream_options=USAGE
        )
        assert [chunk async for chunk in stream]
        with trio.move_on_after(0.2) as scope:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=64,
                stream=True,
                stream_options=USAGE,
                extra_headers={"x-sim-fault": "slow"},
            )
            async with stream:
                async for _ in stream:
                    pass
        assert scope.cancelled_caught
        events = await client.responses.create(
            model=MODEL, input="hi", max_output_tokens=16, stream=True
        )
        assert [event async for event in events]


def test_calls_under_trio_end_once_each(
    otel: Otel, span_counter: SpanCounter, simulator_url: str
) -> None:
    otel.instrument()
    trio.run(_calls, simulator_url)
    assert span_counter.open_after(5) == 0
    spans = otel.our_spans()
    outcomes = [s.attributes["spec_decode.outcome"] for s in spans]
    assert outcomes == ["recorded", "recorded", "not_read_to_end", "no_stats"]
    assert all(s.status.is_ok for s in spans)
    cancelled = spans[2].attributes
    assert cancelled["spec_decode.read_to_end"] is False
    assert "error.type" not in cancelled


def test_a_record_under_trio_is_the_bodys(otel: Otel, simulator_url: str) -> None:
    """The span's figures are the record of the body the client received."""
    otel.instrument()
    got: list[Any] = []

    async def call() -> None:
        async with openai.AsyncOpenAI(base_url=simulator_url, api_key="sk-test") as client:
            got.append(
                await client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=MESSAGES, max_tokens=16
                )
            )

    trio.run(call)
    record = record_from_json(got[0].http_response.json())
    assert record is not None
    (span,) = otel.our_spans()
    assert span.attributes["spec_decode.num_accepted_draft_tokens"] == (
        record.num_accepted_draft_tokens
    )
    assert span.attributes["spec_decode.acceptance_histogram"] == tuple(record.dense_histogram())


pytestmark = [
    pytest.mark.timeout(120),
    # The SDK's stream leaves its async generators to the garbage collector, where trio
    # warns about each (also uninstrumented): theirs, let through here and nothing else.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object:"
        "pytest.PytestUnraisableExceptionWarning"
    ),
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
]
