"""Side by side with opentelemetry-instrumentation-openai-v2 (both real, same providers).

``auto``: one span per call, theirs, carrying their attributes and our ``spec_decode.*``;
the GenAI metrics are recorded once (by them), never by both. Legacy completions, which
openai-v2 does not wrap, get our own span and our GenAI metrics. ``span`` forces our own
child span; ``enrich`` puts our attributes on whatever span is current.
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
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.trace import SpanKind

import spec_decode_otel
from spec_decode_otel.telemetry import SCOPE_NAME

GENAI_METRICS = ("gen_ai.client.operation.duration", "gen_ai.client.token.usage")


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
