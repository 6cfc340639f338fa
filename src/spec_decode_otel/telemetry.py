"""Telemetry: the record as OpenTelemetry span attributes and ``spec_decode.*`` metrics.

This module knows the record and the OpenTelemetry API, nothing of engines or the
``openai`` SDK.

The two histograms are recorded synchronously with the span's context, so their
exemplars link a bucket to the trace of the request that landed in it. The counters are
summed in-process and reported through observable counters (cumulative): a request adds
to one series per histogram bucket and per draft position, and a synchronous add for
each would cost more than everything else the instrumentation does.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation

from spec_decode_otel._fork import fork_safe_lock
from spec_decode_otel.outcome import Outcome
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
SD_DRAFT_METHOD = "spec_decode.draft_method"
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
#: Why the call has (or has no) record: one of :class:`spec_decode_otel.outcome.Outcome`.
SD_OUTCOME = "spec_decode.outcome"
#: False on a stream the user stopped reading before its end (never an error).
SD_READ_TO_END = "spec_decode.read_to_end"
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
M_REQUESTS = "spec_decode.requests"

#: Acceptance length runs from 1 (nothing accepted) to k+1; quarter-token resolution up
#: to 4, where model drafters (EAGLE, MTP, a draft model) usually land, then coarser up
#: to 65: n-gram and suffix drafters run with k of 32 or 64, and MAX_DRAFT_POSITIONS
#: (64) is the largest k whose positions get series of their own. The boundaries up to
#: 16 are those of earlier releases, so quantiles below 16 still add up across a fleet
#: that mixes versions.
ACCEPTANCE_LENGTH_BUCKETS = (
    1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0,
    4.5, 5.0, 5.5, 6.0, 7.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0, 48.0, 65.0,
)  # fmt: skip
ACCEPTANCE_RATE_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

#: Distinct values one metric attribute may take before further ones are reported as
#: ``OVERFLOW_VALUE``: a server that invents model names must not explode the time series.
MAX_VALUES_PER_ATTRIBUTE = 100
#: Histogram buckets / draft positions past this are folded into the overflow series.
MAX_DRAFT_POSITIONS = 64
OVERFLOW_VALUE = "_OTHER"
#: Distinct attribute sets of a histogram of ours (its series), and of a counter (its
#: series times the accepted counts, positions or outcomes). Each attribute is bounded on
#: its own, but the values a server chooses multiply: response models times k times
#: positions went past the SDK's own limit (2,000 per metric by default), whose overflow
#: series then took every later series, a well-behaved server's too. Past these, a new
#: combination has the server's values folded into ``OVERFLOW_VALUE`` and keeps the rest.
MAX_SERIES = 500
MAX_POINTS = 1500
#: Attribute sets kept past those limits with the server's values folded. The caller's
#: values multiply too (request models times servers times ports times tenants, each
#: bounded on its own); past this room a new set keeps only ``OWN_VALUES``.
FOLDED_ROOM = 300
#: The metric attributes whose values the server chooses.
SERVER_CHOSEN = frozenset({GEN_AI_RESPONSE_MODEL, SD_NUM_SPEC_TOKENS, SD_ACCEPTED, SD_POSITION})
#: The metric attributes whose values come from a small set this package (or an adapter)
#: defines: never folded.
OWN_VALUES = frozenset({GEN_AI_OPERATION_NAME, GEN_AI_PROVIDER_NAME, SD_ENGINE, SD_OUTCOME})


def record_attributes(
    record: SpecDecodeAcceptanceRecord, per_step_max_length: int | None = None
) -> dict[str, Any]:
    """The ``spec_decode.*`` span attributes for one record (only what it reports).

    Per-step arrays are included when ``per_step_max_length`` is given and they fit it.
    Every array here is bounded: the histogram by ``MAX_SPEC_TOKENS`` (the record's own
    bound), the per-step arrays by ``per_step_max_length``.
    """
    attrs: dict[str, Any] = {SD_ENGINE: record.engine}
    optional = (
        (SD_DRAFT_METHOD, record.draft_method),
        (SD_MEAN_ACCEPTANCE_LENGTH, record.mean_acceptance_length),
        (SD_DRAFT_ACCEPTANCE_RATE, record.draft_acceptance_rate),
        (SD_NUM_SPEC_STEPS, record.num_spec_steps),
        (SD_NUM_ACCEPTED_DRAFT_TOKENS, record.num_accepted_draft_tokens),
        (SD_NUM_DRAFT_TOKENS, record.num_draft_tokens),
        (SD_NUM_SPEC_TOKENS, record.num_spec_tokens),
    )
    attrs.update((name, value) for name, value in optional if value is not None)
    if record.acceptance_histogram is not None:
        attrs[SD_ACCEPTANCE_HISTOGRAM] = record.dense_histogram()
    if record.is_partial:
        attrs[SD_PARTIAL] = True
    if per_step_max_length is not None:
        for name, array in (
            (SD_PER_STEP_ACCEPTED, record.per_step_accepted),
            (SD_PER_STEP_DRAFTED, record.per_step_drafted),
        ):
            if array is not None and len(array) <= per_step_max_length:
                attrs[name] = array
    return attrs


AttributeKey = tuple[tuple[str, Any], ...]


class _Totals:
    """Cumulative sums per attribute set, read by one observable counter's callback.

    Each add holds the lock for one dict update only; sums saturate at ``MAX_COUNT``
    (OTLP's int64), where a server sending absurd counts would otherwise make every
    later export of this counter fail.
    """

    def __init__(self) -> None:
        self._sums: dict[AttributeKey, int] = {}
        self._lock = fork_safe_lock()

    def add(self, key: AttributeKey, value: int) -> None:
        with self._lock:
            key = _admitted(key, self._sums, MAX_POINTS)
            self._sums[key] = min(self._sums.get(key, 0) + value, MAX_COUNT)

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            snapshot = list(self._sums.items())
        return [Observation(value, dict(key)) for key, value in snapshot]


def _admitted(key: AttributeKey, kept: Collection[AttributeKey], limit: int) -> AttributeKey:
    """The attribute set to report ``key`` under, given the sets ``kept`` so far: ``key``
    itself below ``limit`` sets; then with the server's values folded into
    ``OVERFLOW_VALUE``, below ``limit + FOLDED_ROOM``; then with every value but
    ``OWN_VALUES`` folded, of which there are few."""
    if key in kept or len(kept) < limit:
        return key
    folded = tuple((k, OVERFLOW_VALUE if k in SERVER_CHOSEN else v) for k, v in key)
    if folded in kept or len(kept) < limit + FOLDED_ROOM:
        return folded
    return tuple((k, v if k in OWN_VALUES else OVERFLOW_VALUE) for k, v in key)


def _key(attrs: Mapping[str, Any]) -> AttributeKey:
    return tuple(sorted(attrs.items()))


class SpecDecodeInstruments:
    """The ``spec_decode.*`` instruments of one meter provider, and the sums behind its
    counters. Use :func:`instruments_for`: one instance per provider."""

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

        def counter(name: str, unit: str, description: str) -> _Totals:
            totals = _Totals()
            meter.create_observable_counter(
                name, callbacks=[totals.observe], unit=unit, description=description
            )
            return totals

        self.draft_tokens = counter(M_DRAFT_TOKENS, "{token}", "Draft tokens proposed")
        self.accepted_tokens = counter(M_ACCEPTED_DRAFT_TOKENS, "{token}", "Draft tokens accepted")
        self.verify_steps = counter(M_VERIFY_STEPS, "{step}", "Verify steps by drafts accepted")
        self.accepted_at_position = counter(
            M_ACCEPTED_AT_POSITION, "{token}", "Verify steps whose draft position was accepted"
        )
        self.requests = counter(
            M_REQUESTS,
            "{request}",
            "Instrumented calls, by outcome (why a call has or has no record)",
        )
        #: Per metric attribute, the first values seen; later ones map to the overflow.
        self._seen: dict[str, set[Any]] = {}
        #: The first ``MAX_SERIES`` series seen (as keys).
        self._series: set[AttributeKey] = set()
        self._bounded_lock = fork_safe_lock()

    def bound(self, key: str, value: Any) -> Any:
        """``value`` for metric attribute ``key``, or the overflow value past the limit."""
        with self._bounded_lock:
            seen = self._seen.setdefault(key, set())
            if value in seen or len(seen) < MAX_VALUES_PER_ATTRIBUTE:
                seen.add(value)
                return value
        return OVERFLOW_VALUE

    def series(
        self, attrs: Mapping[str, Any], record: SpecDecodeAcceptanceRecord | None
    ) -> dict[str, Any]:
        """A call's metric attributes plus the record's engine and k (bounded), folded past
        ``MAX_SERIES`` sets (:func:`_admitted`). Without a record: the call's GenAI
        client metrics' attributes."""
        series = dict(attrs)
        if record is not None:
            series[SD_ENGINE] = self.bound(SD_ENGINE, record.engine)
            if record.num_spec_tokens is not None:
                series[SD_NUM_SPEC_TOKENS] = self.bound(SD_NUM_SPEC_TOKENS, record.num_spec_tokens)
        key = _key(series)
        with self._bounded_lock:
            admitted = _admitted(key, self._series, MAX_SERIES)
            self._series.add(admitted)
        return series if admitted is key else dict(admitted)

    def record(
        self,
        record: SpecDecodeAcceptanceRecord,
        series: Mapping[str, Any],
        context: Context | None = None,
    ) -> None:
        """One request's record into the histograms (with ``context`` for exemplars) and
        the counters. Costs O(histogram buckets), bounded by ``MAX_SPEC_TOKENS``."""
        if record.mean_acceptance_length is not None:
            self.acceptance_length.record(record.mean_acceptance_length, series, context=context)
        if record.draft_acceptance_rate is not None:
            self.draft_acceptance_rate.record(record.draft_acceptance_rate, series, context=context)
        key = _key(series)
        if record.num_draft_tokens is not None:
            self.draft_tokens.add(key, record.num_draft_tokens)
        if record.num_accepted_draft_tokens is not None:
            self.accepted_tokens.add(key, record.num_accepted_draft_tokens)
        if record.acceptance_histogram:
            for accepted, steps in record.acceptance_histogram.items():
                self.verify_steps.add((*key, (SD_ACCEPTED, _position(accepted))), steps)
            for position, steps in enumerate(record.accepted_at_position()):
                if steps:
                    self.accepted_at_position.add((*key, (SD_POSITION, _position(position))), steps)

    def count_request(self, outcome: Outcome, series: Mapping[str, Any]) -> None:
        """Count one instrumented call under its outcome."""
        self.requests.add(_key({**series, SD_OUTCOME: outcome.value}), 1)


def _position(index: int) -> int | str:
    return index if index < MAX_DRAFT_POSITIONS else OVERFLOW_VALUE


_by_provider: weakref.WeakKeyDictionary[Any, SpecDecodeInstruments] = weakref.WeakKeyDictionary()
_by_provider_lock = threading.Lock()


def instruments_for(meter_provider: metrics.MeterProvider | None) -> SpecDecodeInstruments:
    """The instruments of ``meter_provider`` (the global one when None), made once.

    The SDK hands back the first observable counter registered under a name and ignores
    a later registration's callbacks, so instrumenting again (or instrumenting two
    clients) against one provider must add to the same sums.
    """
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    with _by_provider_lock:
        try:
            found = _by_provider.get(provider)
        except TypeError:  # not weak-referenceable: cannot share
            return SpecDecodeInstruments(meter_provider)
        if found is None:
            found = _made_through_stand_in(provider) or SpecDecodeInstruments(meter_provider)
            _by_provider[provider] = found
        return found


def _made_through_stand_in(provider: metrics.MeterProvider) -> SpecDecodeInstruments | None:
    """The instruments made before the app set its global provider, through the API's
    stand-in, when ``provider`` is that global one: the stand-in registered their
    counters there, with their callbacks, so a second set would add to sums nothing
    reads (the SDK keeps the first callbacks and says nothing)."""
    from opentelemetry.metrics._internal import _PROXY_METER_PROVIDER

    if provider is not metrics.get_meter_provider():
        return None
    return _by_provider.get(_PROXY_METER_PROVIDER)
