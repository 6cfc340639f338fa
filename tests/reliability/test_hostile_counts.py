"""Counts a hostile server can send that OTLP cannot carry.

OTLP integers are int64. Before the fix, a consistent payload with counts past 2**63-1
gave a valid record; its span attributes were dropped at encoding, and its counter totals
(cumulative, so forever) made EVERY later metrics export of the process fail. Usage token
counts past any float made the SDK's ``Histogram.record`` raise. Now such counts are
rejected (record) or treated as absent (usage), and counter totals saturate at int64.

The property test draws every number of self-consistent vLLM (both shapes) and llama.cpp
payloads from the whole int64 range and beyond (histogram keys, counts, k, usage) and sends
each through the real instrumented client: the call is untouched, a record appears exactly
when every number is within the bounds of ``record.py`` (an oracle written from those
bounds, not from the adapters), and every attribute and metric stays exportable and small.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from reliability_helpers import Otel, canary_messages, instrumented, json_response, mock_client

from openai_sdk import chat_completion
from spec_decode_otel import SpecDecodeAcceptanceRecord, instrument_client, record_from_json
from spec_decode_otel.instrumentation.genai_metrics import (
    M_TOKEN_USAGE,
)
from spec_decode_otel.record import MAX_COUNT, MAX_SPEC_TOKENS
from spec_decode_otel.telemetry import (
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    M_ACCEPTANCE_LENGTH,
    M_DRAFT_TOKENS,
    SD_ENGINE,
    SD_NUM_ACCEPTED_DRAFT_TOKENS,
    SD_NUM_DRAFT_TOKENS,
    SD_NUM_SPEC_STEPS,
    SD_OUTCOME,
)

INT64_MAX = 2**63 - 1


def vllm_body(steps: int, drafted: int, *, prompt_tokens: int = 5, completion: int = 3) -> dict:
    """A self-consistent merged-vLLM response where every step accepted nothing (k = 0)."""
    return chat_completion(
        id="resp-1",
        usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": 8},
        metrics={
            "speculative_decoding": {
                "mean_acceptance_length": 1.0,
                "draft_acceptance_rate": 0.0,
                "acceptance_histogram": [steps],
                "num_spec_steps": steps,
                "num_accepted_draft_tokens": 0,
                "num_draft_tokens": drafted,
                "num_spec_tokens": 0,
            }
        },
    )


def test_the_record_bound_is_int64() -> None:
    assert MAX_COUNT == INT64_MAX
    assert record_from_json(vllm_body(INT64_MAX, INT64_MAX)) is not None
    assert record_from_json(vllm_body(INT64_MAX + 1, INT64_MAX)) is None
    assert record_from_json(vllm_body(1, 2**70)) is None
    with pytest.raises(ValueError):
        SpecDecodeAcceptanceRecord(engine="x", num_draft_tokens=2**63)


@pytest.mark.parametrize(
    "hostile",
    [
        vllm_body(INT64_MAX, INT64_MAX),  # valid, at the bound: counters must saturate
        vllm_body(2**64, 2**70),  # past the bound: no record
        vllm_body(7, 9, prompt_tokens=10**400, completion=2**70),  # absurd usage
    ],
    ids=["at-int64-max", "past-int64", "absurd-usage"],
)
def test_hostile_counts_never_break_the_otlp_export(
    hostile: dict, caplog: pytest.LogCaptureFixture
) -> None:
    normal = vllm_body(7, 9)
    bodies = iter([normal, hostile, hostile, hostile, normal])
    client = mock_client(lambda request: json_response(next(bodies)))
    otel = Otel()
    try:
        with instrumented(otel):
            for _ in range(5):
                response = client.chat.completions.create(model="m", messages=canary_messages())
                assert response.choices[0].message.content == "ok"  # the user is untouched
        spans = otel.spans()
        assert len(spans) == 5
        assert otel.counter.open == 0
        with caplog.at_level(logging.ERROR, logger="opentelemetry"):
            encode_spans(spans)
            data = otel.reader.get_metrics_data()
            encode_metrics(data)  # raised EncodingException before the fix
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
        # The two normal requests are recorded whatever happened in between.
        assert otel.histogram_count(M_ACCEPTANCE_LENGTH) >= 2
        assert all(s.attributes.get(SD_ENGINE) == "vllm" for s in (spans[0], spans[-1]))
        for point in otel.points(M_DRAFT_TOKENS):
            assert 0 <= point.value <= INT64_MAX
        for span in spans:
            for key in (GEN_AI_USAGE_INPUT_TOKENS, GEN_AI_USAGE_OUTPUT_TOKENS):
                assert span.attributes.get(key, 0) <= INT64_MAX
        for point in otel.points(M_TOKEN_USAGE):
            assert point.max <= INT64_MAX
    finally:
        client.close()
        otel.shutdown()


# --------------------------------------------------------------------------- int64 property

EXAMPLES = int(os.environ.get("SPEC_DECODE_OTEL_FUZZ_EXAMPLES", "300"))

#: Any non-negative count a server could send: int64 is the edge that matters (OTLP),
#: around it and far past it too, and the small values real servers send.
counts = st.one_of(
    st.integers(0, 64),
    st.integers(0, INT64_MAX),
    st.integers(INT64_MAX - 64, INT64_MAX + 64),
    st.integers(0, 2**130),
)
#: Histogram keys (accepted draft counts) and k: around the bound, and anywhere.
keys = st.one_of(st.integers(0, MAX_SPEC_TOKENS + 3), st.integers(0, 2**70))


@st.composite
def hostile_payload(draw: Callable[[Any], Any]) -> tuple[str, dict[str, Any], bool]:
    """(shape, body, valid): a payload consistent in itself whose numbers are drawn over
    the whole int64 range; ``valid`` when every one is within record.py's bounds."""
    shape = draw(st.sampled_from(("vllm-premerge", "vllm-merged", "llamacpp")))
    usage = {"prompt_tokens": draw(counts), "completion_tokens": draw(counts), "total_tokens": 1}
    body = chat_completion(usage=usage)
    extra = draw(counts)
    if shape == "llamacpp":
        accepted = draw(counts)
        drafted = accepted + extra
        body["timings"] = {"draft_n": drafted, "draft_n_accepted": accepted}
        return shape, body, drafted <= MAX_COUNT
    if shape == "vllm-merged":
        k = draw(st.integers(0, MAX_SPEC_TOKENS + 3))
        dense = draw(st.lists(counts, min_size=k + 1, max_size=k + 1))
        hist = dict(enumerate(dense))
    else:
        k = draw(st.none() | keys)
        hist = draw(st.dictionaries(keys, counts, max_size=6))
    steps = sum(hist.values())
    accepted = sum(j * c for j, c in hist.items())
    drafted = accepted + extra
    stats = {
        "acceptance_histogram": dense
        if shape == "vllm-merged"
        else {str(j): c for j, c in hist.items()},
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
    }
    if k is not None:
        stats["num_spec_tokens"] = k
    if shape == "vllm-merged":
        body["metrics"] = {"speculative_decoding": stats}
    else:
        body["choices"][0]["speculative_decoding_stats"] = stats
    used = [j for j, c in hist.items() if c]
    valid = (
        drafted <= MAX_COUNT  # steps, accepted and every count are at most this
        and steps <= MAX_COUNT
        and all(j <= MAX_SPEC_TOKENS for j in used)
        and (k is None or (k <= MAX_SPEC_TOKENS and all(j <= k for j in used)))
    )
    return shape, body, valid


@pytest.fixture(scope="module")
def replayed() -> Iterator[dict[str, Any]]:
    """A real client, instrumented on its own, replaying ``state["body"]``."""
    state: dict[str, Any] = {"body": b"{}"}

    def respond(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, content=state["body"], headers={"content-type": "application/json"}
        )

    otel = Otel()
    client = instrument_client(
        mock_client(respond),
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
    )
    state |= {"client": client, "otel": otel}
    yield state
    client.close()
    otel.shutdown()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(drawn=hostile_payload())
def test_any_int64_or_larger_count_is_recorded_only_when_within_bounds(
    replayed: dict[str, Any], drawn: tuple[str, dict[str, Any], bool]
) -> None:
    shape, body, valid = drawn
    otel: Otel = replayed["otel"]
    otel.exporter.clear()
    replayed["body"] = json.dumps(body).encode()
    response = replayed["client"].chat.completions.create(model="m", messages=canary_messages())
    assert response.choices[0].message.content == "ok"  # the user is untouched

    (span,) = otel.spans()
    attrs = span.attributes
    event(f"{shape} {'record' if valid else 'no record'}")
    if body["usage"]["completion_tokens"] <= MAX_COUNT:
        assert (SD_ENGINE in attrs) is valid, (attrs.get(SD_OUTCOME), body)
    # else: the record's completion_tokens comes from this usage count; whether a count
    # past int64 drops only it or the whole record is not pinned here.
    if SD_ENGINE in attrs and shape != "llamacpp":
        stats = (
            body.get("metrics", {}).get("speculative_decoding")
            or (body["choices"][0]["speculative_decoding_stats"])
        )
        assert attrs[SD_NUM_SPEC_STEPS] == stats["num_spec_steps"]
        assert attrs[SD_NUM_ACCEPTED_DRAFT_TOKENS] == stats["num_accepted_draft_tokens"]
        assert attrs[SD_NUM_DRAFT_TOKENS] == stats["num_draft_tokens"]
    for key, value in attrs.items():
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, int) and not isinstance(item, bool):
                assert 0 <= item <= INT64_MAX, key
        if isinstance(value, tuple):
            assert len(value) <= MAX_SPEC_TOKENS + 1, key
    encode_spans([span])  # exportable as it is
    encode_metrics(otel.reader.get_metrics_data())
    for point in otel.points(M_DRAFT_TOKENS):
        assert 0 <= point.value <= INT64_MAX
