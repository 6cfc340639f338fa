"""llama.cpp server (and mlx-vlm, mlxcel): root ``timings`` draft counters.

``draft_n`` (drafted) and ``draft_n_accepted`` (accepted) appear only when something was
drafted; mlx-vlm/mlxcel add ``draft_rounds`` (verify steps). There is no histogram on the
wire and none is synthesized: without rounds the record has no steps and no mean
acceptance length, only the counts and the rate they define.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from spec_decode_otel.adapters._fields import (
    build_record,
    derived_mean_acceptance_length,
    derived_rate,
    exact_int,
)
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import SpecDecodeAcceptanceRecord


def _draft_timings(response: ParsedResponse) -> Mapping[str, Any] | None:
    """The response's ``timings`` when it carries draft counters (``draft_n``), else None."""
    timings = response.root.get("timings")
    if isinstance(timings, Mapping) and timings.get("draft_n") is not None:
        return timings
    return None


class LlamaCppAdapter:
    """Maps llama.cpp-style ``timings`` draft counters."""

    engine: ClassVar[str] = "llamacpp"

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool:
        return any(_draft_timings(response) is not None for response in responses)

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
        timings = next(filter(None, map(_draft_timings, reversed(responses))), None)
        if timings is None:
            return None
        drafted = exact_int(timings.get("draft_n"))
        accepted = exact_int(timings.get("draft_n_accepted"))
        if drafted is None or accepted is None:
            return None
        rounds = None
        if "draft_rounds" in timings:
            rounds = exact_int(timings["draft_rounds"])
            if rounds is None:
                return None
        return build_record(
            cls.engine,
            responses,
            mean_acceptance_length=derived_mean_acceptance_length(accepted, rounds),
            draft_acceptance_rate=derived_rate(accepted, drafted),
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
            num_spec_steps=rounds,
        )
