"""LiteLLM 1.110.2 at its edges: one span per call when calls interleave, fail, or are
left unread, against the simulator over real HTTP.

Fixtures, leak filters and helpers come from ``test_litellm``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
import types
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm
import openai
import pytest
import pytest_asyncio
from framework_relay import Recorded, Relay
from instrumentation_helpers import (
    MODEL,
    Otel,
    expected_span_attributes,
    request_kwargs,
    spec_decode_attributes,
)
from litellm.litellm_core_utils.litellm_logging import Logging
from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper
from litellm.responses.streaming_iterator import BaseResponsesAPIStreamingIterator
from opentelemetry.trace import StatusCode
from test_litellm import (  # noqa: F401  # the fixtures are used by name
    SETTLE,
    collect_litellm_leaks,
    litellm_callbacks,
    litellm_clients,
    litellm_kwargs,
    pytestmark,
    seed_for,
    settled_spans,
)

import spec_decode_otel
from spec_decode_otel import integrations
from spec_decode_otel.integrations import litellm as callback_module

if TYPE_CHECKING:
    from reliability.reliability_helpers import SpanCounter


async def calls_closed(already_open: frozenset[Any] = frozenset()) -> int:
    """LiteLLM calls still open (besides ``already_open``) once the streams dropped so
    far are reclaimed: their ends run on the finalizer's thread, after the collector."""

    def still_open() -> int:
        return len(callback_module._calls._started.keys() - already_open)

    deadline = time.monotonic() + SETTLE
    while still_open() and time.monotonic() < deadline:
        gc.collect()
        await asyncio.sleep(0.02)
    return still_open()


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def no_call_left_open() -> AsyncIterator[None]:
    """Every test here, dropped streams included, leaves no LiteLLM call of its own open
    once its streams are reclaimed (an open call keeps the notes of every openai SDK
    stream on)."""
    before = frozenset(callback_module._calls._started)
    yield
    assert await calls_closed(before) == 0


#: How LiteLLM 1.110.2 streams a Responses call to a ``hosted_vllm/`` model
#: (``OpenAIResponsesAPIConfig.should_fake_stream``, litellm/llms/openai/responses/
#: transformation.py): a model it holds no entry for in ``litellm.model_cost`` is asked
#: unstreamed, and the answer replayed as events (``MockResponsesAPIStreamingIterator``);
#: a model it knows is streamed from the server (``SyncResponsesAPIStreamingIterator`` /
#: ``ResponsesAPIStreamingIterator``, litellm/responses/streaming_iterator.py). A
#: ``Router`` makes every deployment's model known: it registers an entry for each
#: (``register_deployment_in_model_cost``, litellm/router_rust/surface/registry.py).
RESPONSES_STREAMS = {
    "fake stream": ("MockResponsesAPIStreamingIterator",),
    "native stream": ("SyncResponsesAPIStreamingIterator", "ResponsesAPIStreamingIterator"),
}


def responses_streamed_as(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM streams the Responses calls of this test as ``shape``: the model unknown
    to it, or registered as a Router registers it (an empty entry)."""
    key = f"hosted_vllm/{MODEL}"
    if shape == "native stream":
        monkeypatch.setitem(litellm.model_cost, key, {})
    else:
        monkeypatch.delitem(litellm.model_cost, key, raising=False)


def open_stream(api: str, mode: str, base_url: str, seed: str) -> Any:
    """A stream LiteLLM reads with its own handler (``hosted_vllm/``): its chat
    completion, or its Responses call (posted to the server's ``/v1/responses``)."""
    if api == "chat":
        kwargs = litellm_kwargs(
            "hosted_vllm", request_kwargs("vllm", "chat", True, seed_for(seed)), base_url
        )
        return litellm.acompletion(**kwargs) if mode == "async" else litellm.completion(**kwargs)
    kwargs = {
        "model": f"hosted_vllm/{MODEL}",
        "input": "Name three stripes.",
        "stream": True,
        "api_base": base_url,
        "api_key": "sk-t",
        "extra_headers": {"x-sim-seed": str(seed_for(seed))},
    }
    return litellm.aresponses(**kwargs) if mode == "async" else litellm.responses(**kwargs)


@pytest.mark.parametrize("between", ["openai SDK", "litellm openai/"])
@pytest.mark.parametrize(
    ("api", "mode"),
    [("chat", "async"), *((f"responses, {shape}", mode)
                          for shape in RESPONSES_STREAMS for mode in ("async", "sync"))],
)  # fmt: skip
async def test_a_stream_read_around_an_sdk_call_in_the_same_context_keeps_its_span(
    api: str,
    mode: str,
    between: str,
    otel: Otel,
    simulator_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``hosted_vllm/`` stream (chat or Responses) read in part, then an openai SDK
    call (the app's own, or LiteLLM's ``openai/`` route) in the same task or thread, then
    the rest of the stream: two calls, two spans.

    LiteLLM 1.110.2 reports a stream's end from the context that read it to its end
    (``CustomStreamWrapper.__anext__`` creates the logging task from the reading task,
    litellm/litellm_core_utils/streaming_handler.py; the Responses iterators likewise,
    litellm/responses/streaming_iterator.py). The callback took any SDK request made in
    that context after the call started for the call's own, and skipped the stream as
    the openai wrapper's, though LiteLLM had already logged its answer (the call's mark
    decided) without one: the user saw the SDK call's span and none for the stream.

    A Responses call LiteLLM streams from the server (its model known, as a ``Router``
    makes it: :data:`RESPONSES_STREAMS`) logs no answer before its end: the callback
    skipped it the same way. It was seen only when a Router test ran first in the same
    process (the Responses cases failed after test_litellm_router.py)."""
    endpoint, _, shape = api.partition(", ")
    if shape:
        responses_streamed_as(shape, monkeypatch)
    otel.instrument()
    sdk_request = request_kwargs("vllm", "chat", False, seed_for("between", api, mode))
    client = openai.AsyncOpenAI(api_key="sk-t", base_url=simulator_url, max_retries=0)
    sync_client = openai.OpenAI(api_key="sk-t", base_url=simulator_url, max_retries=0)
    via_litellm = litellm_kwargs("openai", sdk_request, simulator_url)
    kind = ""
    try:
        if mode == "async":
            stream = await open_stream(endpoint, mode, simulator_url, f"{api}-{between}")
            kind = type(stream).__name__
            assert await stream.__anext__()
            if between == "openai SDK":
                await client.chat.completions.create(**sdk_request)
            else:
                await litellm.acompletion(**via_litellm)
            assert [chunk async for chunk in stream]
        else:

            def read_around() -> str:  # in a thread without an event loop, as in a script
                stream = iter(open_stream(endpoint, mode, simulator_url, f"{api}-{between}"))
                assert next(stream)
                if between == "openai SDK":
                    sync_client.chat.completions.create(**sdk_request)
                else:
                    litellm.completion(**via_litellm)
                assert list(stream)
                return type(stream).__name__

            kind = await asyncio.to_thread(read_around)
    finally:
        await client.close()
        sync_client.close()
    if shape:
        assert kind in RESPONSES_STREAMS[shape]

    spans = await settled_spans(otel, 2)
    # the SDK call's record, and the stream's span (LiteLLM's own handler keeps no stats)
    assert sorted(s.attributes["spec_decode.outcome"] for s in spans) == ["no_stats", "recorded"]
    assert otel.requests_by_outcome() == {"no_stats": 1, "recorded": 1}


class FailsFirst(Relay):
    """The simulator behind a relay that answers its first request 500, as an engine
    restarting or overloaded does, and forwards the rest."""

    def forward(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        with self._lock:
            first = not self.requests
            if first:
                self.requests.append(Recorded(path, headers, body))
        if first:
            return 500, "application/json", b'{"error": {"message": "overloaded"}}'
        return super().forward(path, headers, body)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_attempt_litellm_retried_and_the_answer_have_a_span_each(
    mode: str, otel: Otel, simulator_url: str
) -> None:
    """``litellm.completion`` / ``await litellm.acompletion(model="hosted_vllm/...",
    num_retries=2)``: the first request gets a 500, LiteLLM's retry gets the answer, with
    its stats. Each attempt gets its span, and none stays open.

    Async, the user saw the first attempt's error span and nothing for the answer:
    LiteLLM 1.110.2 logs the first attempt's failure (``wrapper_async``, utils.py), then
    retries through ``acompletion_with_retries`` (main.py) with ``original_function``,
    the undecorated ``acompletion``: the retry never passes through the wrapper that
    sends the success event, so no callback hears of the answer, then or later. It does
    log the answer's body (``log_post_api_call``), where the callback now records it.

    Sync, the user saw the answer's span only, and the failed attempt stayed open for good
    (``open_litellm_calls()`` 1 after the call), which kept the openai wrapper noting every
    SDK stream: the ``client`` wrapper's ``except`` returns ``completion_with_retries``
    (utils.py) before its failure logging, and the retry starts under the same
    ``litellm_call_id`` in the same thread. That start now ends the failed attempt, with
    ``error.type`` ``_OTHER`` (LiteLLM did not say what failed)."""
    otel.instrument()
    request = request_kwargs("vllm", "chat", False, seed_for("retried", mode))
    with FailsFirst(simulator_url) as relay:
        kwargs = {**litellm_kwargs("hosted_vllm", request, relay.url), "num_retries": 2}
        if mode == "sync":
            response = litellm.completion(**kwargs)
        else:
            response = await litellm.acompletion(**kwargs)
        assert response.choices[0].message.content
        assert len(relay.requests) == 2
        record = spec_decode_otel.record_from_json(relay.replay(1))
    assert record is not None

    failed, answer = sorted(await settled_spans(otel, 2), key=lambda s: s.start_time)
    assert failed.status.status_code is StatusCode.ERROR
    said = "_OTHER" if mode == "sync" else "InternalServerError"
    assert failed.attributes["error.type"] == said
    assert failed.end_time <= answer.start_time
    assert answer.status.status_code is StatusCode.UNSET
    assert spec_decode_attributes(answer.attributes) == expected_span_attributes(record)
    assert otel.requests_by_outcome() == {"error": 1, "recorded": 1}
    assert integrations.open_litellm_calls() == 0


async def test_calls_of_streams_still_held_are_kept_at_most_max_calls(
    otel: Otel, simulator_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams read in part and still held by the caller: LiteLLM 1.110.2 reports a
    stream's end only when it is read to the end (``CustomStreamWrapper``,
    streaming_handler.py), so their calls stay open while they are held. What is kept of
    them is bounded: past ``MAX_CALLS``, the oldest is forgotten (nothing tells a held
    stream from a slow one), and a later call is still recorded. Once dropped, the one
    still kept ends ``not_read_to_end``; the forgotten ones give nothing."""
    monkeypatch.setattr(callback_module, "MAX_CALLS", 2)
    otel.instrument()
    held = []
    for index in range(4):
        request = request_kwargs("vllm", "chat", True, seed_for("held", str(index)))
        stream = litellm.completion(**litellm_kwargs("hosted_vllm", request, simulator_url))
        assert next(iter(stream))
        held.append(stream)
    assert len(callback_module._calls._started) == 2
    assert integrations.open_litellm_calls() == 2

    request = request_kwargs("vllm", "chat", False, seed_for("after the held ones"))
    await litellm.acompletion(**litellm_kwargs("hosted_vllm", request, simulator_url))
    (span,) = await settled_spans(otel)
    assert span.attributes["spec_decode.outcome"] == "recorded"
    # its start pushed out one more held stream; its end closed it
    assert integrations.open_litellm_calls() == len(callback_module._calls._started) == 1

    del held, stream
    assert await calls_closed() == 0
    spans = await settled_spans(otel, 2)
    assert sorted(s.attributes["spec_decode.outcome"] for s in spans) == [
        "not_read_to_end",
        "recorded",
    ]


async def drop_stream(mode: str, how: str, route: str, base_url: str, seed: str) -> None:
    """A ``litellm.completion``/``acompletion`` stream the caller leaves: unread, read in
    part, or read in part and closed (``close()``/``aclose()``), then out of scope."""
    request = request_kwargs("vllm", "chat", True, seed_for(seed, mode, how, route))
    kwargs = litellm_kwargs(route, request, base_url)
    if mode == "async":
        stream = await litellm.acompletion(**kwargs)
        if how != "unread":
            assert await stream.__anext__()
        if how == "closed":
            await stream.aclose()
    else:
        stream = litellm.completion(**kwargs)
        if how != "unread":
            assert next(stream)
        if how == "closed":
            stream.close()
    assert integrations.open_litellm_calls()


@pytest.mark.parametrize("how", ["unread", "read in part", "closed"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_stream_the_caller_drops_ends_not_read_to_end_and_its_call_is_forgotten(
    mode: str, how: str, otel: Otel, span_counter: SpanCounter, simulator_url: str
) -> None:
    """``litellm.completion(model="hosted_vllm/...", stream=True)`` (or ``acompletion``)
    left before its end: LiteLLM 1.110.2 sends no event for it (``CustomStreamWrapper``,
    litellm/litellm_core_utils/streaming_handler.py: ``close()``/``aclose()`` release the
    provider stream, ``__del__`` restores its logging context, none reports the end), so
    its call stayed open in the callback until ``MAX_CALLS`` pushed it out, and the open
    count (which keeps the openai SDK streams' notes on) never fell back to 0. Now, once
    the stream is reclaimed, the call is forgotten and has its span, ended with the
    outcome an openai SDK stream dropped early gets."""
    otel.instrument()
    before = frozenset(callback_module._calls._started)
    await drop_stream(mode, how, "hosted_vllm", simulator_url, "dropped")
    assert await calls_closed(before) == 0

    (span,) = await settled_spans(otel)
    assert span.attributes["spec_decode.outcome"] == "not_read_to_end"
    assert span.attributes["spec_decode.read_to_end"] is False
    assert span.status.status_code is StatusCode.UNSET
    assert span.end_time is not None and span.end_time >= span.start_time
    assert otel.requests_by_outcome() == {"not_read_to_end": 1}
    assert await span_counter.open_after_async(SETTLE) == 0
    assert span_counter.started == 1


@pytest.mark.parametrize("route", ["hosted_vllm", "openai"])
async def test_a_call_cancelled_before_its_answer_is_forgotten(
    route: str, otel: Otel, span_counter: SpanCounter, simulator_url: str
) -> None:
    """``asyncio.wait_for`` running out on ``litellm.acompletion`` before the server
    answers. LiteLLM 1.110.2 reports no end for it (its ``client`` wrappers report
    failures from ``except Exception``, utils.py; a cancellation is no ``Exception``), so
    through either route it stayed open in the callback, holding the caller's context
    and keeping every openai SDK stream noted, until ``MAX_CALLS`` pushed it out (found
    by probing LiteLLM under faults). Now it is forgotten once its ``Logging`` object is
    reclaimed. Through ``openai/`` the openai wrapper's span ends it ``not_read_to_end``;
    through ``hosted_vllm/`` it gets no span, as README says: an unreported end may as
    well be the last attempt of a call whose every attempt failed."""
    request = request_kwargs("vllm", "chat", False, seed_for("cancelled", route))
    kwargs = litellm_kwargs(route, request, simulator_url)
    await litellm.acompletion(**kwargs)  # LiteLLM's first call sets up for seconds
    otel.instrument()
    before = frozenset(callback_module._calls._started)
    slow = {"x-sim-fault": "slow", "x-sim-delay-ms": "3000"}  # past the caller's wait
    kwargs["extra_headers"] = {**kwargs["extra_headers"], **slow}
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(litellm.acompletion(**kwargs), 0.5)
    assert await calls_closed(before) == 0

    if route == "openai":
        (span,) = await settled_spans(otel)
        assert span.attributes["spec_decode.outcome"] == "not_read_to_end"
        assert span.status.status_code is StatusCode.UNSET
        assert otel.requests_by_outcome() == {"not_read_to_end": 1}
    else:
        assert otel.our_spans() == []
    assert await span_counter.open_after_async(SETTLE) == 0


def finished(chunk: Any) -> bool:
    """The chunk carrying the stream's finish reason (its last content chunk)."""
    return bool(chunk.choices) and chunk.choices[0].finish_reason is not None


@pytest.mark.parametrize("usage", ["usage chunk asked", "no usage chunk"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_stream_closed_after_its_last_content_chunk_ends_not_read_to_end(
    mode: str, usage: str, otel: Otel, span_counter: SpanCounter, simulator_url: str
) -> None:
    """A ``hosted_vllm/`` stream read up to the chunk with its finish reason, then closed
    (``close()``/``aclose()``, as a caller does once it has the answer) before the usage
    chunk, or before the end LiteLLM reads after that chunk: LiteLLM 1.110.2 reports the
    end only when a read after the last chunk finds the provider stream ended
    (``__next__``, ``_finalize_completed_stream``, streaming_handler.py), which a closed
    stream never reaches. The callback took a stream whose last chunk was read and that
    was closed for one LiteLLM had reported, so its call stayed open. Now it ends once,
    ``not_read_to_end``, when reclaimed."""
    otel.instrument()
    before = frozenset(callback_module._calls._started)
    request = request_kwargs("vllm", "chat", True, seed_for("closed after the last", mode, usage))
    if usage == "no usage chunk":
        del request["stream_options"]
    kwargs = litellm_kwargs("hosted_vllm", request, simulator_url)
    if mode == "async":
        stream = await litellm.acompletion(**kwargs)
        while not finished(await stream.__anext__()):
            pass
        await stream.aclose()
    else:
        stream = litellm.completion(**kwargs)
        while not finished(next(stream)):
            pass
        stream.close()
    assert integrations.open_litellm_calls()
    del stream
    assert await calls_closed(before) == 0

    (span,) = await settled_spans(otel)
    assert span.attributes["spec_decode.outcome"] == "not_read_to_end"
    assert otel.requests_by_outcome() == {"not_read_to_end": 1}
    assert await span_counter.open_after_async(SETTLE) == 0
    assert span_counter.started == 1


#: How a Responses stream is left: LiteLLM's replayed stream has no ``close()``.
RESPONSES_LEFT = [
    (shape, how)
    for shape in RESPONSES_STREAMS
    for how in ("unread", "read in part", "closed", "read to the end")
    if (shape, how) != ("fake stream", "closed")
]


@pytest.mark.parametrize(("shape", "how"), RESPONSES_LEFT)
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_responses_stream_the_caller_drops_ends_once(
    mode: str,
    shape: str,
    how: str,
    otel: Otel,
    span_counter: SpanCounter,
    simulator_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``litellm.responses(model="hosted_vllm/...", stream=True)`` (or ``aresponses``),
    streamed from the server or replayed (:data:`RESPONSES_STREAMS`), left unread, read
    in part, or closed (``close()``/``aclose()``), then dropped: LiteLLM 1.110.2 reports
    a Responses stream's end only at its terminal event or a failure
    (``BaseResponsesAPIStreamingIterator._process_chunk``,
    litellm/responses/streaming_iterator.py), and these iterators are no
    ``CustomStreamWrapper``, so the call stayed open. Now it ends once, when reclaimed,
    ``not_read_to_end``; read to the end, it has LiteLLM's end (``no_stats``) and
    nothing more."""
    responses_streamed_as(shape, monkeypatch)
    otel.instrument()
    before = frozenset(callback_module._calls._started)
    seed = f"responses dropped {shape} {how}"
    if mode == "async":
        stream = await open_stream("responses", mode, simulator_url, seed)
        kind = type(stream).__name__
        if how == "read to the end":
            assert [event async for event in stream]
        elif how != "unread":
            assert await stream.__anext__()
        if how == "closed":
            await stream.aclose()
        if how != "read to the end":
            assert integrations.open_litellm_calls()
        del stream
    else:

        def leave() -> str:  # in a thread without an event loop, as in a script
            stream = open_stream("responses", mode, simulator_url, seed)
            if how == "read to the end":
                assert list(stream)
            elif how != "unread":
                assert next(stream)
            if how == "closed":
                stream.close()
            if how != "read to the end":
                assert integrations.open_litellm_calls()
            return type(stream).__name__

        kind = await asyncio.to_thread(leave)
    assert kind in RESPONSES_STREAMS[shape]
    assert await calls_closed(before) == 0

    (span,) = await settled_spans(otel)
    expected = "no_stats" if how == "read to the end" else "not_read_to_end"
    assert span.attributes["spec_decode.outcome"] == expected
    assert otel.requests_by_outcome() == {expected: 1}
    assert await span_counter.open_after_async(SETTLE) == 0
    assert span_counter.started == 1


@pytest.mark.parametrize("how", ["unread", "read in part"])
@pytest.mark.parametrize("route", ["hosted_vllm", "openai"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_text_completion_stream_the_caller_drops_ends_its_call(
    mode: str, route: str, how: str, otel: Otel, span_counter: SpanCounter, simulator_url: str
) -> None:
    """``litellm.text_completion(..., stream=True)`` (or ``atext_completion``) left
    unread or read in part, then dropped. LiteLLM 1.110.2 hands back a
    ``TextCompletionStreamWrapper`` (litellm/text_completions/streaming_iterator.py)
    around a generator that sends the request through the openai SDK, and makes its
    ``CustomStreamWrapper``, only when first read (``OpenAITextCompletion.streaming`` /
    ``async_streaming``, litellm/llms/openai/completion/handler.py); it logs that
    generator as the call's response. Dropped unread, nothing was sent and no
    ``CustomStreamWrapper`` made, so nothing ended the call: it stayed open. Now it is
    forgotten when the generator is reclaimed, with no span (there was no request); read
    in part, the openai wrapper's span ends ``not_read_to_end``, once."""
    otel.instrument()
    before = frozenset(callback_module._calls._started)
    request = request_kwargs("vllm", "completions", True, seed_for("text", mode, route, how))
    kwargs = litellm_kwargs(route, request, simulator_url)
    if mode == "async":
        stream = await litellm.atext_completion(**kwargs)
        if how != "unread":
            assert await stream.__anext__()
    else:
        stream = litellm.text_completion(**kwargs)
        if how != "unread":
            assert next(stream)
    assert type(stream).__name__ == "TextCompletionStreamWrapper"
    assert integrations.open_litellm_calls()
    del stream
    assert await calls_closed(before) == 0

    sent = how != "unread"
    spans = await settled_spans(otel, int(sent))
    assert [s.attributes["spec_decode.outcome"] for s in spans] == ["not_read_to_end"] * sent
    assert otel.requests_by_outcome() == ({"not_read_to_end": 1} if sent else {})
    assert await span_counter.open_after_async(SETTLE) == 0
    assert span_counter.started == sent


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_dropped_stream_litellm_sent_through_the_sdk_keeps_only_the_wrappers_span(
    mode: str, otel: Otel, span_counter: SpanCounter, simulator_url: str
) -> None:
    """The same on LiteLLM's ``openai/`` route, whose stream is an openai SDK stream the
    openai wrapper reads (and ends ``not_read_to_end`` when reclaimed with LiteLLM's):
    the call is forgotten without a second span."""
    otel.instrument()
    before = frozenset(callback_module._calls._started)
    await drop_stream(mode, "read in part", "openai", simulator_url, "dropped via the SDK")
    assert await calls_closed(before) == 0

    (span,) = await settled_spans(otel)
    assert span.attributes["spec_decode.outcome"] == "not_read_to_end"
    assert otel.requests_by_outcome() == {"not_read_to_end": 1}
    assert await span_counter.open_after_async(SETTLE) == 0
    assert span_counter.started == 1


@pytest.mark.parametrize("dropped", ["once its span is out", "at once"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_stream_read_to_the_end_then_dropped_is_recorded_once(
    mode: str, dropped: str, otel: Otel, span_counter: SpanCounter, simulator_url: str
) -> None:
    """A ``hosted_vllm/`` stream read to its end, then dropped: LiteLLM 1.110.2 reports
    its end (the callback's span, ``no_stats``: LiteLLM rebuilt the chunks), and
    reclaiming the stream afterwards ends nothing a second time.

    Dropped at once, an async stream is reclaimed as soon as LiteLLM's cache task, which
    holds it, has run: its reclaiming is handled on the finalizer thread while the
    success event's task, made at the same time, may still be on its way to the callback
    (a sync stream's events hold it until they ran). The call still gets LiteLLM's end,
    not ``not_read_to_end``."""
    otel.instrument()
    before = frozenset(callback_module._calls._started)
    request = request_kwargs("vllm", "chat", True, seed_for("read to the end", mode, dropped))
    kwargs = litellm_kwargs("hosted_vllm", request, simulator_url)
    if mode == "async":
        stream = await litellm.acompletion(**kwargs)
        assert [chunk async for chunk in stream]
    else:
        stream = litellm.completion(**kwargs)
        assert list(stream)
    if dropped == "at once":
        del stream
        await asyncio.sleep(0)  # LiteLLM's cache task, which holds an async stream, runs
        gc.collect()
        time.sleep(0.5)  # the loop held: a reclaimed stream is handled on the finalizer thread
        (span,) = await settled_spans(otel)
    else:
        (span,) = await settled_spans(otel)
        del stream
    assert await calls_closed(before) == 0

    assert await settled_spans(otel) == [span]
    assert span.attributes["spec_decode.outcome"] == "no_stats"
    assert otel.requests_by_outcome() == {"no_stats": 1}
    assert await span_counter.open_after_async(SETTLE) == 0
    assert span_counter.started == 1


@pytest.mark.parametrize("read", ["to the end", "in part"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_router_stream_has_one_span_read_to_the_end_or_dropped(
    mode: str, read: str, otel: Otel, span_counter: SpanCounter, simulator_url: str
) -> None:
    """LiteLLM 1.110.2's Router hands out its own ``CustomStreamWrapper`` subclass
    (``_SyncChatStream``/``_AsyncChatStream``, litellm/router_rust/invoke/streaming.py)
    around the attempt's stream, with the same call: it iterates a generator over the
    attempt's stream, so its own end-of-stream state never changes. Read to the end, the
    call has LiteLLM's reported end (``no_stats``) and nothing more when both streams are
    reclaimed; dropped, one ``not_read_to_end`` span."""
    otel.instrument()
    before = frozenset(callback_module._calls._started)
    router = litellm.Router(
        model_list=[
            {
                "model_name": "pool",
                "litellm_params": {
                    "model": f"hosted_vllm/{MODEL}",
                    "api_base": simulator_url,
                    "api_key": "sk-t",
                },
            }
        ]
    )
    request = request_kwargs("vllm", "chat", True, seed_for("router", mode, read))
    kwargs = {**request, "model": "pool"}
    if mode == "async":
        stream = await router.acompletion(**kwargs)
        assert [chunk async for chunk in stream] if read == "to the end" else await anext(stream)
    else:
        stream = router.completion(**kwargs)
        assert list(stream) if read == "to the end" else next(stream)
    if read == "to the end":
        await settled_spans(otel)
    del stream
    assert await calls_closed(before) == 0

    (span,) = await settled_spans(otel)
    expected = "no_stats" if read == "to the end" else "not_read_to_end"
    assert span.attributes["spec_decode.outcome"] == expected
    assert otel.requests_by_outcome() == {expected: 1}
    assert await span_counter.open_after_async(SETTLE) == 0
    assert span_counter.started == 1


async def test_after_dropped_streams_an_openai_sdk_stream_is_not_noted(
    otel: Otel, simulator_url: str
) -> None:
    """The openai wrapper notes each SDK stream's response id only while a LiteLLM call
    is open (:mod:`spec_decode_otel.integrations`). A dropped LiteLLM stream kept its call
    open, so from then on every SDK stream of the application was noted (up to
    ``MAX_STREAMS``). Once the dropped streams are reclaimed, none is."""
    otel.instrument()
    await drop_stream("sync", "read in part", "hosted_vllm", simulator_url, "before notes")
    await drop_stream("async", "read in part", "hosted_vllm", simulator_url, "before notes")
    assert await calls_closed() == 0
    with integrations._streams_lock:
        integrations._streams.clear()  # notes earlier tests' SDK streams left

    client = openai.AsyncOpenAI(api_key="sk-t", base_url=simulator_url, max_retries=0)
    try:
        request = request_kwargs("vllm", "chat", True, seed_for("not noted"))
        chunks = [chunk async for chunk in await client.chat.completions.create(**request)]
    finally:
        await client.close()
    assert chunks[0].id
    assert not integrations._streams
    spans = await settled_spans(otel, 3)
    assert sorted(s.attributes["spec_decode.outcome"] for s in spans) == [
        "not_read_to_end",
        "not_read_to_end",
        "recorded",
    ]


def litellms_own(cls: type, name: str) -> bool:
    """``cls.name`` is the function LiteLLM's own module defines (no wrapper of ours)."""
    value = vars(cls).get(name)
    return type(value) is types.FunctionType and value.__module__ == cls.__module__


async def test_uninstrument_puts_back_litellms_stream_finalizer_and_instrument_wraps_it_again(
    otel: Otel, span_counter: SpanCounter, simulator_url: str
) -> None:
    """Instrumenting wraps ``CustomStreamWrapper.__del__`` (LiteLLM 1.110.2's own,
    litellm/litellm_core_utils/streaming_handler.py) to end the calls of dropped
    streams (and its ``_finalize_completed_stream``, and gives the Responses iterators a
    ``__del__``, and LiteLLM's ``Logging`` one, for calls cancelled before their answer);
    uninstrumenting left it wrapped. Now it is LiteLLM's own again once no
    callback of ours is registered, the calls still open are forgotten (nothing ends them
    any more: a stream held across uninstrument gets no span, and keeps no openai SDK
    stream noted), and instrumenting again wraps it again: a stream dropped then ends."""
    otel.instrument()
    assert not litellms_own(CustomStreamWrapper, "__del__")
    assert not litellms_own(CustomStreamWrapper, "_finalize_completed_stream")
    assert "__del__" in vars(BaseResponsesAPIStreamingIterator)
    assert "__del__" in vars(Logging)  # ends a call cancelled before its answer
    request = request_kwargs("vllm", "chat", True, seed_for("held across uninstrument"))
    held = litellm.completion(**litellm_kwargs("hosted_vllm", request, simulator_url))
    assert next(held)
    assert integrations.open_litellm_calls()

    otel.uninstrument()
    gc.collect()  # callbacks of ours other tests made and dropped
    assert litellms_own(CustomStreamWrapper, "__del__")
    assert litellms_own(CustomStreamWrapper, "_finalize_completed_stream")
    assert "__del__" not in vars(BaseResponsesAPIStreamingIterator)  # it has none of its own
    assert "__del__" not in vars(Logging)  # nor has this
    assert integrations.open_litellm_calls() == 0
    assert not callback_module._calls._started

    otel.instrument()
    assert not litellms_own(CustomStreamWrapper, "__del__")
    assert "__del__" in vars(BaseResponsesAPIStreamingIterator)
    del held
    await drop_stream("async", "read in part", "hosted_vllm", simulator_url, "reinstrumented")
    assert await calls_closed() == 0
    (span,) = await settled_spans(otel)
    assert span.attributes["spec_decode.outcome"] == "not_read_to_end"
    assert otel.requests_by_outcome() == {"not_read_to_end": 1}
    assert await span_counter.open_after_async(SETTLE) == 0


@pytest.mark.parametrize("route", ["hosted_vllm", "openai"])
async def test_a_call_kept_open_keeps_no_prediction_content(
    route: str, otel: Otel, simulator_url: str
) -> None:
    """A ``prediction`` (OpenAI's Predicted Outputs, which LiteLLM 1.110.2 sends on both
    routes) is the text the model is expected to write: content, often a whole file. The
    callback keeps each call's request body, without its content, until LiteLLM reports
    the call's end, which for a stream still held it does not do (up to ``MAX_CALLS``
    calls).
    So what is kept of the prediction is only that there was one, which is all the
    ``usage`` pair's reading needs (a request with a prediction has its usage counts read
    as Predicted Outputs, not speculative decoding)."""
    otel.instrument()
    predicted = "the predicted text " * 1000
    request = request_kwargs("vllm", "chat", True, seed_for("prediction", route))
    kwargs = litellm_kwargs(route, request, simulator_url)
    stream = litellm.completion(**kwargs, prediction={"type": "content", "content": predicted})
    try:
        assert next(iter(stream))
        kept = [started.request for started in callback_module._calls._started.values()]
    finally:
        stream.close()
    assert kept and kept[-1] is not None
    assert kept[-1]["prediction"] == {"type": "content"}
    assert "the predicted text" not in repr(kept)


#: LiteLLM 1.110.2 leaves its logging worker's task on the loop that closes, and says so
#: when the task is collected.
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <coroutine object LoggingWorker._worker_loop"
    ":pytest.PytestUnraisableExceptionWarning"
)
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_async_call_whose_loop_ends_with_it_has_its_span(
    api: str, otel: Otel, simulator_url: str
) -> None:
    """``asyncio.run(litellm.acompletion(model="hosted_vllm/...", ...))``, as a script, a
    CLI or a sync web handler makes one async call: the call returned, its stats were on
    the response, and it had no span, nor metric points, while the program ran; at exit,
    LiteLLM's atexit flush gave it one if the tracer provider was not shut down yet
    (lost when ``litellm`` was imported before the providers were made: their atexit
    shutdown runs first).

    LiteLLM 1.110.2 sends a non-streamed async call's success event to a callback with
    an async hook only through its logging worker's queue
    (``_client_async_logging_helper``, utils.py; ``LoggingWorker``,
    litellm_core_utils/logging_worker.py), which runs on the caller's loop; ``asyncio.run``
    closes that loop as the call returns, and the queued event waits for the next loop
    LiteLLM runs, or exit (``_flush_on_exit``). LiteLLM logged the answer's body as it
    came (``log_post_api_call``)."""
    otel.instrument()
    seed = seed_for("loop ends", api)
    if api == "chat":
        request = litellm_kwargs(
            "hosted_vllm", request_kwargs("vllm", "chat", False, seed), simulator_url
        )
        call = litellm.acompletion
    else:
        request = {
            "model": f"hosted_vllm/{MODEL}",
            "input": "Name three stripes.",
            "api_base": simulator_url,
            "api_key": "sk-t",
            "extra_headers": {"x-sim-seed": str(seed)},
        }
        call = litellm.aresponses

    def script() -> Any:
        async def main() -> Any:
            return await call(**request)

        return asyncio.run(main())

    assert await asyncio.to_thread(script)
    (span,) = await settled_spans(otel)
    expected = "recorded" if api == "chat" else "no_stats"  # vLLM's Responses: no stats
    assert span.attributes["spec_decode.outcome"] == expected
    assert otel.requests_by_outcome() == {expected: 1}


@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <coroutine object LoggingWorker._worker_loop"
    ":pytest.PytestUnraisableExceptionWarning"
)
async def test_mock_responses_reach_no_server_and_get_no_span(
    otel: Otel, simulator_url: str
) -> None:
    """``mock_response`` makes LiteLLM answer the call itself (``mock_completion``,
    litellm 1.110.2 main.py): no server was asked. Such calls had a ``no_stats`` span
    without ``server.address`` and a ``no_stats`` count (lowering the coverage the alerts
    read), an error span for ``mock_response=Exception(...)``, and under ``asyncio.run``
    no span but a call left open for good. A real call to the same server right after is
    recorded as usual, also with the key ``mock-key``."""
    otel.instrument()
    request = litellm_kwargs(
        "hosted_vllm", request_kwargs("vllm", "chat", False, seed_for("mocked")), simulator_url
    )
    litellm.completion(**request, mock_response="hi")
    assert [
        c.choices[0].delta.content
        for c in litellm.completion(**{**request, "stream": True}, mock_response="hi")
    ]
    text = request_kwargs("vllm", "completions", False, seed_for("mocked text"))
    litellm.text_completion(
        **litellm_kwargs("hosted_vllm", text, simulator_url), mock_response="hi"
    )
    with pytest.raises(Exception, match="boom"):
        litellm.completion(**request, mock_response=Exception("boom"))

    def script() -> Any:
        return asyncio.run(litellm.acompletion(**request, mock_response="hi"))

    assert await asyncio.to_thread(script)
    litellm.completion(**{**request, "api_key": "mock-key"})
    (span,) = await settled_spans(otel)
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert span.attributes["server.port"] == int(simulator_url.rsplit(":", 1)[1].split("/")[0])
    assert otel.requests_by_outcome() == {"recorded": 1}


class ManyChoices(Relay):
    """Answers a stream with one chunk of 200 finished choices, as a server ignoring
    ``n`` or a hostile one may."""

    def forward(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        choices = [
            {"index": i, "delta": {"content": "x"}, "finish_reason": "stop"} for i in range(200)
        ]
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
        events = f"data: {json.dumps({**chunk, 'choices': choices})}\n\ndata: [DONE]\n\n"
        return 200, "text/event-stream", events.encode()


async def test_a_stream_litellm_reads_itself_keeps_at_most_16_finish_reasons(
    otel: Otel, simulator_url: str
) -> None:
    """``gen_ai.response.finish_reasons`` is bounded (SECURITY.md: at most 16 on a
    stream); the openai wrapper's stream observer kept that bound, but the list a
    ``hosted_vllm/`` stream's end built from LiteLLM's rebuilt chunk had one entry per
    choice (200 here; found by a helper). The bound is now kept where the span is
    written, for every path."""
    otel.instrument()
    request = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    with ManyChoices(simulator_url) as relay:
        stream = await litellm.acompletion(**litellm_kwargs("hosted_vllm", request, relay.url))
        [chunk async for chunk in stream]
    (span,) = await settled_spans(otel)
    assert 0 < len(span.attributes["gen_ai.response.finish_reasons"]) <= 16


async def test_a_body_litellm_logged_is_decoded_once(
    otel: Otel, simulator_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The callback read a non-streamed ``hosted_vllm/`` answer from the body text
    LiteLLM logged, decoding it once to see that it was one and again to record it: two
    decodes of every body, each 30-50 ms per MiB of container-dense JSON (found by a
    helper). The record is made from the first."""
    from spec_decode_otel.integrations import _litellm_kwargs as wire

    decoded: list[int] = []
    real = wire.decode_json

    def counting(text: Any) -> Any:
        decoded.append(len(text))
        return real(text)

    monkeypatch.setattr(wire, "decode_json", counting)
    otel.instrument()
    request = request_kwargs("vllm", "chat", False, seed_for("decoded-once", "async"))
    await litellm.acompletion(**litellm_kwargs("hosted_vllm", request, simulator_url))
    (span,) = await settled_spans(otel)
    assert span.attributes["spec_decode.outcome"] == "recorded"
    assert len(decoded) == 1, decoded
