"""Side by side with opentelemetry-instrumentation-openai-v2 (both real, same providers).

``auto``: one span per call, theirs, carrying their attributes and our ``spec_decode.*``;
the GenAI metrics are recorded once (by them), never by both. Legacy completions, which
openai-v2 does not wrap, get our own span and our GenAI metrics. ``span`` forces our own
child span; ``enrich`` puts our attributes on whatever span is current. A sampler that
drops the trace changes none of the GenAI metric counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from instrumentation_helpers import (
    MODEL,
    Otel,
    call_async,
    call_sync,
    expected_span_attributes,
    raw_payload,
    request_kwargs,
    spec_decode_attributes,
)
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

import spec_decode_otel
from spec_decode_otel.telemetry import SCOPE_NAME

GENAI_METRICS = ("gen_ai.client.operation.duration", "gen_ai.client.token.usage")
#: Samplers that drop the call's trace: every trace, or (the production set-up) one in ten
#: with the call made under an incoming trace that was not sampled (``traceparent`` with
#: flags 00), which ``ParentBased`` follows whatever the ratio says.
DROPPING = {"always-off": ALWAYS_OFF, "parent-unsampled": ParentBased(TraceIdRatioBased(0.1))}
UNSAMPLED_PARENT = SpanContext(
    trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
    span_id=0x00F067AA0BA902B7,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.DEFAULT),
)


@pytest.fixture
def openai_v2(otel: Otel) -> Iterator[OpenAIInstrumentor]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
    )
    try:
        yield instrumentor
    finally:
        instrumentor.uninstrument()


def counts_by_scope(otel: Otel, name: str) -> dict[str, int]:
    """Total histogram observations of ``name`` per instrumentation scope."""
    out: dict[str, int] = {}
    for scope, metric in otel.metrics():
        if metric.name == name:
            out[scope] = out.get(scope, 0) + sum(p.count for p in metric.data.data_points)
    return out


async def run(mode: str, api: str, kwargs: dict[str, Any], sync: Any, async_: Any) -> list[Any]:
    if mode == "sync":
        return call_sync(sync, api, kwargs)
    return await call_async(async_, api, kwargs)


@pytest.fixture(params=list(DROPPING))
def dropping(request: pytest.FixtureRequest) -> Iterator[Otel]:
    """Providers whose sampler drops the calls' traces (metrics are recorded all the
    same: they do not depend on sampling); the calls run under an unsampled remote
    parent, which only ``ParentBased`` looks at."""
    sampler: Sampler = DROPPING[request.param]
    telemetry = Otel(sampler=sampler)
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(UNSAMPLED_PARENT)))
    try:
        yield telemetry
    finally:
        otel_context.detach(token)
        telemetry.close()


@pytest.fixture
def openai_v2_dropped(dropping: Otel) -> Iterator[OpenAIInstrumentor]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(
        tracer_provider=dropping.tracer_provider, meter_provider=dropping.meter_provider
    )
    try:
        yield instrumentor
    finally:
        instrumentor.uninstrument()


@pytest.mark.parametrize("genai_metrics", [False, True], ids=["default", "genai-opted-in"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_auto_mode_enriches_the_openai_v2_span_and_counts_genai_metrics_once(
    mode: str,
    stream: bool,
    genai_metrics: bool,
    otel: Otel,
    openai_v2: OpenAIInstrumentor,
    openai_client: Any,
    async_openai_client: Any,
    simulator_url: str,
) -> None:
    # Opting in to GenAI metrics must not double openai-v2's: its span, its metrics.
    otel.instrument(genai_metrics=genai_metrics)
    kwargs = request_kwargs("vllm", "chat", stream, 61)
    await run(mode, "chat", kwargs, openai_client, async_openai_client)

    span = otel.only_span()
    assert span.instrumentation_scope.name != SCOPE_NAME  # theirs
    assert span.kind is SpanKind.CLIENT
    attrs = dict(span.attributes)
    assert attrs["gen_ai.response.id"]  # an attribute only openai-v2 sets
    assert attrs["gen_ai.request.model"] == MODEL
    record = spec_decode_otel.record_from_json(raw_payload(simulator_url, "chat", kwargs))
    assert record is not None
    assert spec_decode_attributes(attrs) == expected_span_attributes(record)

    for name in GENAI_METRICS:
        counts = counts_by_scope(otel, name)
        assert SCOPE_NAME not in counts, name
        assert sum(counts.values()) == (1 if name.endswith("duration") else 2), counts
    spec = counts_by_scope(otel, "spec_decode.acceptance_length")
    assert spec == {SCOPE_NAME: 1}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("span_mode", ["auto", "span"])
async def test_opted_in_genai_metrics_count_once_beside_openai_v2_when_the_trace_is_dropped(
    mode: str,
    stream: bool,
    span_mode: str,
    dropping: Otel,
    openai_v2_dropped: OpenAIInstrumentor,
    openai_client: Any,
    async_openai_client: Any,
) -> None:
    """openai-v2 (opentelemetry-instrumentation-openai-v2 2.4b0, patch.py
    ``chat_completions_create_v_new``; opentelemetry-util-genai 1.1b0,
    _inference_invocation.py ``_apply_finish``) records a chat call's duration and token
    usage whether its span is sampled or not, while its span, sampled out, is a
    ``NonRecordingSpan`` that tells nothing of whose it is. Ours must still stay out:
    each call counted once, by them."""
    dropping.instrument(mode=span_mode, genai_metrics=True)
    kwargs = request_kwargs("vllm", "chat", stream, 67)
    await run(mode, "chat", kwargs, openai_client, async_openai_client)

    assert dropping.spans() == []  # the sampler dropped every span
    for name in GENAI_METRICS:
        counts = counts_by_scope(dropping, name)
        assert SCOPE_NAME not in counts, (name, counts)
        assert sum(counts.values()) == (1 if name.endswith("duration") else 2), counts
    assert counts_by_scope(dropping, "spec_decode.acceptance_length") == {SCOPE_NAME: 1}


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_opted_in_genai_metrics_are_ours_alone_when_the_trace_is_dropped(
    api: str, dropping: Otel, openai_client: Any
) -> None:
    """With no other GenAI instrumentation, a dropped trace changes nothing: the call's
    GenAI metrics are ours, once."""
    dropping.instrument(genai_metrics=True)
    call_sync(openai_client, api, request_kwargs("vllm", api, True, 68))
    assert dropping.spans() == []
    assert counts_by_scope(dropping, "gen_ai.client.operation.duration") == {SCOPE_NAME: 1}
    assert counts_by_scope(dropping, "gen_ai.client.token.usage") == {SCOPE_NAME: 2}


async def test_opted_in_genai_metrics_are_ours_for_calls_openai_v2_does_not_wrap_when_dropped(
    dropping: Otel, openai_v2_dropped: OpenAIInstrumentor, openai_client: Any
) -> None:
    """openai-v2 2.4b0 wraps chat ``create`` only (``__init__.py`` ``_instrument``): a
    legacy completion and a chat ``parse()`` (openai 3.63.0 posts it without ``create``)
    are recorded by no one else, sampled or not."""
    dropping.instrument(genai_metrics=True)
    call_sync(openai_client, "completions", request_kwargs("vllm", "completions", False, 69))
    parse = request_kwargs("vllm", "chat", False, 70)
    del parse["stream"]  # parse() takes none
    openai_client.chat.completions.parse(**parse)
    assert counts_by_scope(dropping, "gen_ai.client.operation.duration") == {SCOPE_NAME: 2}


async def test_auto_mode_makes_our_own_span_where_openai_v2_has_none(
    otel: Otel, openai_v2: OpenAIInstrumentor, openai_client: Any
) -> None:
    otel.instrument(genai_metrics=True)
    call_sync(openai_client, "completions", request_kwargs("vllm", "completions", False, 62))
    span = otel.only_span()
    assert span.instrumentation_scope.name == SCOPE_NAME
    assert spec_decode_attributes(span.attributes)["spec_decode.engine"] == "vllm"
    assert counts_by_scope(otel, "gen_ai.client.operation.duration") == {SCOPE_NAME: 1}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_span_mode_forces_our_own_child_span(
    stream: bool, otel: Otel, openai_v2: OpenAIInstrumentor, openai_client: Any
) -> None:
    otel.instrument(mode="span", genai_metrics=True)
    call_sync(openai_client, "chat", request_kwargs("vllm", "chat", stream, 63))
    spans = otel.spans()
    assert len(spans) == 2
    (ours,) = otel.our_spans()
    (theirs,) = [s for s in spans if s is not ours]
    assert ours.parent is not None and ours.parent.span_id == theirs.context.span_id
    assert spec_decode_attributes(ours.attributes)["spec_decode.engine"] == "vllm"
    assert spec_decode_attributes(theirs.attributes) == {}
    # opted-in GenAI metrics are for calls with no GenAI instrumentation of their own
    # (README, genai_metrics): openai-v2 records this call's, so a forced span of ours
    # does not count it a second time (the dashboard sums both scopes)
    counts = counts_by_scope(otel, "gen_ai.client.operation.duration")
    assert counts == {theirs.instrumentation_scope.name: 1}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_enrich_mode_adds_to_the_current_user_span(
    stream: bool, otel: Otel, openai_client: Any
) -> None:
    otel.instrument(mode="enrich")
    with otel.tracer.start_as_current_span("agent step") as step:
        call_sync(openai_client, "chat", request_kwargs("sglang", "chat", stream, 64))
    span = otel.only_span()
    assert span.context.span_id == step.get_span_context().span_id
    assert spec_decode_attributes(span.attributes)["spec_decode.engine"] == "sglang"
    # GenAI metrics are opt-in (none by default)
    assert counts_by_scope(otel, "gen_ai.client.operation.duration") == {}
    assert counts_by_scope(otel, "spec_decode.acceptance_length") == {SCOPE_NAME: 1}


async def test_enrich_mode_without_a_current_span_still_makes_one(
    otel: Otel, openai_client: Any
) -> None:
    otel.instrument(mode="enrich")
    call_sync(openai_client, "chat", request_kwargs("vllm", "chat", False, 65))
    (span,) = otel.our_spans()
    assert span.name == f"chat {MODEL}"
    assert spec_decode_attributes(span.attributes)["spec_decode.engine"] == "vllm"


async def test_auto_mode_does_not_mistake_a_user_span_for_a_genai_one(
    instrumented: Otel, openai_client: Any
) -> None:
    with instrumented.tracer.start_as_current_span("handler") as handler:
        call_sync(openai_client, "chat", request_kwargs("vllm", "chat", False, 66))
    (ours,) = instrumented.our_spans()
    assert ours.parent is not None
    assert ours.parent.span_id == handler.get_span_context().span_id
    user = next(s for s in instrumented.spans() if s is not ours)
    assert spec_decode_attributes(user.attributes) == {}


def test_openai_v2_uninstrument_leaves_no_wrapper(otel: Otel) -> None:
    from openai.resources.chat import completions

    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
    )
    assert type(completions.Completions.__dict__["create"]).__name__ == "FunctionWrapper"
    instrumentor.uninstrument()
    # so the other tests in this process see an openai without openai-v2
    assert type(completions.Completions.__dict__["create"]).__name__ == "function"
    assert type(completions.AsyncCompletions.__dict__["create"]).__name__ == "function"
