"""The async client on the ``openai`` SDK's aiohttp transport, instrumented for real.

``openai.DefaultAioHttpClient()`` is what the SDK's README recommends for
high-concurrency async code: in openai 3.63.0 (``_base_client.py``) an
``httpx2.AsyncClient`` on the vendored ``openai._vendor.httpx_aiohttp`` transport, in
openai 2.54.0 an ``httpx.AsyncClient`` on the ``httpx-aiohttp`` package's
(``scripts/test-matrix.sh`` runs this file in its openai 2 venv). Our wrapper sits on
``AsyncAPIClient.request``, above the transport, and the raw-response readers read the
SDK's response object, so nothing of ours should depend on it; these calls check that
on every form a user reads a response in: ``create`` with and without a stream,
``with_raw_response`` and ``with_streaming_response``, a stream left early. Each record
must equal what ``record_from_json`` reads from the same seeded payload fetched again
without instrumentation, and what the user reads must equal what the server sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from instrumentation_helpers import (
    Otel,
    call_async,
    dumps_without_volatile,
    expected_outcome,
    expected_span_attributes,
    raw_payload,
    request_kwargs,
    spec_decode_attributes,
)

import spec_decode_otel

ENGINES = ["vllm", "sglang", "trtllm", "llamacpp"]


@pytest.fixture
async def aiohttp_client(simulator_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    http_client = openai.DefaultAioHttpClient()
    # the calls really go through aiohttp (the transport's module is the vendored one)
    assert "httpx_aiohttp" in type(http_client._transport).__module__
    client = openai.AsyncOpenAI(
        api_key="sk-test", base_url=simulator_url, max_retries=0, http_client=http_client
    )
    yield client
    await client.close()


def record_of(simulator_url: str, kwargs: dict[str, Any]) -> Any:
    payload = raw_payload(simulator_url, "chat", kwargs)
    record = spec_decode_otel.record_from_json(payload)
    assert record is not None
    return payload, record


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("engine", ENGINES)
async def test_create_on_aiohttp_gives_the_record_of_the_payload(
    engine: str,
    stream: bool,
    instrumented: Otel,
    simulator_url: str,
    aiohttp_client: openai.AsyncOpenAI,
) -> None:
    kwargs = request_kwargs(engine, "chat", stream, 7100 + ENGINES.index(engine))
    results = await call_async(aiohttp_client, "chat", kwargs)
    payload, record = record_of(simulator_url, kwargs)
    assert dumps_without_volatile(results) == dumps_without_volatile(
        payload if stream else [payload]
    )
    span = instrumented.only_span()
    assert span.attributes is not None
    assert span.attributes["spec_decode.outcome"] == expected_outcome(record)
    assert spec_decode_attributes(span.attributes) == expected_span_attributes(record)


@pytest.mark.parametrize("read", ["iter_lines", "iter_bytes", "iter_text"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_raw_and_streaming_responses_on_aiohttp_give_the_record(
    engine: str,
    read: str,
    instrumented: Otel,
    simulator_url: str,
    aiohttp_client: openai.AsyncOpenAI,
) -> None:
    """``read``: how the user reads the streamed body; aiohttp hands it over in its own
    pieces, which our SSE decoding must take across any boundary."""
    completions = aiohttp_client.chat.completions
    plain = request_kwargs(engine, "chat", False, 7200)
    raw = await completions.with_raw_response.create(**plain)
    parsed = raw.parse()
    streamed = request_kwargs(engine, "chat", True, 7201)
    async with completions.with_streaming_response.create(**streamed) as response:
        if read == "iter_lines":
            lines = [line async for line in response.iter_lines()]
        elif read == "iter_bytes":
            lines = b"".join([piece async for piece in response.iter_bytes()]).decode().split("\n")
        else:
            lines = "".join([piece async for piece in response.iter_text()]).split("\n")
    _, plain_record = record_of(simulator_url, plain)
    stream_payload, stream_record = record_of(simulator_url, streamed)
    assert parsed.choices and len([line for line in lines if line.startswith("data: {")]) == len(
        stream_payload
    )
    spans = instrumented.spans()
    assert [spec_decode_attributes(s.attributes or {}) for s in spans] == [
        expected_span_attributes(plain_record),
        expected_span_attributes(stream_record),
    ]


async def test_a_stream_left_early_on_aiohttp_ends_its_span_as_not_read_to_end(
    instrumented: Otel, aiohttp_client: openai.AsyncOpenAI
) -> None:
    stream = await aiohttp_client.chat.completions.create(
        **request_kwargs("vllm", "chat", True, 7300)
    )
    async for _ in stream:
        break
    await stream.close()
    span = instrumented.only_span()
    assert span.attributes is not None
    assert span.attributes["spec_decode.outcome"] == "not_read_to_end"
    assert span.attributes["spec_decode.read_to_end"] is False
