"""The engine-neutral record of one request's speculative-decoding acceptance, and the
bounds on everything a server can send.

Every engine reports acceptance differently; everything downstream (span attributes,
metrics, the CLI) reads only this record. It is the gatekeeper too: one pydantic
validation (field types, then every cross-field invariant in one validator) decides
whether a payload's numbers can be trusted, so an adapter cannot hand telemetry counts
that contradict each other.

Partial results. Some engines report only part of the picture (a released TensorRT-LLM
server sends only an average acceptance length; llama.cpp sends drafted and accepted
counts but no steps). Nothing is estimated to fill the gaps: a quantity the engine did
not report is ``None`` here, and telemetry omits it. ``is_partial`` tells such a record
apart from a full one.

Bounds. A server is not trusted to keep its numbers small, and the work the
instrumentation does for a response must not grow with a value the server chose. Every
size that comes from the wire is bounded here, far above any real deployment; a payload
over a bound gives no record (the call itself is untouched):

- ``MAX_SPEC_TOKENS``: draft length k, the largest histogram key, the length of a dense
  histogram minus one, and the number of per-draft-length rows. vLLM runs k <= 16 in
  practice and SGLang's EAGLE trees reach 64 nodes.
- ``MAX_SPEC_STEPS``: the length of a per-step array (one entry per verify step).
  Adapters drop arrays over it and keep the rest of the record.
- ``MAX_CHOICES``: choices examined per response (a response with more is n > 1, which
  gives no record anyway).
- ``MAX_COUNT``: any count (OTLP carries int64).
- ``MAX_ENGINE_LENGTH``: the engine and drafter names.
"""

from __future__ import annotations

import math
import operator
from itertools import accumulate
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

MAX_SPEC_TOKENS = 256
MAX_SPEC_STEPS = 100_000
MAX_CHOICES = 128
MAX_COUNT = 2**63 - 1
MAX_ENGINE_LENGTH = 64

#: Engine floats are kept verbatim but must agree with the counts to this relative
#: tolerance; a larger disagreement means the payload contradicts itself.
FLOAT_AGREEMENT = 1e-6

Count = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
SpecTokens = Annotated[int, Strict(), Field(ge=0, le=MAX_SPEC_TOKENS)]
#: Per-step entries are strict ints; that each is >= 0 is checked once over the array in
#: the record's validator (with the sums equal to the totals, that also bounds each entry
#: by MAX_COUNT): pydantic's per-element constraint check would be most of the cost of
#: a detailed response.
PerStep = Annotated[list[Annotated[int, Strict()]], Field(max_length=MAX_SPEC_STEPS)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_ENGINE_LENGTH)]


def finite_number(value: Any) -> float | None:
    """A finite JSON number (int or float, never bool: a bool is an int to Python but
    never a rate on the wire), else None."""
    try:
        if type(value) in (int, float) and math.isfinite(value):
            return float(value)
    except OverflowError:  # an int beyond any float
        pass
    return None


def digit_key(key: Any) -> int | None:
    """A JSON object key spelling a small non-negative int (``"3"``) as that int, else None."""
    if type(key) is str and key.isascii() and key.isdigit() and len(key) <= 6:
        return int(key)
    return None


def _sparse_histogram(value: Any) -> dict[int, Any] | None:
    """Accept the JSON form (digit-string keys) and drop zero buckets, so dense-list
    engines, sparse-dict engines and the record's own JSON give the same dict.

    Keys are checked against ``MAX_SPEC_TOKENS`` before anything is built from them.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("histogram must be a mapping")
    if len(value) > MAX_SPEC_TOKENS + 1:
        raise ValueError("histogram has more buckets than MAX_SPEC_TOKENS allows")
    out: dict[int, Any] = {}
    for key, count in value.items():
        if type(key) is not int:
            key = digit_key(key)
        if key is None or not 0 <= key <= MAX_SPEC_TOKENS:
            raise ValueError("histogram keys must be ints in 0..MAX_SPEC_TOKENS")
        if key in out:
            raise ValueError("duplicate histogram key")
        if count != 0 or type(count) is not int:
            out[key] = count
    return out


class SpecDecodeAcceptanceRecord(BaseModel):
    """One request's acceptance figures, engine-neutral and self-consistent.

    ``acceptance_histogram`` is sparse: ``{accepted_draft_count: steps}``, zero buckets
    omitted, the bonus token excluded. Its JSON form has string keys (JSON has no int
    keys) and validates back to an equal record.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Name
    #: The drafter, when the engine names it (e.g. ``eagle3``, ``mtp``, ``dflash``).
    draft_method: Name | None = None
    mean_acceptance_length: float | None = None
    draft_acceptance_rate: float | None = None
    acceptance_histogram: dict[Count, Count] | None = None
    num_accepted_draft_tokens: Count | None = None
    num_draft_tokens: Count | None = None
    num_spec_steps: Count | None = None
    num_spec_tokens: SpecTokens | None = None
    completion_tokens: Count | None = None
    per_step_accepted: PerStep | None = None
    per_step_drafted: PerStep | None = None

    @field_validator("mean_acceptance_length", "draft_acceptance_rate", mode="before")
    @classmethod
    def _finite_number(cls, value: Any) -> float | None:
        # NaN would compare as agreeing with nothing in the invariants below.
        number = finite_number(value)
        if number is None and value is not None:
            raise ValueError("must be a finite number")
        return number

    @field_validator("acceptance_histogram", mode="before")
    @classmethod
    def _histogram_keys(cls, value: Any) -> dict[int, Any] | None:
        return _sparse_histogram(value)

    @model_validator(mode="after")
    def _invariants(self) -> SpecDecodeAcceptanceRecord:
        """Every cross-field rule; a violation rejects the payload."""
        mal, rate = self.mean_acceptance_length, self.draft_acceptance_rate
        steps, accepted = self.num_spec_steps, self.num_accepted_draft_tokens
        drafted, k = self.num_draft_tokens, self.num_spec_tokens
        # At most every draft of every step accepted, k <= MAX_SPEC_TOKENS of them.
        if mal is not None and not 1.0 <= mal <= 1.0 + MAX_SPEC_TOKENS:
            raise ValueError(f"mean_acceptance_length must be in [1, {1 + MAX_SPEC_TOKENS}]")
        if rate is not None and not 0.0 <= rate <= 1.0:
            raise ValueError("draft_acceptance_rate must be in [0, 1]")
        if accepted is not None and drafted is not None and accepted > drafted:
            raise ValueError("accepted drafts exceed drafted tokens")

        hist = self.acceptance_histogram
        if hist is not None:
            if steps is None or accepted is None:
                raise ValueError("a histogram needs num_spec_steps and accepted counts")
            if sum(hist.values()) != steps:
                raise ValueError("histogram counts do not sum to num_spec_steps")
            if sum(j * count for j, count in hist.items()) != accepted:
                raise ValueError("histogram does not account for the accepted drafts")
            if k is not None and hist and max(hist) > k:
                raise ValueError("histogram bucket beyond num_spec_tokens")

        self._check_per_step()

        if mal is not None and steps is not None and accepted is not None:
            derived = 1.0 + accepted / steps if steps else 1.0
            if not abs(mal - derived) <= FLOAT_AGREEMENT * derived:
                raise ValueError("mean_acceptance_length contradicts the counts")
        if rate is not None and drafted is not None and accepted is not None:
            derived = accepted / drafted if drafted else 0.0
            if not abs(rate - derived) <= FLOAT_AGREEMENT:
                raise ValueError("draft_acceptance_rate contradicts the counts")
        return self

    def _check_per_step(self) -> None:
        """Per-step arrays: one entry per step, summing to the totals; no step accepting
        more than it drafted, or drafting more than k."""
        per_acc, per_drf = self.per_step_accepted, self.per_step_drafted
        steps = self.num_spec_steps
        for name, array, total in (
            ("per_step_accepted", per_acc, self.num_accepted_draft_tokens),
            ("per_step_drafted", per_drf, self.num_draft_tokens),
        ):
            if array is None:
                continue
            if steps is None or len(array) != steps:
                raise ValueError(f"{name} length differs from num_spec_steps")
            if min(array, default=0) < 0:
                raise ValueError(f"{name} entries must be greater than or equal to 0")
            if total is None or sum(array) != total:
                raise ValueError(f"{name} does not sum to its total")
        # Both arrays have length num_spec_steps by now.
        if per_acc is not None and per_drf is not None and any(map(operator.gt, per_acc, per_drf)):
            raise ValueError("a step accepted more drafts than it drafted")
        k = self.num_spec_tokens
        if per_drf is not None and k is not None and max(per_drf, default=0) > k:
            raise ValueError("a step drafted more than num_spec_tokens")

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

        Length is ``num_spec_tokens + 1`` when k is known, else just past the largest
        bucket: the shape engines send and span attributes carry. Both are bounded by
        ``MAX_SPEC_TOKENS``.
        """
        hist = self.acceptance_histogram or {}
        k = self.num_spec_tokens
        dense = [0] * max(k + 1 if k is not None else 0, max(hist, default=-1) + 1)
        for j, count in hist.items():
            dense[j] = count
        return dense

    def accepted_at_position(self) -> list[int]:
        """Steps whose draft position p (0-based) was accepted, for p in 0..max.

        A step that accepted j drafts accepted positions 0..j-1 (drafts are accepted as a
        prefix), so this is the histogram's reverse cumulative sum shifted by one.
        """
        return list(accumulate(reversed(self.dense_histogram()[1:])))[::-1]
