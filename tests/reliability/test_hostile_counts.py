"""Counts a hostile server can send that OTLP cannot carry.

OTLP integers are int64. Before the fix, a consistent payload with counts past 2**63-1
gave a valid record; its span attributes were dropped at encoding, and its counter totals
(cumulative, so forever) made EVERY later metrics export of the process fail. Usage token
counts past any float made the SDK's ``Histogram.record`` raise. Now such counts are
rejected (record) or treated as absent (usage), and counter totals saturate at int64.
"""

from __future__ import annotations

import logging

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from reliability_helpers import Otel, canary_messages, instrumented, json_response, mock_client

from spec_decode_otel import SpecDecodeAcceptanceRecord, record_from_json
from spec_decode_otel.instrumentation.genai_metrics import (
    M_TOKEN_USAGE,
)
from spec_decode_otel.record import MAX_COUNT
from spec_decode_otel.telemetry import (
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    M_ACCEPTANCE_LENGTH,
    M_DRAFT_TOKENS,
    SD_ENGINE,
)

INT64_MAX = 2**63 - 1


def vllm_body(steps: int, drafted: int, *, prompt_tokens: int = 5, completion: int = 3) -> dict:
    """A self-consistent merged-vLLM response where every step accepted nothing (k = 0)."""
    return {
        "id": "resp-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": 8,
        },
        "metrics": {
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
    }


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
