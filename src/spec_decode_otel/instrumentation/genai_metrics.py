"""The GenAI semantic-convention client metrics (opt-in: ``genai_metrics=True``).

Not spec-decode data: duration, token usage and time to first chunk, for users who run
no other GenAI instrumentation. Off by default, and never recorded for a call whose span
belongs to another GenAI instrumentation (it records them itself; twice would double
every GenAI dashboard).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import Context

from spec_decode_otel.telemetry import ERROR_TYPE, GEN_AI_TOKEN_TYPE, SCOPE_NAME
from spec_decode_otel.version import __version__

M_OPERATION_DURATION = "gen_ai.client.operation.duration"
M_TOKEN_USAGE = "gen_ai.client.token.usage"
M_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"

# The GenAI semantic conventions' advisory buckets.
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip


class GenAiMetrics:
    """The three GenAI client histograms of one meter provider."""

    def __init__(self, meter_provider: metrics.MeterProvider | None) -> None:
        meter = metrics.get_meter(SCOPE_NAME, __version__, meter_provider=meter_provider)
        self.operation_duration = meter.create_histogram(
            M_OPERATION_DURATION,
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.token_usage = meter.create_histogram(
            M_TOKEN_USAGE,
            unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.time_to_first_chunk = meter.create_histogram(
            M_TIME_TO_FIRST_CHUNK,
            unit="s",
            description="Time from request start to the first streamed chunk",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )

    def record(
        self,
        series: Mapping[str, Any],
        context: Context | None,
        *,
        duration: float,
        time_to_first_chunk: float | None,
        error_type: str | None,
        input_tokens: int | None,
        output_tokens: int | None,
    ) -> None:
        attrs = dict(series) if error_type is None else {**series, ERROR_TYPE: error_type}
        self.operation_duration.record(duration, attrs, context=context)
        if time_to_first_chunk is not None:
            # The first chunk came: how the stream ended later is not its attribute (the
            # convention's table for this metric has no error.type).
            self.time_to_first_chunk.record(time_to_first_chunk, dict(series), context=context)
        # Token usage carries the token type, not error.type.
        for token_type, tokens in (("input", input_tokens), ("output", output_tokens)):
            if tokens is not None:
                self.token_usage.record(
                    tokens, {**series, GEN_AI_TOKEN_TYPE: token_type}, context=context
                )
