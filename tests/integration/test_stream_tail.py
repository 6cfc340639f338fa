"""Streams of one sequence are read per chunk through one test; what they report is unchanged.

For ``n`` = 1 the stream proxy reads only ``choices[0].finish_reason`` of each chunk and
keeps the finish chunk, the chunks after it and the latest chunk; for ``n`` > 1 it still
observes every chunk. These tests drive streams far longer than the chunks it keeps
(``KEEP_CHUNKS``) through the simulator, every way a user reads them (``for``,
``next()``, ``async for``, ``__anext__``), and check that each still reports exactly what
``record_from_json`` reads from the same payload fetched without instrumentation; that
several sequences still give no record; that our injected usage chunk stays hidden; that a
running-average stream closed early reports its latest chunk's average; and that the proxy
reads the SDK's own generator where the SDK only forwards to it, and calls a patched
``__iter__`` where it does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest
from instrumentation_helpers import (
    MODEL,
    Otel,
    create_method,
    dumps_without_volatile,
    expected_span_attributes,
    fingerprint_left_on_the_usage_chunk,
    payload_finish_reasons,
    payload_usage,
    raw_payload,
    request_kwargs,
    spec_decode_attributes,
)

import spec_decode_otel
from spec_decode_otel.instrumentation.streams import KEEP_CHUNKS

#: Natural completions of 1,500-2,000 tokens: streams of hundreds of chunks.
LONG_ARGS = (
    "--engine", "vllm", "--level", "detailed", "--k", "4", "--alpha", "0.7",
    "--seed", "77", "--min-length", "1500", "--max-length", "2000",
)  # fmt: skip
READS = ["for", "next", "async-for", "anext"]
#: Engine shapes, each with its usual usage setting (instrumentation_helpers), plus the
#: other setting where it moves the stats: SGLang then ends with two choice-less chunks
#: (sglext, usage), llama.cpp without usage puts its timings on the finish chunk.
TAIL_CASES = [
    "vllm",
    "vllm-premerge",
    "sglang",
    "sglang+usage",
    "trtllm",
    "trtllm-released",
    "llamacpp",
    "llamacpp+no-usage",
]


@pytest.fixture(scope="module")
def long_url(start_simulator: Callable[..., str]) -> str:
    return start_simulator(*LONG_ARGS)


@pytest.fixture
async def clients(long_url: str) -> Any:
    sync = openai.OpenAI(api_key="sk-test", base_url=long_url, max_retries=0)
    asynchronous = openai.AsyncOpenAI(api_key="sk-test", base_url=long_url, max_retries=0)
    yield sync, asynchronous
    sync.close()
    await asynchronous.close()


async def read_all(read: str, clients: Any, api: str, kwargs: dict[str, Any]) -> list[Any]:
    """Every chunk of one stream, read the way ``read`` names."""
    sync, asynchronous = clients
    if read in ("for", "next"):
        stream = create_method(sync, api)(**kwargs)
        if read == "for":
            return [chunk for chunk in stream]
        out = []
        while True:
            try:
                out.append(next(stream))
            except StopIteration:
                return out
    stream = await create_method(asynchronous, api)(**kwargs)
    if read == "async-for":
        return [chunk async for chunk in stream]
    out = []
    while True:
        try:
            out.append(await stream.__anext__())
        except StopAsyncIteration:
            return out


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("case", TAIL_CASES)
async def test_a_long_stream_reports_the_record_of_its_payload(
    case: str, read: str, instrumented: Otel, clients: Any, long_url: str
) -> None:
    engine, _, variant = case.partition("+")
    kwargs = request_kwargs(engine, "chat", True, 900 + TAIL_CASES.index(case))
    if variant == "usage":
        kwargs["stream_options"] = {"include_usage": True}
    elif variant == "no-usage":
        del kwargs["stream_options"]
    chunks = await read_all(read, clients, "chat", kwargs)
    assert len(chunks) > 10 * KEEP_CHUNKS

    payload = raw_payload(long_url, "chat", kwargs)
    assert dumps_without_volatile(chunks) == dumps_without_volatile(payload)
    record = spec_decode_otel.record_from_json(payload)
    assert record is not None
    attrs = dict(instrumented.only_span().attributes)
    assert spec_decode_attributes(attrs) == expected_span_attributes(record)
    assert attrs["gen_ai.response.finish_reasons"] == tuple(payload_finish_reasons(payload))
    assert attrs["gen_ai.response.model"] == MODEL
    usage = payload_usage(payload)
    if usage is None:
        assert "gen_ai.usage.output_tokens" not in attrs
    else:
        assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    (ttfc,) = instrumented.points(
        instrumented.metrics(), "gen_ai.client.operation.time_to_first_chunk"
    )
    assert ttfc.count == 1 and ttfc.sum > 0


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
async def test_several_sequences_give_no_record_and_every_finish_reason(
    engine: str, read: str, instrumented: Otel, clients: Any
) -> None:
    kwargs = request_kwargs(engine, "chat", True, 950, n=2)
    chunks = await read_all(read, clients, "chat", kwargs)
    assert len(chunks) > 10 * KEEP_CHUNKS
    assert {c.index for chunk in chunks for c in chunk.choices} == {0, 1}
    attrs = dict(instrumented.only_span().attributes)
    assert spec_decode_attributes(attrs) == {}
    assert len(attrs["gen_ai.response.finish_reasons"]) == 2


@pytest.mark.parametrize("read", READS)
async def test_a_multi_prompt_completion_is_several_sequences_though_n_is_one(
    read: str, instrumented: Otel, clients: Any, long_url: str
) -> None:
    # n = 1 asked, two prompts: two sequences come back, seen on their finish chunks
    kwargs = request_kwargs("vllm", "completions", True, 960, prompt=["one", "two"])
    chunks = await read_all(read, clients, "completions", kwargs)
    assert {c.index for chunk in chunks for c in chunk.choices} == {0, 1}
    payload = raw_payload(long_url, "completions", kwargs)
    assert spec_decode_otel.record_from_json(payload) is None  # several sequences
    attrs = dict(instrumented.only_span().attributes)
    assert spec_decode_attributes(attrs) == {}
    assert len(attrs["gen_ai.response.finish_reasons"]) == 2


@pytest.mark.parametrize("read", READS)
async def test_the_injected_usage_chunk_stays_hidden_on_a_long_stream(
    read: str, otel: Otel, clients: Any, long_url: str
) -> None:
    kwargs = request_kwargs("vllm", "chat", True, 970)
    del kwargs["stream_options"]  # the user did not ask for usage: we inject it
    otel.instrument(inject_include_usage=True)
    chunks = await read_all(read, clients, "chat", kwargs)

    bare = raw_payload(long_url, "chat", kwargs)  # the wire without our injection
    assert not any(c.get("usage") for c in bare)
    seen = fingerprint_left_on_the_usage_chunk(dumps_without_volatile(bare))
    assert dumps_without_volatile(chunks) == seen
    assert all(chunk.choices for chunk in chunks)
    attrs = dict(otel.only_span().attributes)
    # the stats and usage came from the chunk the user never saw
    with_usage = raw_payload(
        long_url, "chat", {**kwargs, "stream_options": {"include_usage": True}}
    )
    record = spec_decode_otel.record_from_json(with_usage)
    assert record is not None
    assert spec_decode_attributes(attrs) == expected_span_attributes(record)
    assert attrs["gen_ai.usage.output_tokens"] == payload_usage(with_usage)["completion_tokens"]


@pytest.mark.parametrize("read", READS)
async def test_a_running_average_stream_closed_early_reports_the_latest_average(
    read: str, instrumented: Otel, clients: Any
) -> None:
    sync, asynchronous = clients
    kwargs = request_kwargs("trtllm-released", "chat", True, 980)
    seen: list[Any] = []
    if read in ("for", "next"):
        stream = sync.chat.completions.create(**kwargs)
        if read == "for":
            for chunk in stream:
                seen.append(chunk)
                if len(seen) == 3 * KEEP_CHUNKS:
                    break
        else:
            seen = [next(stream) for _ in range(3 * KEEP_CHUNKS)]
        stream.close()
    else:
        stream = await asynchronous.chat.completions.create(**kwargs)
        if read == "async-for":
            async for chunk in stream:
                seen.append(chunk)
                if len(seen) == 3 * KEEP_CHUNKS:
                    break
        else:
            seen = [await stream.__anext__() for _ in range(3 * KEEP_CHUNKS)]
        await stream.close()

    attrs = dict(instrumented.only_span().attributes)
    assert "gen_ai.response.finish_reasons" not in attrs  # cut before the finish chunk
    latest = seen[-1].choices[0].model_extra["avg_decoded_tokens_per_iter"]
    assert attrs["spec_decode.engine"] == "tensorrt_llm"
    assert attrs["spec_decode.partial"] is True
    assert attrs["spec_decode.mean_acceptance_length"] == pytest.approx(latest)


async def test_a_patched_sdk_iteration_method_is_still_called(
    instrumented: Otel, clients: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync, asynchronous = clients
    calls: list[str] = []
    original_iter, original_aiter = openai.Stream.__iter__, openai.AsyncStream.__aiter__

    def patched_iter(self: Any) -> Any:
        calls.append("iter")
        return original_iter(self)

    def patched_aiter(self: Any) -> Any:
        calls.append("aiter")
        return original_aiter(self)

    monkeypatch.setattr(openai.Stream, "__iter__", patched_iter)
    monkeypatch.setattr(openai.AsyncStream, "__aiter__", patched_aiter)
    kwargs = request_kwargs("vllm", "chat", True, 995)
    chunks = list(sync.chat.completions.create(**kwargs))
    achunks = [c async for c in await asynchronous.chat.completions.create(**kwargs)]
    assert calls == ["iter", "aiter"]
    assert dumps_without_volatile(chunks) == dumps_without_volatile(achunks)
    spans = instrumented.spans()
    assert len(spans) == 2
    assert all(s.attributes["spec_decode.engine"] == "vllm" for s in spans)


def test_a_multi_prompt_completion_closed_early_gives_no_record(
    instrumented: Otel, clients: Any
) -> None:
    # Two prompts, n = 1: the request itself says two sequences. Closed after the first
    # chunk (TensorRT-LLM sends its running average on every chunk), no chunk has shown
    # a second choice index yet, and the stream must still count as several sequences.
    sync, _ = clients
    kwargs = request_kwargs("trtllm", "completions", True, 980, prompt=["one", "two"])
    stream = create_method(sync, "completions")(**kwargs)
    first = next(stream)
    stream.close()
    assert [c.index for c in first.choices] == [0]
    assert first.choices[0].model_extra  # it carries the running average
    attrs = dict(instrumented.only_span().attributes)
    assert spec_decode_attributes(attrs) == {}
