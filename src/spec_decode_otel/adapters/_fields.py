"""Strict field readers shared by the built-in adapters.

Wire payloads come from servers we do not control: every reader accepts exactly the JSON
type the engine documents (a JSON ``true`` is not the count 1) and returns None
otherwise, so adapters can map fields without a try/except per line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from spec_decode_otel.adapters.protocol import InvalidPayload
from spec_decode_otel.capture import ParsedResponse, last_completion_tokens
from spec_decode_otel.record import MAX_SPEC_STEPS, MAX_SPEC_TOKENS, SpecDecodeAcceptanceRecord


def exact_int(value: Any) -> int | None:
    """A non-negative JSON integer, else None."""
    return value if type(value) is int and value >= 0 else None


def first_present(mapping: Mapping[str, Any], *names: str) -> Any:
    """The value of the first of ``names`` present in ``mapping`` (aliases across releases)."""
    for name in names:
        if name in mapping:
            return mapping[name]
    return None


def dense_histogram(value: Any) -> dict[int, int] | None:
    """A dense list of exact ints (index = accepted drafts) as a sparse dict, else None.

    A list longer than ``MAX_SPEC_TOKENS + 1`` is refused before it is read.
    """
    if type(value) is not list or len(value) > MAX_SPEC_TOKENS + 1:
        return None
    sparse: dict[int, int] = {}
    for j, count in enumerate(value):
        if type(count) is not int or count < 0:
            return None
        if count:
            sparse[j] = count
    return sparse


def per_step_arrays(accepted: Any, drafted: Any) -> tuple[list[Any] | None, list[Any] | None]:
    """The per-step arrays as sent, or neither when one is longer than ``MAX_SPEC_STEPS``.

    The arrays are an optional detail: over the bound, the record keeps its totals and
    drops both arrays (element types and sums are checked by the record). Anything but a
    list or null is malformed.
    """
    for value in (accepted, drafted):
        if value is not None and type(value) is not list:
            raise InvalidPayload("per-step arrays must be lists")
    if any(type(v) is list and len(v) > MAX_SPEC_STEPS for v in (accepted, drafted)):
        return None, None
    return accepted, drafted


def is_present(value: Any) -> bool:
    """Wire rule: null and an empty object both mean 'absent' (anything else is present,
    and malformed unless it has the engine's shape)."""
    return value is not None and not (isinstance(value, Mapping) and not value)


def last_choice_field(responses: Sequence[ParsedResponse], name: str) -> Any:
    """The last present per-choice value of ``name`` across all responses, or None."""
    for response in reversed(responses):
        for choice in reversed(response.choices):
            value = choice.get(name)
            if is_present(value):
                return value
    return None


def stats_choice_indices(responses: Sequence[ParsedResponse], name: str) -> set[Any]:
    """Choice indices that carried a present ``name`` object (more than one means n > 1)."""
    indices: set[Any] = set()
    for response in responses:
        for choice in response.choices:
            if is_present(choice.get(name)):
                indices.add(_index_key(choice.get("index")))
    return indices


def _index_key(index: Any) -> Any:
    # A hostile server can send any JSON as "index". A scalar keys with its type (so
    # "0" and True are not 0); a list or an object, unhashable and of any size and
    # depth, keys as its type alone: repr() of one nested deep enough raises.
    if type(index) is int:
        return index
    if isinstance(index, (str, float, bool)) or index is None:
        return (type(index), index)
    return type(index)


def build_record(
    engine: str, responses: Sequence[ParsedResponse], **fields: Any
) -> SpecDecodeAcceptanceRecord:
    """Validate the mapped fields into a record; raise InvalidPayload with the first
    broken rule (a rule's name, never a value from the payload)."""
    try:
        return SpecDecodeAcceptanceRecord.model_validate(
            {"engine": engine, "completion_tokens": last_completion_tokens(responses), **fields}
        )
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        reason = str(errors[0].get("msg")) if errors else "invalid"
        location = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else ""
        where = f"{location}: " if location else ""
        raise InvalidPayload(f"{engine} payload: {where}{reason}") from None


def derived_mean_acceptance_length(accepted: int | None, steps: int | None) -> float | None:
    """1 + accepted/steps (1.0 with no steps), the record's definition; None if unknown."""
    if accepted is None or steps is None:
        return None
    try:
        return 1.0 + accepted / steps if steps else 1.0
    except OverflowError:  # counts beyond any float: inf, which the record rejects
        return math.inf


def derived_rate(accepted: int | None, drafted: int | None) -> float | None:
    """accepted/drafted (0.0 with nothing drafted); None if unknown."""
    if accepted is None or drafted is None:
        return None
    try:
        return accepted / drafted if drafted else 0.0
    except OverflowError:  # accepted > drafted by far: inf, which the record rejects
        return math.inf
