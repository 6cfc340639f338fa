"""The engine-neutral record of one request's speculative-decoding acceptance.

Every engine reports acceptance differently; everything downstream (span attributes,
metrics, the CLI) reads only this record. It is the gatekeeper too: the invariants that
make the numbers trustworthy live in its validator, so an adapter cannot hand telemetry
a payload whose counts contradict each other.

Partial results. Some engines report only part of the picture (a released TensorRT-LLM
server sends only an average acceptance length; llama.cpp sends drafted and accepted
counts but no steps unless it is mlx-vlm/mlxcel). Nothing is estimated to fill the
gaps: a quantity the engine did not report is ``None`` here, and telemetry omits it.
``is_partial`` tells such a record apart from a full one (histogram and counts known).
"""

from __future__ import annotations

import math
import operator
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

#: Per-step arrays and histograms longer than this are rejected before any work is done
#: on them: no real request runs 100,000 verify steps, and a hostile server must not be
#: able to make the client spend unbounded CPU.
MAX_ARRAY_LENGTH = 100_000

#: Engine floats are kept verbatim but must agree with the counts to this relative
#: tolerance; a larger disagreement means the payload contradicts itself.
FLOAT_AGREEMENT = 1e-6

#: Largest count a record may hold: OTLP carries integers as int64, and a value beyond it
#: cannot be exported (a span attribute is dropped; a counter point fails the whole
#: metrics export, every time, since counters are cumulative).
MAX_COUNT = 2**63 - 1

NonNegativeInt = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
#: Per-step entries are strict ints; ``>= 0`` is checked by the model validator over the
#: whole array (a constrained int costs pydantic ~4x a strict one per element, and a
#: detailed response carries one entry per verify step).
_PerStep = Annotated[list[Annotated[int, Strict()]], Field(max_length=MAX_ARRAY_LENGTH)]


def _agrees(sent: float, derived: float) -> bool:
    return abs(sent - derived) <= FLOAT_AGREEMENT * max(1.0, abs(derived))


def _small_counts(values: list[int] | None) -> bytes | None:
    """``values`` as bytes when every entry is in 0..255, else None.

    ``bytes()`` range-checks in C, and sums and bounds over its result run in C too. A
    step's counts are at most k, so real per-step arrays take this path.
    """
    if values is None:
        return None
    try:
        return bytes(values)
    except ValueError:  # an entry outside 0..255 (entries are already strict ints)
        return None


def _nonnegative_sum(values: list[int], packed: bytes | None, name: str) -> int:
    if packed is not None:
        return sum(packed)
    if values and min(values) < 0:
        raise ValueError(f"per_step_{name} has a negative entry")
    return sum(values)


def _any_above(values: list[int], packed: bytes | None, limit: int) -> bool:
    if packed is not None:  # delete every byte <= limit; anything left is above it
        return limit < 255 and bool(packed.translate(None, bytes(range(limit + 1))))
    return max(values, default=0) > limit


def _check_per_step(
    per_acc: list[int] | None,
    per_drf: list[int] | None,
    steps: int | None,
    accepted: int | None,
    drafted: int | None,
    k: int | None,
) -> None:
    """Per-step arrays: one entry >= 0 per step, summing to the totals; no step accepting
    more drafts than it drafted, or drafting more than k.

    A detailed response carries one entry per verify step (10,000+ on a long request) and
    this runs for every such request, so the element loops run in C where they can: a
    drafted array in which every step drafted the same number (fixed k, the usual case)
    is one ``list.count``, and arrays of counts in 0..255 go through ``bytes()``. Other
    arrays take the plain path; the verdict is the same either way.
    """
    for values, name in ((per_acc, "accepted"), (per_drf, "drafted")):
        if values is not None and (steps is None or len(values) != steps):
            raise ValueError(f"per_step_{name} length differs from num_spec_steps")
    acc_packed = _small_counts(per_acc)
    if per_acc is not None and (
        accepted is None or _nonnegative_sum(per_acc, acc_packed, "accepted") != accepted
    ):
        raise ValueError("per_step_accepted does not sum to the accepted total")
    if per_drf is None:
        return
    same = per_drf[0] if per_drf and per_drf.count(per_drf[0]) == len(per_drf) else None
    drf_packed = None
    if same is not None:
        if same < 0:
            raise ValueError("per_step_drafted has a negative entry")
        drf_total = same * len(per_drf)
    else:
        drf_packed = _small_counts(per_drf)
        drf_total = _nonnegative_sum(per_drf, drf_packed, "drafted")
    if drafted is None or drf_total != drafted:
        raise ValueError("per_step_drafted does not sum to the drafted total")
    if per_acc is not None:
        if same is not None:
            exceeded = _any_above(per_acc, acc_packed, same)
        else:
            exceeded = any(map(operator.gt, per_acc, per_drf))
        if exceeded:
            raise ValueError("a step accepted more drafts than it drafted")
    if k is not None and (same > k if same is not None else _any_above(per_drf, drf_packed, k)):
        raise ValueError("a step drafted more than num_spec_tokens")


class SpecDecodeAcceptanceRecord(BaseModel):
    """One request's acceptance figures, engine-neutral and self-consistent.

    ``acceptance_histogram`` is sparse: ``{accepted_draft_count: steps}``, zero buckets
    omitted, the bonus token excluded. Its JSON form has string keys (JSON has no int
    keys) and validates back to an equal record.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Annotated[str, Field(min_length=1, max_length=64)]
    mean_acceptance_length: float | None = None
    draft_acceptance_rate: float | None = None
    acceptance_histogram: dict[NonNegativeInt, NonNegativeInt] | None = None
    num_accepted_draft_tokens: NonNegativeInt | None = None
    num_draft_tokens: NonNegativeInt | None = None
    num_spec_steps: NonNegativeInt | None = None
    num_spec_tokens: NonNegativeInt | None = None
    completion_tokens: NonNegativeInt | None = None
    per_step_accepted: _PerStep | None = None
    per_step_drafted: _PerStep | None = None

    @field_validator("mean_acceptance_length", "draft_acceptance_rate", mode="before")
    @classmethod
    def _finite_number(cls, value: Any) -> Any:
        # JSON numbers only: a bool is an int to Python but never a rate on the wire.
        if value is None:
            return None
        try:
            finite = type(value) in (int, float) and math.isfinite(value)
        except OverflowError:  # an int beyond any float
            finite = False
        if not finite:
            raise ValueError("must be a finite number")
        return float(value)

    @field_validator("acceptance_histogram", mode="before")
    @classmethod
    def _histogram_keys(cls, value: Any) -> Any:
        # Accept the JSON form (digit-string keys) and drop zero buckets, so both the
        # dense-list engines and the record's own JSON produce the same sparse dict.
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError("histogram must be a mapping")
        if len(value) > MAX_ARRAY_LENGTH:
            raise ValueError("histogram too large")
        out: dict[int, Any] = {}
        for key, count in value.items():
            if type(key) is str and key.isascii() and key.isdigit():
                key = int(key)
            elif type(key) is not int:
                raise ValueError("histogram keys must be non-negative ints")
            if key in out:
                raise ValueError("duplicate histogram key")
            if count != 0 or type(count) is not int:
                out[key] = count
        return out

    @model_validator(mode="after")
    def _invariants(self) -> SpecDecodeAcceptanceRecord:
        mal, rate = self.mean_acceptance_length, self.draft_acceptance_rate
        if mal is not None and mal < 1.0:
            raise ValueError("mean_acceptance_length must be >= 1")
        if rate is not None and not 0.0 <= rate <= 1.0:
            raise ValueError("draft_acceptance_rate must be in [0, 1]")

        steps, accepted = self.num_spec_steps, self.num_accepted_draft_tokens
        drafted, k = self.num_draft_tokens, self.num_spec_tokens
        if accepted is not None and drafted is not None and accepted > drafted:
            raise ValueError("accepted drafts exceed drafted tokens")

        hist = self.acceptance_histogram
        if hist is not None:
            if steps is None or accepted is None:
                raise ValueError("a histogram needs num_spec_steps and accepted counts")
            if sum(hist.values()) != steps:
                raise ValueError("histogram counts do not sum to num_spec_steps")
            if sum(j * c for j, c in hist.items()) != accepted:
                raise ValueError("histogram does not account for the accepted drafts")
            if k is not None and hist and max(hist) > k:
                raise ValueError("histogram bucket beyond num_spec_tokens")

        _check_per_step(self.per_step_accepted, self.per_step_drafted, steps, accepted, drafted, k)

        if mal is not None and steps is not None and accepted is not None:
            try:
                derived = 1.0 + accepted / steps if steps else 1.0
            except OverflowError:  # counts beyond any float: no finite mean can agree
                raise ValueError("mean_acceptance_length contradicts the counts") from None
            if not _agrees(mal, derived):
                raise ValueError("mean_acceptance_length contradicts the counts")
        if rate is not None and drafted is not None and accepted is not None:
            derived = accepted / drafted if drafted else 0.0
            if not _agrees(rate, derived):
                raise ValueError("draft_acceptance_rate contradicts the counts")
        return self

    @property
    def is_partial(self) -> bool:
        """True when the engine reported less than the full histogram and counts."""
        return (
            self.acceptance_histogram is None
            or self.mean_acceptance_length is None
            or self.draft_acceptance_rate is None
            or self.num_draft_tokens is None
        )

    def dense_histogram(self) -> list[int]:
        """Steps per accepted-draft count as a dense list (index j = steps that accepted j).

        Length is ``num_spec_tokens + 1`` when k is known, else just past the largest bucket,
        which is the shape engines send and span attributes carry.
        """
        hist = self.acceptance_histogram or {}
        size = (self.num_spec_tokens + 1) if self.num_spec_tokens is not None else 0
        if hist:
            size = max(size, max(hist) + 1)
        dense = [0] * size
        for j, count in hist.items():
            dense[j] = count
        return dense

    def accepted_at_position(self) -> list[int]:
        """Steps whose draft position p (0-based) was accepted, for p in 0..max.

        A step that accepted j drafts accepted positions 0..j-1 (drafts are accepted as a
        prefix), so this is the histogram's reverse cumulative sum shifted by one.
        """
        dense = self.dense_histogram()
        out = [0] * max(len(dense) - 1, 0)
        running = 0
        for j in range(len(dense) - 1, 0, -1):
            running += dense[j]
            out[j - 1] = running
        return out
