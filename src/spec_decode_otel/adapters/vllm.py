"""vLLM: both generations of per-request spec-decode stats.

Merged format (vLLM >= 0.29, ``--per-request-spec-decode-metrics``): one object at the
response root, ``metrics.speculative_decoding``, with a dense histogram of length k+1;
streams carry it only on the final usage chunk. Pre-merge format (the PR's earlier
revision, ``--per-request-spec-decode-stats``): per choice,
``choices[i].speculative_decoding_stats``, with a sparse string-keyed histogram; streams
carry it on the finish_reason chunk. Servers of both generations are deployed, so one
adapter reads both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from spec_decode_otel.adapters._fields import (
    build_record,
    dense_histogram,
    derived_mean_acceptance_length,
    derived_rate,
    exact_int,
    is_present,
    per_step_arrays,
    stats_choice_indices,
)
from spec_decode_otel.adapters.protocol import InvalidPayload
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import (
    MAX_SPEC_TOKENS,
    SpecDecodeAcceptanceRecord,
    digit_key,
    finite_number,
)

_MERGED = "speculative_decoding"
_PREMERGE = "speculative_decoding_stats"


class VllmAdapter:
    """Maps vLLM's merged (root ``metrics``) and pre-merge (per-choice) shapes."""

    engine: ClassVar[str] = "vllm"
    #: The merged shape's stats ride only the usage chunk (the pre-merge shape's ride the
    #: finish chunk, but that shape is gone from vLLM since 0.33.0).
    usage_chunk_engines: ClassVar[frozenset[str]] = frozenset({"vllm"})

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool:
        # A null or empty stats object is vLLM saying "none here" (stats off, or n > 1).
        return cls._last_stats(responses)[0] is not None

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
        if len(stats_choice_indices(responses, _PREMERGE)) > 1:
            return None
        stats, dense = cls._last_stats(responses)
        if not isinstance(stats, Mapping):
            raise InvalidPayload("vllm payload: stats are not an object")
        get = stats.get
        raw_k = get("num_spec_tokens")
        k = exact_int(raw_k)
        if raw_k is not None and (k is None or k > MAX_SPEC_TOKENS):
            raise InvalidPayload("vllm payload: num_spec_tokens is not a count within bounds")
        raw_hist: Any = get("acceptance_histogram")
        if dense:
            hist = dense_histogram(raw_hist)
            if hist is None or k is None or len(raw_hist) != k + 1:
                raise InvalidPayload("vllm payload: histogram is not a dense list of k+1 ints")
            by_length = get("acceptance_histogram_by_draft_length")
            if by_length is not None and not _by_draft_length_agrees(by_length, raw_hist):
                raise InvalidPayload("vllm payload: histogram by draft length disagrees")
        else:
            hist = _sparse_string_keyed(raw_hist)
            if hist is None:
                raise InvalidPayload("vllm payload: histogram is not a sparse map of counts")

        steps = exact_int(get("num_spec_steps"))
        accepted = exact_int(get("num_accepted_draft_tokens"))
        drafted = exact_int(get("num_draft_tokens"))
        if steps is None or accepted is None or drafted is None:
            raise InvalidPayload("vllm payload: counts are not exact non-negative integers")
        # The engine's float when sent (the record checks it against the counts).
        if "mean_acceptance_length" in stats:
            mal = finite_number(stats["mean_acceptance_length"])
        else:
            mal = derived_mean_acceptance_length(accepted, steps)
        if "draft_acceptance_rate" in stats:
            rate = finite_number(stats["draft_acceptance_rate"])
        else:
            rate = derived_rate(accepted, drafted)
        if mal is None or rate is None:
            raise InvalidPayload("vllm payload: mean or rate is not a finite number")
        per_acc, per_drf = per_step_arrays(get("per_step_accepted"), get("per_step_drafted"))
        return build_record(
            cls.engine,
            responses,
            mean_acceptance_length=mal,
            draft_acceptance_rate=rate,
            acceptance_histogram=hist,
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
            num_spec_steps=steps,
            num_spec_tokens=k,
            per_step_accepted=per_acc,
            per_step_drafted=per_drf,
        )

    @staticmethod
    def _last_stats(responses: Sequence[ParsedResponse]) -> tuple[Mapping[str, Any] | None, bool]:
        """The last present stats object, and whether it is the merged (dense) shape."""
        for response in reversed(responses):
            metrics = response.root.get("metrics")
            if isinstance(metrics, Mapping) and is_present(metrics.get(_MERGED)):
                return metrics[_MERGED], True
            for choice in reversed(response.choices):
                if is_present(choice.get(_PREMERGE)):
                    return choice[_PREMERGE], False
        return None, False


def _sparse_string_keyed(value: Any) -> dict[int, int] | None:
    """The pre-merge histogram: a JSON object with digit-string keys and int counts."""
    if not isinstance(value, Mapping) or len(value) > MAX_SPEC_TOKENS + 1:
        return None
    sparse: dict[int, int] = {}
    for key, count in value.items():
        j = digit_key(key)
        if j is None or exact_int(count) is None:
            return None
        if count:
            sparse[j] = count
    return sparse


def _by_draft_length_agrees(by_length: Any, flat: list[int]) -> bool:
    """``acceptance_histogram_by_draft_length`` (pending upstream) must sum to the flat one.

    Each entry ``{"<d>": [d+1 ints]}`` counts the steps that drafted d tokens; summed over
    d bucket by bucket they are the flat histogram.
    """
    if not isinstance(by_length, Mapping) or len(by_length) > len(flat) + 1:
        return False
    total = [0] * len(flat)
    for key, hist in by_length.items():
        draft_len = digit_key(key)
        if draft_len is None or type(hist) is not list or len(hist) != draft_len + 1:
            return False
        if draft_len + 1 > len(flat):
            return False
        for j, count in enumerate(hist):
            if exact_int(count) is None:
                return False
            total[j] += count
    return total == flat
