"""Options and scopes: ``instrument_client``, user attributes, the opt-in request changes
(``inject_include_usage``, ``inject_traceparent``, ``request_engine_stats``).

What goes on the wire is captured with an ``httpx`` event hook on the client's own
transport (``http_client=httpx.Client(event_hooks=...)``), so the tests see the exact
headers and body the server received.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from instrumentation_helpers import (
    MESSAGES,
    MODEL,
    Otel,
    call_async,
    call_sync,
    dumps_without_volatile,
    expected_span_attributes,
    fingerprint_left_on_the_usage_chunk,
    raw_payload,
    request_kwargs,
    spec_decode_attributes,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler

import spec_decode_otel
from reclaimed import collect
from spec_decode_otel._attributes import current_attributes

# -- instrument_client ---------------------------------------------------------------------


def test_instrument_client_covers_that_instance_and_its_copies_only(
    otel: Otel, simulator_url: str
) -> None:
    """``with_options()``/``copy()`` make a new client per call site (the SDK's own
    Responses tool runner does, openai 3.63.0 ``lib/responses_tool_runner.py``:
    ``client.with_options(max_retries=0)``); each is the chosen client with other request
    options, so it is covered with the same providers. A client made apart is not."""
    chosen = openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0)
    other = openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0)
    try:
        returned = spec_decode_otel.instrument_client(
            chosen, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
        )
        assert returned is chosen
        call_sync(chosen, "chat", request_kwargs("vllm", "chat", False, 71))
        assert len(otel.spans()) == 1
        call_sync(other, "chat", request_kwargs("vllm", "chat", False, 72))
        call_sync(other, "chat", request_kwargs("vllm", "chat", True, 73))
        assert len(otel.spans()) == 1  # not the other client
        derived = chosen.with_options(timeout=30)
        assert derived.timeout == 30 and chosen.timeout != 30  # the SDK's copy, unchanged
        call_sync(derived, "chat", request_kwargs("vllm", "chat", False, 74))
        call_sync(
            chosen.copy(max_retries=1).with_options(timeout=5),
            "chat",
            request_kwargs("vllm", "chat", False, 75),
        )
        call_sync(chosen, "chat", request_kwargs("vllm", "chat", True, 76))
        spans = otel.spans()
        assert len(spans) == 4
        for span, seed in zip(spans, (71, 74, 75, 76), strict=True):
            kwargs = request_kwargs("vllm", "chat", seed == 76, seed)
            record = spec_decode_otel.record_from_json(raw_payload(simulator_url, "chat", kwargs))
            assert record is not None
            assert spec_decode_attributes(span.attributes) == expected_span_attributes(record)
    finally:
        chosen.close()
        other.close()


async def test_instrument_client_async_and_no_double_span_with_global(
    otel: Otel, simulator_url: str
) -> None:
    chosen = openai.AsyncOpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0)
    other = openai.AsyncOpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0)
    try:
        spec_decode_otel.instrument_client(
            chosen, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
        )
        await call_async(chosen, "chat", request_kwargs("sglang", "chat", True, 76))
        await call_async(other, "chat", request_kwargs("sglang", "chat", True, 77))
        await call_async(
            chosen.with_options(timeout=30), "chat", request_kwargs("sglang", "chat", True, 80)
        )
        assert len(otel.spans()) == 2
        # instrumenting the whole process as well must not record the client (or a copy)
        # twice
        otel.instrument()
        await call_async(chosen, "chat", request_kwargs("sglang", "chat", False, 78))
        await call_async(other, "chat", request_kwargs("sglang", "chat", False, 79))
        await call_async(
            chosen.copy(timeout=30), "chat", request_kwargs("sglang", "chat", False, 83)
        )
        assert len(otel.spans()) == 5
    finally:
        await chosen.close()
        await other.close()


def test_counters_keep_counting_across_reinstrumentation(otel: Otel, openai_client: Any) -> None:
    """Re-instrumenting against the same meter provider must not orphan the counters."""
    otel.instrument()
    call_sync(openai_client, "chat", request_kwargs("vllm", "chat", False, 81))
    otel.instrument(record_per_step=True)
    call_sync(openai_client, "chat", request_kwargs("vllm", "chat", False, 82))
    drafted = [s.attributes["spec_decode.num_draft_tokens"] for s in otel.spans()]
    steps = [s.attributes["spec_decode.num_spec_steps"] for s in otel.spans()]
    metrics = otel.metrics()
    (point,) = otel.points(metrics, "spec_decode.draft_tokens")
    assert point.value == sum(drafted)
    assert sum(p.value for p in otel.points(metrics, "spec_decode.verify_steps")) == sum(steps)
    (length,) = otel.points(metrics, "spec_decode.acceptance_length")
    assert length.count == 2


def sampled_run(sampler: Sampler, openai_client: Any) -> tuple[int, dict[str, Any]]:
    """Three seeded calls (a body, a stream with usage, a stream without) under a tracer
    provider with ``sampler``: the spans exported, and every ``spec_decode.*`` figure."""
    otel = Otel()
    otel.tracer_provider = TracerProvider(sampler=sampler)
    otel.tracer_provider.add_span_processor(SimpleSpanProcessor(otel.exporter))
    try:
        otel.instrument(genai_metrics=True)
        with otel.tracer_provider.get_tracer("tests.user").start_as_current_span("handler"):
            call_sync(openai_client, "chat", request_kwargs("vllm", "chat", False, 91))
            call_sync(openai_client, "chat", vllm_stream(92))
            call_sync(openai_client, "chat", request_kwargs("vllm", "chat", True, 93))
        figures: dict[str, Any] = {}
        for scope, metric in otel.metrics():
            for point in metric.data.data_points:
                key = (scope, metric.name, tuple(sorted(point.attributes.items())))
                if metric.unit == "s":
                    figures[key] = point.count  # times differ from run to run
                else:
                    figures[key] = getattr(point, "value", None) or (point.count, point.sum)
        return len(otel.spans()), figures
    finally:
        otel.close()


def test_calls_the_sampler_drops_are_still_measured_in_full(openai_client: Any) -> None:
    """Production tracing keeps a few percent of traces, while dashboards and alerts read
    the metrics, which must see every call. Under the SDK's ``ParentBased(ALWAYS_OFF)``
    (the spans of our calls do not record, not even for exemplars) every histogram point,
    counter and outcome count is what the same seeded calls give fully sampled."""
    sampled_spans, sampled = sampled_run(ALWAYS_ON, openai_client)
    dropped_spans, dropped = sampled_run(ParentBased(ALWAYS_OFF), openai_client)
    assert (sampled_spans, dropped_spans) == (4, 0)
    assert dropped == sampled
    outcomes = {
        dict(key[2])["spec_decode.outcome"]: value
        for key, value in sampled.items()
        if key[1] == "spec_decode.requests"
    }
    assert outcomes == {"recorded": 2, "no_stats": 1}


# -- user attributes ---------------------------------------------------------------------


def test_user_attributes_go_on_spans_and_allow_listed_ones_on_metrics(
    otel: Otel, openai_client: Any
) -> None:
    otel.instrument(metric_attributes=("workload",), genai_metrics=True)
    with spec_decode_otel.attributes(workload="rag", tenant="acme"):
        with spec_decode_otel.attributes(workload="summarize"):  # inner wins
            call_sync(openai_client, "chat", request_kwargs("vllm", "chat", False, 83))
        call_sync(openai_client, "chat", request_kwargs("vllm", "chat", True, 84))
    call_sync(openai_client, "chat", request_kwargs("vllm", "chat", False, 85))

    first, second, third = otel.spans()
    assert (first.attributes["workload"], first.attributes["tenant"]) == ("summarize", "acme")
    assert (second.attributes["workload"], second.attributes["tenant"]) == ("rag", "acme")
    assert "workload" not in third.attributes and "tenant" not in third.attributes

    metrics = otel.metrics()
    lengths = otel.points(metrics, "spec_decode.acceptance_length")
    by_workload = {dict(p.attributes).get("workload"): p.count for p in lengths}
    assert by_workload == {"summarize": 1, "rag": 1, None: 1}
    # not allow-listed: never a metric attribute
    for name in ("spec_decode.acceptance_length", "spec_decode.verify_steps"):
        assert all("tenant" not in p.attributes for p in otel.points(metrics, name))
    durations = otel.points(metrics, "gen_ai.client.operation.duration")
    assert sorted(str(dict(p.attributes).get("workload")) for p in durations) == [
        "None",
        "rag",
        "summarize",
    ]


def test_user_attributes_stay_off_metrics_unless_allow_listed(
    instrumented: Otel, openai_client: Any
) -> None:
    with spec_decode_otel.attributes(workload="rag"):
        call_sync(openai_client, "chat", request_kwargs("vllm", "chat", False, 86))
    assert instrumented.only_span().attributes["workload"] == "rag"
    metrics = instrumented.metrics()
    for name in ("spec_decode.acceptance_length", "gen_ai.client.operation.duration"):
        (point,) = instrumented.points(metrics, name)
        assert "workload" not in point.attributes


async def test_user_attributes_cross_await_and_never_bleed_between_tasks(
    otel: Otel, async_openai_client: Any
) -> None:
    otel.instrument(metric_attributes=("workload",), genai_metrics=True)
    start = asyncio.Event()

    async def task(i: int) -> None:
        with spec_decode_otel.attributes(workload=f"w{i}"):
            await start.wait()  # every task is inside its block before any call starts
            kwargs = request_kwargs("vllm", "chat", True, 90 + i, model=f"model-{i}")
            stream = await async_openai_client.chat.completions.create(**kwargs)
            async for _ in stream:
                await asyncio.sleep(0)  # interleave the tasks chunk by chunk

    tasks = [asyncio.create_task(task(i)) for i in range(4)]
    await asyncio.sleep(0)
    start.set()
    await asyncio.gather(*tasks)

    spans = otel.spans()
    assert len(spans) == 4
    for span in spans:
        i = span.name.removeprefix("chat model-")
        assert span.attributes["workload"] == f"w{i}"
        assert span.attributes["spec_decode.engine"] == "vllm"
    points = otel.points(otel.metrics(), "spec_decode.acceptance_length")
    assert sorted(
        (p.attributes["workload"], p.attributes["gen_ai.request.model"]) for p in points
    ) == [(f"w{i}", f"model-{i}") for i in range(4)]


async def test_user_attributes_in_a_relay_generator_stepped_in_copied_contexts(
    instrumented: Otel, openai_client: Any
) -> None:
    """A proxy that relays a stream from a sync generator through Starlette's
    ``StreamingResponse``, which steps it with ``iterate_in_threadpool``: each step runs
    in a copy of the context (``anyio.to_thread.run_sync``; starlette 1.10.0,
    ``concurrency.py``). An ``attributes()`` block in that generator began in one copy
    and ended in another, and its exit raised ``ValueError`` ("created in a different
    Context") into the request: the response failed at its last chunk. Now the relay
    reads to the end, and the span carries the block's values."""
    from starlette.concurrency import iterate_in_threadpool

    def relay() -> Iterator[Any]:
        with spec_decode_otel.attributes(tenant="acme"):
            yield from openai_client.chat.completions.create(
                **request_kwargs("vllm", "chat", True, 95)
            )

    chunks = [chunk async for chunk in iterate_in_threadpool(relay())]
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)  # read to its end
    span = instrumented.only_span()
    assert span.attributes["tenant"] == "acme"
    assert span.attributes["spec_decode.outcome"] == "recorded"


def test_user_attributes_in_an_async_generator_the_loop_closes_raise_nothing(
    instrumented: Otel, simulator_url: str
) -> None:
    """An async relay generator left half read: ``asyncio.run`` closes it at its end
    (``shutdown_asyncgens``), in another context than the block's, and the loop reported
    the block's ``ValueError`` as an unhandled exception."""
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, c: reported.append(c))
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0)

        async def relay() -> AsyncIterator[Any]:
            with spec_decode_otel.attributes(tenant="acme"):
                kwargs = request_kwargs("vllm", "chat", True, 96)
                async for chunk in await client.chat.completions.create(**kwargs):
                    yield chunk

        async for _ in relay():
            break  # the generator is left to the loop

    asyncio.run(main())
    assert reported == []
    collect()  # openai 1.40's stream is left to the garbage collector, which ends its span
    assert instrumented.only_span().attributes["tenant"] == "acme"


def test_user_attributes_ended_in_another_context_undo_only_their_own_values() -> None:
    """Where a block ends in another context than it began in, that context gets back
    the values from before the block when it holds the block's (a copy taken inside it),
    and keeps its own otherwise: values set there by someone else are not clobbered."""
    block = spec_decode_otel.attributes(tenant="acme")
    began = contextvars.copy_context()
    began.run(block.__enter__)
    holding_the_block = began.copy()
    holding_the_block.run(block.__exit__, None, None, None)
    assert dict(holding_the_block.run(current_attributes)) == {}

    other_block = spec_decode_otel.attributes(tenant="beta")
    began = contextvars.copy_context()
    began.run(other_block.__enter__)
    elsewhere = contextvars.copy_context()
    elsewhere.run(spec_decode_otel.attributes(workload="batch").__enter__)
    elsewhere.run(other_block.__exit__, None, None, None)
    assert dict(elsewhere.run(current_attributes)) == {"workload": "batch"}
    assert dict(began.run(current_attributes)) == {"tenant": "beta"}


# -- opt-in request changes -----------------------------------------------------------------


class WireLog:
    """The requests the client's transport sent: headers and decoded JSON body."""

    def __init__(self) -> None:
        self.requests: list[tuple[httpx.Headers, dict[str, Any]]] = []

    def hook(self, request: httpx.Request) -> None:
        self.requests.append((request.headers, json.loads(request.content or b"{}")))

    async def async_hook(self, request: httpx.Request) -> None:
        self.hook(request)

    @property
    def last(self) -> tuple[httpx.Headers, dict[str, Any]]:
        return self.requests[-1]


@pytest.fixture
def wire(simulator_url: str) -> Any:
    log = WireLog()
    http_client = httpx.Client(event_hooks={"request": [log.hook]})
    client = openai.OpenAI(
        api_key="sk-test", base_url=simulator_url, max_retries=0, http_client=http_client
    )
    yield client, log
    client.close()


@pytest.fixture
async def async_wire(simulator_url: str) -> Any:
    log = WireLog()
    http_client = httpx.AsyncClient(event_hooks={"request": [log.async_hook]})
    client = openai.AsyncOpenAI(
        api_key="sk-test", base_url=simulator_url, max_retries=0, http_client=http_client
    )
    yield client, log
    await client.close()


def vllm_stream(seed: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": MESSAGES,
        "stream": True,
        "extra_headers": {"x-spec-decode-engine": "vllm", "x-sim-seed": str(seed)},
        **extra,
    }


async def read_chat(client: Any, kwargs: dict[str, Any]) -> list[Any]:
    """One chat call on the sync or the async client, as the user sees it."""
    if isinstance(client, openai.AsyncOpenAI):
        return await call_async(client, "chat", kwargs)
    return call_sync(client, "chat", kwargs)


def is_usage_chunk(chunk: Any) -> bool:
    return not chunk.choices and chunk.usage is not None


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_injected_include_usage_is_invisible_to_the_user(
    mode: str, otel: Otel, wire: Any, async_wire: Any
) -> None:
    client, log = wire if mode == "sync" else async_wire

    bare = await read_chat(client, vllm_stream(101))
    assert "stream_options" not in log.last[1]
    otel.instrument(inject_include_usage=True)
    ours = await read_chat(client, vllm_stream(101))

    assert log.last[1]["stream_options"] == {"include_usage": True}  # asked on the wire
    assert len(ours) == len(bare)
    assert not any(is_usage_chunk(c) for c in ours)
    seen = fingerprint_left_on_the_usage_chunk(dumps_without_volatile(bare))
    assert dumps_without_volatile(ours) == seen
    span = otel.only_span()
    # the stats came from the chunk the user never saw
    assert span.attributes["spec_decode.engine"] == "vllm"
    assert span.attributes["spec_decode.num_spec_steps"] > 0
    assert span.attributes["gen_ai.usage.output_tokens"] > 0

    # a non-streaming request is left as it was
    await read_chat(client, {**vllm_stream(102), "stream": False})
    assert "stream_options" not in log.last[1]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_include_usage_is_not_injected_beside_continuous_usage_stats(
    mode: str, otel: Otel, wire: Any, async_wire: Any
) -> None:
    """vLLM sends usage on every chunk only when both ``include_usage`` and
    ``continuous_usage_stats`` are set (``should_include_usage`` in
    ``vllm/entrypoints/serve/utils/api_utils.py``, vllm 0.34.0's wheel; the simulator does
    the same). A user who sent ``continuous_usage_stats``
    alone gets no usage; injecting ``include_usage`` would put usage on every chunk they
    see, which hiding the final usage chunk cannot undo. So the request goes out as the
    user made it, and the user sees what the bare SDK shows."""
    client, log = wire if mode == "sync" else async_wire
    request = {**vllm_stream(103), "stream_options": {"continuous_usage_stats": True}}
    bare = await read_chat(client, request)
    otel.instrument(inject_include_usage=True)
    ours = await read_chat(client, request)

    assert log.last[1]["stream_options"] == {"continuous_usage_stats": True}
    assert all(chunk.usage is None for chunk in bare)
    assert dumps_without_volatile(ours) == dumps_without_volatile(bare)
    assert otel.only_span().attributes["spec_decode.outcome"] == "no_stats"


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_calls_inside_suppress_instrumentation_are_neither_recorded_nor_amended(
    mode: str, otel: Otel, wire: Any, async_wire: Any
) -> None:
    """``suppress_instrumentation()`` is every OpenTelemetry instrumentation's off switch
    for a block of code (opentelemetry-instrumentation's ``is_instrumentation_enabled``;
    the SDK's exporters and many applications' health checks use it). Inside it a call
    gets no span and no count, and goes out exactly as the user made it: no
    ``include_usage`` or ``traceparent`` added even when those options are on."""
    from opentelemetry.instrumentation.utils import suppress_instrumentation

    client, log = wire if mode == "sync" else async_wire

    bare = await read_chat(client, vllm_stream(103))
    otel.instrument(inject_include_usage=True, inject_traceparent=True)
    with suppress_instrumentation():
        suppressed = await read_chat(client, vllm_stream(103))
        await read_chat(client, {**vllm_stream(104), "stream": False})
    headers, body = log.last
    assert "stream_options" not in body and "traceparent" not in headers
    assert dumps_without_volatile(suppressed) == dumps_without_volatile(bare)
    assert otel.spans() == []
    assert otel.points(otel.metrics(), "spec_decode.requests") == []

    await read_chat(client, vllm_stream(105))  # outside the block: recorded again
    assert otel.only_span().attributes["spec_decode.outcome"] == "recorded"
    assert "traceparent" in log.last[0]


@pytest.mark.parametrize("include_usage", [True, False])
def test_an_explicit_include_usage_is_respected(include_usage: bool, otel: Otel, wire: Any) -> None:
    client, log = wire
    kwargs = vllm_stream(103, stream_options={"include_usage": include_usage})
    bare = call_sync(client, "chat", kwargs)
    otel.instrument(inject_include_usage=True)
    ours = call_sync(client, "chat", kwargs)
    assert log.last[1]["stream_options"] == {"include_usage": include_usage}
    assert dumps_without_volatile(ours) == dumps_without_volatile(bare)
    assert is_usage_chunk(ours[-1]) is include_usage  # the user's own usage chunk stays
    stats = spec_decode_attributes(otel.only_span().attributes)
    assert bool(stats) is include_usage


def test_options_in_code_replace_settings_from_the_environment_only(otel: Otel, wire: Any) -> None:
    """``instrument(skip_dep_check=True)`` is the call ``opentelemetry-instrument`` makes
    (opentelemetry-instrumentation 0.66b2, ``_load_instrumentors``): settings from the
    ``SPEC_DECODE_OTEL_*`` variables only. Options given in code afterwards replace them
    (the injected ``include_usage`` is on the wire, the stream gets its statistics);
    options given in code a second time keep the first, with a ``RuntimeWarning`` at the
    caller's line (``warnings.catch_warnings``' ``filename``), not inside the package."""
    client, log = wire
    instrumentor = spec_decode_otel.SpecDecodeInstrumentor()
    instrumentor.uninstrument()
    instrumentor.instrument(skip_dep_check=True)
    providers = {"tracer_provider": otel.tracer_provider, "meter_provider": otel.meter_provider}
    with warnings.catch_warnings(record=True) as replacing:
        warnings.simplefilter("always")
        instrumentor.instrument(inject_include_usage=True, **providers)
    assert replacing == []
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        instrumentor.instrument(inject_include_usage=False, **providers)
    (warned,) = again
    assert issubclass(warned.category, RuntimeWarning)
    assert "the first settings stay" in str(warned.message)
    assert warned.filename == __file__
    call_sync(client, "chat", vllm_stream(104))
    assert log.last[1]["stream_options"] == {"include_usage": True}
    assert otel.only_span().attributes["spec_decode.engine"] == "vllm"


def test_traceparent_carries_the_span_of_the_call(otel: Otel, wire: Any) -> None:
    client, log = wire
    otel.instrument()
    call_sync(client, "chat", request_kwargs("vllm", "chat", False, 104))
    assert "traceparent" not in log.last[0]  # opt-in only

    otel.clear()
    otel.instrument(inject_traceparent=True)
    call_sync(client, "chat", request_kwargs("vllm", "chat", True, 105))
    version, trace_id, span_id, flags = log.last[0]["traceparent"].split("-")
    span = otel.only_span()
    assert version == "00" and int(flags, 16) & 0x01  # sampled
    assert int(trace_id, 16) == span.context.trace_id
    assert int(span_id, 16) == span.context.span_id

    # a traceparent the user sent is theirs to keep
    user_tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    kwargs = request_kwargs("vllm", "chat", False, 106)
    kwargs["extra_headers"]["traceparent"] = user_tp
    call_sync(client, "chat", kwargs)
    assert log.last[0]["traceparent"] == user_tp


async def test_traceparent_on_the_async_client_under_a_user_span(
    otel: Otel, async_wire: Any
) -> None:
    client, log = async_wire
    otel.instrument(inject_traceparent=True)
    with otel.tracer.start_as_current_span("request handler") as handler:
        await call_async(client, "chat", request_kwargs("vllm", "chat", False, 107))
    _, trace_id, span_id, _ = log.last[0]["traceparent"].split("-")
    (ours,) = otel.our_spans()
    assert int(trace_id, 16) == ours.context.trace_id == handler.get_span_context().trace_id
    assert int(span_id, 16) == ours.context.span_id  # the call's span, not the handler's


def test_request_engine_stats_adds_the_sglang_field_without_overriding(
    otel: Otel, wire: Any
) -> None:
    client, log = wire
    plain = request_kwargs("sglang", "chat", False, 108)
    del plain["extra_body"]

    otel.instrument()
    call_sync(client, "chat", plain)
    assert "return_spec_tokens_details" not in log.last[1]
    assert spec_decode_attributes(otel.only_span().attributes) == {}

    otel.clear()
    otel.instrument(request_engine_stats=("sglang",))
    call_sync(client, "chat", plain)
    assert log.last[1]["return_spec_tokens_details"] is True
    assert otel.only_span().attributes["spec_decode.engine"] == "sglang"
    assert "extra_body" not in plain  # the user's arguments were not mutated

    otel.clear()
    call_sync(client, "chat", {**plain, "extra_body": {"return_spec_tokens_details": False}})
    assert log.last[1]["return_spec_tokens_details"] is False
    assert spec_decode_attributes(otel.only_span().attributes) == {}

    otel.clear()
    streamed = request_kwargs("sglang", "completions", True, 109)
    del streamed["extra_body"]
    call_sync(client, "completions", streamed)
    assert log.last[1]["return_spec_tokens_details"] is True
    assert otel.only_span().attributes["spec_decode.engine"] == "sglang"


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_sglang_stats_chunk_asked_for_the_user_is_invisible_to_them(
    mode: str, api: str, otel: Otel, wire: Any, async_wire: Any
) -> None:
    """SGLang streams its stats in a chunk of their own, with no choices and no usage,
    after the finish chunks and before any usage chunk (sglang 0.5.23's wheel:
    ``srt/entrypoints/openai/serving_chat.py`` and ``serving_completions.py``; the
    simulator sends it so). When ``request_engine_stats`` asked for the stats, the user did
    not: that chunk is hidden as the injected usage chunk is, so a loop reading
    ``chunk.choices[0]`` keeps working, and the record still comes from it. A usage chunk
    the user asked for stays theirs; a stats field they asked for themselves shows."""
    client, log = wire if mode == "sync" else async_wire

    async def read(kwargs: dict[str, Any]) -> list[Any]:
        if mode == "sync":
            return call_sync(client, api, kwargs)
        return await call_async(client, api, kwargs)

    plain = request_kwargs("sglang", api, True, 112)
    del plain["extra_body"]
    with_usage = {**plain, "stream_options": {"include_usage": True}}
    bare, bare_with_usage = await read(plain), await read(with_usage)
    asked = await read({**plain, "extra_body": {"return_spec_tokens_details": True}})
    assert [c for c in asked if not c.choices and c.usage is None]  # the stats chunk exists

    otel.instrument(request_engine_stats=("sglang",))
    ours = await read(plain)
    assert log.last[1]["return_spec_tokens_details"] is True
    assert all(c.choices for c in ours)
    assert dumps_without_volatile(ours) == dumps_without_volatile(bare)
    attrs = otel.only_span().attributes
    assert attrs["spec_decode.engine"] == "sglang" and attrs["spec_decode.num_spec_steps"] > 0

    otel.clear()
    ours_with_usage = await read(with_usage)
    assert dumps_without_volatile(ours_with_usage) == dumps_without_volatile(bare_with_usage)
    assert ours_with_usage[-1].usage is not None  # the user's own usage chunk is kept
    assert otel.only_span().attributes["spec_decode.engine"] == "sglang"


def test_one_span_per_logical_call_across_retries(otel: Otel, simulator_url: str) -> None:
    log = WireLog()
    client = openai.OpenAI(
        api_key="sk-test",
        base_url=simulator_url,
        max_retries=1,  # the simulator's 429 says retry-after: 1
        http_client=httpx.Client(event_hooks={"request": [log.hook]}),
    )
    otel.instrument(genai_metrics=True)
    kwargs = request_kwargs("vllm", "chat", False, 110)
    kwargs["extra_headers"]["x-sim-fault"] = "http-429"
    try:
        with pytest.raises(openai.RateLimitError):
            call_sync(client, "chat", kwargs)
    finally:
        client.close()
    assert len(log.requests) == 2  # the SDK did retry
    span = otel.only_span()
    assert span.attributes["error.type"] == "RateLimitError"
    (duration,) = otel.points(otel.metrics(), "gen_ai.client.operation.duration")
    assert duration.count == 1 and duration.sum >= 0.5  # the whole call, retry included


def test_per_step_arrays_only_on_request_and_under_the_cap(
    otel: Otel, openai_client: Any, simulator_url: str
) -> None:
    kwargs = request_kwargs("vllm", "chat", False, 111)
    otel.instrument()
    call_sync(openai_client, "chat", kwargs)
    assert "spec_decode.per_step_accepted" not in otel.only_span().attributes

    otel.clear()
    otel.instrument(record_per_step=True)
    call_sync(openai_client, "chat", kwargs)
    stats = raw_payload(simulator_url, "chat", kwargs)["metrics"]["speculative_decoding"]
    attrs = otel.only_span().attributes
    assert list(attrs["spec_decode.per_step_accepted"]) == stats["per_step_accepted"]
    assert list(attrs["spec_decode.per_step_drafted"]) == stats["per_step_drafted"]

    otel.clear()
    otel.instrument(record_per_step=True, per_step_max_length=len(stats["per_step_accepted"]) - 1)
    call_sync(openai_client, "chat", kwargs)
    attrs = otel.only_span().attributes
    assert "spec_decode.per_step_accepted" not in attrs
    assert attrs["spec_decode.num_spec_steps"] == stats["num_spec_steps"]
