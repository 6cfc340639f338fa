"""A ``with_streaming_response`` body read raw is recorded as ``.parse()`` records it.

Gateways and proxies forward a server's SSE by reading the body raw:
``iter_lines()``/``iter_text()``/``iter_bytes()`` (async: the same names, awaited), or
``read()``/``text()``. The ``data:`` events they read feed the same stream observer as
``.parse()``'s chunks, so the span (every attribute, outcome included) and the metrics are
those of ``.parse()`` iterating the same seeded answer, and the record is the one
``record_from_json`` reads from that answer fetched without instrumentation. What the user
reads is byte for byte what the bare SDK returns (a real loopback server sends the same
bytes twice), injected usage chunk included.

Ways out, each ending the call exactly once: the end of the body, ``[DONE]`` (a gateway
that stops there), an error mid-body, ``close()``, leaving the ``with`` block, and garbage
collection. Hostile bodies: an event of many MiB without a line end stays bounded in
memory and gives no record; an event that is not JSON is skipped; an ``error`` event ends
the call as the ``APIError`` ``.parse()`` would have raised. Non-streaming bodies read raw
give the record of the JSON body at its end.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from instrumentation_helpers import (
    MESSAGES,
    MODEL,
    Otel,
    expected_span_attributes,
    raw_payload,
    spec_decode_attributes,
)
from opentelemetry.trace import StatusCode

import spec_decode_otel
from reclaimed import collect
from reliability.loopback import LoopbackServer
from spec_decode_otel.sse import MAX_EVENT_CHARS

MODES = ["sync", "async"]
#: The raw ways to read a body (sync and async clients name them alike).
READS = ["iter_lines", "iter_text", "iter_bytes", "read", "text"]


def kwargs_for(seed: int, *, stream: bool = True, engine: str = "vllm", **extra: Any) -> Any:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "extra_headers": {"x-spec-decode-engine": engine, "x-sim-seed": str(seed)},
    }
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    if engine == "sglang":
        kwargs["extra_body"] = {"return_spec_tokens_details": True}
    kwargs.update(extra)
    return kwargs


def read_sync(response: Any, how: str, **options: Any) -> list[Any]:
    """Everything the user gets from one raw read, as the SDK hands it over."""
    if how in ("read", "text"):
        return [getattr(response, how)()]
    return list(getattr(response, how)(**options))


async def read_async(response: Any, how: str, **options: Any) -> list[Any]:
    if how in ("read", "text"):
        return [await getattr(response, how)()]
    return [piece async for piece in getattr(response, how)(**options)]


async def read_raw(
    client: Any, mode: str, how: str, kwargs: Any, otel: Otel | None = None, **options: Any
) -> list[Any]:
    """One call through ``with_streaming_response`` read raw; when ``otel`` is given,
    asserts the span ended with the reading, before the ``with`` block's exit."""
    if mode == "sync":
        with client.chat.completions.with_streaming_response.create(**kwargs) as response:
            pieces = read_sync(response, how, **options)
            if otel is not None:
                assert len(otel.our_spans()) == 1
        return pieces
    async with client.chat.completions.with_streaming_response.create(**kwargs) as response:
        pieces = await read_async(response, how, **options)
        if otel is not None:
            assert len(otel.our_spans()) == 1
    return pieces


async def parse_all(client: Any, mode: str, kwargs: Any) -> list[Any]:
    """The same call through ``with_streaming_response`` and ``.parse()``."""
    if mode == "sync":
        with client.chat.completions.with_streaming_response.create(**kwargs) as response:
            parsed = response.parse()
            return list(parsed) if kwargs.get("stream") else [parsed]
    async with client.chat.completions.with_streaming_response.create(**kwargs) as response:
        parsed = await response.parse()
        return [c async for c in parsed] if kwargs.get("stream") else [parsed]


def client_of(mode: str, sync_client: Any, async_client: Any) -> Any:
    return sync_client if mode == "sync" else async_client


def take_span(otel: Otel) -> Any:
    (span,) = otel.our_spans()
    otel.clear()
    return span


def sse_text(events: list[Any], line_end: str = "\n", multiline: bool = False) -> bytes:
    """An SSE body of ``events`` (JSON objects, or ``[DONE]``), non-ASCII kept raw;
    ``multiline``: each object's JSON spread over several ``data:`` lines."""
    out = []
    for event in events:
        if isinstance(event, str):
            data = [event]
        else:
            data = json.dumps(event, ensure_ascii=False, indent=1 if multiline else None)
            data = data.split("\n")
        out.extend(f"data: {line}{line_end}" for line in data)
        out.append(line_end)
    return "".join(out).encode()


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as running:
        yield running


@pytest.fixture
async def loopback_clients(server: LoopbackServer) -> Any:
    sync_client = openai.OpenAI(api_key="sk-test", base_url=server.url, max_retries=0)
    async_client = openai.AsyncOpenAI(api_key="sk-test", base_url=server.url, max_retries=0)
    yield sync_client, async_client
    sync_client.close()
    await async_client.close()


# -- the same record as .parse() ---------------------------------------------------------


@pytest.mark.parametrize("how", READS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_stream_read_raw_gives_the_span_and_metrics_parse_gives(
    mode: str,
    how: str,
    instrumented: Otel,
    openai_client: Any,
    async_openai_client: Any,
    simulator_url: str,
) -> None:
    client = client_of(mode, openai_client, async_openai_client)
    kwargs = kwargs_for(101)
    await parse_all(client, mode, kwargs)
    parsed_span = take_span(instrumented)

    pieces = await read_raw(client, mode, how, kwargs, instrumented)
    span = take_span(instrumented)

    assert pieces and all(
        isinstance(p, bytes if how in ("iter_bytes", "read") else str) for p in pieces
    )
    assert dict(span.attributes) == dict(parsed_span.attributes)
    assert span.status.status_code is StatusCode.UNSET
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert "spec_decode.read_to_end" not in span.attributes
    record = spec_decode_otel.record_from_json(raw_payload(simulator_url, "chat", kwargs))
    assert record is not None
    assert spec_decode_attributes(span.attributes) == expected_span_attributes(record)
    assert instrumented.requests_by_outcome() == {"recorded": 2}
    (duration,) = instrumented.points(instrumented.metrics(), "gen_ai.client.operation.duration")
    assert duration.count == 2


@pytest.mark.parametrize("engine", ["vllm-premerge", "sglang", "trtllm", "llamacpp", "none"])
@pytest.mark.parametrize("mode", MODES)
async def test_every_engine_shape_read_as_lines_gives_what_parse_gives(
    mode: str, engine: str, instrumented: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    client = client_of(mode, openai_client, async_openai_client)
    kwargs = kwargs_for(202, engine=engine)
    await parse_all(client, mode, kwargs)
    parsed_span = take_span(instrumented)
    await read_raw(client, mode, "iter_lines", kwargs, instrumented)
    span = take_span(instrumented)
    assert dict(span.attributes) == dict(parsed_span.attributes)
    expected = (
        "no_stats" if engine == "none" else ("partial" if engine == "llamacpp" else "recorded")
    )
    assert span.attributes["spec_decode.outcome"] == expected


@pytest.mark.parametrize("mode", MODES)
async def test_a_responses_api_stream_read_as_lines_gives_what_parse_gives(
    mode: str, instrumented: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    kwargs = {
        "model": MODEL,
        "input": "Describe a zebra-unicorn in exactly three words.",
        "max_output_tokens": 40,
        "stream": True,
        "extra_headers": {"x-spec-decode-engine": "llamacpp", "x-sim-seed": "303"},
    }
    if mode == "sync":
        with openai_client.responses.with_streaming_response.create(**kwargs) as response:
            list(response.parse())
        parsed_span = take_span(instrumented)
        with openai_client.responses.with_streaming_response.create(**kwargs) as response:
            lines = list(response.iter_lines())
    else:
        async with async_openai_client.responses.with_streaming_response.create(
            **kwargs
        ) as response:
            [e async for e in await response.parse()]
        parsed_span = take_span(instrumented)
        async with async_openai_client.responses.with_streaming_response.create(
            **kwargs
        ) as response:
            lines = [line async for line in response.iter_lines()]
    span = take_span(instrumented)
    assert any(line.startswith("event: response.completed") for line in lines)
    assert dict(span.attributes) == dict(parsed_span.attributes)
    assert span.attributes["spec_decode.outcome"] == "partial"  # llama.cpp's timings


@pytest.mark.parametrize(
    "how,options",
    [
        ("iter_bytes", {"chunk_size": 1}),
        ("iter_bytes", {"chunk_size": 7}),
        ("iter_text", {"chunk_size": 3}),
    ],
    ids=["bytes-1", "bytes-7", "text-3"],
)
@pytest.mark.parametrize("mode", MODES)
async def test_events_split_across_chunks_are_decoded_whole(
    mode: str,
    how: str,
    options: dict[str, int],
    instrumented: Otel,
    openai_client: Any,
    async_openai_client: Any,
    simulator_url: str,
) -> None:
    client = client_of(mode, openai_client, async_openai_client)
    kwargs = kwargs_for(404)
    pieces = await read_raw(client, mode, how, kwargs, instrumented, **options)
    assert max(len(p) for p in pieces) == options["chunk_size"] and len(pieces) > 100
    span = take_span(instrumented)
    record = spec_decode_otel.record_from_json(raw_payload(simulator_url, "chat", kwargs))
    assert record is not None
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert spec_decode_attributes(span.attributes) == expected_span_attributes(record)


@pytest.mark.parametrize("mode", MODES)
async def test_multiline_events_crlf_and_multibyte_characters_split_between_chunks_are_decoded(
    mode: str, otel: Otel, server: LoopbackServer, loopback_clients: Any, simulator_url: str
) -> None:
    payload = raw_payload(simulator_url, "chat", kwargs_for(505))
    for chunk in payload:
        for choice in chunk["choices"]:
            if (choice.get("delta") or {}).get("content"):
                choice["delta"]["content"] += " zébra 🦄\u2028"
    server.reply(sse_text([*payload, "[DONE]"], line_end="\r\n", multiline=True))
    otel.instrument()
    client = client_of(mode, *loopback_clients)
    await read_raw(client, mode, "iter_bytes", kwargs_for(505), otel, chunk_size=1)
    span = take_span(otel)
    record = spec_decode_otel.record_from_json(payload)
    assert record is not None
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert spec_decode_attributes(span.attributes) == expected_span_attributes(record)


#: Model output a server writing UTF-8 JSON sends raw: U+2028, U+2029 and U+0085 (which
#: httpx's ``iter_lines()`` ends lines at), escaped quotes and an escaped backslash.
CUT_CONTENT = 'say "hi"\u2028\u2029 twice\u0085\u2028, a backslash \\\u2028end'


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json-body"])
@pytest.mark.parametrize("how", READS)
@pytest.mark.parametrize("mode", MODES)
async def test_unicode_line_ends_in_json_strings_read_raw_give_what_parse_gives(
    mode: str,
    how: str,
    stream: bool,
    otel: Otel,
    server: LoopbackServer,
    loopback_clients: Any,
    simulator_url: str,
) -> None:
    """httpx's ``iter_lines()`` ends lines where ``str.splitlines`` does (httpx 0.28.1 and
    httpx2 2.17 ``_decoders.py``, ``LineDecoder``), so also at U+0085, U+2028 and U+2029,
    which JSON strings may hold raw, while the SDK's SSE decoder splits bytes at ``\\r``
    and ``\\n`` only. Here every choice's text holds them, the one whose chunk carries
    vLLM's pre-merge stats included, and a JSON body's too. Read line by line, the cut
    events (or body) gave no record where ``.parse()`` gave one; every raw read now gives
    the span ``.parse()`` gives."""
    kwargs = kwargs_for(1405, stream=stream, engine="vllm-premerge" if stream else "vllm")
    payload = raw_payload(simulator_url, "chat", kwargs)
    if stream:
        for chunk in payload:
            for choice in chunk["choices"]:
                choice["delta"]["content"] = (choice["delta"].get("content") or "") + CUT_CONTENT
        stats_chunk = next(
            c for c in payload if c["choices"] and c["choices"][0].get("speculative_decoding_stats")
        )
        assert CUT_CONTENT in stats_chunk["choices"][0]["delta"]["content"]
        body = sse_text([*payload, "[DONE]"])
    else:
        payload["choices"][0]["message"]["content"] += CUT_CONTENT
        body = json.dumps(payload, ensure_ascii=False).encode()
    server.reply(body)
    otel.instrument()
    client = client_of(mode, *loopback_clients)
    await parse_all(client, mode, kwargs)
    parsed_span = take_span(otel)
    pieces = await read_raw(client, mode, how, kwargs, otel)
    span = take_span(otel)
    if how == "iter_lines":  # the premise: httpx cut the events (the body) there
        real_lines = body.decode().count("\n") + (0 if stream else 1)
        assert len(pieces) > real_lines
    record = spec_decode_otel.record_from_json(payload)
    assert record is not None
    assert parsed_span.attributes["spec_decode.outcome"] == "recorded"
    assert spec_decode_attributes(span.attributes) == expected_span_attributes(record)
    assert dict(span.attributes) == dict(parsed_span.attributes)


# -- what the user reads ------------------------------------------------------------------


@pytest.mark.parametrize("how", READS)
@pytest.mark.parametrize("mode", MODES)
async def test_what_the_user_reads_is_byte_for_byte_what_the_bare_sdk_returns(
    mode: str,
    how: str,
    otel: Otel,
    server: LoopbackServer,
    loopback_clients: Any,
    simulator_url: str,
) -> None:
    payload = raw_payload(simulator_url, "chat", kwargs_for(606))
    body = sse_text([*payload, "[DONE]"]).replace(b"data: {", b": keep-alive\ndata:{", 3)
    server.reply(body)
    client = client_of(mode, *loopback_clients)
    bare = await read_raw(client, mode, how, kwargs_for(606))
    otel.instrument()
    ours = await read_raw(client, mode, how, kwargs_for(606), otel)
    assert ours == bare
    joined = b"".join(ours) if how in ("iter_bytes", "read") else "".join(ours).encode()
    assert joined == (body if how != "iter_lines" else body.replace(b"\n", b""))
    assert take_span(otel).attributes["spec_decode.outcome"] == "recorded"


@pytest.mark.parametrize("mode", MODES)
async def test_a_raw_reader_sees_the_usage_chunk_we_injected_and_parse_hides_it(
    mode: str, otel: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    otel.instrument(inject_include_usage=True)
    client = client_of(mode, openai_client, async_openai_client)
    kwargs = kwargs_for(707)
    del kwargs["stream_options"]  # the user did not ask for usage; we do
    chunks = await parse_all(client, mode, kwargs)
    parsed_span = take_span(otel)
    lines = await read_raw(client, mode, "iter_lines", kwargs, otel)
    span = take_span(otel)

    events = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]
    assert len(events) == len(chunks) + 1  # the server's bytes: the usage chunk too
    assert events[-1]["choices"] == [] and events[-1]["usage"]
    assert all(chunk.choices for chunk in chunks)
    assert dict(span.attributes) == dict(parsed_span.attributes)
    assert span.attributes["spec_decode.outcome"] == "recorded"


# -- exactly one end, on every way out ----------------------------------------------------

EXITS = {
    # way out: (outcome, read to the end, error)
    "exhausted": ("recorded", True, False),
    "stop-at-done": ("recorded", True, False),
    "error": ("error", False, True),
    "close": ("not_read_to_end", False, False),
    "with-exit": ("not_read_to_end", False, False),
    "abandoned": ("not_read_to_end", False, False),
}


async def leave_sync(client: Any, how: str, way: str, otel: Otel) -> BaseException | None:
    """Read ``way`` out; asserts the span ended right then (not at garbage collection)."""
    kwargs = kwargs_for(808)
    if way == "error":
        kwargs["extra_headers"]["x-sim-fault"] = "drop-mid-stream"
    caught: BaseException | None = None
    manager = client.chat.completions.with_streaming_response.create(**kwargs)
    response = manager.__enter__()
    pieces = getattr(response, how)()
    if way == "exhausted":
        list(pieces)
    elif way == "stop-at-done":
        for piece in pieces:
            if "[DONE]" in piece:
                break
    elif way == "error":
        with pytest.raises(Exception) as info:  # what the transport raises, unchanged
            list(pieces)
        caught = info.value
    else:
        next(pieces)
        assert otel.our_spans() == []
        if way == "close":
            response.close()
        elif way == "with-exit":
            manager.__exit__(None, None, None)
        else:
            del pieces, response, manager
            collect()
            return None
    assert len(otel.our_spans()) == 1
    manager.__exit__(None, None, None)
    del pieces, response, manager
    collect()
    return caught


async def leave_async(client: Any, how: str, way: str, otel: Otel) -> BaseException | None:
    kwargs = kwargs_for(808)
    if way == "error":
        kwargs["extra_headers"]["x-sim-fault"] = "drop-mid-stream"
    caught: BaseException | None = None
    manager = client.chat.completions.with_streaming_response.create(**kwargs)
    response = await manager.__aenter__()
    pieces = getattr(response, how)()
    if way == "exhausted":
        [p async for p in pieces]
    elif way == "stop-at-done":
        async for piece in pieces:
            if "[DONE]" in piece:
                break
    elif way == "error":
        with pytest.raises(Exception) as info:
            [p async for p in pieces]
        caught = info.value
    else:
        await pieces.__anext__()
        assert otel.our_spans() == []
        if way == "close":
            await response.close()
        elif way == "with-exit":
            await manager.__aexit__(None, None, None)
        else:
            del pieces, response, manager
            for _ in range(5):  # the event loop's finalizer closes the async generator
                collect()
                await asyncio.sleep(0)
            return None
    assert len(otel.our_spans()) == 1
    await manager.__aexit__(None, None, None)
    if hasattr(pieces, "aclose"):
        await pieces.aclose()
    del pieces, response, manager
    collect()
    return caught


@pytest.mark.parametrize("how", ["iter_lines", "iter_text"])
@pytest.mark.parametrize("way", list(EXITS))
@pytest.mark.parametrize("mode", MODES)
async def test_every_way_out_of_a_raw_read_ends_the_call_exactly_once(
    mode: str,
    way: str,
    how: str,
    instrumented: Otel,
    openai_client: Any,
    async_openai_client: Any,
) -> None:
    if mode == "sync":
        caught = await leave_sync(openai_client, how, way, instrumented)
    else:
        caught = await leave_async(async_openai_client, how, way, instrumented)
    collect()

    outcome, read_to_end, error = EXITS[way]
    span = instrumented.only_span()
    assert span.end_time is not None
    assert span.attributes["spec_decode.outcome"] == outcome
    assert span.attributes.get("spec_decode.read_to_end", True) is read_to_end
    if error:
        assert caught is not None
        assert span.attributes["error.type"] == type(caught).__qualname__
        assert span.status.status_code is StatusCode.ERROR
    else:
        assert "error.type" not in span.attributes
        assert span.status.status_code is StatusCode.UNSET
    if outcome == "recorded":
        assert spec_decode_attributes(span.attributes)["spec_decode.engine"] == "vllm"
    else:  # vLLM's stats ride the final usage chunk: only a body read to it has them
        assert spec_decode_attributes(span.attributes) == {}
    assert instrumented.requests_by_outcome() == {outcome: 1}


# -- hostile bodies -----------------------------------------------------------------------


@pytest.mark.parametrize("after", ["nothing", "a-valid-stream"])
@pytest.mark.parametrize("mode", MODES)
async def test_a_huge_event_without_a_line_end_stays_bounded_and_gives_no_record(
    mode: str,
    after: str,
    otel: Otel,
    server: LoopbackServer,
    loopback_clients: Any,
    simulator_url: str,
) -> None:
    huge = 40 * 1024 * 1024  # 2.5 times the bound: unbounded buffering would show
    assert huge > 2 * MAX_EVENT_CHARS
    payload = raw_payload(simulator_url, "chat", kwargs_for(909))
    body = b"data: {" + b"x" * huge
    if after == "a-valid-stream":
        body += b"\n\n" + sse_text([*payload, "[DONE]"])
    server.reply(body)
    otel.instrument()
    client = client_of(mode, *loopback_clients)
    tracemalloc.start()
    try:
        read = 0
        if mode == "sync":
            with client.chat.completions.with_streaming_response.create(**kwargs_for(909)) as r:
                for piece in r.iter_bytes():
                    read += len(piece)
        else:
            async with client.chat.completions.with_streaming_response.create(
                **kwargs_for(909)
            ) as r:
                async for piece in r.iter_bytes():
                    read += len(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert read == len(body)
    assert peak < MAX_EVENT_CHARS + 8 * 1024 * 1024, peak
    span = take_span(otel)
    if after == "nothing":
        assert span.attributes["spec_decode.outcome"] == "no_stats"
        assert spec_decode_attributes(span.attributes) == {}
    else:  # only the huge event was dropped
        record = spec_decode_otel.record_from_json(payload)
        assert record is not None
        assert spec_decode_attributes(span.attributes) == expected_span_attributes(record)


@pytest.mark.parametrize("broken", ["a-chunk", "the-stats-chunk"])
@pytest.mark.parametrize("mode", MODES)
async def test_an_event_that_is_not_json_is_skipped_without_an_exception(
    mode: str,
    broken: str,
    otel: Otel,
    server: LoopbackServer,
    loopback_clients: Any,
    simulator_url: str,
) -> None:
    payload = raw_payload(simulator_url, "chat", kwargs_for(1001))
    events: list[Any] = [*payload, "[DONE]"]
    if broken == "a-chunk":
        events.insert(1, '{"choices": [{"index": 0, "delta": {"content": "cut')
    else:  # vLLM's stats ride the last chunk, cut short here
        events[-2] = json.dumps(payload[-1])[:-9]
    server.reply(sse_text(events))
    otel.instrument()
    client = client_of(mode, *loopback_clients)
    lines = await read_raw(client, mode, "iter_lines", kwargs_for(1001), otel)
    assert lines[-2:] == ["data: [DONE]", ""]
    span = take_span(otel)
    assert span.status.status_code is StatusCode.UNSET
    if broken == "a-chunk":
        record = spec_decode_otel.record_from_json(payload)
        assert record is not None
        assert spec_decode_attributes(span.attributes) == expected_span_attributes(record)
    else:
        assert span.attributes["spec_decode.outcome"] == "no_stats"
        assert spec_decode_attributes(span.attributes) == {}


@pytest.mark.parametrize("mode", MODES)
async def test_a_chat_chunk_with_null_choices_read_raw_gives_what_parse_gives(
    mode: str, otel: Otel, server: LoopbackServer, loopback_clients: Any, simulator_url: str
) -> None:
    """A chunk whose ``choices`` is null is still a chat chunk: the call's route says
    which API a stream speaks. A raw read once took such a chunk for a Responses API
    event and so lost the model its first chunk names; ``.parse()`` (openai's
    ``ChatCompletionChunk``, built without validation) keeps it."""
    payload = raw_payload(simulator_url, "chat", kwargs_for(1201))
    server.reply(sse_text([{**payload[0], "choices": None}, *payload[1:], "[DONE]"]))
    otel.instrument()
    client = client_of(mode, *loopback_clients)
    await parse_all(client, mode, kwargs_for(1201))
    parsed_span = take_span(otel)
    await read_raw(client, mode, "iter_lines", kwargs_for(1201), otel)
    span = take_span(otel)
    assert span.attributes["gen_ai.response.model"] == payload[0]["model"]
    assert dict(span.attributes) == dict(parsed_span.attributes)


@pytest.mark.parametrize("mode", MODES)
async def test_an_error_event_ends_the_call_as_the_api_error_parse_raises(
    mode: str, otel: Otel, server: LoopbackServer, loopback_clients: Any, simulator_url: str
) -> None:
    payload = raw_payload(simulator_url, "chat", kwargs_for(1102))
    server.reply(sse_text([payload[0], {"error": {"message": "engine overloaded"}}]))
    otel.instrument()
    client = client_of(mode, *loopback_clients)
    with pytest.raises(openai.APIError, match="engine overloaded"):
        await parse_all(client, mode, kwargs_for(1102))
    parsed_span = take_span(otel)
    lines = await read_raw(client, mode, "iter_lines", kwargs_for(1102), otel)
    assert any("engine overloaded" in line for line in lines)
    span = take_span(otel)
    assert dict(span.attributes) == dict(parsed_span.attributes)
    assert span.attributes["error.type"] == "APIError"
    assert span.attributes["spec_decode.outcome"] == "error"


# -- non-streaming bodies -----------------------------------------------------------------


@pytest.mark.parametrize("how", READS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_json_body_read_raw_gives_the_record_of_that_body(
    mode: str, how: str, instrumented: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    client = client_of(mode, openai_client, async_openai_client)
    kwargs = kwargs_for(1203, stream=False)
    await parse_all(client, mode, kwargs)
    parsed_span = take_span(instrumented)
    pieces = await read_raw(client, mode, how, kwargs, instrumented)
    span = take_span(instrumented)
    body = json.loads(b"".join(pieces) if how in ("iter_bytes", "read") else "".join(pieces))
    record = spec_decode_otel.record_from_json(body)
    assert record is not None
    assert spec_decode_attributes(span.attributes) == expected_span_attributes(record)
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert dict(span.attributes) == dict(parsed_span.attributes)


@pytest.mark.parametrize("mode", MODES)
async def test_a_json_body_closed_unread_is_not_read_to_end(
    mode: str, instrumented: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    kwargs = kwargs_for(1304, stream=False)
    if mode == "sync":
        with openai_client.chat.completions.with_streaming_response.create(**kwargs) as r:
            next(r.iter_bytes(chunk_size=16))
    else:
        async with async_openai_client.chat.completions.with_streaming_response.create(
            **kwargs
        ) as r:
            pieces = r.iter_bytes(chunk_size=16)
            await pieces.__anext__()
            await pieces.aclose()
    span = take_span(instrumented)
    assert span.attributes["spec_decode.outcome"] == "not_read_to_end"
    assert span.attributes["spec_decode.read_to_end"] is False
