"""LiteLLM (the real ``litellm`` package, 1.110) against the simulator over real HTTP.

LiteLLM's ``hosted_vllm/`` chat route posts with its own HTTP handler, not the openai SDK;
its ``openai/``, ``custom_openai/``, ``llamafile/`` and ``lm_studio/`` routes, and every
text completion, go through the SDK (checked here: the span of an SDK-routed call is the
openai wrapper's, the others' is the LiteLLM callback's). Whatever the route, each call
must end with exactly one span and one set of metric points, whose ``spec_decode.*``
equal ``record_from_json`` of the same seeded response fetched again without any
instrumentation (the ``x-sim-seed`` header makes the sample depend on the seed alone).

Where LiteLLM itself drops the stats (a stream carried by its own handler rebuilds every
chunk from a fixed set of fields), the tests pin the loss: the raw stream had them, the
span says ``no_stats``.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import subprocess
import sys
import time
import warnings
import weakref
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import httpx2
import litellm
import pytest
import pytest_asyncio
from framework_relay import Relay
from instrumentation_helpers import (
    ENGINES,
    MESSAGES,
    MODEL,
    OPERATION,
    SPEC_DECODE_METRICS,
    Otel,
    expected_outcome,
    expected_span_attributes,
    raw_payload,
    request_kwargs,
    server_of,
    spec_decode_attributes,
)
from litellm.integrations.custom_logger import CustomLogger
from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import SpanKind, StatusCode

import spec_decode_otel
from spec_decode_otel._logging import _said_once
from spec_decode_otel.integrations.litellm import SpecDecodeLiteLLMCallback
from spec_decode_otel.payloads import parse_payloads
from spec_decode_otel.telemetry import SCOPE_NAME

#: LiteLLM providers that reach an OpenAI-compatible server (LiteLLM 1.110 has no
#: ``sglang/`` provider, and ``openai_like/`` serves embeddings only).
PROVIDERS = ("hosted_vllm", "openai", "custom_openai", "llamafile", "lm_studio")
#: Calls whose request LiteLLM sends with its own HTTP handler (the rest use the SDK).
OWN_HANDLER = {("hosted_vllm", "chat")}
#: Providers whose text completions LiteLLM sends to the chat endpoint.
TEXT_AS_CHAT = {"custom_openai", "lm_studio"}
#: Seconds to wait for LiteLLM's logging (a thread pool for sync calls, a task for async).
SETTLE = 15.0


def seed_for(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode()) % 100_000 + 1


@pytest.fixture(autouse=True)
def litellm_callbacks() -> Iterator[None]:
    """LiteLLM's callback lists as they were before the test, after it."""
    names = ("callbacks", "success_callback", "failure_callback", "input_callback")
    hidden = ("_async_success_callback", "_async_failure_callback", "_async_input_callback")
    saved = {name: list(getattr(litellm, name)) for name in (*names, *hidden)}
    yield
    for name, value in saved.items():
        getattr(litellm, name)[:] = value


#: LiteLLM caches its HTTP clients per event loop: one loop for the whole module keeps it
#: from piling up clients of closed loops (whose sockets then leak when collected).
#: LiteLLM 1.110 also leaves connections open (an async text-completion stream's, its
#: aiohttp connectors'; the same with this package not instrumenting): the warnings their
#: socket, transport, connector and session give when collected are let through here,
#: and no other unraisable one.
LITELLM_LEAKS = (
    "<socket.socket",
    "<function _SelectorTransport.__del__",
    "<function BaseConnector.__del__",
    "<function ClientSession.__del__",
)
pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    *(
        pytest.mark.filterwarnings(
            f"ignore:Exception ignored in. {leak}:pytest.PytestUnraisableExceptionWarning"
        )
        for leak in LITELLM_LEAKS
    ),
    # the same leaks when aiohttp warns directly rather than from a finalizer
    pytest.mark.filterwarnings("ignore:Unclosed connector:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Unclosed client session:ResourceWarning"),
]


@pytest.fixture(autouse=True, scope="module")
def collect_litellm_leaks() -> Iterator[None]:
    """Collect what LiteLLM leaked here, under this module's filters, so that its
    finalizers' warnings never land in a later module's test."""
    yield
    close_connections_of_closed_loops()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def close_connections_of_closed_loops() -> None:
    """Close the sockets of connections whose event loop is closed.

    LiteLLM 1.110.2 runs each attempt of a sync ``completion(..., fallbacks=[...])`` on an
    event loop it makes and closes (``run_async_function``, asyncify.py) and keeps the
    aiohttp connections opened there; closed loops can no longer close them, and their
    sockets warn whenever they are finally collected, in whichever later test that is.
    """
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.BaseTransport):
            loop, sock = getattr(obj, "_loop", None), getattr(obj, "_sock", None)
            if loop is not None and loop.is_closed() and sock is not None:
                sock.close()
                obj._sock = None  # type: ignore[attr-defined]  # its __del__ warns otherwise


@pytest_asyncio.fixture(scope="module", loop_scope="module", autouse=True)
async def litellm_clients() -> AsyncIterator[None]:
    """At the end, close every client LiteLLM cached (sync and async) on the loop they
    belong to, and drop them."""
    yield
    await close_litellm_async_clients()
    cache = litellm.in_memory_llm_clients_cache
    for client in list(cache.cache_dict.values()):
        close = getattr(client, "aclose", None) or getattr(client, "close", None)
        if callable(close):
            result = close()
            if inspect.isawaitable(result):
                await result
    cache.flush_cache()


def litellm_kwargs(provider: str, sdk_kwargs: dict[str, Any], base_url: str) -> dict[str, Any]:
    """The same request through LiteLLM: its provider prefix, the simulator as api_base."""
    return {**sdk_kwargs, "model": f"{provider}/{MODEL}", "api_base": base_url, "api_key": "sk-t"}


async def call(api: str, mode: str, kwargs: dict[str, Any]) -> list[Any]:
    """One LiteLLM call; the response, or every chunk of a fully read stream."""
    stream = kwargs.get("stream") is True
    if api == "chat":
        run = litellm.acompletion if mode == "async" else litellm.completion
    else:
        run = litellm.atext_completion if mode == "async" else litellm.text_completion
    result = run(**kwargs)
    if mode == "async":
        result = await result
        return [c async for c in result] if stream else [result]
    return list(result) if stream else [result]


async def settled_spans(otel: Otel, expected: int = 1) -> list[Any]:
    """Our spans once LiteLLM's logging has run (it reports a call after returning it)."""
    deadline = time.monotonic() + SETTLE
    while len(otel.our_spans()) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)  # nothing more may come: a second record would show now
    return otel.our_spans()


def check_metric_points(otel: Otel, record: Any, attrs: dict[str, Any]) -> None:
    """One call's spec-decode metric points, written out from the record."""
    metrics = otel.metrics()
    if record is None:
        assert not [n for n in SPEC_DECODE_METRICS if otel.points(metrics, n)]
        return
    series = {**attrs, "spec_decode.engine": record.engine}
    if record.num_spec_tokens is not None:
        series["spec_decode.num_spec_tokens"] = record.num_spec_tokens
    for name, value in (
        ("spec_decode.acceptance_length", record.mean_acceptance_length),
        ("spec_decode.draft_acceptance_rate", record.draft_acceptance_rate),
    ):
        points = otel.points(metrics, name)
        if value is None:
            assert not points, name
            continue
        assert [(dict(p.attributes), p.count, p.sum) for p in points] == [
            (series, 1, pytest.approx(value))
        ]
    for name, value in (
        ("spec_decode.draft_tokens", record.num_draft_tokens),
        ("spec_decode.accepted_draft_tokens", record.num_accepted_draft_tokens),
    ):
        points = otel.points(metrics, name)
        assert [(dict(p.attributes), p.value) for p in points] == (
            [] if value is None else [(series, value)]
        )
    steps = {
        p.attributes["spec_decode.accepted"]: p.value
        for p in otel.points(metrics, "spec_decode.verify_steps")
    }
    assert steps == (record.acceptance_histogram or {})


def expected_payload(base_url: str, span: Any, sdk_kwargs: dict[str, Any]) -> Any:
    """The server's response to the same seeded request, from the endpoint the call used
    (LiteLLM answers some text completions through the chat endpoint)."""
    operation = span.attributes["gen_ai.operation.name"]
    api = "chat" if operation == "chat" else "completions"
    body = dict(sdk_kwargs)
    if api == "chat" and "prompt" in body:
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    return raw_payload(base_url, api, body)


def check_span(span: Any, base_url: str, record: Any, operation: str) -> None:
    attrs = dict(span.attributes)
    host, port = server_of(base_url)
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    assert span.name == f"{operation} {MODEL}"
    assert attrs["gen_ai.operation.name"] == operation
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.model"] == MODEL
    assert (attrs["server.address"], attrs["server.port"]) == (host, port)
    assert spec_decode_attributes(attrs) == (
        {} if record is None else expected_span_attributes(record)
    )
    assert attrs["spec_decode.outcome"] == expected_outcome(record)
    assert span.end_time >= span.start_time


# -- every route, every call kind -------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_each_call_has_one_span_and_the_record_of_its_response(
    provider: str, api: str, mode: str, stream: bool, otel: Otel, simulator_url: str
) -> None:
    """``SpecDecodeInstrumentor().instrument()`` alone covers LiteLLM: the SDK routes are
    the openai wrapper's (streams included, read from the wire), LiteLLM's own handler's
    are the callback's. One span, one ``spec_decode.requests`` point, per call."""
    otel.instrument()
    sdk_kwargs = request_kwargs("vllm", api, stream, seed_for(provider, api, mode, str(stream)))
    results = await call(api, mode, litellm_kwargs(provider, sdk_kwargs, simulator_url))
    assert results

    (span,) = await settled_spans(otel)
    operation = "chat" if api == "chat" or provider in TEXT_AS_CHAT else "text_completion"
    payload = expected_payload(simulator_url, span, sdk_kwargs)
    record = spec_decode_otel.record_from_json(payload)
    assert record is not None and record.engine == "vllm"
    if (provider, api) in OWN_HANDLER and stream:
        record = None  # LiteLLM rebuilt the chunks: the usage chunk's metrics are gone
    check_span(span, simulator_url, record, operation)
    assert otel.requests_by_outcome() == {expected_outcome(record): 1}
    host, port = server_of(simulator_url)
    check_metric_points(
        otel,
        record,
        {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": MODEL,
            "gen_ai.response.model": MODEL,
            "server.address": host,
            "server.port": port,
        },
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("engine", ENGINES)
async def test_litellm_own_handler_gives_every_engine_record(
    engine: str, mode: str, otel: Otel, simulator_url: str
) -> None:
    """``hosted_vllm/`` chat, non-streaming, for every engine shape: root fields
    (``metrics``, ``sglext``, ``timings``) survive in LiteLLM's response, per-choice ones
    (pre-merge vLLM, TensorRT-LLM) come back from ``provider_specific_fields``."""
    otel.instrument(genai_metrics=True)
    sdk_kwargs = request_kwargs(engine, "chat", False, seed_for(engine, mode))
    results = await call("chat", mode, litellm_kwargs("hosted_vllm", sdk_kwargs, simulator_url))
    payload = raw_payload(simulator_url, "chat", sdk_kwargs)
    record = spec_decode_otel.record_from_json(payload)
    assert (record is None) == (engine == "none")

    (span,) = await settled_spans(otel)
    check_span(span, simulator_url, record, "chat")
    usage = payload["usage"]
    assert span.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert span.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert span.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    # the user got LiteLLM's usual response, with the same content the server sent
    assert results[0].choices[0].message.content == payload["choices"][0]["message"]["content"]
    duration = otel.points(otel.metrics(), "gen_ai.client.operation.duration")
    # counted from LiteLLM's start of the call, like the span
    assert len(duration) == 1
    assert duration[0].sum == pytest.approx((span.end_time - span.start_time) / 1e9, abs=0.05)
    host, port = server_of(simulator_url)
    check_metric_points(
        otel,
        record,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": MODEL,
            "gen_ai.response.model": MODEL,
            "server.address": host,
            "server.port": port,
        },
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("engine", ["vllm", "vllm-premerge", "sglang", "trtllm", "llamacpp"])
async def test_own_handler_streams_lose_the_stats_and_say_so(
    engine: str, mode: str, otel: Otel, simulator_url: str
) -> None:
    """LiteLLM 1.110's own handler rebuilds each stream chunk from a fixed set of fields
    (``OpenAIChatCompletionStreamingHandler.chunk_parser``: id, model, choices' delta and
    finish reason, usage): root ``metrics``/``sglext``/``timings`` and per-choice stats
    never reach a callback. The span says ``no_stats``; no spec-decode metric is made
    up; README's LiteLLM section and a one-time warning say so."""
    otel.instrument()
    sdk_kwargs = request_kwargs(engine, "chat", True, seed_for("stream", engine, mode))
    sdk_kwargs["stream_options"] = {"include_usage": True}
    chunks = await call("chat", mode, litellm_kwargs("hosted_vllm", sdk_kwargs, simulator_url))
    assert chunks
    assert spec_decode_otel.record_from_json(raw_payload(simulator_url, "chat", sdk_kwargs))

    (span,) = await settled_spans(otel)
    check_span(span, simulator_url, None, "chat")
    assert span.attributes["gen_ai.usage.output_tokens"] > 0  # include_usage: the server's
    assert otel.requests_by_outcome() == {"no_stats": 1}
    check_metric_points(otel, None, {})
    # and the log says it once, with the way out (warn_once: process-wide)
    assert "litellm-stream" in _said_once


# -- the Responses API -------------------------------------------------------------------

#: Providers whose ``litellm.responses()`` LiteLLM 1.110.2 posts to the server's
#: ``/v1/responses`` with its own handler (``HostedVLLMResponsesAPIConfig``,
#: ``OpenAIResponsesAPIConfig``: litellm/llms/{hosted_vllm,openai}/responses/
#: transformation.py); the others go through LiteLLM's bridge to chat completions, sent
#: through the openai SDK.
RESPONSES_NATIVE = ("hosted_vllm", "openai")


async def call_responses(mode: str, kwargs: dict[str, Any]) -> list[Any]:
    """One ``litellm.responses`` / ``aresponses`` call; the response, or every event."""
    stream = kwargs.get("stream") is True
    if mode == "async":
        result = await litellm.aresponses(**kwargs)
        return [e async for e in result] if stream else [result]
    result = litellm.responses(**kwargs)
    return list(result) if stream else [result]


def raw_responses(base_url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """The same request through plain httpx: the body, or the list of stream events."""
    response = httpx2.post(base_url + "/responses", json=body, headers=headers, timeout=30)
    response.raise_for_status()
    return parse_payloads(response.text) if body["stream"] else response.json()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_responses_api_calls_have_one_span_each(
    provider: str, engine: str, mode: str, stream: bool, otel: Otel, simulator_url: str
) -> None:
    """``litellm.responses()`` / ``aresponses()``: one span per call, operation ``chat``
    as the openai wrapper names a Responses call, whichever way LiteLLM sends it.

    Native routes: LiteLLM reports the call (call type ``responses``/``aresponses``) with
    the completed response, streamed or not, and keeps the server's root fields on it.
    Neither engine puts stats there: vLLM 0.34.0's Responses ``metrics`` are timing fields
    only, and llama.cpp's ``timings`` ride on the ``response.completed`` event itself,
    which LiteLLM's ``ResponseCompletedEvent`` does not keep (the openai SDK's stream gives
    that record: ``test_responses_api.py``). So the span says ``no_stats``, with LiteLLM's
    usage and finish reason. Bridged routes are chat completions through the SDK, recorded
    by the wrapper from the wire; the callback skips the outer call."""
    otel.instrument()
    seed = seed_for("responses", provider, engine, mode, str(stream))
    headers = {"x-spec-decode-engine": engine, "x-sim-seed": str(seed)}
    body = {"model": MODEL, "input": "Name three stripes.", "max_output_tokens": 24}
    kwargs = {**litellm_kwargs(provider, {**body, "stream": stream}, simulator_url)}
    results = await call_responses(mode, {**kwargs, "extra_headers": headers})
    assert results

    (span,) = await settled_spans(otel)
    attrs = dict(span.attributes)
    assert span.name == f"chat {MODEL}" and span.kind is SpanKind.CLIENT
    assert attrs["gen_ai.operation.name"] == "chat"
    assert (attrs["server.address"], attrs["server.port"]) == server_of(simulator_url)
    if provider not in RESPONSES_NATIVE:
        assert attrs["spec_decode.outcome"] in ("recorded", "partial")
        assert attrs["spec_decode.engine"] == engine
        return
    payload = raw_responses(simulator_url, {**body, "stream": stream}, headers)
    completed = payload[-1]["response"] if stream else payload
    # what the SDK reads from the wire, and what LiteLLM keeps (the completed response)
    sdk_record = spec_decode_otel.record_from_json(payload)
    assert (sdk_record is not None) == (engine == "llamacpp" and stream)
    assert spec_decode_otel.record_from_json(completed) is None
    check_span(span, simulator_url, None, "chat")
    assert attrs["gen_ai.usage.input_tokens"] == completed["usage"]["input_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == completed["usage"]["output_tokens"]
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert otel.requests_by_outcome() == {"no_stats": 1}
    check_metric_points(otel, None, {})


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("provider", ["hosted_vllm", "custom_openai"])
async def test_responses_api_calls_with_the_callback_alone_have_one_span_each(
    provider: str, mode: str, stream: bool, otel: Otel, simulator_url: str
) -> None:
    """Without the openai wrapper, a bridged call (a chat completion LiteLLM makes for
    ``responses()``) is still one call to the callback: it is recorded from the chat body
    LiteLLM kept when not streamed, and, like every stream the callback alone sees, gets
    ``no_stats`` when streamed."""
    callback = SpecDecodeLiteLLMCallback(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
    )
    litellm.callbacks.append(callback)
    seed = seed_for("responses-alone", provider, mode, str(stream))
    body = {"model": MODEL, "input": "Name three stripes.", "max_output_tokens": 24}
    kwargs = litellm_kwargs(provider, {**body, "stream": stream}, simulator_url)
    try:
        assert await call_responses(mode, {**kwargs, "extra_headers": {"x-sim-seed": str(seed)}})
        (span,) = await settled_spans(otel)
    finally:
        callback.unregister()
    recorded = provider not in RESPONSES_NATIVE and not stream
    assert span.attributes["spec_decode.outcome"] == ("recorded" if recorded else "no_stats")
    assert otel.requests_by_outcome() == {span.attributes["spec_decode.outcome"]: 1}


# -- Anthropic's Messages API ------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("provider", ["hosted_vllm", "custom_openai", "lm_studio"])
async def test_anthropic_messages_calls_have_one_span_with_the_chat_bodys_record(
    provider: str, mode: str, stream: bool, otel: Otel, simulator_url: str
) -> None:
    """``litellm.anthropic.messages.create()`` / ``acreate()`` (what the proxy's
    ``/v1/messages`` runs, e.g. for Claude Code in front of a self-hosted engine):
    LiteLLM 1.110.2 answers it from a chat completion to the server
    (litellm/llms/anthropic/experimental_pass_through/), reported to callbacks as call
    type ``anthropic_messages`` with the chat body it logged. ``hosted_vllm/`` posts that
    with its own handler: the body's record when not streamed, ``no_stats`` when
    streamed (the rebuilt chunks drop the stats, as for its chat streams). The other
    routes send it through the openai SDK, whose wrapper reads the wire (streams too),
    and the callback skips the call. Ground truth: the server's answer to the same
    seeded chat request."""
    otel.instrument()
    seed = seed_for("anthropic", provider, mode, str(stream))
    headers = {"x-spec-decode-engine": "vllm", "x-sim-seed": str(seed)}
    kwargs = {
        **litellm_kwargs(provider, {"messages": MESSAGES, "max_tokens": 24}, simulator_url),
        "stream": stream,
        "extra_headers": headers,
    }
    if mode == "async":
        result = await litellm.anthropic.messages.acreate(**kwargs)
        events = [e async for e in result] if stream else [result]
    else:
        result = litellm.anthropic.messages.create(**kwargs)
        events = list(result) if stream else [result]
    assert events

    (span,) = await settled_spans(otel)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 24, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    record = spec_decode_otel.record_from_json(
        raw_payload(simulator_url, "chat", {**body, "extra_headers": headers})
    )
    assert record is not None
    if provider == "hosted_vllm" and stream:
        record = None
    assert span.attributes["gen_ai.operation.name"] == "chat"
    assert span.attributes["spec_decode.outcome"] == expected_outcome(record)
    assert spec_decode_attributes(dict(span.attributes)) == (
        {} if record is None else expected_span_attributes(record)
    )
    assert otel.requests_by_outcome() == {expected_outcome(record): 1}


# -- the callback alone ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("provider", "api"),
    [("hosted_vllm", "chat"), ("openai", "chat"), ("hosted_vllm", "completions"),
     ("lm_studio", "completions")],
)  # fmt: skip
@pytest.mark.parametrize("engine", ["vllm", "vllm-premerge", "sglang", "trtllm", "llamacpp"])
async def test_callback_alone_records_every_route_from_what_litellm_keeps(
    engine: str, provider: str, api: str, mode: str, otel: Otel, simulator_url: str
) -> None:
    """Without the openai wrapper, ``litellm.callbacks.append(SpecDecodeLiteLLMCallback())``
    records SDK routes too, from LiteLLM's ``original_response`` (the body's JSON text or
    the SDK's object): ``lm_studio/`` answers a text completion through the chat endpoint
    and its own response object keeps none of the chat body's root fields."""
    callback = SpecDecodeLiteLLMCallback(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
    )
    litellm.callbacks.append(callback)
    try:
        sdk_kwargs = request_kwargs(engine, api, False, seed_for("alone", engine, provider, api))
        await call(api, mode, litellm_kwargs(provider, sdk_kwargs, simulator_url))
        (span,) = await settled_spans(otel)
    finally:
        callback.unregister()
    operation = span.attributes["gen_ai.operation.name"]
    assert operation == OPERATION[api]  # LiteLLM's call type, whatever endpoint it used
    record = spec_decode_otel.record_from_json(expected_payload(simulator_url, span, sdk_kwargs))
    assert record is not None
    check_span(span, simulator_url, record, operation)
    assert otel.requests_by_outcome() == {expected_outcome(record): 1}


async def test_two_callbacks_still_give_one_record(otel: Otel, simulator_url: str) -> None:
    """The instrumentor's callback plus one added by hand (and LiteLLM's sync and async
    success events for one call): one span, one count."""
    otel.instrument()
    litellm.callbacks.append(
        SpecDecodeLiteLLMCallback(
            tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
        )
    )
    registered = [c for c in litellm.callbacks if isinstance(c, SpecDecodeLiteLLMCallback)]
    assert len(registered) == 2
    sdk_kwargs = request_kwargs("vllm", "chat", False, 41)
    await call("chat", "sync", litellm_kwargs("hosted_vllm", sdk_kwargs, simulator_url))
    await call("chat", "async", litellm_kwargs("hosted_vllm", sdk_kwargs, simulator_url))
    spans = await settled_spans(otel, 2)
    assert len(spans) == 2
    assert otel.requests_by_outcome() == {"recorded": 2}


@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
async def test_a_text_stream_read_as_the_proxy_reads_it_has_one_span(
    provider: str, otel: Otel, simulator_url: str
) -> None:
    """The LiteLLM 1.110.2 proxy reads a streamed text completion in three contexts that
    share no context variable: ``atext_completion`` starts the call in a worker thread
    (main.py), the proxy fetches the first chunk in a task of its own
    (``_buffer_first_chunk_honoring_disconnect``, proxy/common_request_processing.py,
    which sends the SDK request) and Starlette's response task reads the rest. Read so
    here, two streams at once: one span each, the openai wrapper's, with its stream's
    record (the callback knows the call by the response id of the stream the wrapper read).
    """
    otel.instrument()
    engines = ("vllm", "sglang")
    requests = [
        request_kwargs(engine, "completions", True, seed_for("proxy-read", engine))
        for engine in engines
    ]
    streams = [
        await litellm.atext_completion(**litellm_kwargs(provider, r, simulator_url))
        for r in requests
    ]
    await asyncio.gather(*(asyncio.ensure_future(s.__anext__()) for s in streams))

    async def rest(stream: Any) -> None:
        async for _ in stream:
            pass

    await asyncio.gather(*(asyncio.create_task(rest(s)) for s in streams))

    spans = await settled_spans(otel, 2)
    assert len(spans) == 2
    by_engine = {s.attributes.get("spec_decode.engine"): s for s in spans}
    assert sorted(by_engine, key=str) == sorted(engines)
    for engine, request in zip(engines, requests, strict=True):
        payload = raw_payload(simulator_url, "completions", request)
        record = spec_decode_otel.record_from_json(payload)
        assert record is not None and record.engine == engine
        check_span(by_engine[engine], simulator_url, record, "text_completion")
    counted = otel.points(otel.metrics(), "spec_decode.requests")
    assert sum(p.value for p in counted) == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_span_joins_the_callers_trace_with_its_attributes(
    mode: str, otel: Otel, simulator_url: str
) -> None:
    """Made after the call, the span is still the child of the span current when the call
    started, with the ``spec_decode_otel.attributes`` in force there (allow-listed ones
    on the metrics too), like the openai wrapper's."""
    otel.instrument(metric_attributes=("workload",))
    sdk_kwargs = request_kwargs("vllm", "chat", False, seed_for("parent", mode))
    with (
        otel.tracer.start_as_current_span("agent step") as parent,
        spec_decode_otel.attributes(workload="summaries", tenant="acme"),
    ):
        await call("chat", mode, litellm_kwargs("hosted_vllm", sdk_kwargs, simulator_url))
    (span,) = await settled_spans(otel)
    assert span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id
    assert span.context.trace_id == parent.get_span_context().trace_id
    assert (span.attributes["workload"], span.attributes["tenant"]) == ("summaries", "acme")
    (point,) = otel.points(otel.metrics(), "spec_decode.acceptance_length")
    assert point.attributes["workload"] == "summaries" and "tenant" not in point.attributes


async def test_n_greater_than_one_gives_a_span_without_a_record(
    otel: Otel, simulator_url: str
) -> None:
    otel.instrument()
    sdk_kwargs = request_kwargs("vllm-premerge", "chat", False, 17, n=2)
    results = await call("chat", "sync", litellm_kwargs("hosted_vllm", sdk_kwargs, simulator_url))
    assert len(results[0].choices) == 2
    (span,) = await settled_spans(otel)
    assert spec_decode_attributes(span.attributes) == {}
    assert span.attributes["spec_decode.outcome"] == "multi_sequence"
    assert len(span.attributes["gen_ai.response.finish_reasons"]) == 2
    assert otel.requests_by_outcome() == {"multi_sequence": 1}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
async def test_calls_inside_suppress_instrumentation_get_no_span(
    provider: str, mode: str, otel: Otel, simulator_url: str
) -> None:
    """``suppress_instrumentation()`` switches the LiteLLM callback off for its block as
    it does the openai wrapper, on LiteLLM's own handler (``hosted_vllm/``) and on a
    route through the SDK (``openai/``): LiteLLM reports the call's start in the caller's
    context, and a call not started there is never recorded when LiteLLM reports its end
    (from a thread pool or a task of its own)."""
    from opentelemetry.instrumentation.utils import suppress_instrumentation

    otel.instrument()
    hidden = request_kwargs("vllm", "chat", False, seed_for("suppressed", provider, mode))
    seen = request_kwargs("vllm", "chat", False, seed_for("not suppressed", provider, mode))
    with suppress_instrumentation():
        (response,) = await call("chat", mode, litellm_kwargs(provider, hidden, simulator_url))
    assert response.choices[0].message.content
    await call("chat", mode, litellm_kwargs(provider, seen, simulator_url))

    # LiteLLM reports the two calls' ends in order: a record of the first would be here.
    (span,) = await settled_spans(otel)
    record = spec_decode_otel.record_from_json(expected_payload(simulator_url, span, seen))
    assert record is not None
    assert record != spec_decode_otel.record_from_json(
        expected_payload(simulator_url, span, hidden)
    )
    check_span(span, simulator_url, record, "chat")
    assert otel.requests_by_outcome() == {"recorded": 1}


@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
async def test_with_litellm_opentelemetry_callback_its_span_and_ours(
    provider: str, otel: Otel, simulator_url: str
) -> None:
    """LiteLLM's OpenTelemetry callback makes and ends its ``litellm_request`` span inside
    its own logging handler (``OpenTelemetry._start_primary_span``: start, set_attributes,
    end), where no callback can add to it: with it on, the call has its span and ours,
    ``spec_decode.*`` only on ours, and still one record (README: LiteLLM)."""
    from litellm.integrations.opentelemetry import OpenTelemetry, OpenTelemetryConfig

    otel.instrument()
    theirs = OpenTelemetry(
        config=OpenTelemetryConfig(exporter=otel.exporter, skip_set_global=True),
        tracer_provider=otel.tracer_provider,
    )
    litellm.callbacks.append(theirs)
    sdk_kwargs = request_kwargs("vllm", "chat", False, seed_for("litellm-otel", provider))
    await call("chat", "sync", litellm_kwargs(provider, sdk_kwargs, simulator_url))
    (ours,) = await settled_spans(otel)
    deadline = time.monotonic() + SETTLE
    while not [s for s in otel.spans() if s.name == "litellm_request"] and (
        time.monotonic() < deadline
    ):
        await asyncio.sleep(0.02)
    (litellm_span,) = [s for s in otel.spans() if s.name == "litellm_request"]
    assert litellm_span.instrumentation_scope.name == "litellm"
    theirs_only = [s for s in otel.spans() if s.instrumentation_scope.name != SCOPE_NAME]
    assert not [k for s in theirs_only for k in s.attributes if k.startswith("spec_decode.")]
    assert ours.attributes["spec_decode.outcome"] == "recorded"
    assert otel.requests_by_outcome() == {"recorded": 1}


# -- errors, user-visible behaviour, LiteLLM's own features ----------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
async def test_errors_reach_the_user_unchanged_and_one_error_span(
    provider: str, mode: str, otel: Otel, simulator_url: str
) -> None:
    sdk_kwargs = request_kwargs("vllm", "chat", False, 7)
    sdk_kwargs["extra_headers"]["x-sim-fault"] = "http-500"
    kwargs = {**litellm_kwargs(provider, sdk_kwargs, simulator_url), "num_retries": 0}

    async def attempt() -> BaseException:
        with pytest.raises(litellm.InternalServerError) as info:
            await call("chat", mode, dict(kwargs))
        return info.value

    bare = await attempt()
    otel.instrument()
    seen = await attempt()
    assert type(seen) is type(bare) and seen.status_code == bare.status_code == 500
    assert str(seen) == str(bare)
    (span,) = await settled_spans(otel)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["spec_decode.outcome"] == "error"
    assert span.attributes["error.type"]
    assert otel.requests_by_outcome() == {"error": 1}


class Recorder(CustomLogger):
    """Another user's callback: it must keep getting its events."""

    def __init__(self) -> None:
        super().__init__()
        self.responses: list[Any] = []

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any):  # type: ignore[no-untyped-def]
        self.responses.append(response_obj)

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ):  # type: ignore[no-untyped-def]
        self.responses.append(response_obj)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_cost_tracking_other_callbacks_and_the_response_are_untouched(
    mode: str, otel: Otel, simulator_url: str
) -> None:
    """LiteLLM's cost tracking (``_hidden_params["response_cost"]``,
    ``litellm.completion_cost``) and another callback work as without us, and the user
    gets the same response."""
    pricing = {"input_cost_per_token": 2e-6, "output_cost_per_token": 5e-6}
    recorder = Recorder()  # LiteLLM keeps one logger per class: one for both calls
    litellm.callbacks.append(recorder)

    async def one(seed: int) -> Any:
        sdk_kwargs = request_kwargs("vllm", "chat", False, seed)
        kwargs = {**litellm_kwargs("hosted_vllm", sdk_kwargs, simulator_url), **pricing}
        (response,) = await call("chat", mode, kwargs)
        deadline = time.monotonic() + SETTLE
        while not any(r is response for r in recorder.responses) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return response

    bare = await one(11)
    otel.instrument()
    seen = await one(11)
    (span,) = await settled_spans(otel)
    assert span.attributes["spec_decode.outcome"] == "recorded"

    usage = seen.usage
    cost = usage.prompt_tokens * 2e-6 + usage.completion_tokens * 5e-6
    assert seen._hidden_params["response_cost"] == pytest.approx(cost)
    assert bare._hidden_params["response_cost"] == pytest.approx(cost)
    per_token = {"input_cost_per_token": 2e-6, "output_cost_per_token": 5e-6}
    assert litellm.completion_cost(
        completion_response=seen, custom_cost_per_token=per_token
    ) == pytest.approx(cost)
    assert [id(r) for r in recorder.responses] == [id(bare), id(seen)]
    volatile = {"id", "created"}
    assert seen.model_dump(exclude=volatile) == bare.model_dump(exclude=volatile)
    assert seen.model_extra == bare.model_extra  # vLLM's metrics, as LiteLLM kept them


async def test_uninstrument_removes_the_callback(otel: Otel, simulator_url: str) -> None:
    otel.instrument()
    assert [c for c in litellm.callbacks if isinstance(c, SpecDecodeLiteLLMCallback)]
    otel.uninstrument()
    lists = (litellm.callbacks, litellm.success_callback, litellm._async_success_callback)
    assert not [c for cs in lists for c in cs if isinstance(c, SpecDecodeLiteLLMCallback)]
    sdk_kwargs = request_kwargs("vllm", "chat", False, 5)
    await call("chat", "sync", litellm_kwargs("hosted_vllm", sdk_kwargs, simulator_url))
    await asyncio.sleep(0.5)
    assert otel.our_spans() == []


# -- registration: only when litellm is imported, never imported by us ----------------------

REGISTRATION = """
import sys
from opentelemetry.sdk.trace import TracerProvider
from spec_decode_otel import SpecDecodeInstrumentor
if sys.argv[1] == "absent":
    sys.modules["litellm"] = None  # as if not installed: importing it fails
SpecDecodeInstrumentor().instrument(tracer_provider=TracerProvider())
print("imported" if sys.modules.get("litellm") else "not imported")
if sys.argv[1] == "present":
    import litellm
    from spec_decode_otel.integrations.litellm import SpecDecodeLiteLLMCallback
    print(sum(isinstance(c, SpecDecodeLiteLLMCallback) for c in litellm.callbacks))
"""


@pytest.mark.parametrize("installed", ["present", "absent"])
async def test_instrument_registers_the_callback_only_once_litellm_is_imported(
    installed: str,
) -> None:
    """``SpecDecodeInstrumentor().instrument()`` (hence ``setup()`` and
    ``opentelemetry-instrument``) never imports LiteLLM (about ten seconds here): the
    callback goes in when the application imports it, and without LiteLLM nothing
    happens and nothing fails."""
    done = subprocess.run(
        [sys.executable, "-c", REGISTRATION, installed],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[:2] == ["not", "imported"]
    assert lines[2:] == (["1"] if installed == "present" else [])


@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
async def test_a_text_stream_cut_by_the_server_as_the_proxy_reads_it_has_one_span(
    provider: str, otel: Otel, simulator_url: str
) -> None:
    """A streamed text completion the server cuts mid-way, read as the LiteLLM 1.110.2
    proxy reads it (first chunk in a task of its own, the rest in another; see
    :func:`test_a_text_stream_read_as_the_proxy_reads_it_has_one_span`): one span, the
    openai wrapper's, with error status; the user gets LiteLLM's error.

    LiteLLM reports the failure without the stream's response id: ``CustomStreamWrapper``
    (litellm/litellm_core_utils/streaming_handler.py, ``_dispatch_stream_failure``) hands
    ``Logging.dispatch_attempt_failure_handlers`` only the exception, in a task created
    from the reading task. What both sides see is that exception: LiteLLM's
    ``kwargs["exception"]`` is the very error the SDK stream raised through the openai
    wrapper (``openai.APIConnectionError``, from httpx's ``RemoteProtocolError``), or
    one whose ``__cause__``/``__context__`` chain holds it. Before the fix the callback
    gave the call a second span (and a second ``error`` count)."""
    otel.instrument()
    request = request_kwargs("vllm", "completions", True, seed_for("cut", provider))
    request["extra_headers"]["x-sim-fault"] = "drop-mid-stream"
    stream = await litellm.atext_completion(**litellm_kwargs(provider, request, simulator_url))
    first = await asyncio.ensure_future(stream.__anext__())
    assert first.choices

    async def rest() -> BaseException | None:
        try:
            async for _ in stream:
                pass
        except Exception as error:
            return error
        return None

    error = await asyncio.create_task(rest())
    assert isinstance(error, litellm.APIConnectionError | litellm.InternalServerError), error
    (span,) = await settled_spans(otel)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["spec_decode.outcome"] == "error"
    assert span.attributes["gen_ai.operation.name"] == "text_completion"
    assert otel.requests_by_outcome() == {"error": 1}


async def test_a_noted_stream_error_excuses_one_failed_call_to_its_server() -> None:
    """How the callback tells a failure the openai wrapper recorded (see
    :func:`test_a_text_stream_cut_by_the_server_as_the_proxy_reads_it_has_one_span`):
    LiteLLM 1.110.2 raises its own exception from the SDK's (``raise ... from`` or inside
    ``except``), so the chain is walked along ``__cause__``/``__context__`` to the httpx
    error (httpx2 ``RemoteProtocolError``), whose ``request`` is the failed stream's. It
    excuses one call, to the same server; a chain that loops ends; nothing is kept while
    no LiteLLM call is open; and a note holds neither the error nor its request: once
    nothing else does, both are gone (an error's traceback holds frames and the
    connection they hold)."""
    from spec_decode_otel.integrations import (
        note_openai_stream_error,
        set_open_litellm_calls,
        took_openai_stream_error,
    )

    def raised_from(cause: BaseException) -> BaseException:
        try:
            raise RuntimeError("litellm's") from cause
        except RuntimeError as error:
            return error

    def cut() -> BaseException:
        request = httpx2.Request("POST", "http://127.0.0.1:1/v1/completions")
        return httpx2.RemoteProtocolError("peer closed connection", request=request)

    def unhashable_request() -> BaseException:
        class Hostile:
            def __hash__(self) -> int:
                raise ValueError("no hash")

        error = ConnectionError("odd request")
        error.request = Hostile()  # type: ignore[attr-defined]
        return error

    sdk_error, unnoted, dropped = cut(), cut(), cut()
    set_open_litellm_calls(0)  # whatever an earlier test's dropped LiteLLM stream left open
    note_openai_stream_error(unnoted, "127.0.0.1:1")  # no LiteLLM call open: not kept
    set_open_litellm_calls(1)
    try:
        note_openai_stream_error(sdk_error, "127.0.0.1:1")
        note_openai_stream_error(dropped, "127.0.0.1:1")
        note_openai_stream_error(ConnectionError("no request named"), "127.0.0.1:1")
        note_openai_stream_error(unhashable_request(), "127.0.0.1:1")  # must not raise
    finally:
        set_open_litellm_calls(0)
    request_gone = weakref.ref(dropped.request)
    del dropped
    gc.collect()
    assert request_gone() is None  # the note kept nothing alive
    looped = RuntimeError("loop")
    looped.__context__ = RuntimeError("back")
    looped.__context__.__context__ = looped
    assert not took_openai_stream_error(looped, "127.0.0.1:1")
    assert not took_openai_stream_error(raised_from(unnoted), "127.0.0.1:1")
    assert not took_openai_stream_error(raised_from(sdk_error), "127.0.0.1:2")
    assert not took_openai_stream_error(None, "127.0.0.1:1")
    assert took_openai_stream_error(raised_from(raised_from(sdk_error)), "127.0.0.1:1")
    assert not took_openai_stream_error(sdk_error, "127.0.0.1:1")  # taken


# -- beside openai-v2, GenAI metrics opted in ---------------------------------------------

#: Samplers for the GenAI-metrics cases beside openai-v2: one that keeps every trace, one
#: that drops every trace (the GenAI client metrics do not depend on sampling).
SAMPLERS = {"always-on": ALWAYS_ON, "always-off": ALWAYS_OFF}
GENAI_METRICS = ("gen_ai.client.operation.duration", "gen_ai.client.token.usage")
#: The scope of openai-v2 2.4b0's metrics (it records through opentelemetry-util-genai
#: 1.1b0's handler).
OPENAI_V2_SCOPE = "opentelemetry.util.genai.handler"


class AzureRelay(Relay):
    """The relay, taking Azure OpenAI's chat path
    (``/openai/deployments/{model}/chat/completions?api-version=...``) to the simulator's."""

    def upstream_url(self, path: str) -> str:
        assert "/openai/deployments/" in path and "/chat/completions?" in path, path
        return f"{self.upstream}/chat/completions"


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize(
    "provider, stream",
    [
        ("openai", False),
        ("openai", True),
        ("hosted_vllm", False),
        ("hosted_vllm", True),
        ("azure", False),
    ],
    ids=["openai-json", "openai-sse", "hosted_vllm-json", "hosted_vllm-sse", "azure-json"],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_opted_in_genai_metrics_beside_openai_v2_count_each_litellm_call_once(
    mode: str, provider: str, stream: bool, sampler: str, simulator_url: str
) -> None:
    """With ``genai_metrics`` on beside openai-v2 (opentelemetry-instrumentation-openai-v2
    2.4b0, which wraps the openai SDK's chat ``create``), each LiteLLM chat call's GenAI
    client metrics are counted once, whether the sampler keeps its trace or drops it.

    LiteLLM 1.110.2 sends an ``openai/`` (``custom_openai/``, ...) chat call with
    ``OpenAI.post("/chat/completions", ...)`` (``make_sync_openai_chat_completion_request``
    and its async twin, litellm/llms/openai/openai.py), not ``chat.completions.create``:
    openai-v2 never sees it, so the call's metrics are ours (the openai wrapper's), as
    for ``hosted_vllm/``, which LiteLLM's own HTTP handler sends (the callback's). Its
    ``azure/`` route does call ``chat.completions.with_raw_response.create``
    (litellm/llms/azure/azure.py): openai-v2 records that call, and the openai wrapper,
    finding openai-v2's wrapper on the stack, records none (sampled or not). Azure streams
    are left out: openai-v2 2.4b0 wraps a raw stream's parsed ``Stream``, whose missing
    ``headers`` LiteLLM's Azure handler then raises on, whoever else is installed."""
    otel = Otel(sampler=SAMPLERS[sampler])
    theirs = OpenAIInstrumentor()
    theirs.instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    # A relay per call for Azure: LiteLLM caches its Azure client per endpoint, and the
    # client's ``with_raw_response`` keeps the ``create`` (openai-v2's wrapper, with its
    # providers) it first found.
    relay = AzureRelay(simulator_url) if provider == "azure" else None
    try:
        otel.instrument(genai_metrics=True)
        sdk_kwargs = request_kwargs("vllm", "chat", stream, seed_for("v2", provider, mode))
        kwargs = litellm_kwargs(provider, sdk_kwargs, simulator_url)
        if relay is not None:
            kwargs |= {"api_base": relay.url, "api_version": "2024-10-21"}
        assert await call("chat", mode, kwargs)

        # LiteLLM's own handler rebuilds a stream's chunks without the stats
        outcome = "no_stats" if provider == "hosted_vllm" and stream else "recorded"
        deadline = time.monotonic() + SETTLE
        while not otel.requests_by_outcome() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # nothing more may come: a second record would show now
        assert otel.requests_by_outcome() == {outcome: 1}
        # openai-v2's span and metrics share one scope; its span carries our attributes
        recorder = OPENAI_V2_SCOPE if provider == "azure" else SCOPE_NAME
        if sampler == "always-on":
            (span,) = otel.spans()
            assert span.instrumentation_scope.name == recorder
            assert span.attributes["spec_decode.outcome"] == outcome
        else:
            assert otel.spans() == []
        metrics = otel.metrics()
        counts = {
            name: {
                scope: sum(p.count for p in metric.data.data_points)
                for scope, metric in metrics
                if metric.name == name
            }
            for name in GENAI_METRICS
        }
        assert counts == {
            "gen_ai.client.operation.duration": {recorder: 1},
            "gen_ai.client.token.usage": {recorder: 2},
        }
    finally:
        theirs.uninstrument()
        otel.close()
        if relay is not None:
            relay.close()
