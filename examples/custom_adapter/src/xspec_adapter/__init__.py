"""A spec-decode-otel adapter for XSpec, a made-up engine used as a template.

XSpec puts its per-request stats at the response root (for streams: on the last chunk)::

    "x_spec": {"steps": 12, "accepted": 21, "drafted": 36}

An adapter is a class with an ``engine`` name and two classmethods, ``can_adapt`` and
``adapt``, taking the request's responses as ``spec_decode_otel.adapters.ParsedResponse`` objects
(one for a body, one per chunk for a stream). spec-decode-otel finds it through the
``spec_decode_otel.adapters`` entry point declared in this package's pyproject.toml.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from pydantic import ValidationError

from spec_decode_otel import SpecDecodeAcceptanceRecord
from spec_decode_otel.adapters import ParsedResponse

__all__ = ["XSpecAdapter"]


def _count(stats: Mapping[str, object], name: str) -> int | None:
    value = stats.get(name)
    # Exactly a non-negative JSON integer: a JSON true is not the count 1.
    return value if type(value) is int and value >= 0 else None


class XSpecAdapter:
    """Maps XSpec's root ``x_spec`` counters onto the engine-neutral record."""

    engine: ClassVar[str] = "xspec"

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool:
        """Cheap and side-effect free: claim only XSpec's own signature."""
        return any(isinstance(r.root.get("x_spec"), Mapping) for r in responses)

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
        """The record, or None for a malformed or n > 1 payload. Never raises."""
        if any(r.choice_count > 1 for r in responses):
            return None  # stats are request-level: meaningless with several sequences
        found = [r.root["x_spec"] for r in responses if isinstance(r.root.get("x_spec"), Mapping)]
        if not found:
            return None
        stats = found[-1]  # when several chunks carry stats, the last wins
        steps, accepted, drafted = (_count(stats, n) for n in ("steps", "accepted", "drafted"))
        if steps is None or accepted is None or drafted is None:
            return None
        usage = next((r.usage for r in reversed(responses) if r.usage), None)
        completion_tokens = usage.get("completion_tokens") if usage else None
        try:
            # No histogram on XSpec's wire, and none is made up: the record is partial.
            return SpecDecodeAcceptanceRecord(
                engine=cls.engine,
                mean_acceptance_length=1.0 + accepted / steps if steps else 1.0,
                draft_acceptance_rate=accepted / drafted if drafted else 0.0,
                num_spec_steps=steps,
                num_accepted_draft_tokens=accepted,
                num_draft_tokens=drafted,
                completion_tokens=completion_tokens if type(completion_tokens) is int else None,
            )
        except (ValidationError, ValueError, OverflowError):
            return None  # the counts contradict each other (accepted > drafted, ...)
