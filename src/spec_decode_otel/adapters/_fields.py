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

from spec_decode_otel._logging import logger
from spec_decode_otel.capture import ParsedResponse, last_completion_tokens
from spec_decode_otel.record import MAX_ARRAY_LENGTH, SpecDecodeAcceptanceRecord, construct_checked


def exact_int(value: Any) -> int | None:
    """A non-negative JSON integer, else None."""
    return value if type(value) is int and value >= 0 else None


def finite_number(value: Any) -> float | None:
    """A finite JSON number (int or float, never bool), else None."""
    try:
        if type(value) in (int, float) and math.isfinite(value):
            return float(value)
    except OverflowError:  # an int beyond any float
        pass
    return None


def first_present(mapping: Mapping[str, Any], *names: str) -> Any:
    """The value of the first of ``names`` present in ``mapping`` (aliases across releases)."""
    for name in names:
        if name in mapping:
            return mapping[name]
    return None


def dense_histogram(value: Any) -> dict[int, int] | None:
    """A dense list of exact ints (index = accepted drafts) as a sparse dict, else None."""
    if type(value) is not list or len(value) > MAX_ARRAY_LENGTH:
        return None
    sparse: dict[int, int] = {}
    for j, count in enumerate(value):
        if type(count) is not int or count < 0:
            return None
        if count:
            sparse[j] = count
    return sparse


def int_array(value: Any) -> list[int] | None:
    """A per-step array: a list under the size cap (element types checked by the record)."""
    if type(value) is list and len(value) <= MAX_ARRAY_LENGTH:
        return value
    return None


def is_present(value: Any) -> bool:
    """Wire rule: null and an empty object both mean 'absent'."""
    if type(value) is dict:  # what decoded JSON holds; skips the ABC check
        return bool(value)
    return value is not None and isinstance(value, Mapping) and bool(value)


def last_choice_field(responses: Sequence[ParsedResponse], name: str) -> Any:
    """The last present per-choice value of ``name`` across all responses, or None."""
    for response in reversed(responses):
        for choice in reversed(response.choices):
            value = choice.get(name)
            if value is not None and value != {}:
                return value
    return None


def choice_has(responses: Sequence[ParsedResponse], name: str) -> bool:
    for response in responses:
        for choice in response.choices:
            if name in choice:
                return True
    return False


def stats_choice_indices(responses: Sequence[ParsedResponse], name: str) -> set[Any]:
    """Choice indices that carried a present ``name`` object (more than one means n > 1)."""
    indices: set[Any] = set()
    for response in responses:
        for choice in response.choices:
            value = choice.get(name)
            if value is not None and is_present(value):
                indices.add(_index_key(choice.get("index")))
    return indices


def _index_key(index: Any) -> Any:
    # A hostile server can send any JSON as "index"; lists and objects are unhashable.
    return index if type(index) is int else repr(index)


def build_record(
    engine: str, responses: Sequence[ParsedResponse], **fields: Any
) -> SpecDecodeAcceptanceRecord | None:
    """Validate the mapped fields into a record; an invariant violation gives None."""
    try:
        return construct_checked(
            engine=engine, completion_tokens=last_completion_tokens(responses), **fields
        )
    except (ValidationError, ValueError, TypeError) as exc:
        logger.debug("spec-decode %s payload rejected: %s", engine, _first_error(exc))
        return None


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_input=False)
        if errors:
            return str(errors[0].get("msg"))
    elif type(exc) is ValueError:  # the record's own messages name a rule, never a value
        return str(exc)
    return type(exc).__name__


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
