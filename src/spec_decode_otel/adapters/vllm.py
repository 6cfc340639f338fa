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

from spec_decode_otel._logging import logger, rate_limited
from spec_decode_otel.adapters._fields import (
    build_record,
    choice_has,
    dense_histogram,
    derived_mean_acceptance_length,
    derived_rate,
    exact_int,
    finite_number,
    int_array,
    is_present,
    stats_choice_indices,
)
from spec_decode_otel.capture import ParsedResponse, is_multi_sequence
from spec_decode_otel.record import MAX_ARRAY_LENGTH, SpecDecodeAcceptanceRecord

_MERGED = "speculative_decoding"
_PREMERGE = "speculative_decoding_stats"


class VllmAdapter:
    """Maps vLLM's merged (root ``metrics``) and pre-merge (per-choice) shapes."""

    engine: ClassVar[str] = "vllm"

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool:
        for response in responses:
            metrics = response.root.get("metrics")
            if metrics is None:  # every other engine's response: skip the ABC check
                continue
            if (type(metrics) is dict or isinstance(metrics, Mapping)) and _MERGED in metrics:
                return True
        return choice_has(responses, _PREMERGE)

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
        # Runs once per instrumented call: each stats key is read once.
        if is_multi_sequence(responses) or len(stats_choice_indices(responses, _PREMERGE)) > 1:
            return None
        stats, dense = cls._last_stats(responses)
        if stats is None:
            return None
        get = stats.get
        raw_k = get("num_spec_tokens")
        k = exact_int(raw_k)
        if k is None and raw_k is not None:
            return None  # present but not a count: malformed, not "variable k"
        raw_hist = get("acceptance_histogram")
        if dense:
            hist = dense_histogram(raw_hist)
            if hist is None or k is None or len(raw_hist) != k + 1:
                logger.debug("vLLM histogram is not a dense list of k+1 ints")
                return None
            by_length = get("acceptance_histogram_by_draft_length")
            if by_length is not None and not _by_draft_length_agrees(by_length, raw_hist):
                return None
        else:
            hist = _sparse_string_keyed(raw_hist)
            if hist is None:
                return None

        steps = exact_int(get("num_spec_steps"))
        accepted = exact_int(get("num_accepted_draft_tokens"))
        drafted = exact_int(get("num_draft_tokens"))
        if steps is None or accepted is None or drafted is None:
            logger.debug("vLLM stats lack exact integer counts")
            return None
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
            return None
        per_acc, per_drf = get("per_step_accepted"), get("per_step_drafted")
        if (per_acc is not None and int_array(per_acc) is None) or (
            per_drf is not None and int_array(per_drf) is None
        ):
            logger.debug("vLLM per-step arrays are not lists under the size cap")
            return None
        record = build_record(
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
        if record is not None:
            _check_usage_identity(record)
        return record

    @staticmethod
    def _last_stats(responses: Sequence[ParsedResponse]) -> tuple[Mapping[str, Any] | None, bool]:
        """The last present stats object, and whether it is the merged (dense) shape."""
        for response in reversed(responses):
            metrics = response.root.get("metrics")
            if metrics is not None and (type(metrics) is dict or isinstance(metrics, Mapping)):
                merged = metrics.get(_MERGED)
                if merged is not None and is_present(merged):
                    return merged, True
            for choice in reversed(response.choices):
                stats = choice.get(_PREMERGE)
                if stats is not None and is_present(stats):
                    return stats, False
        return None, False


def _sparse_string_keyed(value: Any) -> dict[int, int] | None:
    """The pre-merge histogram: a JSON object with digit-string keys and int counts."""
    if not isinstance(value, Mapping) or len(value) > MAX_ARRAY_LENGTH:
        return None
    sparse: dict[int, int] = {}
    for key, count in value.items():
        if type(key) is not str or not (key.isascii() and key.isdigit()):
            return None
        if type(count) is not int or count < 0:
            return None
        if count:
            sparse[int(key)] = count
    return sparse


def _by_draft_length_agrees(by_length: Any, flat: list[int]) -> bool:
    """``acceptance_histogram_by_draft_length`` (pending upstream) must sum to the flat one.

    Each entry ``{"<d>": [d+1 ints]}`` counts the steps that drafted d tokens; summed over
    d bucket by bucket they are the flat histogram.
    """
    if not isinstance(by_length, Mapping) or len(by_length) > len(flat) + 1:
        logger.debug("vLLM acceptance_histogram_by_draft_length is malformed")
        return False
    total = [0] * len(flat)
    for key, hist in by_length.items():
        if type(key) is not str or not (key.isascii() and key.isdigit()):
            return False
        draft_len = int(key)
        if type(hist) is not list or len(hist) != draft_len + 1 or draft_len + 1 > len(flat):
            return False
        for j, count in enumerate(hist):
            if type(count) is not int or count < 0:
                return False
            total[j] += count
    if total != flat:
        logger.debug("vLLM histogram by draft length disagrees with the flat histogram")
        return False
    return True


def _check_usage_identity(record: SpecDecodeAcceptanceRecord) -> None:
    """steps + accepted == completion_tokens, give or take the prefill token.

    A warning-level signal, not a rejection: prefill-only tokens and truncation can
    legitimately move it, but a large gap usually means a proxy rewrote usage.
    """
    if record.completion_tokens is None or record.num_spec_steps is None:
        return
    produced = record.num_spec_steps + (record.num_accepted_draft_tokens or 0)
    if abs(record.completion_tokens - produced) > 1:
        rate_limited.log(
            30,
            "vllm-usage-identity",
            "vLLM spec-decode counts (%d steps + %d accepted) disagree with usage "
            "completion_tokens (%d)",
            record.num_spec_steps,
            record.num_accepted_draft_tokens or 0,
            record.completion_tokens,
        )
