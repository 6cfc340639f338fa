"""The engine-neutral record of one request's speculative-decoding acceptance.

Every engine reports acceptance differently; everything downstream (span attributes,
metrics, the CLI) reads only this record. It is the gatekeeper too: the invariants that
make the numbers trustworthy live in one function that both its validator and the
adapters' cheaper constructor (``construct_checked``) run, so an adapter cannot hand
telemetry a payload whose counts contradict each other.

Partial results. Some engines report only part of the picture (a released TensorRT-LLM
server sends only an average acceptance length; llama.cpp sends drafted and accepted
counts but no steps unless it is mlx-vlm/mlxcel). Nothing is estimated to fill the
gaps: a quantity the engine did not report is ``None`` here, and telemetry omits it.
``is_partial`` tells such a record apart from a full one (histogram and counts known).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    field_validator,
    model_validator,
)

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

#: The bound on ``engine``, one constant for the model and the fast path alike.
_ENGINE_MAX_LENGTH = 64

NonNegativeInt = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
#: Per-step entries are strict ints; ``>= 0`` is checked by the model validator over the
#: whole array (a constrained int costs pydantic ~4x a strict one per element, and a
#: detailed response carries one entry per verify step).
_PerStep = Annotated[list[Annotated[int, Strict()]], Field(max_length=MAX_ARRAY_LENGTH)]


#: ``_AT_MOST[n]`` holds the bytes 0..n: deleting them from packed counts leaves exactly
#: the counts above n (``bytes.translate``, one pass in C).
_AT_MOST: tuple[bytes, ...] = tuple(bytes(range(n + 1)) for n in range(255))


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
    arrays take the plain path; the verdict is the same either way. No helper functions:
    on the client this runs once per call with the caches cold, where each Python call
    costs as much as a pass over a hundred entries.
    """
    if per_acc is not None and (steps is None or len(per_acc) != steps):
        raise ValueError("per_step_accepted length differs from num_spec_steps")
    if per_drf is not None and (steps is None or len(per_drf) != steps):
        raise ValueError("per_step_drafted length differs from num_spec_steps")
    acc_packed = None
    if per_acc is not None:
        if accepted is None:
            raise ValueError("per_step_accepted does not sum to the accepted total")
        try:
            acc_packed = bytes(per_acc)  # every entry in 0..255 (entries are strict ints)
        except ValueError:
            if min(per_acc) < 0:
                raise ValueError("per_step_accepted has a negative entry") from None
        if sum(per_acc) != accepted:
            raise ValueError("per_step_accepted does not sum to the accepted total")
    if per_drf is None:
        return
    same = per_drf[0] if per_drf and per_drf.count(per_drf[0]) == steps else None
    drf_packed = None
    if same is not None:
        if same < 0:
            raise ValueError("per_step_drafted has a negative entry")
        drf_total = same * steps
    else:
        try:
            drf_packed = bytes(per_drf)
        except ValueError:
            if min(per_drf) < 0:
                raise ValueError("per_step_drafted has a negative entry") from None
        drf_total = sum(per_drf)
    if drafted is None or drf_total != drafted:
        raise ValueError("per_step_drafted does not sum to the drafted total")
    if per_acc is not None:
        if same is None:
            exceeded = any(map(operator.gt, per_acc, per_drf))
        elif acc_packed is not None:
            exceeded = same < 255 and bool(acc_packed.translate(None, _AT_MOST[same]))
        else:
            exceeded = max(per_acc) > same
        if exceeded:
            raise ValueError("a step accepted more drafts than it drafted")
    if k is not None:
        if same is not None:
            exceeded = same > k
        elif drf_packed is not None:
            exceeded = k < 255 and bool(drf_packed.translate(None, _AT_MOST[k]))
        else:
            exceeded = max(per_drf, default=0) > k
        if exceeded:
            raise ValueError("a step drafted more than num_spec_tokens")


def _finite_float(value: Any) -> float | None:
    """A rate or mean as a float; JSON numbers only (a bool is an int to Python but never
    a rate on the wire), and finite, since NaN would compare as agreeing with nothing."""
    if value is None:
        return None
    try:
        finite = type(value) in (int, float) and math.isfinite(value)
    except OverflowError:  # an int beyond any float
        finite = False
    if not finite:
        raise ValueError("must be a finite number")
    return float(value)


def _sparse_histogram(value: Any) -> dict[int, Any] | None:
    """Accept the JSON form (digit-string keys) and drop zero buckets, so both the
    dense-list engines and the record's own JSON produce the same sparse dict.

    Counts are returned unchecked (the field type makes them strict ints); a count that
    is not an int 0 is kept so that check sees it.
    """
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


def _check_invariants(values: Mapping[str, Any]) -> None:
    """The cross-field rules, over field values that already have their types.

    The one copy of them: the model's validator runs it on a constructed record and
    :func:`construct_checked` on its checked fields, so the two cannot drift apart.
    """
    mal, rate = values["mean_acceptance_length"], values["draft_acceptance_rate"]
    if mal is not None and mal < 1.0:
        raise ValueError("mean_acceptance_length must be >= 1")
    if rate is not None and not 0.0 <= rate <= 1.0:
        raise ValueError("draft_acceptance_rate must be in [0, 1]")

    steps, accepted = values["num_spec_steps"], values["num_accepted_draft_tokens"]
    drafted, k = values["num_draft_tokens"], values["num_spec_tokens"]
    if accepted is not None and drafted is not None and accepted > drafted:
        raise ValueError("accepted drafts exceed drafted tokens")

    hist = values["acceptance_histogram"]
    if hist is not None:
        if steps is None or accepted is None:
            raise ValueError("a histogram needs num_spec_steps and accepted counts")
        hist_steps = hist_accepted = 0
        top = -1
        for j, count in hist.items():  # k+1 buckets at most on a real record
            hist_steps += count
            hist_accepted += j * count
            if j > top:
                top = j
        if hist_steps != steps:
            raise ValueError("histogram counts do not sum to num_spec_steps")
        if hist_accepted != accepted:
            raise ValueError("histogram does not account for the accepted drafts")
        if k is not None and top > k:
            raise ValueError("histogram bucket beyond num_spec_tokens")

    per_acc, per_drf = values["per_step_accepted"], values["per_step_drafted"]
    if per_acc is not None or per_drf is not None:
        _check_per_step(per_acc, per_drf, steps, accepted, drafted, k)

    # Both derived values are >= 0, and a rate is <= 1 (accepted <= drafted holds by
    # now), so the tolerance FLOAT_AGREEMENT * max(1, derived) needs no max() here.
    if mal is not None and steps is not None and accepted is not None:
        try:
            derived = 1.0 + accepted / steps if steps else 1.0
        except OverflowError:  # counts beyond any float: no finite mean can agree
            raise ValueError("mean_acceptance_length contradicts the counts") from None
        if not abs(mal - derived) <= FLOAT_AGREEMENT * derived:
            raise ValueError("mean_acceptance_length contradicts the counts")
    if rate is not None and drafted is not None and accepted is not None:
        derived = accepted / drafted if drafted else 0.0
        if not abs(rate - derived) <= FLOAT_AGREEMENT:
            raise ValueError("draft_acceptance_rate contradicts the counts")


class SpecDecodeAcceptanceRecord(BaseModel):
    """One request's acceptance figures, engine-neutral and self-consistent.

    ``acceptance_histogram`` is sparse: ``{accepted_draft_count: steps}``, zero buckets
    omitted, the bonus token excluded. Its JSON form has string keys (JSON has no int
    keys) and validates back to an equal record.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Annotated[str, Field(min_length=1, max_length=_ENGINE_MAX_LENGTH)]
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
    def _finite_number(cls, value: Any) -> float | None:
        return _finite_float(value)

    @field_validator("acceptance_histogram", mode="before")
    @classmethod
    def _histogram_keys(cls, value: Any) -> dict[int, Any] | None:
        return _sparse_histogram(value)

    @model_validator(mode="after")
    def _invariants(self) -> SpecDecodeAcceptanceRecord:
        _check_invariants(self.__dict__)
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


#: Every field unset, the starting point of a record built without pydantic's validation.
_UNSET: dict[str, None] = dict.fromkeys(SpecDecodeAcceptanceRecord.model_fields)
_count_fields = operator.itemgetter(
    "num_accepted_draft_tokens",
    "num_draft_tokens",
    "num_spec_steps",
    "num_spec_tokens",
    "completion_tokens",
)
_PER_STEP = ("per_step_accepted", "per_step_drafted")
#: The per-step fields' own type, validated alone: its element loop runs in pydantic's
#: Rust core (faster than any Python check on a 10,000-step array) and it returns a
#: list the record owns, with pydantic's own verdict on tuples, bools and int subclasses.
_validate_per_step = TypeAdapter(_PerStep).validator.validate_python
_set = object.__setattr__


def construct_checked(**fields: Any) -> SpecDecodeAcceptanceRecord:
    """The record ``SpecDecodeAcceptanceRecord(**fields)`` gives, for a fraction of its cost.

    Adapters build one record per instrumented call, and the model's validation was most
    of the client's CPU cost per call. Here the field rules the model declares are
    checked by hand for the exact types adapters pass (JSON ``int``, ``float``, ``str``,
    ``dict``), the per-step lists go through their own pydantic type alone (its Rust
    loop beats any Python one on long arrays), the invariants are the model's own
    :func:`_check_invariants`, and the instance state is set directly, as
    ``model_construct`` does but without its per-field loop. A value of any other type
    (an int subclass, a bool where a count goes, a non-ASCII engine name) goes through
    the model instead, so pydantic's coercions and messages stay its own. Either way
    the verdict and the record are the model's (tests/unit/test_record_fast_path.py).

    Raises ValueError (pydantic's ValidationError is one) exactly when the model would
    reject ``fields``; adapters call it through ``build_record``, which turns that into
    None.
    """
    values = {**_UNSET, **fields}
    if len(values) != len(_UNSET):
        raise ValueError("unknown field")  # extra="forbid"
    engine = values["engine"]
    if type(engine) is not str or not engine.isascii():
        return SpecDecodeAcceptanceRecord(**fields)
    if not 0 < len(engine) <= _ENGINE_MAX_LENGTH:
        raise ValueError("engine must be 1..64 characters")
    for count in _count_fields(values):
        if count is not None:
            if type(count) is not int:
                return SpecDecodeAcceptanceRecord(**fields)
            if not 0 <= count <= MAX_COUNT:
                raise ValueError("count out of range")
    values["mean_acceptance_length"] = _finite_float(values["mean_acceptance_length"])
    values["draft_acceptance_rate"] = _finite_float(values["draft_acceptance_rate"])
    hist = values["acceptance_histogram"]
    if hist is not None:
        hist = values["acceptance_histogram"] = _sparse_histogram(hist)
        for key, count in hist.items():
            if type(count) is not int:
                return SpecDecodeAcceptanceRecord(**fields)
            if not (0 <= key <= MAX_COUNT and 0 <= count <= MAX_COUNT):
                raise ValueError("histogram entry out of range")
    for name in _PER_STEP:
        if values[name] is not None:
            values[name] = _validate_per_step(values[name])
    _check_invariants(values)
    record = SpecDecodeAcceptanceRecord.__new__(SpecDecodeAcceptanceRecord)
    _set(record, "__dict__", values)
    _set(record, "__pydantic_fields_set__", set(fields))
    _set(record, "__pydantic_extra__", None)
    _set(record, "__pydantic_private__", None)
    return record
