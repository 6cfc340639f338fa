"""One instrumented call: its span, what it collected, and its single finalization.

The wrappers create a ``Call`` when a request starts and hand it whatever the SDK
returned; the ``Call`` ends exactly once — with a response object, a raw JSON body, a
stream's collected chunks, an error, or abandonment — and only then emits telemetry.
Every public method here swallows its own failures: instrumentation must never raise
into user code.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import Span, Status, StatusCode, set_span_in_context

from spec_decode_otel._logging import rate_limited
from spec_decode_otel.adapters.registry import detect
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import MAX_COUNT, SpecDecodeAcceptanceRecord
from spec_decode_otel.telemetry import (
    ERROR_TYPE,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    MetricAttributes,
    ResponseSeries,
    Telemetry,
    per_step_attributes,
    record_attributes,
)

ABANDONED = "abandoned"


def report_internal_error(where: str) -> None:
    """Instrumentation bugs go to a rate-limited debug log, never to the caller."""
    rate_limited.log(
        logging.DEBUG,
        f"internal:{where}",
        "spec_decode_otel internal error in %s",
        where,
        exc_info=True,
    )


class Call:
    """State of one chat/completions call from request start to its single end."""

    __slots__ = (
        "_done",
        "_lock",
        "context",
        "genai_metrics",
        "metric_attributes",
        "own_span",
        "per_step_max_length",
        "record_per_step",
        "requested_sequences",
        "span",
        "start",
        "telemetry",
    )

    def __init__(
        self,
        telemetry: Telemetry,
        span: Span,
        own_span: bool,
        metric_attributes: MetricAttributes,
        genai_metrics: bool,
        record_per_step: bool,
        per_step_max_length: int,
        requested_sequences: int = 1,
        context: Any = None,
    ) -> None:
        self.telemetry = telemetry
        self.span = span
        #: A context holding ``span``, made once: the wrapper attaches it for the request
        #: and the histogram records take it for their exemplars. None: made at the end.
        self.context = context
        self.own_span = own_span
        self.metric_attributes = metric_attributes
        self.genai_metrics = genai_metrics
        self.record_per_step = record_per_step
        self.per_step_max_length = per_step_max_length
        #: Sequences the request asked for (``n``, times the prompts of a completion
        #: with several): a stream proxy that knows the call wants one sequence can skip
        #: per-chunk bookkeeping for several.
        self.requested_sequences = requested_sequences
        self.start = time.perf_counter()
        self._done = False
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self._done

    def _claim(self) -> bool:
        with self._lock:
            if self._done:
                return False
            self._done = True
            return True

    # -- the ways a call ends ------------------------------------------------------

    def finish_object(self, obj: Any) -> None:
        """A parsed SDK object (ChatCompletion, Completion, ParsedChatCompletion)."""
        if not self._claim():
            return
        try:
            usage = getattr(obj, "usage", None)
            self._end(
                [ParsedResponse.from_sdk(obj)],
                response_model=getattr(obj, "model", None),
                finish_reasons=[getattr(c, "finish_reason", None) for c in obj.choices or ()],
                input_tokens=getattr(usage, "prompt_tokens", None),
                output_tokens=getattr(usage, "completion_tokens", None),
            )
        except Exception:
            report_internal_error("finish_object")
            self._end_span_safely()

    def finish_dict(self, body: Any) -> None:
        """A raw JSON body (with_raw_response, or ``.json()`` on a streamed response)."""
        if not self._claim():
            return
        try:
            parsed = ParsedResponse.from_dict(body) if isinstance(body, Mapping) else None
            if parsed is None:
                self._end([])
                return
            usage = parsed.usage or {}
            self._end(
                [parsed],
                response_model=_str_or_none(parsed.root.get("model")),
                finish_reasons=[c.get("finish_reason") for c in parsed.choices],
                input_tokens=usage.get("prompt_tokens"),
                output_tokens=usage.get("completion_tokens"),
            )
        except Exception:
            report_internal_error("finish_dict")
            self._end_span_safely()

    def finish_stream(
        self,
        chunks: Sequence[Any],
        *,
        response_model: str | None,
        finish_reasons: Sequence[str],
        multi_sequence: bool,
        first_chunk_at: float | None,
        error: BaseException | str | None = None,
    ) -> None:
        """A stream ended (exhausted, failed, closed or abandoned) with these chunks kept."""
        if not self._claim():
            return
        try:
            responses = [] if multi_sequence else [ParsedResponse.from_sdk(c) for c in chunks]
            input_tokens = output_tokens = None
            for chunk in reversed(chunks):
                usage = getattr(chunk, "usage", None)
                if usage is not None:
                    input_tokens = getattr(usage, "prompt_tokens", None)
                    output_tokens = getattr(usage, "completion_tokens", None)
                    break
            self._end(
                responses,
                response_model=response_model,
                finish_reasons=finish_reasons,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                error=error,
                first_chunk_at=first_chunk_at,
            )
        except Exception:
            report_internal_error("finish_stream")
            self._end_span_safely()

    def finish_error(self, error: BaseException | str) -> None:
        """The request raised (the exception itself is re-raised by the wrapper)."""
        if not self._claim():
            return
        try:
            self._end([], error=error)
        except Exception:
            report_internal_error("finish_error")
            self._end_span_safely()

    def finish_empty(self) -> None:
        """Ended without a body we can read (e.g. a raw response closed unread)."""
        if not self._claim():
            return
        try:
            self._end([])
        except Exception:
            report_internal_error("finish_empty")
            self._end_span_safely()

    # -- emission --------------------------------------------------------------

    def _end(
        self,
        responses: list[ParsedResponse],
        *,
        response_model: Any = None,
        finish_reasons: Sequence[Any] = (),
        input_tokens: Any = None,
        output_tokens: Any = None,
        error: BaseException | str | None = None,
        first_chunk_at: float | None = None,
    ) -> None:
        end = time.perf_counter()
        span = self.span
        telemetry = self.telemetry
        record: SpecDecodeAcceptanceRecord | None = detect(responses) if responses else None
        attrs: dict[str, Any] = {}
        if not (isinstance(response_model, str) and response_model):
            response_model = None
        else:
            attrs[GEN_AI_RESPONSE_MODEL] = response_model
        series = self.metric_attributes.for_response(response_model)
        # Counts that fail _is_count are absent, for the span and the metrics alike.
        if _is_count(input_tokens):
            attrs[GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
        else:
            input_tokens = None
        if _is_count(output_tokens):
            attrs[GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
        else:
            output_tokens = None
        reasons = [r for r in finish_reasons if isinstance(r, str)]
        if reasons:
            attrs[GEN_AI_RESPONSE_FINISH_REASONS] = reasons
        if record is not None:
            attrs.update(record_attributes(record))
            if self.record_per_step:
                attrs.update(per_step_attributes(record, self.per_step_max_length))
        error_type = None
        if error is not None:
            error_type = error if isinstance(error, str) else type(error).__qualname__
            attrs[ERROR_TYPE] = error_type
        if span.is_recording():
            span.set_attributes(attrs)
            if error_type is not None:
                span.set_status(Status(StatusCode.ERROR, error_type))
        if record is not None or self.genai_metrics:
            ctx = self.context  # exemplars link each record to this span
            if ctx is None:
                ctx = set_span_in_context(span)
            if record is not None:
                telemetry.record_metrics(record, series, span, ctx)
            if self.genai_metrics:
                self._genai_metrics(
                    series, ctx, end, error_type, input_tokens, output_tokens, first_chunk_at
                )
        if self.own_span:
            span.end()

    def _genai_metrics(
        self,
        series: ResponseSeries,
        ctx: Any,
        end: float,
        error_type: str | None,
        input_tokens: Any,
        output_tokens: Any,
        first_chunk_at: float | None,
    ) -> None:
        telemetry = self.telemetry
        attrs = series.attrs
        if error_type is not None:
            attrs = {**attrs, ERROR_TYPE: error_type}
        telemetry.operation_duration.record(end - self.start, attrs, context=ctx)
        if first_chunk_at is not None:
            telemetry.time_to_first_chunk.record(first_chunk_at - self.start, attrs, context=ctx)
        # Token usage carries the token type, not error.type (as before an error).
        if input_tokens is not None:  # already checked by _end
            telemetry.token_usage.record(input_tokens, series.input_attrs, context=ctx)
        if output_tokens is not None:
            telemetry.token_usage.record(output_tokens, series.output_attrs, context=ctx)

    def _end_span_safely(self) -> None:
        if self.own_span:
            try:
                self.span.end()
            except Exception:
                report_internal_error("span.end")


def _is_count(value: Any) -> bool:
    # Usage comes from the server: an int beyond int64 cannot be exported (and one beyond
    # any float makes the SDK's Histogram.record raise), so it counts as absent.
    return type(value) is int and 0 <= value <= MAX_COUNT


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
