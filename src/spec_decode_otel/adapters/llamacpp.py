"""The ``timings`` family: llama.cpp server, mlx-vlm (and servers that copy them).

Root ``timings`` carries ``draft_n`` (drafted) and ``draft_n_accepted`` (accepted) when
something was drafted. There is no histogram on the wire and none is synthesized.

Which engine sent it is told by two fields only mlx-vlm has (0.7.10): ``draft_rounds``
(verify steps) and ``draft_kind`` (the drafter, e.g. ``eagle3``, ``mtp``, ``dflash``).
llama.cpp's server (``server_slot_stats::to_json``) sends neither. So a ``timings`` with
either field is labelled ``mlx_vlm`` (mlxcel, which copies mlx-vlm's fields, reads the
same), anything else ``llamacpp``. ``draft_kind`` becomes the record's ``draft_method``;
``draft_rounds`` gives steps and the mean acceptance length. Without rounds the record
has no steps and no mean, only the counts and the rate they define.
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
from spec_decode_otel.adapters.protocol import InvalidPayload
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import SpecDecodeAcceptanceRecord

#: Fields mlx-vlm adds to llama.cpp's ``timings``.
MLX_VLM_FIELDS = ("draft_rounds", "draft_kind")


def _draft_timings(response: ParsedResponse) -> Mapping[str, Any] | None:
    """The response's ``timings`` when it carries draft counters (``draft_n``), else None."""
    timings = response.root.get("timings")
    if isinstance(timings, Mapping) and timings.get("draft_n") is not None:
        return timings
    return None


def _final_timings(response: ParsedResponse) -> Mapping[str, Any] | None:
    """:func:`_draft_timings` of a response that ends its sequence, else None.

    With ``timings_per_token`` llama.cpp puts the running counts on every content chunk
    (``server_task_result_cmpl_partial`` in tools/server/server-task.cpp, b11312 to b11434); only
    the chunk with the ``finish_reason`` or the usage (a Responses stream's
    ``response.completed``) holds the request's own. A stream the caller left before that
    chunk has no stats, not the counts so far.
    """
    ends = response.usage is not None or any(
        choice.get("finish_reason") is not None for choice in response.choices
    )
    return _draft_timings(response) if ends else None


class LlamaCppAdapter:
    """Maps llama.cpp-style ``timings`` draft counters (llama.cpp and mlx-vlm)."""

    engine: ClassVar[str] = "llamacpp"
    #: mlx-vlm streams its counters only on the usage chunk; llama.cpp on the finish chunk.
    usage_chunk_engines: ClassVar[frozenset[str]] = frozenset({"mlx_vlm"})

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool:
        return any(_final_timings(response) is not None for response in responses)

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
        timings = next(filter(None, map(_final_timings, reversed(responses))), None)
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
        method = timings.get("draft_kind")
        if method is not None and not isinstance(method, str):
            raise InvalidPayload("mlx_vlm payload: draft_kind is not a string")
        mlx_vlm = any(name in timings for name in MLX_VLM_FIELDS)
        return build_record(
            "mlx_vlm" if mlx_vlm else cls.engine,
            responses,
            draft_method=method or None,
            mean_acceptance_length=derived_mean_acceptance_length(accepted, rounds),
            draft_acceptance_rate=derived_rate(accepted, drafted),
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
            num_spec_steps=rounds,
        )
