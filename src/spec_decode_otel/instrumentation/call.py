"""One instrumented call: its span, and its single end.

The wrapper makes a ``Call`` when a request starts and hands it whatever the SDK
returned; the ``Call`` ends exactly once — with a response object, a raw JSON body, a
stream's kept chunks, or an error — and only then detects the record and emits
telemetry. Every way of ending swallows its own failures: instrumentation must never
raise into user code, and the span is ended whatever happens.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode

from spec_decode_otel._logging import report_internal_error
from spec_decode_otel.adapters.registry import Detection, detect_outcome
from spec_decode_otel.capture import ParsedResponse, sdk_choices, usage_view
from spec_decode_otel.instrumentation.genai_metrics import GenAiMetrics
from spec_decode_otel.instrumentation.hints import hints
from spec_decode_otel.outcome import Outcome
from spec_decode_otel.record import MAX_COUNT
from spec_decode_otel.telemetry import (
    ERROR_TYPE,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    SD_OUTCOME,
    SD_READ_TO_END,
    SpecDecodeInstruments,
    record_attributes,
)

#: Finish reasons put on a span at most (one per sequence; a server may send thousands).
MAX_FINISH_REASONS = 16
#: Longest model name or finish reason taken from a server. A longer one is left out, as
#: unknown: cut short it would be a name the server never sent, and whole it would put
#: however much the server sent on every span and in a metric series.
MAX_SERVER_TEXT = 256


@dataclass(frozen=True)
class CallPlan:
    """What the wrapper decided when the request started."""

    instruments: SpecDecodeInstruments
    span: Span
    #: True: our span, which we end; False: someone else's span we add ``spec_decode.*``
    #: to, and nothing else (no status, no ``error.type``, no usage).
    own_span: bool
    #: The call's metric attributes (operation, provider, request model, server, allowed
    #: user attributes), values already bounded; unknown values are left out.
    metric_attributes: Mapping[str, Any]
    #: Set when the GenAI client metrics are recorded for this call.
    genai_metrics: GenAiMetrics | None
    #: Longest per-step array put on the span; None: per-step arrays are not recorded.
    per_step_max_length: int | None
    #: Sequences the request asked for (``n``, times the prompts of a completion).
    requested_sequences: int
    #: ``host:port``, for the hints.
    server: str
    streaming: bool
    #: The stream asked for the usage chunk (by the user or by us).
    include_usage: bool
    #: A context holding ``span``: the histogram records take it for their exemplars.
    context: Context
    #: The JSON body as sent, for adapters whose reading depends on the request (e.g.
    #: usage counts that are Predicted Outputs when the request carried ``prediction``).
    #: Only adapters read it; nothing of it is recorded.
    request: Mapping[str, Any] | None = None
    #: When enriching: starts a span of ours (a child of ``span``, dated from the given
    #: ``time_ns``) for a record that arrives after ``span`` ended. Some instrumentations
    #: end theirs before the body is read (OpenLLMetry 0.62.4 on ``with_raw_response`` /
    #: ``with_streaming_response`` streams) or as their stream wrapper is reclaimed,
    #: before ours is: attributes set on an ended span are dropped.
    late_span: Callable[[int], Span] | None = None
    #: A Responses API call: its usage counts are read by that API's names first (a
    #: gateway may send both namings; the user's code reads those of the API it called).
    responses_api: bool = False


class Call:
    """State of one chat/completions call from request start to its single end."""

    def __init__(self, plan: CallPlan) -> None:
        self.plan = plan
        self.started = time.perf_counter()
        self.started_ns = time.time_ns()
        #: (``perf_counter``, ``time_ns``) when its dropped stream or response was
        #: reclaimed: the end runs later, on the finalizer thread, but is dated then.
        self.reclaimed_at: tuple[float, int] | None = None
        #: The process that made the call: a forked child's copy is the parent's to end.
        self.pid = os.getpid()
        self._done = False
        self._lock = threading.Lock()
        #: The span of ours started for a record that outlived the enriched span.
        self._late_span: Span | None = None

    @property
    def done(self) -> bool:
        return self._done

    def reclaimed(self) -> bool:
        """Its proxy was reclaimed by the garbage collector: date the end now, and say
        whether it is this process's to end (not when it is done, nor in a forked child
        dropping its copy of the parent's call, which the parent ends). Called from
        ``__del__``, so it takes no lock."""
        if self._done or self.pid != os.getpid():
            return False
        self.reclaimed_at = (time.perf_counter(), time.time_ns())
        return True

    # -- the ways a call ends ------------------------------------------------------

    def finish_object(self, obj: Any) -> None:
        """A parsed SDK object (ChatCompletion, Completion, ParsedChatCompletion, or a
        Responses API ``Response``)."""
        self._end_once(
            lambda: self._end(
                [ParsedResponse.from_sdk(obj, self.plan.request)],
                response_model=getattr(obj, "model", None),
                finish_reasons=finish_reasons(obj),
                usage=getattr(obj, "usage", None),
                failure=responses_failure(obj),
            )
        )

    def finish_dict(self, body: Any) -> None:
        """A raw JSON body (with_raw_response, or ``.json()`` on a streamed response)."""
        self._end_once(lambda: self._end_dict(body))

    def _end_dict(self, body: Any) -> None:
        parsed = (
            ParsedResponse.from_dict(body, self.plan.request) if isinstance(body, Mapping) else None
        )
        if parsed is None:
            self._end([])
            return
        self._end(
            [parsed],
            response_model=body.get("model"),
            finish_reasons=finish_reasons(body),
            usage=parsed.usage,
            failure=responses_failure(body),
        )

    def finish_stream(
        self,
        chunks: Sequence[Any],
        *,
        response_model: str | None,
        finish_reasons: Sequence[str],
        multi_sequence: bool,
        first_chunk_at: float | None,
        read_to_end: bool,
        error: BaseException | None = None,
        failure: str | None = None,
    ) -> None:
        """A stream ended (exhausted, failed, or stopped early) with these chunks kept;
        ``failure`` is the Responses event that said the response failed."""

        def end() -> None:
            self._end(
                []
                if multi_sequence
                else [p for c in chunks if (p := _parsed_chunk(c, self.plan.request))],
                response_model=response_model,
                finish_reasons=finish_reasons,
                usage=next(filter(None, map(_chunk_usage, reversed(chunks))), None),
                error=error,
                failure=failure,
                first_chunk_at=first_chunk_at,
                read_to_end=read_to_end,
                multi_sequence=multi_sequence,
            )

        self._end_once(end)

    def finish_error(self, error: BaseException) -> None:
        """The request raised (the exception itself is re-raised by the wrapper)."""
        self._end_once(lambda: self._end([], error=error))

    def finish_empty(self, *, read_to_end: bool = True) -> None:
        """Ended without a body we can read; ``read_to_end=False`` when the user closed
        a raw response without reading its body."""
        self._end_once(lambda: self._end([], read_to_end=read_to_end))

    # -- emission --------------------------------------------------------------

    def _end_once(self, end: Callable[[], None]) -> None:
        """Run ``end`` unless the call has ended; a failure still ends our span. So does
        what is no failure of ours (Ctrl-C, ``sys.exit()`` from a log handler or span
        processor it calls), which then goes on to the caller: the call counts as ended
        from here on, so nothing else would end the span. A forked child's copy of the
        parent's call (a stream it inherited and closes or reads) is the parent's to end:
        ending it here too would export the parent's span twice."""
        if self.pid != os.getpid():
            return
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            end()
        except Exception:
            report_internal_error("call end")
            self._end_span_left_open()
        except BaseException:
            self._end_span_left_open()
            raise

    def _end_span_left_open(self) -> None:
        span = self.plan.span if self.plan.own_span else self._late_span
        if span is not None and span.is_recording():
            try:
                span.end()
            except Exception:
                report_internal_error("span.end")

    def _end(
        self,
        responses: list[ParsedResponse],
        *,
        response_model: Any = None,
        finish_reasons: Sequence[Any] = (),
        usage: Any = None,
        error: BaseException | None = None,
        failure: str | None = None,
        first_chunk_at: float | None = None,
        read_to_end: bool = True,
        multi_sequence: bool = False,
    ) -> None:
        reclaimed_at = self.reclaimed_at
        ended = time.perf_counter() if reclaimed_at is None else reclaimed_at[0]
        plan = self.plan
        if error is not None and not isinstance(error, Exception):
            # Cancelled or interrupted (CancelledError, KeyboardInterrupt): the caller
            # stopped waiting; the call did not fail. OTel's use_span and util-genai's
            # stream wrappers count only an Exception as an error.
            error, read_to_end = None, False
        first_chunk = None if first_chunk_at is None else first_chunk_at - self.started
        counts = usage_view(usage, plan.responses_api) or {}
        input_tokens = counts.get("prompt_tokens")
        output_tokens = counts.get("completion_tokens")
        input_tokens = input_tokens if _is_count(input_tokens) else None
        output_tokens = output_tokens if _is_count(output_tokens) else None
        response_model = response_model if is_short_text(response_model) else None

        detection = self._detect(responses, multi_sequence)
        outcome = detection.outcome
        if error is not None or failure is not None:
            outcome = Outcome.ERROR
        elif not read_to_end and outcome is Outcome.NO_STATS:
            outcome = Outcome.NOT_READ_TO_END
        record = detection.record

        attrs: dict[str, Any] = {SD_OUTCOME: outcome.value}
        if record is not None:
            attrs.update(record_attributes(record, plan.per_step_max_length))
        if not read_to_end:
            attrs[SD_READ_TO_END] = False
        error_type = type(error).__qualname__ if error is not None else failure
        span, own_span = plan.span, plan.own_span
        if not own_span and plan.late_span is not None and not span.is_recording():
            # The enriched span was recording when the call started: it has ended since.
            span = self._late_span = plan.late_span(self.started_ns)
            own_span = True
        if own_span:
            if response_model is not None:
                attrs[GEN_AI_RESPONSE_MODEL] = response_model
            if input_tokens is not None:
                attrs[GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
            if output_tokens is not None:
                attrs[GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
            reasons = [r for r in finish_reasons[:MAX_FINISH_REASONS] if is_short_text(r)]
            if reasons:
                attrs[GEN_AI_RESPONSE_FINISH_REASONS] = reasons
            if error_type is not None:
                attrs[ERROR_TYPE] = error_type
        if span.is_recording():
            span.set_attributes(attrs)
            if own_span and error_type is not None:
                span.set_status(Status(StatusCode.ERROR, error_type))

        instruments = plan.instruments
        call_series: Mapping[str, Any] = plan.metric_attributes
        if response_model is not None:
            call_series = {
                **call_series,
                GEN_AI_RESPONSE_MODEL: instruments.bound(GEN_AI_RESPONSE_MODEL, response_model),
            }
        series = instruments.series(call_series, record)
        context = plan.context
        if record is not None:
            instruments.record(record, series, context)
        instruments.count_request(outcome, series)
        if plan.genai_metrics is not None:
            plan.genai_metrics.record(
                instruments.series(call_series, None),
                context,
                duration=ended - self.started,
                time_to_first_chunk=first_chunk,
                error_type=error_type,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
            )
        hints.observe(
            plan.server,
            outcome,
            streaming=plan.streaming,
            include_usage=plan.include_usage,
            reason=detection.reason,
            engine=record.engine if record is not None else None,
        )
        if own_span:
            span.end(None if reclaimed_at is None else reclaimed_at[1])

    def _detect(self, responses: list[ParsedResponse], multi_sequence: bool) -> Detection:
        if multi_sequence or self.plan.requested_sequences > 1:
            return Detection(None, Outcome.MULTI_SEQUENCE)
        return detect_outcome(responses)


#: Why a Responses API response is ``incomplete`` → a GenAI finish reason; another
#: reason is given as sent.
_INCOMPLETE_REASONS: Mapping[str, str] = {
    "max_output_tokens": "length",
    "content_filter": "content_filter",
}


def responses_finish_reason(response: Any) -> str | None:
    """A Responses API response's finish reason, as genai-openai maps its status
    (opentelemetry-util-genai's ``response_extractors.py``, ``_finish_reason_from_status``):
    ``completed`` is ``stop``, ``failed`` and ``cancelled`` are ``error``, ``incomplete``
    is its reason (``max_output_tokens`` is ``length``), or ``incomplete`` without one;
    None for any other status. ``response`` is an SDK object or its decoded JSON."""
    status = field_of(response, "status")
    if status == "completed":
        return "stop"
    if status in ("failed", "cancelled"):
        return "error"
    if status != "incomplete":
        return None
    reason = field_of(field_of(response, "incomplete_details"), "reason")
    if not isinstance(reason, str):
        return "incomplete"
    return _INCOMPLETE_REASONS.get(reason, reason)


def responses_failure(response: Any) -> str | None:
    """``response.failed`` for a Responses API response the server says failed (a 200
    answer with ``status: failed``, which the SDK returns without raising), else None.
    ``response`` is an SDK object or its decoded JSON."""
    return "response.failed" if field_of(response, "status") == "failed" else None


def finish_reasons(body: Any) -> list[Any]:
    """Each choice's finish reason; for a Responses API response, its status's. ``body``
    is an SDK object or its decoded JSON."""
    if isinstance(body, Mapping):
        choices = body.get("choices")
        choices = choices if isinstance(choices, list) else ()
    else:
        choices = sdk_choices(body)
    if choices:
        return [field_of(c, "finish_reason") for c in choices[:MAX_FINISH_REASONS]]
    reason = responses_finish_reason(body)
    return [reason] if reason is not None else []


def _parsed_chunk(chunk: Any, request: Mapping[str, Any] | None) -> ParsedResponse | None:
    """A kept chunk: an SDK object, or the JSON of one a raw reader read."""
    if isinstance(chunk, Mapping):
        return ParsedResponse.from_dict(chunk, request)
    return ParsedResponse.from_sdk(chunk, request)


def field_of(obj: Any, name: str) -> Any:
    """``obj.name``, or ``obj[name]`` of a decoded JSON object; None for None."""
    if obj is None:
        return None
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _chunk_usage(chunk: Any) -> Any:
    """A chunk's usage; for a Responses stream event, its response's."""
    usage = field_of(chunk, "usage")
    return usage if usage is not None else field_of(field_of(chunk, "response"), "usage")


def is_short_text(value: Any) -> bool:
    """A name (a model, a finish reason) that can go on a span and into a metric series:
    not empty, not longer than ``MAX_SERVER_TEXT``, and with a UTF-8 form. JSON can spell
    a lone surrogate, which has none and which the OTLP encoder therefore drops, with a
    logged exception on every export."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_SERVER_TEXT:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _is_count(value: Any) -> bool:
    # Usage comes from the server: an int beyond int64 cannot be exported (and one beyond
    # any float makes the SDK's Histogram.record raise), so it counts as absent.
    return type(value) is int and 0 <= value <= MAX_COUNT
