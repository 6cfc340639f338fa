"""DSPy (the real ``dspy`` 3.4.1) against the simulator over HTTP, through LiteLLM.

How DSPy 3.4.1 sends a ``dspy.Predict`` call (read in the installed source):

- ``dspy/clients/lm.py``: ``dspy.LM(model, engine="auto", ...)``. ``engine="litellm"``
  sends every call through ``litellm.completion`` / ``acompletion``
  (``litellm_completion``, ``alitellm_completion``: the LM's keyword arguments, its
  ``headers`` with DSPy's ``User-Agent`` added, ``cache={"no-cache": True, ...}``).
  ``cache=False`` turns DSPy's own response cache off (``_get_cached_completion_fn``), so
  every call reaches the server.
- ``dspy/clients/backend_selection.py`` ``select_backend``: under the default
  ``engine="auto"``, a model lm15 (DSPy's vendored client, ``dspy/_vendor/lm15``) knows,
  ``openai/...`` and ``hosted_vllm/...`` included, goes to lm15 itself ("native") when
  the LM's client settings are only ``api_key``, ``api_base``, ``base_url`` and
  ``timeout``; any other (``headers``, ``extra_headers``, ...), or a body field lm15 does
  not take (``extra_body``), sends it to LiteLLM. lm15 speaks HTTP over its own sockets
  (``_vendor/lm15/transports/_sync.py``, ``_async.py``): neither the ``openai`` SDK nor
  LiteLLM runs. ``spec_decode_otel.integrations.dspy`` wraps lm15's request methods
  (``providers/base.py`` ``BaseProviderLM._send`` / ``_stream_raw``, their twins in
  ``providers/async_base.py``, ``providers/openai_chat.py``
  ``OpenAIChatLM.parse_stream_events``), so those calls get the openai wrapper's span
  and record too (tests at the end). An LM without headers cannot pick the simulator's
  engine shape: the relay adds the shape and seed headers to what it forwards for them
  (``ShapedRelay``), so the request as DSPy sent it stays lm15's own.
- Through LiteLLM 1.110.2, ``openai/`` posts with the ``openai`` SDK (our wrapper's span,
  read from the wire); ``hosted_vllm/`` with LiteLLM's own handler (the LiteLLM
  callback's span, from the response LiteLLM hands its callbacks; see test_litellm.py).
  Which client sent a request shows on the wire: the SDK's ``x-stainless-*`` headers.
- ``dspy.Predict`` with the default ``ChatAdapter`` asks for ``[[ ## answer ## ]]``
  sections; the relay (``framework_relay.py``) answers the simulator's body with that
  text, keeping the engine's stats.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
import zlib
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import dspy
import pytest
import wrapt
from framework_relay import Relay, check_span
from instrumentation_helpers import (
    MODEL,
    Otel,
    expected_outcome,
)
from opentelemetry.trace import StatusCode
from test_litellm import (  # noqa: F401  # the fixtures are used by name
    SETTLE,
    collect_litellm_leaks,
    litellm_callbacks,
    litellm_clients,
    pytestmark,
)

from reliability.reliability_helpers import SpanCounter
from spec_decode_otel import record_from_json

ROUTES = ("openai", "hosted_vllm")
ENGINES = ("vllm", "sglang", "trtllm", "llamacpp", "none")
#: (engine shape, sync or async call): every shape once, async on two of them
CASES = [*((engine, "sync") for engine in ENGINES), ("vllm", "async"), ("trtllm", "async")]
QUESTION = "What is a zebra-unicorn?"
ANSWER = "A striped horse with a horn."
#: what DSPy's ChatAdapter asks the model for, for ``question -> answer``
ANSWER_TEXT = f"[[ ## answer ## ]]\n{ANSWER}\n\n[[ ## completed ## ]]"


class ShapedRelay(Relay):
    """The relay, adding ``headers`` to every request it forwards to the simulator (and
    records, so that ``replay`` asks for the same sample): the engine shape and seed of
    an LM whose own requests carry no header of ours."""

    headers: dict[str, str] = {}
    #: An SSE error event put after a stream's first event (as a server that fails
    #: mid-stream sends it), the rest of the stream dropped.
    error_event: dict[str, Any] | None = None
    #: An error status and JSON body answered in place of the simulator's answer.
    error_answer: tuple[int, dict[str, Any]] | None = None

    def forward(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        status, content_type, payload = super().forward(path, {**headers, **self.headers}, body)
        if self.error_answer is not None:
            status, error = self.error_answer
            return status, "application/json", json.dumps(error).encode()
        if self.error_event is None or status != 200 or not json.loads(body).get("stream"):
            return status, content_type, payload
        first = payload.decode().split("\n\n")[0]
        return status, content_type, f"{first}\n\ndata: {json.dumps(self.error_event)}\n\n".encode()

    def shape(self, engine: str, seed: int, **more: str) -> None:
        self.headers = {"x-spec-decode-engine": engine, "x-sim-seed": str(seed), **more}


@pytest.fixture
def relay(simulator_url: str) -> Iterator[ShapedRelay]:
    with ShapedRelay(simulator_url, lambda request: ANSWER_TEXT) as r:
        yield r


def seed_for(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode()) % 100_000 + 1


def lm_for(route: str, relay: Relay, shape: str | None, seed: int, **settings: Any) -> dspy.LM:
    """A DSPy LM on ``route``, its cache off; ``shape`` (the simulator's engine shape) and
    the seed go as headers."""
    headers = {} if shape is None else {"x-spec-decode-engine": shape, "x-sim-seed": str(seed)}
    if shape == "sglang":
        settings["extra_body"] = {"return_spec_tokens_details": True}
    if headers:
        settings["headers"] = headers
    return dspy.LM(f"{route}/{MODEL}", api_base=relay.url, api_key="sk-t", cache=False, **settings)


async def predict(lm: dspy.LM, mode: str) -> dspy.Prediction:
    program = dspy.Predict("question -> answer")
    with dspy.context(lm=lm):
        if mode == "async":
            return await program.acall(question=QUESTION)
        return program(question=QUESTION)


async def settled_spans(otel: Otel, expected: int) -> list[Any]:
    """Our spans once LiteLLM's logging has run (it reports a call after returning it)."""
    deadline = time.monotonic() + SETTLE
    while len(otel.our_spans()) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)  # nothing more may come: a second record would show now
    return otel.our_spans()


def sent_by_the_openai_sdk(relay: Relay, index: int) -> bool:
    return "x-stainless-lang" in relay.requests[index].headers


@pytest.mark.parametrize(("engine", "mode"), CASES)
@pytest.mark.parametrize("route", ROUTES)
async def test_each_predict_call_through_litellm_gets_one_span_with_the_record(
    route: str,
    engine: str,
    mode: str,
    otel: Otel,
    span_counter: SpanCounter,
    relay: Relay,
    no_internal_errors: None,
) -> None:
    """``dspy.LM(engine="litellm", cache=False)``: each ``Predict`` call is one request to
    the server and one span of ours, with the record of that request's answer; the
    ``openai/`` route's span is the openai wrapper's (the request carries the SDK's
    headers), ``hosted_vllm/``'s the LiteLLM callback's, never both. DSPy's prediction is
    the same as without instrumentation."""
    seed = seed_for(route, engine, mode)
    bare = await predict(lm_for(route, relay, engine, seed, engine="litellm"), mode)
    assert otel.spans() == []

    otel.instrument()
    seen = await predict(lm_for(route, relay, engine, seed, engine="litellm"), mode)
    assert seen.toDict() == bare.toDict() == {"answer": ANSWER}

    spans = await settled_spans(otel, 1)
    assert len(relay.requests) == 2  # the bare call and this one: DSPy's cache is off
    assert sent_by_the_openai_sdk(relay, 1) == (route == "openai")
    assert relay.bodies()[1] == relay.bodies()[0]
    record = record_from_json(relay.replay(1))
    assert (record is None) == (engine == "none")
    (span,) = spans
    check_span(span, record)
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {expected_outcome(record): 1}


@pytest.mark.parametrize("route", ROUTES)
async def test_repeated_identical_calls_with_the_cache_off_each_get_a_span(
    route: str, otel: Otel, span_counter: SpanCounter, relay: Relay, no_internal_errors: None
) -> None:
    """The same question three times on one LM (``cache=False``): three requests, three
    spans, each with its own answer's record (the same seed, so the same record)."""
    otel.instrument()
    lm = lm_for(route, relay, "vllm", seed_for("repeat", route), engine="litellm")
    for _ in range(3):
        assert (await predict(lm, "sync")).answer == ANSWER
    spans = await settled_spans(otel, 3)
    assert len(spans) == len(relay.requests) == 3
    for index, span in enumerate(spans):
        record = record_from_json(relay.replay(index))
        assert record is not None and record.engine == "vllm"
        check_span(span, record)
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {"recorded": 3}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("route", ROUTES)
async def test_headers_alone_send_the_default_engine_through_litellm(
    route: str, mode: str, otel: Otel, relay: Relay, no_internal_errors: None
) -> None:
    """Under the default ``engine="auto"``, an LM with ``headers`` is one lm15 does not
    take (``select_backend``: a client setting other than key, base and timeout), so the
    call goes through LiteLLM and gets its span and record."""
    otel.instrument()
    lm = lm_for(route, relay, "sglang", seed_for("auto", route, mode))
    assert (await predict(lm, mode)).answer == ANSWER
    (span,) = await settled_spans(otel, 1)
    assert sent_by_the_openai_sdk(relay, 0) == (route == "openai")
    record = record_from_json(relay.replay(0))
    assert record is not None and record.engine == "sglang"
    check_span(span, record)


# -- DSPy's own client (lm15), the default engine -----------------------------------------


def plain_lm(route: str, relay: Relay, **settings: Any) -> dspy.LM:
    """An LM the default engine sends through lm15: only ``api_base`` and ``api_key``."""
    return dspy.LM(f"{route}/{MODEL}", api_base=relay.url, api_key="sk-t", cache=False, **settings)


async def closed(lm: dspy.LM, mode: str) -> None:
    if mode == "async":
        await lm.aclose()
    lm.close()


async def stream_predict(lm: dspy.LM, mode: str, stop_early: bool = False) -> list[Any]:
    """``dspy.streamify(Predict)``'s items: the sync program runs in a worker thread
    (``asyncify``, lm15's sync stream), the async one with ``acall`` (its async stream).
    ``stop_early``: the reader stops at the first answer chunk and closes the stream."""
    program = dspy.streamify(
        dspy.Predict("question -> answer"),
        stream_listeners=[dspy.streaming.StreamListener(signature_field_name="answer")],
        is_async_program=mode == "async",
    )
    items: list[Any] = []
    with dspy.context(lm=lm):
        stream = program(question=QUESTION)
        try:
            async for item in stream:
                items.append(item)
                if stop_early and isinstance(item, dspy.streaming.StreamResponse):
                    break
        finally:
            await stream.aclose()
    return items


def summary(items: list[Any]) -> tuple[list[str], dict[str, Any] | None]:
    """What a streamed program gave: its answer chunks and its prediction."""
    chunks = [i.chunk for i in items if isinstance(i, dspy.streaming.StreamResponse)]
    predictions = [i.toDict() for i in items if isinstance(i, dspy.Prediction)]
    return chunks, predictions[-1] if predictions else None


def check_usage(span: Any, usage: dict[str, Any]) -> None:
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["server.address"] == "127.0.0.1"


def lm15_is_wrapped() -> bool:
    from dspy._vendor.lm15.providers import async_base, base, openai_chat

    methods = (
        base.BaseProviderLM.__dict__["_send"],
        base.BaseProviderLM.__dict__["_stream_raw"],
        async_base.AsyncBaseProviderLM.__dict__["_send"],
        async_base.AsyncBaseProviderLM.__dict__["_stream_raw"],
        openai_chat.OpenAIChatLM.__dict__["parse_stream_events"],
    )
    wrapped = [isinstance(m, wrapt.FunctionWrapper) for m in methods]
    assert len(set(wrapped)) == 1, wrapped  # all or none
    return wrapped[0]


@pytest.mark.parametrize(("engine", "mode"), CASES)
@pytest.mark.parametrize("route", ROUTES)
async def test_each_predict_call_through_the_default_engine_gets_one_span_with_the_record(
    route: str,
    engine: str,
    mode: str,
    otel: Otel,
    span_counter: SpanCounter,
    relay: ShapedRelay,
    no_internal_errors: None,
) -> None:
    """``dspy.LM("openai/..." or "hosted_vllm/...", api_base=..., api_key=...)`` under the
    default ``engine="auto"`` is sent by lm15 (no SDK headers on the wire), and each
    ``Predict`` call is one request and one span of ours, ended before the call returns,
    with the record of that request's answer (the simulator's stats, replayed), its usage
    and finish reason. SGLang's shape answers with no stats: its details need
    ``return_spec_tokens_details``, and an LM with ``extra_body`` is sent to LiteLLM
    (covered above). DSPy's request, headers and prediction are the same as without
    instrumentation."""
    relay.shape(engine, seed_for("lm15", route, engine, mode))
    bare_lm = plain_lm(route, relay)
    bare = await predict(bare_lm, mode)
    assert otel.spans() == []

    otel.instrument()
    lm = plain_lm(route, relay)
    seen = await predict(lm, mode)
    assert seen.toDict() == bare.toDict() == {"answer": ANSWER}
    (span,) = otel.our_spans()
    assert len(relay.requests) == 2
    assert not sent_by_the_openai_sdk(relay, 1)
    assert relay.bodies()[1] == relay.bodies()[0]
    assert relay.requests[1].headers == relay.requests[0].headers
    body = relay.replay(1)
    record = record_from_json(body)
    assert (record is None) == (engine in ("sglang", "none"))
    check_span(span, record)
    check_usage(span, body["usage"])
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {expected_outcome(record): 1}
    await closed(bare_lm, mode)
    await closed(lm, mode)


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "llamacpp"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("route", ROUTES)
async def test_a_streamed_predict_call_through_the_default_engine_gets_one_span_with_the_record(
    route: str,
    mode: str,
    engine: str,
    otel: Otel,
    span_counter: SpanCounter,
    relay: ShapedRelay,
    no_internal_errors: None,
) -> None:
    """``dspy.streamify(Predict)`` on the default engine streams through lm15 (sync: its
    ``_stream_raw`` in DSPy's worker thread; async: its async twin): one request, one span
    of ours with the record of the stream's events (replayed from the simulator), read to
    its end. The reader gets the same chunks and prediction as without instrumentation."""
    relay.shape(engine, seed_for("lm15-stream", route, engine, mode))
    bare_lm = plain_lm(route, relay)
    bare = summary(await stream_predict(bare_lm, mode))
    assert bare[1] == {"answer": ANSWER}
    assert otel.spans() == []

    otel.instrument()
    lm = plain_lm(route, relay)
    assert summary(await stream_predict(lm, mode)) == bare
    (span,) = otel.our_spans()
    assert len(relay.requests) == 2
    assert relay.bodies()[1] == relay.bodies()[0]
    assert relay.bodies()[1]["stream"] is True
    assert not sent_by_the_openai_sdk(relay, 1)
    events = relay.replay(1)
    record = record_from_json(events)
    assert record is not None and record.engine == {"trtllm": "tensorrt_llm"}.get(engine, engine)
    check_span(span, record)
    check_usage(span, events[-1]["usage"])
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {expected_outcome(record): 1}
    await closed(bare_lm, mode)
    await closed(lm, mode)


def lm15_request() -> Any:
    return dspy.lm15.Request(model=MODEL, messages=(dspy.lm15.Message.user(QUESTION),))


@pytest.mark.parametrize("how", ["closed", "dropped"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_stream_read_in_part_then_closed_or_dropped_ends_its_span_not_read_to_end(
    mode: str,
    how: str,
    otel: Otel,
    span_counter: SpanCounter,
    relay: ShapedRelay,
    no_internal_errors: None,
) -> None:
    """The default engine streams with lm15's provider (``LM15Engine.stream`` →
    ``provider.stream`` → ``coalesce_stream(_stream_raw(...))``, in
    ``dspy/clients/engines/lm15_engine.py`` and ``_vendor/lm15/providers/base.py``); here
    DSPy's vendored ``dspy.lm15.OpenAIChatLM`` / ``AsyncOpenAIChatLM`` stream is read up
    to its first text delta, then closed (``close``/``aclose``, which
    ``coalesce_stream`` passes on: the span ends at once) or dropped (garbage collected:
    it ends on the finalizer's thread). Either way the one span ends, status unset,
    marked not read to end (the engine's stats come at the stream's end)."""
    relay.shape("vllm", seed_for("lm15-part", mode, how))
    otel.instrument()
    if mode == "sync":
        client: Any = dspy.lm15.OpenAIChatLM(api_key="sk-t", base_url=relay.url)
        events = client.stream(lm15_request())
        assert any(event.type == "delta" for event in events)  # stops at the first
        if how == "closed":
            events.close()
            assert span_counter.open == 0
        del events
    else:
        client = dspy.lm15.AsyncOpenAIChatLM(api_key="sk-t", base_url=relay.url)
        events = client.stream(lm15_request())
        async for event in events:
            if event.type == "delta":
                break
        if how == "closed":
            await events.aclose()
            assert span_counter.open == 0
        del events
    gc.collect()
    assert await span_counter.open_after_async(10) == 0
    (span,) = otel.our_spans()
    attrs = dict(span.attributes or {})
    assert len(relay.requests) == 1
    assert span.status.status_code is StatusCode.UNSET
    assert attrs["spec_decode.read_to_end"] is False
    assert attrs["spec_decode.outcome"] == "not_read_to_end"
    assert otel.requests_by_outcome() == {"not_read_to_end": 1}
    if mode == "async":
        await client.aclose()
    else:
        client.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_error_status_from_the_server_ends_the_span_with_lm15s_error(
    mode: str, otel: Otel, span_counter: SpanCounter, relay: ShapedRelay, no_internal_errors: None
) -> None:
    """The server answers 500 (``x-sim-fault: http-500``), ``num_retries=0``: DSPy raises,
    and the one span of the request ends with status error and ``error.type`` the class
    lm15 raises for that status (``map_http_error``: ``ServerError``, the cause of DSPy's
    ``LMServerError``)."""
    relay.shape("vllm", seed_for("lm15-500", mode), **{"x-sim-fault": "http-500"})
    otel.instrument()
    lm = plain_lm("openai", relay, num_retries=0)
    with pytest.raises(Exception, match="Internal server error") as raised:
        await predict(lm, mode)
    assert type(raised.value.__cause__).__qualname__ == "ServerError"  # lm15's, DSPy's cause
    assert len(relay.requests) == 1
    (span,) = otel.our_spans()
    attrs = dict(span.attributes or {})
    assert span.status.status_code is StatusCode.ERROR
    assert attrs["error.type"] == "ServerError"
    assert attrs["spec_decode.outcome"] == "error"
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {"error": 1}
    await closed(lm, mode)


@pytest.mark.parametrize(
    ("status", "code", "lm15_class"),
    [
        (400, "context_length_exceeded", "ContextLengthError"),
        (429, "insufficient_quota", "BillingError"),
    ],
)
@pytest.mark.parametrize("padding", [0, 5000])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_error_status_is_typed_by_its_body_as_lm15_types_it(
    mode: str,
    padding: int,
    status: int,
    code: str,
    lm15_class: str,
    otel: Otel,
    span_counter: SpanCounter,
    relay: ShapedRelay,
    no_internal_errors: None,
) -> None:
    """An error answer in OpenAI's envelope (``{"error": {"message", "type", "code"}}``, as
    OpenAI and the gateways in front of engines send it): lm15's ``_http_error``
    (``dspy/_vendor/lm15/providers/base.py``, DSPy 3.4.1) raises what the provider's
    ``normalize_error`` makes of the status and body, and ``OpenAIChatLM`` borrows
    ``OpenAILM.normalize_error`` (``providers/openai.py``), which types the error by its
    code: ``ContextLengthError`` where the status alone says ``InvalidRequestError``,
    ``BillingError`` where it says ``RateLimitError``. The span's ``error.type`` is the
    class DSPy's error is caused by, not the status's. Also with a message of 5,000
    characters: the body was cut to 4 KiB before ``normalize_error``, whose ``json.loads``
    then failed, and the span said the status's class while lm15 raised the code's."""
    relay.shape("vllm", seed_for("lm15-typed", str(status), mode))
    message = f"refused: {code}" + "." * padding
    relay.error_answer = (
        status,
        {"error": {"message": message, "type": "invalid_request_error", "code": code}},
    )
    otel.instrument()
    lm = plain_lm("openai", relay, num_retries=0)
    with pytest.raises(Exception, match="refused") as raised:
        await predict(lm, mode)
    assert type(raised.value.__cause__).__qualname__ == lm15_class  # lm15's, DSPy's cause
    (span,) = otel.our_spans()
    attrs = dict(span.attributes or {})
    assert span.status.status_code is StatusCode.ERROR
    assert attrs["error.type"] == lm15_class
    assert attrs["spec_decode.outcome"] == "error"
    assert span_counter.open == 0
    await closed(lm, mode)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_error_event_in_a_stream_ends_the_span_with_the_error_raised_for_it(
    mode: str, otel: Otel, span_counter: SpanCounter, relay: ShapedRelay, no_internal_errors: None
) -> None:
    """A stream whose second event is an error event (``{"error": {...}}``):
    ``OpenAIChatLM.parse_stream_events`` yields a ``StreamErrorEvent`` and DSPy raises the
    class ``error_class_for_code`` gives its code (``stream_guard.error_from_event``:
    ``ProviderError`` for a code lm15 does not map, which DSPy's reader gets as
    ``LMProviderError``); the span ends with status error and that class as
    ``error.type``."""
    relay.shape("vllm", seed_for("lm15-error-event", mode))
    relay.error_event = {"error": {"message": "overloaded", "type": "server_error", "code": 503}}
    otel.instrument()
    lm = plain_lm("openai", relay, num_retries=0)
    with pytest.raises(Exception, match="overloaded") as raised:
        await stream_predict(lm, mode)
    assert await span_counter.open_after_async(10) == 0
    assert len(relay.requests) == 1
    (span,) = otel.our_spans()
    attrs = dict(span.attributes or {})
    assert span.status.status_code is StatusCode.ERROR
    assert type(raised.value).__qualname__ == "LMProviderError"  # DSPy's for ProviderError
    assert attrs["error.type"] == "ProviderError"
    assert attrs["spec_decode.outcome"] == "error"
    assert otel.requests_by_outcome() == {"error": 1}
    await closed(lm, mode)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_uninstrument_unwraps_lm15_and_its_calls_get_no_span(
    mode: str, otel: Otel, relay: ShapedRelay, no_internal_errors: None
) -> None:
    """``uninstrument()`` puts lm15's methods back: a default-engine call, plain or
    streamed, then makes no span and no metric point; instrumenting again wraps them."""
    relay.shape("vllm", seed_for("lm15-off", mode))
    otel.instrument()
    assert lm15_is_wrapped()
    otel.uninstrument()
    assert not lm15_is_wrapped()
    lm = plain_lm("openai", relay)
    assert (await predict(lm, mode)).answer == ANSWER
    assert summary(await stream_predict(lm, mode))[1] == {"answer": ANSWER}
    assert len(relay.requests) == 2
    assert otel.spans() == []
    assert otel.requests_by_outcome() == {}
    otel.instrument()
    assert lm15_is_wrapped()
    assert (await predict(lm, mode)).answer == ANSWER
    assert len(otel.our_spans()) == 1
    await closed(lm, mode)


async def test_a_wrapper_of_ours_left_inside_anothers_records_nothing_once_instrumented_again(
    otel: Otel, relay: ShapedRelay, no_internal_errors: None
) -> None:
    """Another library wraps lm15's ``_send`` over ours; ``uninstrument()`` then leaves
    ours inside theirs (putting back the original would drop their wrapper), and
    instrumenting again wraps the method anew: the call still gets one span and one metric
    point, not two."""
    from dspy._vendor.lm15.providers import base

    pristine = base.BaseProviderLM.__dict__["_send"]
    relay.shape("vllm", seed_for("lm15-theirs"))
    try:
        otel.instrument()
        wrapt.wrap_function_wrapper(
            base.BaseProviderLM, "_send", lambda wrapped, instance, args, kw: wrapped(*args, **kw)
        )
        otel.uninstrument()
        assert isinstance(base.BaseProviderLM.__dict__["_send"], wrapt.FunctionWrapper)  # theirs
        otel.instrument()
        lm = plain_lm("openai", relay)
        assert (await predict(lm, "sync")).answer == ANSWER
        (span,) = otel.our_spans()
        record = record_from_json(relay.replay(0))
        check_span(span, record)
        assert otel.requests_by_outcome() == {expected_outcome(record): 1}
        lm.close()
    finally:
        otel.uninstrument()
        base.BaseProviderLM._send = pristine  # type: ignore[method-assign]
