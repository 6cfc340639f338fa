"""Every engine shape x sync/async x JSON/SSE x chat/completions, instrumented for real.

The real ``openai`` SDK talks to the simulator subprocess; the real OTel SDK records into
memory. Each call must give exactly one CLIENT span with the GenAI attributes, and the
``spec_decode.*`` attributes and metric points must equal what ``record_from_json`` reads
from the same (seeded) payload fetched again without any instrumentation. Also: partial
engines, the ``none`` engine, n > 1, and HTTP errors (same exception as the bare SDK).
"""

from __future__ import annotations

import zlib
from typing import Any

import openai
import pytest
from instrumentation_helpers import (
    ENGINES,
    MODEL,
    OPERATION,
    SPEC_DECODE_METRICS,
    Otel,
    call_async,
    call_sync,
    dumps_without_volatile,
    expected_outcome,
    expected_span_attributes,
    payload_finish_reasons,
    payload_usage,
    raw_payload,
    request_kwargs,
    server_of,
    spec_decode_attributes,
)
from opentelemetry.trace import SpanKind, StatusCode

import spec_decode_otel
from spec_decode_otel.instrumentation.genai_metrics import (
    DURATION_BUCKETS,
    TOKEN_BUCKETS,
)
from spec_decode_otel.record import SpecDecodeAcceptanceRecord
from spec_decode_otel.telemetry import (
    ACCEPTANCE_LENGTH_BUCKETS,
    ACCEPTANCE_RATE_BUCKETS,
    SCOPE_NAME,
)

PARTIAL_ENGINES = {"trtllm-released", "llamacpp"}


def seed_for(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode()) % 100_000 + 1


async def run(
    mode: str, api: str, kwargs: dict[str, Any], sync_client: Any, async_client: Any
) -> list[Any]:
    if mode == "sync":
        return call_sync(sync_client, api, kwargs)
    return await call_async(async_client, api, kwargs)


def metric_base(api: str, base_url: str, response_model: str) -> dict[str, Any]:
    host, port = server_of(base_url)
    return {
        "gen_ai.operation.name": OPERATION[api],
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": MODEL,
        "gen_ai.response.model": response_model,
        "server.address": host,
        "server.port": port,
    }


def check_spec_decode_metrics(
    otel: Otel, record: SpecDecodeAcceptanceRecord, base: dict[str, Any]
) -> None:
    """One request's spec-decode metric points, written out from the record."""
    metrics = otel.metrics()
    attrs = {**base, "spec_decode.engine": record.engine}
    if record.num_spec_tokens is not None:
        attrs["spec_decode.num_spec_tokens"] = record.num_spec_tokens

    for name, value, unit, bounds in (
        (
            "spec_decode.acceptance_length",
            record.mean_acceptance_length,
            "{token}",
            ACCEPTANCE_LENGTH_BUCKETS,
        ),
        (
            "spec_decode.draft_acceptance_rate",
            record.draft_acceptance_rate,
            "1",
            ACCEPTANCE_RATE_BUCKETS,
        ),
    ):
        found = otel.find(metrics, name)
        if value is None:
            assert not otel.points(metrics, name), name
            continue
        assert len(found) == 1 and found[0].unit == unit
        (point,) = found[0].data.data_points
        assert dict(point.attributes) == attrs
        assert point.count == 1 and point.sum == pytest.approx(value)
        assert tuple(point.explicit_bounds) == tuple(bounds)
        assert sum(point.bucket_counts) == 1
        # the one observation sits in the bucket its value belongs to
        index = next((i for i, b in enumerate(bounds) if value <= b), len(bounds))
        assert point.bucket_counts[index] == 1

    for name, value in (
        ("spec_decode.draft_tokens", record.num_draft_tokens),
        ("spec_decode.accepted_draft_tokens", record.num_accepted_draft_tokens),
    ):
        points = otel.points(metrics, name)
        if value is None:
            assert not points, name
            continue
        assert [(dict(p.attributes), p.value) for p in points] == [(attrs, value)]
        assert otel.find(metrics, name)[0].unit == "{token}"

    steps = {
        dict(p.attributes)["spec_decode.accepted"]: p.value
        for p in otel.points(metrics, "spec_decode.verify_steps")
    }
    positions = {
        dict(p.attributes)["spec_decode.position"]: p.value
        for p in otel.points(metrics, "spec_decode.accepted_at_position")
    }
    hist = record.acceptance_histogram
    if hist is None:
        assert not steps and not positions
        return
    assert steps == hist  # sparse: zero buckets give no series
    assert sum(steps.values()) == record.num_spec_steps
    for p in otel.points(metrics, "spec_decode.verify_steps"):
        assert {k: v for k, v in p.attributes.items() if k != "spec_decode.accepted"} == attrs
    # a step that accepted j drafts accepted positions 0..j-1
    expected_positions = {
        pos: sum(c for j, c in hist.items() if j > pos) for pos in range(max(hist, default=0))
    }
    assert positions == {p: c for p, c in expected_positions.items() if c}
    assert sum(positions.values()) == record.num_accepted_draft_tokens
    assert otel.find(metrics, "spec_decode.verify_steps")[0].unit == "{step}"


def check_genai_metrics(
    otel: Otel, base: dict[str, Any], usage: Any, stream: bool, error: str | None = None
) -> None:
    metrics = otel.metrics()
    attrs = dict(base)
    if error is not None:
        attrs["error.type"] = error
    (duration,) = otel.find(metrics, "gen_ai.client.operation.duration")
    assert duration.unit == "s"
    (point,) = duration.data.data_points
    assert point.count == 1 and point.sum > 0 and dict(point.attributes) == attrs
    assert tuple(point.explicit_bounds) == DURATION_BUCKETS

    tokens = {
        dict(p.attributes).pop("gen_ai.token.type"): p
        for p in otel.points(metrics, "gen_ai.client.token.usage")
    }
    if usage is None:
        assert tokens == {}
    else:
        assert {k: (p.count, p.sum) for k, p in tokens.items()} == {
            "input": (1, usage["prompt_tokens"]),
            "output": (1, usage["completion_tokens"]),
        }
        for kind, p in tokens.items():
            assert dict(p.attributes) == {**base, "gen_ai.token.type": kind}
            assert tuple(p.explicit_bounds) == TOKEN_BUCKETS
    ttfc = otel.points(metrics, "gen_ai.client.operation.time_to_first_chunk")
    assert len(ttfc) == (1 if stream else 0)
    if stream:
        assert ttfc[0].count == 1 and 0 < ttfc[0].sum <= point.sum


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("engine", ENGINES)
async def test_one_span_with_the_record_of_the_payload(
    engine: str,
    mode: str,
    stream: bool,
    api: str,
    instrumented: Otel,
    simulator_url: str,
    openai_client: Any,
    async_openai_client: Any,
) -> None:
    kwargs = request_kwargs(engine, api, stream, seed_for(engine, mode, str(stream), api))
    results = await run(mode, api, kwargs, openai_client, async_openai_client)
    assert results

    payload = raw_payload(simulator_url, api, kwargs)
    record = spec_decode_otel.record_from_json(payload)
    assert (record is None) == (engine == "none")

    span = instrumented.only_span()
    attrs = dict(span.attributes)
    assert span.name == f"{OPERATION[api]} {MODEL}"
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    assert span.parent is None
    host, port = server_of(simulator_url)
    response_model = results[0].model
    usage = payload_usage(payload)
    expected = {
        "gen_ai.operation.name": OPERATION[api],
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": MODEL,
        "gen_ai.response.model": response_model,
        "server.address": host,
        "server.port": port,
        "gen_ai.response.finish_reasons": tuple(payload_finish_reasons(payload)),
    }
    if usage is not None:
        expected["gen_ai.usage.input_tokens"] = usage["prompt_tokens"]
        expected["gen_ai.usage.output_tokens"] = usage["completion_tokens"]
    if stream:
        expected["gen_ai.request.stream"] = True
    assert {k: v for k, v in attrs.items() if not k.startswith("spec_decode.")} == expected
    # the user saw exactly what the server sent (every chunk, nothing added or removed)
    sent = payload if stream else [payload]
    assert dumps_without_volatile(results) == dumps_without_volatile(sent)

    base = metric_base(api, simulator_url, response_model)
    check_genai_metrics(instrumented, base, usage, stream)
    # every call has an outcome, on its span and in the requests counter
    assert attrs["spec_decode.outcome"] == expected_outcome(record)
    requests = instrumented.points(instrumented.metrics(), "spec_decode.requests")
    assert [(p.attributes["spec_decode.outcome"], p.value) for p in requests] == [
        (expected_outcome(record), 1)
    ]
    if record is None:
        assert spec_decode_attributes(attrs) == {}
        metrics = instrumented.metrics()
        assert not [n for n in SPEC_DECODE_METRICS if instrumented.points(metrics, n)]
        return

    assert spec_decode_attributes(attrs) == expected_span_attributes(record)
    assert (attrs.get("spec_decode.partial") is True) == (engine in PARTIAL_ENGINES)
    if engine not in PARTIAL_ENGINES:
        hist = attrs["spec_decode.acceptance_histogram"]
        assert len(hist) == attrs["spec_decode.num_spec_tokens"] + 1
        assert sum(hist) == attrs["spec_decode.num_spec_steps"]
        assert (
            sum(j * c for j, c in enumerate(hist)) == attrs["spec_decode.num_accepted_draft_tokens"]
        )
        assert attrs["spec_decode.mean_acceptance_length"] == pytest.approx(
            1 + attrs["spec_decode.num_accepted_draft_tokens"] / attrs["spec_decode.num_spec_steps"]
        )
    check_spec_decode_metrics(instrumented, record, base)


def test_partial_engines_report_only_what_they_send(instrumented: Otel, openai_client: Any) -> None:
    released = request_kwargs("trtllm-released", "chat", False, 5)
    llamacpp = request_kwargs("llamacpp", "chat", False, 5)
    call_sync(openai_client, "chat", released)
    call_sync(openai_client, "chat", llamacpp)
    first, second = (spec_decode_attributes(s.attributes) for s in instrumented.spans())
    assert set(first) == {
        "spec_decode.engine",
        "spec_decode.mean_acceptance_length",
        "spec_decode.partial",
    }
    assert first["spec_decode.engine"] == "tensorrt_llm"
    assert set(second) == {
        "spec_decode.engine",
        "spec_decode.draft_acceptance_rate",
        "spec_decode.num_accepted_draft_tokens",
        "spec_decode.num_draft_tokens",
        "spec_decode.partial",
    }
    metrics = instrumented.metrics()
    # nothing that needs steps or a histogram is invented
    assert not instrumented.points(metrics, "spec_decode.verify_steps")
    assert not instrumented.points(metrics, "spec_decode.accepted_at_position")
    assert [
        dict(p.attributes)["spec_decode.engine"]
        for p in instrumented.points(metrics, "spec_decode.acceptance_length")
    ] == ["tensorrt_llm"]
    assert [
        dict(p.attributes)["spec_decode.engine"]
        for p in instrumented.points(metrics, "spec_decode.draft_tokens")
    ] == ["llamacpp"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("engine", ["vllm", "vllm-premerge", "sglang", "trtllm"])
def test_n_greater_than_one_gives_a_span_without_spec_decode(
    engine: str, stream: bool, instrumented: Otel, openai_client: Any, simulator_url: str
) -> None:
    kwargs = request_kwargs(engine, "chat", stream, 17, n=2)
    results = call_sync(openai_client, "chat", kwargs)
    # the server did send per-choice stats for the shapes that have them
    payload = raw_payload(simulator_url, "chat", kwargs)
    if engine in ("vllm-premerge", "trtllm"):
        chunks = payload if stream else [payload]
        assert any(
            c.get("speculative_decoding_stats") or c.get("speculative_decoding")
            for chunk in chunks
            for c in chunk["choices"]
        )
    span = instrumented.only_span()
    assert spec_decode_attributes(span.attributes) == {}
    assert len(span.attributes["gen_ai.response.finish_reasons"]) == 2
    assert results
    metrics = instrumented.metrics()
    assert not [n for n in SPEC_DECODE_METRICS if instrumented.points(metrics, n)]
    assert len(instrumented.points(metrics, "gen_ai.client.operation.duration")) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("fault", ["http-500", "http-429"])
async def test_server_errors_give_an_error_span_and_the_bare_sdk_exception(
    fault: str,
    mode: str,
    stream: bool,
    otel: Otel,
    simulator_url: str,
    openai_client: Any,
    async_openai_client: Any,
) -> None:
    kwargs = request_kwargs("vllm", "chat", stream, 3)
    kwargs["extra_headers"]["x-sim-fault"] = fault

    async def attempt() -> openai.APIStatusError:
        with pytest.raises(openai.APIStatusError) as info:
            await run(mode, "chat", kwargs, openai_client, async_openai_client)
        return info.value

    bare = await attempt()
    assert otel.spans() == []
    otel.instrument(genai_metrics=True)
    seen = await attempt()

    assert type(seen) is type(bare)
    assert (seen.status_code, seen.body, seen.message) == (
        bare.status_code,
        bare.body,
        bare.message,
    )
    assert seen.status_code == int(fault.removeprefix("http-"))
    span = otel.only_span()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == type(seen).__qualname__
    assert spec_decode_attributes(span.attributes) == {}
    base = metric_base("chat", simulator_url, "")
    del base["gen_ai.response.model"]
    check_genai_metrics(otel, base, None, False, error=type(seen).__qualname__)
    metrics = otel.metrics()
    assert not [n for n in SPEC_DECODE_METRICS if otel.points(metrics, n)]


@pytest.mark.parametrize("model", ["", "m" * 257], ids=["empty", "too-long"])
def test_a_request_model_that_is_no_usable_name_is_left_out(
    model: str, instrumented: Otel, openai_client: Any
) -> None:
    """README: an unknown value "is left out, never sent empty". An empty model went on
    the span and into every metric series as ``gen_ai.request.model=""`` (found by a
    helper comparing our telemetry with the GenAI conventions); a name past 256
    characters is held to the rule the server's model names are held to."""
    kwargs = request_kwargs("vllm", "chat", False, 77)
    kwargs["model"] = model
    call_sync(openai_client, "chat", kwargs)
    span = instrumented.only_span()
    assert span.name == "chat"
    assert "gen_ai.request.model" not in span.attributes
    assert span.attributes["spec_decode.outcome"] == "recorded"
    points = [
        p for scope, m in instrumented.metrics() if scope == SCOPE_NAME for p in m.data.data_points
    ]
    assert points and all("gen_ai.request.model" not in p.attributes for p in points)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_the_requests_sampling_settings_go_on_the_span_and_never_on_metrics(
    api: str, instrumented: Otel, openai_client: Any
) -> None:
    """The GenAI conventions' recommended request attributes (semantic-conventions-genai
    ``docs/gen-ai/openai.md``): acceptance moves with temperature and top_p, so a trace
    search can slice it by them. Numbers as sent; a value of another type is left out,
    as is a ``max_tokens`` of ``true`` (an int to Python, not to JSON)."""
    kwargs = request_kwargs("vllm", api, False, 78, temperature=0.7, top_p=1)
    kwargs.update(seed=5, frequency_penalty=0.25)
    # In the body as sent (extra_body): openai 1.40 has no max_completion_tokens keyword.
    limit = "max_completion_tokens" if api == "chat" else "max_tokens"
    kwargs["extra_body"] = {limit: 64, "presence_penalty": "high"}
    call_sync(openai_client, api, kwargs)
    attrs = instrumented.only_span().attributes
    assert {k: v for k, v in attrs.items() if k.startswith("gen_ai.request.")} == {
        "gen_ai.request.model": MODEL,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 1,
        "gen_ai.request.seed": 5,
        "gen_ai.request.frequency_penalty": 0.25,
        "gen_ai.request.max_tokens": 64,
    }
    keys = {k for _, m in instrumented.metrics() for p in m.data.data_points for k in p.attributes}
    assert keys and not {k for k in keys if k.startswith("gen_ai.request.")} - {
        "gen_ai.request.model"
    }

    instrumented.clear()
    kwargs = request_kwargs("vllm", api, True, 79, n=2, max_tokens=True)
    call_sync(openai_client, api, kwargs)
    attrs = instrumented.only_span().attributes
    assert attrs["gen_ai.request.choice.count"] == 2
    assert attrs["gen_ai.request.stream"] is True
    assert "gen_ai.request.max_tokens" not in attrs
