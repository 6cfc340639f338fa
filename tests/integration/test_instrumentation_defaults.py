"""What one line of ``instrument()`` emits with no options: spec-decode data only.

The GenAI client metrics (duration, token usage, time to first chunk) are opt-in: they
are not spec-decode data, a GenAI instrumentation such as openai-v2 already records them,
and each is another synchronous histogram record on the caller's hot path. The other
integration tests run with them on (the ``instrumented`` fixture); these pin the default.
"""

from __future__ import annotations

from typing import Any

import pytest
from instrumentation_helpers import Otel, call_async, call_sync, request_kwargs

from spec_decode_otel.instrumentation.genai_metrics import (
    M_OPERATION_DURATION,
    M_TIME_TO_FIRST_CHUNK,
    M_TOKEN_USAGE,
)
from spec_decode_otel.telemetry import (
    M_ACCEPTANCE_LENGTH,
    M_ACCEPTED_AT_POSITION,
    M_ACCEPTED_DRAFT_TOKENS,
    M_DRAFT_ACCEPTANCE_RATE,
    M_DRAFT_TOKENS,
    M_VERIFY_STEPS,
)

SPEC_DECODE_METRICS = {
    M_ACCEPTANCE_LENGTH,
    M_DRAFT_ACCEPTANCE_RATE,
    M_DRAFT_TOKENS,
    M_ACCEPTED_DRAFT_TOKENS,
    M_VERIFY_STEPS,
    M_ACCEPTED_AT_POSITION,
}
GENAI_METRICS = {M_OPERATION_DURATION, M_TOKEN_USAGE, M_TIME_TO_FIRST_CHUNK}


def metric_names(otel: Otel) -> set[str]:
    return {m.name for _, m in otel.metrics() if any(True for _ in m.data.data_points)}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_default_instrumentation_records_spec_decode_metrics_and_no_genai_ones(
    mode: str, stream: bool, otel: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    otel.instrument()
    kwargs = request_kwargs("vllm", "chat", stream, 401)
    if mode == "sync":
        call_sync(openai_client, "chat", kwargs)
    else:
        await call_async(async_openai_client, "chat", kwargs)

    names = metric_names(otel)
    assert names >= SPEC_DECODE_METRICS
    assert not names & GENAI_METRICS
    span = otel.only_span()
    assert span.attributes["spec_decode.engine"] == "vllm"
    # the span still carries the GenAI usage attributes: only the metrics are opt-in
    assert span.attributes["gen_ai.usage.output_tokens"] > 0


def test_genai_metrics_are_turned_on_by_keyword(otel: Otel, openai_client: Any) -> None:
    otel.instrument(genai_metrics=True)
    call_sync(openai_client, "chat", request_kwargs("vllm", "chat", True, 402))
    assert metric_names(otel) >= SPEC_DECODE_METRICS | GENAI_METRICS


def test_genai_metrics_are_turned_on_by_environment(
    otel: Otel, openai_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPEC_DECODE_OTEL_GENAI_METRICS", "true")
    otel.instrument()
    call_sync(openai_client, "chat", request_kwargs("sglang", "chat", False, 403))
    names = metric_names(otel)
    assert {M_OPERATION_DURATION, M_TOKEN_USAGE} <= names
    assert M_TIME_TO_FIRST_CHUNK not in names  # not a stream
