"""TensorRT-LLM: the per-choice ``speculative_decoding`` object, or only an average.

The full object (open PR NVIDIA/TensorRT-LLM#19311, server opt-in
``per_request_spec_decode_stats: true``) gives counts and a dense histogram; the mean
acceptance length is derived (1 + accepted/steps) since the engine sends none.
``num_spec_tokens`` is null under a draft-length schedule.

Released servers send only ``avg_decoded_tokens_per_iter`` per choice (every streamed
chunk; the last one wins): ``getAvgDecodedTokensPerIter`` in ``llmRequest.h``, the
tokens generated over the decoding iterations, where the PyTorch sampler counts the
prefill iteration and its token too. For S verify steps and A accepted drafts that is
(1 + S + A) / (1 + S), not the record's 1 + A / S, and nothing else on the wire gives S
or A (``usage.completion_tokens`` need not equal the engine's count of generated
tokens). So the record is partial and carries TensorRT-LLM's own average as its mean
acceptance length, every count None; README says how far it reads low. No count is
invented. An average of exactly 0 is the engine's "no decoding iteration yet" (the
getter returns 0 while ``mDecodingIter`` is 0, as after a prefill-only request on the C++
runtime): no stats, not a malformed payload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from spec_decode_otel.adapters._fields import (
    build_record,
    dense_histogram,
    derived_mean_acceptance_length,
    derived_rate,
    exact_int,
    is_present,
    last_choice_field,
    stats_choice_indices,
)
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import SpecDecodeAcceptanceRecord, finite_number

_STATS = "speculative_decoding"
_AVERAGE = "avg_decoded_tokens_per_iter"


def _has_average(value: object) -> bool:
    return is_present(value) and not (type(value) in (int, float) and value == 0)


class TensorRtLlmAdapter:
    """Maps TensorRT-LLM's per-choice stats, full or acceptance-length-only."""

    engine: ClassVar[str] = "tensorrt_llm"

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool:
        return any(
            is_present(choice.get(_STATS)) or _has_average(choice.get(_AVERAGE))
            for response in responses
            for choice in response.choices
        )

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
        if len(stats_choice_indices(responses, _STATS)) > 1:
            return None
        stats = last_choice_field(responses, _STATS)
        if stats is not None:
            return cls._full(stats, responses)
        average = finite_number(last_choice_field(responses, _AVERAGE))
        if average is None:
            return None
        return build_record(cls.engine, responses, mean_acceptance_length=average)

    @classmethod
    def _full(
        cls, stats: object, responses: Sequence[ParsedResponse]
    ) -> SpecDecodeAcceptanceRecord | None:
        if not isinstance(stats, dict):
            return None
        raw_hist: Any = stats.get("acceptance_histogram")
        hist = dense_histogram(raw_hist)
        k_raw = stats.get("num_spec_tokens")
        k = exact_int(k_raw)
        if hist is None or (k_raw is not None and (k is None or len(raw_hist) != k + 1)):
            return None
        steps = exact_int(stats.get("num_spec_steps"))
        accepted = exact_int(stats.get("total_accepted_draft_tokens"))
        drafted = exact_int(stats.get("total_draft_tokens"))
        if steps is None or accepted is None or drafted is None:
            return None
        sent_rate = stats.get("acceptance_rate")
        rate = derived_rate(accepted, drafted) if sent_rate is None else finite_number(sent_rate)
        if rate is None:
            return None
        return build_record(
            cls.engine,
            responses,
            mean_acceptance_length=derived_mean_acceptance_length(accepted, steps),
            draft_acceptance_rate=rate,
            acceptance_histogram=hist,
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
            num_spec_steps=steps,
            num_spec_tokens=k,
        )
