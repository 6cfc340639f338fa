"""Edges of the stream and raw-response proxies not pinned elsewhere, found by probing
them with the real ``openai`` SDK (3.63.0) against the simulator.

- A ``with_streaming_response`` whose body the user ``.parse()``-d into a stream and
  left (the ``with`` block's exit closes the response) ends the call at that exit, as a
  stream's own ``with`` exit does, not when the collector reclaims the stream.
- A stream parsed into plain dicts (``parse(to=openai.Stream[dict])``) shows the user what
  the bare SDK shows (our injected usage chunk hidden) and is recorded like any stream.
- A ``with_raw_response`` response has no ``close()`` or ``json()`` in the SDK: the
  proxy adds neither.
- ``repr()`` of what the user gets back is the SDK's, not a proxy's.
- Pinned where nothing else pins them: the caller's context object is untouched by every
  step of every kind of stream, and ``aclose()`` on an unread stream ends its call.
- A ``close()`` from another thread or task while a read waits ends the call at once:
  only a stop from inside one of our reads waits for that read.
"""

from __future__ import annotations

import asyncio
import copy
import pickle
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, ExitStack, suppress
from typing import Any

import openai
import pytest
from instrumentation_helpers import (
    MESSAGES,
    MODEL,
    Otel,
    dumps_without_volatile,
    fingerprint_left_on_the_usage_chunk,
)
from opentelemetry import context as otel_context
from opentelemetry.trace import StatusCode

from reclaimed import collect

MODES = ["sync", "async"]


def kwargs_for(seed: int, **extra: Any) -> dict[str, Any]:
    """A vLLM-shaped stream; its stats ride the usage chunk."""
    return {
        "model": MODEL,
        "messages": MESSAGES,
        "stream": True,
        "extra_headers": {"x-spec-decode-engine": "vllm", "x-sim-seed": str(seed)},
        **extra,
    }


# -- with_streaming_response + parse(), left early ----------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_leaving_a_streaming_response_with_its_parsed_stream_half_read_ends_the_call(
    mode: str, instrumented: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    """``with client.chat.completions.with_streaming_response.create(stream=True) as r:
    s = r.parse(); next(s)`` then the block's end: the SDK (3.63.0,
    ``ResponseContextManager.__exit__``) closes the response, so the stream is over. The
    span must end there, not stay open for as long as the user keeps ``s`` (then be
    dated whenever the collector gets to it)."""
    kwargs = kwargs_for(61, stream_options={"include_usage": True})
    if mode == "sync":
        with openai_client.chat.completions.with_streaming_response.create(**kwargs) as raw:
            stream = raw.parse()
            next(stream)
            assert instrumented.spans() == []
    else:
        async with async_openai_client.chat.completions.with_streaming_response.create(
            **kwargs
        ) as raw:
            stream = await raw.parse()
            await stream.__anext__()
            assert instrumented.spans() == []
    span = instrumented.only_span()  # ended at the exit, while ``stream`` is still held
    assert span.attributes["spec_decode.outcome"] == "not_read_to_end"
    assert span.attributes["spec_decode.read_to_end"] is False
    assert span.status.status_code is StatusCode.UNSET
    del stream, raw
    collect()
    assert len(instrumented.spans()) == 1
    assert instrumented.requests_by_outcome() == {"not_read_to_end": 1}


@pytest.mark.parametrize("mode", MODES)
async def test_a_parsed_stream_read_to_its_end_keeps_its_record_at_the_block_exit(
    mode: str, instrumented: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    """The exit that closes the response after the user read the parsed stream to its
    end changes nothing: one span, recorded."""
    kwargs = kwargs_for(62, stream_options={"include_usage": True})
    if mode == "sync":
        with openai_client.chat.completions.with_streaming_response.create(**kwargs) as raw:
            list(raw.parse())
    else:
        async with async_openai_client.chat.completions.with_streaming_response.create(
            **kwargs
        ) as raw:
            [chunk async for chunk in await raw.parse()]
    span = instrumented.only_span()
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert "spec_decode.read_to_end" not in span.attributes


# -- a stream of dicts -------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_stream_parsed_into_dicts_hides_our_usage_chunk_and_is_recorded(
    mode: str, otel: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    """``response.parse(to=openai.Stream[dict])`` (the SDK's documented ``to=`` of
    ``parse()``, 3.63.0 ``_response.py``) gives the chunks as the JSON dicts the server
    sent. With ``inject_include_usage`` the user, who did not ask for usage, must not get
    the usage chunk we asked for (``{"choices": [], "usage": ...}``), and vLLM's stats on
    that chunk must give the span its record, as with SDK chunk objects."""

    async def chunks() -> list[Any]:
        kwargs = kwargs_for(63)
        if mode == "sync":
            with openai_client.chat.completions.with_streaming_response.create(**kwargs) as raw:
                return list(raw.parse(to=openai.Stream[dict]))
        async with async_openai_client.chat.completions.with_streaming_response.create(
            **kwargs
        ) as raw:
            return [c async for c in await raw.parse(to=openai.AsyncStream[dict])]

    bare = await chunks()
    otel.instrument(inject_include_usage=True)
    ours = await chunks()
    assert all(isinstance(chunk, dict) for chunk in ours)
    assert dumps_without_volatile(ours) == fingerprint_left_on_the_usage_chunk(
        dumps_without_volatile(bare)
    )
    span = otel.only_span()
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert span.attributes["spec_decode.engine"] == "vllm"
    assert span.attributes["gen_ai.usage.output_tokens"] > 0


# -- with_raw_response: the SDK's methods only ------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_raw_streamed_response_has_no_method_the_sdk_does_not_have(
    mode: str, otel: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    """``with_raw_response.create(stream=True)`` returns a ``LegacyAPIResponse``, which
    has neither ``close()`` nor ``json()`` in any openai release (1.40, 2.54, 3.63:
    ``_legacy_response.py``). Code that calls ``close`` when an object has one
    (``getattr(r, "close", None)``) must find what it finds without instrumentation, not
    a method that raises ``AttributeError``."""

    async def raw_response() -> Any:
        kwargs = kwargs_for(64, stream_options={"include_usage": True})
        if mode == "sync":
            raw = openai_client.chat.completions.with_raw_response.create(**kwargs)
        else:
            raw = await async_openai_client.chat.completions.with_raw_response.create(**kwargs)
        await _drain(raw.parse())
        return raw

    bare = await raw_response()
    otel.instrument()
    ours = await raw_response()
    for name in ("close", "json"):
        assert hasattr(ours, name) is hasattr(bare, name) is False
    assert otel.only_span().attributes["spec_decode.outcome"] == "recorded"


async def _drain(stream: Any) -> None:
    if isinstance(stream, openai.AsyncStream):
        [chunk async for chunk in stream]
    else:
        list(stream)


# -- repr ----------------------------------------------------------------------------------


def _reprs(client: Any) -> list[str]:
    """``repr()`` of a stream, its ``response``, and raw and streaming responses (memory
    addresses left out)."""
    kwargs = kwargs_for(65)
    stream = client.chat.completions.create(**kwargs)
    shown = [repr(stream), repr(stream.response)]
    stream.close()
    raw = client.chat.completions.with_raw_response.create(**kwargs)
    shown.append(repr(raw))
    raw.parse().close()
    with client.chat.completions.with_streaming_response.create(**kwargs) as streaming:
        shown.append(repr(streaming))
    return [re.sub(r"0x[0-9a-fA-F]+", "0x", text) for text in shown]


def test_what_the_user_gets_back_has_the_sdks_repr(otel: Otel, openai_client: Any) -> None:
    """``repr()`` is what a log line (``%r``), a debugger or a REPL shows: the SDK's
    (3.63.0: ``<APIResponse [200 OK] type=...>``, httpx's ``<Response [200 OK]>``), not a
    proxy's (wrapt's ``<SyncStreamProxy at 0x... for Stream at 0x...>``)."""
    bare = _reprs(openai_client)
    otel.instrument()
    assert _reprs(openai_client) == bare
    assert "Proxy" not in "".join(bare)


# -- the caller's context, step by step ---------------------------------------------------

#: Every kind of stream the wrapper proxies: created, or parsed or read raw from a response.
STREAMS = ["chat", "completions", "responses", "parse", "iter_lines"]


def _open_sync(client: Any, kind: str, stack: ExitStack) -> Iterator[Any]:
    kwargs = kwargs_for(66, stream_options={"include_usage": True})
    if kind == "chat":
        return iter(client.chat.completions.create(**kwargs))
    if kind == "completions":
        del kwargs["messages"]
        return iter(client.completions.create(prompt="a zebra-unicorn", **kwargs))
    if kind == "responses":  # llama.cpp's timings ride response.completed
        del kwargs["messages"], kwargs["stream_options"]
        kwargs["extra_headers"]["x-spec-decode-engine"] = "llamacpp"
        return iter(client.responses.create(input="a zebra-unicorn", **kwargs))
    raw = stack.enter_context(client.chat.completions.with_streaming_response.create(**kwargs))
    return iter(raw.parse()) if kind == "parse" else raw.iter_lines()


async def _open_async(client: Any, kind: str, stack: AsyncExitStack) -> AsyncIterator[Any]:
    kwargs = kwargs_for(66, stream_options={"include_usage": True})
    if kind == "chat":
        return (await client.chat.completions.create(**kwargs)).__aiter__()
    if kind == "completions":
        del kwargs["messages"]
        return (await client.completions.create(prompt="a zebra-unicorn", **kwargs)).__aiter__()
    if kind == "responses":
        del kwargs["messages"], kwargs["stream_options"]
        kwargs["extra_headers"]["x-spec-decode-engine"] = "llamacpp"
        return (await client.responses.create(input="a zebra-unicorn", **kwargs)).__aiter__()
    raw = await stack.enter_async_context(
        client.chat.completions.with_streaming_response.create(**kwargs)
    )
    return (await raw.parse()).__aiter__() if kind == "parse" else raw.iter_lines()


@pytest.mark.parametrize("kind", STREAMS)
@pytest.mark.parametrize("mode", MODES)
async def test_every_step_of_a_stream_leaves_the_callers_context_object_as_it_was(
    mode: str,
    kind: str,
    instrumented: Otel,
    openai_client: Any,
    async_openai_client: Any,
) -> None:
    """``opentelemetry.context.get_current()`` is the very same object before and after
    each ``next()``/``__anext__()`` of every kind of stream, the last one (which ends our
    span, records the metrics and runs the span processors) included: the span is never
    attached while the user reads, and nothing attached on the way is left behind."""
    steps = 0
    with instrumented.tracer.start_as_current_span("user-parent"):
        before = otel_context.get_current()
        if mode == "sync":
            with ExitStack() as stack:
                stream = _open_sync(openai_client, kind, stack)
                assert otel_context.get_current() is before
                for _ in stream:
                    assert otel_context.get_current() is before
                    steps += 1
                assert otel_context.get_current() is before
        else:
            async with AsyncExitStack() as stack:
                astream = await _open_async(async_openai_client, kind, stack)
                assert otel_context.get_current() is before
                async for _ in astream:
                    assert otel_context.get_current() is before
                    steps += 1
                assert otel_context.get_current() is before
        assert otel_context.get_current() is before
    assert steps > 3
    (span,) = instrumented.our_spans()
    assert span.attributes["spec_decode.outcome"] in ("recorded", "partial")


# -- aclose() ----------------------------------------------------------------------------


async def test_aclose_before_any_chunk_ends_the_call_at_once(
    instrumented: Otel, async_openai_client: Any
) -> None:
    """``AsyncStream.aclose()`` (openai 3.63.0: an alias of ``close()``; openai 1 and 2
    have none, and the proxy forwards to ``close()``) on a stream not read at all: one
    span, ended right then, stopped rather than failed."""
    stream = await async_openai_client.chat.completions.create(**kwargs_for(67))
    assert instrumented.spans() == []
    await stream.aclose()
    span = instrumented.only_span()
    assert span.attributes["spec_decode.outcome"] == "not_read_to_end"
    assert span.status.status_code is StatusCode.UNSET
    del stream
    collect()
    assert len(instrumented.spans()) == 1


# -- a stop from outside a read ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_close_from_another_thread_or_task_while_a_read_waits_ends_the_call_then(
    mode: str, instrumented: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    """A stop waits for one of our reads only when it comes from inside that read
    (genai-openai 1.3b0's hook on the response's close, which the SDK's stream calls as it
    reaches its end: test_coexistence_matrix.py). ``close()`` from another thread (sync) or
    task (async) while a read waits for the next chunk (the simulator's ``slow`` fault holds
    it back for seconds) ends the call at the close: stopped, not failed by what the
    waiting read then raises (openai 3.63.0: ``APIConnectionError``, the response being
    closed under it)."""
    kwargs = kwargs_for(71)
    kwargs["extra_headers"] |= {"x-sim-fault": "slow", "x-sim-delay-ms": "2000"}
    if mode == "sync":
        stream = openai_client.chat.completions.create(**kwargs)
        next(stream)
        reader = threading.Thread(target=_read_one, args=(stream,))
        reader.start()
        time.sleep(0.3)  # the reader is waiting for the server's next chunk
        stream.close()
        ended = instrumented.spans()
        reader.join(10)
        assert not reader.is_alive()
    else:
        stream = await async_openai_client.chat.completions.create(**kwargs)
        await stream.__anext__()
        task = asyncio.create_task(_aread_one(stream))
        await asyncio.sleep(0.3)
        await stream.close()
        ended = instrumented.spans()
        await asyncio.wait_for(task, 10)
    assert [s.attributes["spec_decode.outcome"] for s in ended] == ["not_read_to_end"]
    assert ended[0].status.status_code is StatusCode.UNSET
    assert len(instrumented.spans()) == 1


def _read_one(stream: Any) -> None:
    with suppress(openai.APIConnectionError):
        next(stream)


async def _aread_one(stream: Any) -> None:
    with suppress(openai.APIConnectionError):
        await stream.__anext__()


# -- copy.copy, copy.deepcopy, pickle ----------------------------------------------------

#: What the user may copy: a stream, its ``response``, and the response wrappers of
#: ``with_streaming_response`` and ``with_raw_response``.
COPIED = ["stream", "stream.response", "streaming_response", "raw_response"]


def _copy_outcomes(obj: Any) -> list[str]:
    """What ``copy.copy``, ``copy.deepcopy`` and a pickle round trip of ``obj`` give:
    the class of the result, or the exception raised."""
    outcomes = []
    for how in (copy.copy, copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))):
        try:
            outcomes.append(how(obj).__class__.__name__)
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    return outcomes


async def _copied(mode: str, kind: str, sync_client: Any, async_client: Any) -> list[str]:
    """``_copy_outcomes`` of one ``kind`` of object the SDK hands back, then closed."""
    kwargs = kwargs_for(68, stream_options={"include_usage": True})
    client = sync_client if mode == "sync" else async_client
    if kind in ("stream", "stream.response"):
        stream = client.chat.completions.create(**kwargs)
        stream = await stream if mode == "async" else stream
        outcomes = _copy_outcomes(stream if kind == "stream" else stream.response)
        await _close(stream.close())
        return outcomes
    if kind == "raw_response":
        raw = client.chat.completions.with_raw_response.create(**kwargs)
        raw = await raw if mode == "async" else raw
        outcomes = _copy_outcomes(raw)
        await _close(raw.parse().close())
        return outcomes
    if mode == "sync":
        with client.chat.completions.with_streaming_response.create(**kwargs) as response:
            return _copy_outcomes(response)
    async with client.chat.completions.with_streaming_response.create(**kwargs) as response:
        return _copy_outcomes(response)


async def _close(result: Any) -> None:
    if result is not None:
        await result


# deepcopy of an SDK object (3.63.0) fails half-way through copying its client, whose
# ``HttpxClientWrapper.__del__`` then fails on the half-made copy: the SDK's, not ours.
SDK_HALF_COPIED_CLIENT = (
    r"ignore:Exception ignored in. <function (Sync|Async)HttpxClientWrapper.__del__"
    r":pytest.PytestUnraisableExceptionWarning"
)


@pytest.mark.filterwarnings(SDK_HALF_COPIED_CLIENT)
@pytest.mark.parametrize("kind", COPIED)
@pytest.mark.parametrize("mode", MODES)
async def test_copying_what_the_user_gets_back_does_what_copying_the_sdks_object_does(
    mode: str, kind: str, otel: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    """openai 3.63.0: ``copy.copy()`` of a ``Stream``/``AsyncStream``, its httpx response,
    an ``APIResponse``/``AsyncAPIResponse`` or a ``LegacyAPIResponse`` gives an object of
    the same class; ``copy.deepcopy()`` and ``pickle`` raise ``TypeError`` (the client's
    lock). wrapt's ``ObjectProxy`` (2.1.2, ``wrappers.py``) raises ``NotImplementedError``
    for all three unless the proxy defines them: code that copies what it got back
    (a cache, a framework's defensive copy) must see what it sees without us."""
    bare = await _copied(mode, kind, openai_client, async_openai_client)
    otel.instrument()
    ours = await _copied(mode, kind, openai_client, async_openai_client)
    assert ours == bare
    assert bare[0] != "NotImplementedError"
    del bare, ours
    collect()
    assert [span.attributes["spec_decode.outcome"] for span in otel.spans()] == ["not_read_to_end"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_copied_stream_read_to_its_end_is_recorded_once_as_the_stream_would_be(
    mode: str, otel: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    """The SDK's shallow copy of a stream (3.63.0: ``copy.copy`` copies ``__dict__``)
    shares its ``_iterator`` and ``response``: it is the same stream. Read through the
    copy, the user sees the chunks the bare SDK shows (with ``inject_include_usage`` our
    usage chunk still hidden), the call is recorded from them, and it ends once: neither
    the original, then read to its (shared) end and closed, nor the collector reclaiming
    both ends it again."""

    async def read_a_copy() -> tuple[list[Any], list[Any]]:
        kwargs = kwargs_for(69)
        if mode == "sync":
            stream = openai_client.chat.completions.create(**kwargs)
            twin = copy.copy(stream)
            assert isinstance(twin, openai.Stream)
            chunks, rest = list(twin), list(stream)
            stream.close()
        else:
            stream = await async_openai_client.chat.completions.create(**kwargs)
            twin = copy.copy(stream)
            assert isinstance(twin, openai.AsyncStream)
            chunks, rest = [c async for c in twin], [c async for c in stream]
            await stream.close()
        return chunks, rest

    bare, bare_rest = await read_a_copy()
    otel.instrument(inject_include_usage=True)
    ours, rest = await read_a_copy()
    assert rest == bare_rest == []
    assert dumps_without_volatile(ours) == fingerprint_left_on_the_usage_chunk(
        dumps_without_volatile(bare)
    )
    span = otel.only_span()
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert span.attributes["spec_decode.engine"] == "vllm"
    collect()
    assert len(otel.spans()) == 1
    assert otel.requests_by_outcome() == {"recorded": 1}


@pytest.mark.parametrize("mode", MODES)
async def test_a_copied_streaming_response_read_raw_ends_the_call_of_the_response_once(
    mode: str, instrumented: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    """A copy of a ``with_streaming_response`` response (3.63.0: the same
    ``http_response``) read raw with ``iter_lines()`` is that response's body: the call is
    recorded from it, and the block's exit closing the original ends nothing more."""
    kwargs = kwargs_for(70, stream_options={"include_usage": True})
    if mode == "sync":
        with openai_client.chat.completions.with_streaming_response.create(**kwargs) as raw:
            twin = copy.copy(raw)
            assert isinstance(twin, openai.APIResponse)
            lines = list(twin.iter_lines())
    else:
        async with async_openai_client.chat.completions.with_streaming_response.create(
            **kwargs
        ) as raw:
            twin = copy.copy(raw)
            assert isinstance(twin, openai.AsyncAPIResponse)
            lines = [line async for line in twin.iter_lines()]
    assert "data: [DONE]" in lines
    span = instrumented.only_span()
    assert span.attributes["spec_decode.outcome"] == "recorded"
    del raw, twin
    collect()
    assert instrumented.requests_by_outcome() == {"recorded": 1}


# -- ``in`` on a stream ----------------------------------------------------------------


@pytest.mark.parametrize("raw", [False, True], ids=["create", "with_raw_response"])
def test_in_on_a_stream_reads_it_through_our_observer(
    raw: bool, otel: Otel, openai_client: Any
) -> None:
    """OpenLLMetry 0.62.4 (``_set_response_attributes``: ``"error" in response``) runs
    ``in`` on the stream a ``with_raw_response`` text completion parses to, and so reads
    it to its end. ``openai.Stream`` has no ``__contains__``: Python reads it through
    ``__iter__``. wrapt's proxy (2.5.2) passed ``in`` to the SDK's stream, so its chunks
    went by our observer and the call was recorded ``no_stats``. ``in`` now answers what
    it answers on the bare stream and the call is recorded from the chunks it read."""

    def membership() -> bool:
        kwargs = kwargs_for(71, stream_options={"include_usage": True})
        if raw:
            stream = openai_client.chat.completions.with_raw_response.create(**kwargs).parse()
        else:
            stream = openai_client.chat.completions.create(**kwargs)
        with stream:
            return "error" in stream

    bare = membership()
    otel.instrument()
    assert membership() is bare is False
    (span,) = otel.spans()
    assert span.attributes is not None
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert span.attributes["spec_decode.num_accepted_draft_tokens"] > 0


# -- setting ``response`` on a stream ----------------------------------------------------


def test_setting_a_streams_response_does_what_it_does_on_the_sdks_stream(
    otel: Otel, openai_client: Any
) -> None:
    """``openai.Stream.response`` is a plain attribute (openai 2.x ``_streaming.py``):
    code may replace it, as a wrapper swapping in a response of its own would. Our proxy
    reads it through a property, which alone made the assignment raise
    ``AttributeError``. The assignment now lands on the SDK's stream and reads back, and a
    ``close`` through the new response still ends the call."""

    def replace_response() -> bool:
        stream = openai_client.chat.completions.create(**kwargs_for(72))
        next(iter(stream))
        # The SDK's httpx (openai 3 uses httpx2): a response of the same class.
        new = stream.response.__class__(200, request=stream.response.request)
        stream.response = new
        replaced = stream.response == new
        stream.response.close()
        return replaced

    assert replace_response() is True
    otel.instrument()
    assert replace_response() is True
    (span,) = otel.spans()
    assert span.attributes is not None
    assert span.attributes["spec_decode.outcome"] == "not_read_to_end"


# -- an exception thrown in at a chunk ---------------------------------------------------


def _relay(stream: Any) -> Iterator[Any]:
    """A relay generator: its ``throw()`` is thrown into ``stream``'s iterator."""
    yield from stream


@pytest.mark.parametrize("mode", MODES)
async def test_an_exception_thrown_into_the_iterator_is_not_a_failed_read(
    mode: str, otel: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    """An exception thrown into a stream's iterator at a chunk (``throw()`` on it, as a
    relay ``yield from stream`` forwards its own; ``athrow()`` on the async iterator)
    comes from the consumer, not from reading: the SDK's stream (openai 3.63.0
    ``_streaming.py``: ``__iter__`` yields from one shared iterator) stays readable, and
    the user reads on to its end. Our read loop took it for a read that raised, so the
    call ended there as an error, its stats lost. Now it is the call the stream read to
    its end would be, and the user gets what the bare SDK gives."""

    usage: dict[str, Any] = {"stream_options": {"include_usage": True}}

    async def read_with_a_throw() -> tuple[int, str]:
        if mode == "sync":
            stream = openai_client.chat.completions.create(**kwargs_for(73, **usage))
            relay = _relay(stream)
            next(relay)
            with pytest.raises(ValueError) as thrown:
                relay.throw(ValueError("the consumer's own signal"))
            return 1 + sum(1 for _ in stream), str(thrown.value)
        astream = await async_openai_client.chat.completions.create(**kwargs_for(73, **usage))
        iterator = astream.__aiter__()
        await iterator.__anext__()
        with pytest.raises(ValueError) as athrown:
            await iterator.athrow(ValueError("the consumer's own signal"))  # type: ignore[attr-defined]
        return 1 + len([c async for c in astream]), str(athrown.value)

    bare = await read_with_a_throw()
    otel.instrument()
    assert await read_with_a_throw() == bare
    assert bare[0] > 3
    (span,) = otel.spans()
    assert span.attributes is not None
    assert span.status.status_code is StatusCode.UNSET
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert "error.type" not in span.attributes
