"""Telemetry: the names, the instruments, and ``emit`` (record → span attributes + metrics).

This module knows the record and OpenTelemetry, nothing of engines or the ``openai`` SDK.

Cost shapes the metric design. A synchronous counter add per histogram bucket and per
draft position would cost more than a whole competing instrumentation, so the four
counters are aggregated in-process (a dict update) and reported through observable
counters (cumulative). The two histograms stay synchronous because they carry exemplars
that link a metric bucket to the trace of the request that landed in it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span

from spec_decode_otel.record import MAX_COUNT, SpecDecodeAcceptanceRecord
from spec_decode_otel.version import __version__

SCOPE_NAME = "spec_decode_otel"

# GenAI semantic-convention attributes (our own string constants; the semconv package's
# GenAI names are still moving between releases).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

# Our namespace: span attributes.
SD_ENGINE = "spec_decode.engine"
SD_MEAN_ACCEPTANCE_LENGTH = "spec_decode.mean_acceptance_length"
SD_DRAFT_ACCEPTANCE_RATE = "spec_decode.draft_acceptance_rate"
SD_NUM_SPEC_STEPS = "spec_decode.num_spec_steps"
SD_NUM_ACCEPTED_DRAFT_TOKENS = "spec_decode.num_accepted_draft_tokens"
SD_NUM_DRAFT_TOKENS = "spec_decode.num_draft_tokens"
SD_NUM_SPEC_TOKENS = "spec_decode.num_spec_tokens"
SD_ACCEPTANCE_HISTOGRAM = "spec_decode.acceptance_histogram"
SD_PER_STEP_ACCEPTED = "spec_decode.per_step_accepted"
SD_PER_STEP_DRAFTED = "spec_decode.per_step_drafted"
SD_PARTIAL = "spec_decode.partial"
# Metric-only attributes.
SD_ACCEPTED = "spec_decode.accepted"
SD_POSITION = "spec_decode.position"

# Metric names.
M_ACCEPTANCE_LENGTH = "spec_decode.acceptance_length"
M_DRAFT_ACCEPTANCE_RATE = "spec_decode.draft_acceptance_rate"
M_DRAFT_TOKENS = "spec_decode.draft_tokens"
M_ACCEPTED_DRAFT_TOKENS = "spec_decode.accepted_draft_tokens"
M_VERIFY_STEPS = "spec_decode.verify_steps"
M_ACCEPTED_AT_POSITION = "spec_decode.accepted_at_position"
M_OPERATION_DURATION = "gen_ai.client.operation.duration"
M_TOKEN_USAGE = "gen_ai.client.token.usage"
M_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"

#: Acceptance length runs from 1 (nothing accepted) to k+1; quarter-token resolution up
#: to 4, then coarser up to the largest drafters in use (k of 15 or so).
ACCEPTANCE_LENGTH_BUCKETS = (
    1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0,
    4.5, 5.0, 5.5, 6.0, 7.0, 8.0, 10.0, 12.0, 16.0,
)  # fmt: skip
ACCEPTANCE_RATE_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
# The GenAI semantic conventions' advisory buckets.
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

#: Distinct values one metric attribute may take before further ones are reported as
#: ``OVERFLOW_VALUE``: a server that invents model names must not explode the time series.
MAX_VALUES_PER_ATTRIBUTE = 100
#: Histogram buckets / draft positions past this are folded into the overflow series.
MAX_DRAFT_POSITIONS = 64
OVERFLOW_VALUE = "_OTHER"


class BoundedValues:
    """Remembers the first N values seen for one attribute; later ones map to overflow."""

    __slots__ = ("_limit", "_lock", "_seen")

    def __init__(self, limit: int = MAX_VALUES_PER_ATTRIBUTE) -> None:
        self._limit = limit
        self._seen: set[Any] = set()
        self._lock = threading.Lock()

    def __call__(self, value: Any) -> Any:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self._limit:
                self._seen.add(value)
                return value
        return OVERFLOW_VALUE


class _CounterTotals:
    """Cumulative sums per attribute set, read by an observable counter's callback.

    Each attribute set's sum lives in a one-element list (a cell), so a caller that keeps
    the cell (see :class:`SpecSeries`) adds to it without hashing the attribute key again.
    The four spec-decode counters of one meter provider share one lock, so a request's
    counts are added under a single acquisition.
    """

    __slots__ = ("_lock", "_totals")

    def __init__(self, lock: threading.Lock | None = None) -> None:
        self._totals: dict[tuple[tuple[str, Any], ...], list[int]] = {}
        self._lock = lock if lock is not None else threading.Lock()

    def cell_locked(self, key: tuple[tuple[str, Any], ...]) -> list[int]:
        """The cell of ``key``, created (at 0) on first use; the caller holds the lock."""
        found = self._totals.get(key)
        if found is None:
            found = self._totals[key] = [0]
        return found

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            snapshot = [(key, found[0]) for key, found in self._totals.items()]
        return [Observation(value, dict(key)) for key, value in snapshot]


def record_attributes(record: SpecDecodeAcceptanceRecord) -> dict[str, Any]:
    """The ``spec_decode.*`` span attributes for one record (only what it reports)."""
    attrs: dict[str, Any] = {SD_ENGINE: record.engine}
    if record.mean_acceptance_length is not None:
        attrs[SD_MEAN_ACCEPTANCE_LENGTH] = record.mean_acceptance_length
    if record.draft_acceptance_rate is not None:
        attrs[SD_DRAFT_ACCEPTANCE_RATE] = record.draft_acceptance_rate
    if record.num_spec_steps is not None:
        attrs[SD_NUM_SPEC_STEPS] = record.num_spec_steps
    if record.num_accepted_draft_tokens is not None:
        attrs[SD_NUM_ACCEPTED_DRAFT_TOKENS] = record.num_accepted_draft_tokens
    if record.num_draft_tokens is not None:
        attrs[SD_NUM_DRAFT_TOKENS] = record.num_draft_tokens
    if record.num_spec_tokens is not None:
        attrs[SD_NUM_SPEC_TOKENS] = record.num_spec_tokens
    if record.acceptance_histogram is not None:
        attrs[SD_ACCEPTANCE_HISTOGRAM] = record.dense_histogram()
    if record.is_partial:
        attrs[SD_PARTIAL] = True
    return attrs


def per_step_attributes(record: SpecDecodeAcceptanceRecord, max_length: int) -> dict[str, Any]:
    """Per-step arrays as span attributes, only when present and within ``max_length``."""
    attrs: dict[str, Any] = {}
    if record.per_step_accepted is not None and len(record.per_step_accepted) <= max_length:
        attrs[SD_PER_STEP_ACCEPTED] = record.per_step_accepted
    if record.per_step_drafted is not None and len(record.per_step_drafted) <= max_length:
        attrs[SD_PER_STEP_DRAFTED] = record.per_step_drafted
    return attrs


class _MeterInstruments:
    """The instruments of one meter provider and the in-process totals behind its counters.

    Built once per meter provider and shared by every :class:`Telemetry` using it: the SDK
    hands back the first instrument registered under a name (ignoring the callbacks of a
    later registration), so re-instrumenting, or instrumenting two clients, against one
    provider would otherwise add to totals that no observable counter ever reads.
    """

    def __init__(self, meter_provider: metrics.MeterProvider | None) -> None:
        meter = metrics.get_meter(SCOPE_NAME, __version__, meter_provider=meter_provider)
        self.acceptance_length = meter.create_histogram(
            M_ACCEPTANCE_LENGTH,
            unit="{token}",
            description="Mean acceptance length per request: tokens per verify step "
            "including the bonus token",
            explicit_bucket_boundaries_advisory=ACCEPTANCE_LENGTH_BUCKETS,
        )
        self.draft_acceptance_rate = meter.create_histogram(
            M_DRAFT_ACCEPTANCE_RATE,
            unit="1",
            description="Accepted / drafted tokens per request (drafts only)",
            explicit_bucket_boundaries_advisory=ACCEPTANCE_RATE_BUCKETS,
        )
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
        self.counter_lock = threading.Lock()
        self.draft_tokens = _CounterTotals(self.counter_lock)
        self.accepted_tokens = _CounterTotals(self.counter_lock)
        self.verify_steps = _CounterTotals(self.counter_lock)
        self.accepted_at_position = _CounterTotals(self.counter_lock)
        for name, unit, totals, description in (
            (M_DRAFT_TOKENS, "{token}", self.draft_tokens, "Draft tokens proposed"),
            (M_ACCEPTED_DRAFT_TOKENS, "{token}", self.accepted_tokens, "Draft tokens accepted"),
            (M_VERIFY_STEPS, "{step}", self.verify_steps, "Verify steps by drafts accepted"),
            (
                M_ACCEPTED_AT_POSITION,
                "{token}",
                self.accepted_at_position,
                "Verify steps whose draft position was accepted",
            ),
        ):
            meter.create_observable_counter(
                name, callbacks=[totals.observe], unit=unit, description=description
            )
        self.bounded: dict[str, BoundedValues] = {}
        self.bounded_lock = threading.Lock()


_instruments_by_provider: weakref.WeakKeyDictionary[Any, _MeterInstruments] = (
    weakref.WeakKeyDictionary()
)
_instruments_lock = threading.Lock()


def _instruments_for(meter_provider: metrics.MeterProvider | None) -> _MeterInstruments:
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    with _instruments_lock:
        try:
            found = _instruments_by_provider.get(provider)
        except TypeError:  # neither hashable nor weak-referenceable: cannot share
            return _MeterInstruments(meter_provider)
        if found is None:
            found = _MeterInstruments(meter_provider)
            with contextlib.suppress(TypeError):
                _instruments_by_provider[provider] = found
        return found


#: Distinct response models / (engine, k) pairs whose derived attribute sets one
#: :class:`MetricAttributes` / :class:`ResponseSeries` caches; past that, built per call.
_SERIES_CACHE_MAX = 64


class SpecSeries:
    """One spec-decode attribute set (base + response model + engine + k): the dict the
    histograms record with, and the counter cells its counts go to, each built once."""

    __slots__ = ("_accepted", "_drafted", "_positions", "_steps", "attrs", "key")

    def __init__(self, attrs: dict[str, Any]) -> None:
        self.attrs = attrs
        self.key: tuple[tuple[str, Any], ...] = tuple(sorted(attrs.items()))
        self._drafted: list[int] | None = None
        self._accepted: list[int] | None = None
        # bucket / position (at most MAX_DRAFT_POSITIONS, then the overflow value) -> cell
        self._steps: dict[int | str, list[int]] = {}
        self._positions: dict[int | str, list[int]] = {}

    def add_counts(self, record: SpecDecodeAcceptanceRecord, counters: _MeterInstruments) -> None:
        """Add one request's counts to the four counters (under their shared lock).

        Sums saturate at MAX_COUNT (written out rather than ``min()``: a builtin call per
        cell is a measurable share of this on the caller's hot path).
        """
        drafted = record.num_draft_tokens
        accepted = record.num_accepted_draft_tokens
        hist = record.acceptance_histogram
        key = self.key
        with counters.counter_lock:
            if drafted is not None:
                found = self._drafted
                if found is None:
                    found = self._drafted = counters.draft_tokens.cell_locked(key)
                total = found[0] + drafted
                found[0] = total if total < MAX_COUNT else MAX_COUNT
            if accepted is not None:
                found = self._accepted
                if found is None:
                    found = self._accepted = counters.accepted_tokens.cell_locked(key)
                total = found[0] + accepted
                found[0] = total if total < MAX_COUNT else MAX_COUNT
            if not hist:
                return
            cells = self._steps
            for j, count in hist.items():
                bucket = j if j < MAX_DRAFT_POSITIONS else OVERFLOW_VALUE
                found = cells.get(bucket)
                if found is None:
                    found = cells[bucket] = counters.verify_steps.cell_locked(
                        (*key, (SD_ACCEPTED, bucket))
                    )
                total = found[0] + count
                found[0] = total if total < MAX_COUNT else MAX_COUNT
            # Position p was accepted by every step that accepted more than p drafts: the
            # reverse cumulative sum of the histogram (record.accepted_at_position()).
            running = 0
            cells = self._positions
            get = hist.get
            for p in range(max(hist) - 1, -1, -1):
                running += get(p + 1, 0)
                if running:
                    position = p if p < MAX_DRAFT_POSITIONS else OVERFLOW_VALUE
                    found = cells.get(position)
                    if found is None:
                        found = cells[position] = counters.accepted_at_position.cell_locked(
                            (*key, (SD_POSITION, position))
                        )
                    total = found[0] + running
                    found[0] = total if total < MAX_COUNT else MAX_COUNT


class ResponseSeries:
    """The metric attribute sets of calls sharing base attributes and a response model."""

    __slots__ = ("_spec", "_telemetry", "attrs", "input_attrs", "output_attrs")

    def __init__(self, telemetry: Telemetry, attrs: dict[str, Any]) -> None:
        self._telemetry = telemetry
        self.attrs = attrs
        self.input_attrs = {**attrs, GEN_AI_TOKEN_TYPE: "input"}
        self.output_attrs = {**attrs, GEN_AI_TOKEN_TYPE: "output"}
        self._spec: dict[tuple[Any, Any], SpecSeries] = {}

    def spec(self, engine: str, num_spec_tokens: int | None) -> SpecSeries:
        found = self._spec.get((engine, num_spec_tokens))
        if found is None:
            bound = self._telemetry.bound
            attrs = dict(self.attrs)
            attrs[SD_ENGINE] = bound(SD_ENGINE, engine)
            if num_spec_tokens is not None:
                attrs[SD_NUM_SPEC_TOKENS] = bound(SD_NUM_SPEC_TOKENS, num_spec_tokens)
            found = SpecSeries(attrs)
            if len(self._spec) < _SERIES_CACHE_MAX:
                self._spec[(engine, num_spec_tokens)] = found
        return found


class MetricAttributes:
    """A call's base metric attributes (operation, provider, request model, server, allowed
    user attributes) and, per response model, the sets derived from them.

    Instances are cached and shared by the instrumentation, so the derived sets are
    built once per distinct combination instead of once per call. Bounded values are
    stable once seen (a bounded attribute only gains values, up to its limit), so a
    cached set is exactly what building it again would give.
    """

    __slots__ = ("_by_model", "_telemetry", "base")

    def __init__(self, telemetry: Telemetry, base: dict[str, Any]) -> None:
        self._telemetry = telemetry
        self.base = base
        self._by_model: dict[str | None, ResponseSeries] = {}

    def for_response(self, response_model: str | None) -> ResponseSeries:
        """The sets for a response whose model is ``response_model`` (None: unknown)."""
        found = self._by_model.get(response_model)
        if found is None:
            attrs = self.base
            if response_model:
                attrs = dict(attrs)
                attrs[GEN_AI_RESPONSE_MODEL] = self._telemetry.bound(
                    GEN_AI_RESPONSE_MODEL, response_model
                )
            found = ResponseSeries(self._telemetry, attrs)
            if len(self._by_model) < _SERIES_CACHE_MAX:
                self._by_model[response_model] = found
        return found


class Telemetry:
    """A tracer plus the (per meter provider, shared) instruments and bounded attributes."""

    def __init__(
        self,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE_NAME, __version__, tracer_provider=tracer_provider)
        shared = _instruments_for(meter_provider)
        self.acceptance_length = shared.acceptance_length
        self.draft_acceptance_rate = shared.draft_acceptance_rate
        self.operation_duration = shared.operation_duration
        self.token_usage = shared.token_usage
        self.time_to_first_chunk = shared.time_to_first_chunk
        self._draft_tokens = shared.draft_tokens
        self._accepted_tokens = shared.accepted_tokens
        self._verify_steps = shared.verify_steps
        self._accepted_at_position = shared.accepted_at_position
        self._counters = shared
        self._bounded = shared.bounded
        self._bounded_lock = shared.bounded_lock

    def bound(self, key: str, value: Any) -> Any:
        """``value`` for metric attribute ``key``, or the overflow value past the limit."""
        bounded = self._bounded.get(key)
        if bounded is None:
            with self._bounded_lock:
                bounded = self._bounded.setdefault(key, BoundedValues())
        return bounded(value)

    def metric_attributes(self, base: dict[str, Any]) -> MetricAttributes:
        """Wrap a call's base metric attributes (see :class:`MetricAttributes`)."""
        return MetricAttributes(self, base)

    def record_metrics(
        self,
        record: SpecDecodeAcceptanceRecord,
        attributes: Mapping[str, Any] | ResponseSeries,
        span: Span | None,
        context: Any = None,
    ) -> None:
        """Record one request's spec-decode metrics, with the span's context for exemplars.

        ``attributes`` is the call's metric attribute set (a plain mapping, or the cached
        :class:`ResponseSeries` the instrumentation passes); ``context``, when given, is
        ``span``'s context already made by the caller.
        """
        if not isinstance(attributes, ResponseSeries):
            attributes = ResponseSeries(self, dict(attributes))
        series = attributes.spec(record.engine, record.num_spec_tokens)
        attrs = series.attrs
        ctx = context
        if ctx is None and span is not None:
            ctx = trace.set_span_in_context(span)
        if record.mean_acceptance_length is not None:
            self.acceptance_length.record(record.mean_acceptance_length, attrs, context=ctx)
        if record.draft_acceptance_rate is not None:
            self.draft_acceptance_rate.record(record.draft_acceptance_rate, attrs, context=ctx)

        series.add_counts(record, self._counters)
