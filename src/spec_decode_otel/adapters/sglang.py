"""SGLang: ``sglext.spec_tokens_details`` (root) or per-choice ``meta_info``.

SGLang renamed its counters across releases, so each count is read through its aliases,
newest first. Its ``spec_accept_length`` counts the prefill token (completion tokens /
verify steps), which is not the record's definition, so the mean acceptance length is
always derived from the counts instead of taken verbatim; the rate likewise.
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
    finite_number,
    first_present,
    is_present,
    stats_choice_indices,
)
from spec_decode_otel.adapters.protocol import InvalidPayload
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import SpecDecodeAcceptanceRecord

_STEPS = ("spec_verify_ct",)
_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_DRAFTED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")
_FLOATS = ("spec_accept_rate", "spec_accept_length")
_SIGNATURE = _STEPS + _ACCEPTED + _DRAFTED + _HISTOGRAM


def _sglext_details(response: ParsedResponse) -> Any:
    sglext = response.root.get("sglext")
    return sglext.get("spec_tokens_details") if isinstance(sglext, Mapping) else None


def _meta_has_spec(choice: Mapping[str, Any]) -> bool:
    meta = choice.get("meta_info")
    return isinstance(meta, Mapping) and any(name in meta for name in _SIGNATURE)


class SglangAdapter:
    """Maps SGLang's spec-token details, whichever of its two locations carries them."""

    engine: ClassVar[str] = "sglang"
    #: SGLang sends its stats only when the request asks for them.
    request_fields: ClassVar[Mapping[str, Any]] = {"return_spec_tokens_details": True}

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool:
        for response in responses:
            sglext = response.root.get("sglext")
            if isinstance(sglext, Mapping) and is_present(sglext.get("spec_tokens_details")):
                return True
            for choice in response.choices:
                if choice.get("meta_info") is not None and _meta_has_spec(choice):
                    return True
        return False

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
        if len(stats_choice_indices(responses, "meta_info")) > 1:
            return None
        details = cls._last_details(responses)
        if details is None:
            return None
        if not isinstance(details, Mapping):
            raise InvalidPayload("sglang payload: spec_tokens_details is not an object")
        steps = exact_int(first_present(details, *_STEPS))
        accepted = exact_int(first_present(details, *_ACCEPTED))
        drafted = exact_int(first_present(details, *_DRAFTED))
        for names, count in ((_STEPS, steps), (_ACCEPTED, accepted), (_DRAFTED, drafted)):
            if count is None and first_present(details, *names) is not None:
                return None  # present but not an exact count: malformed, not "unreported"
        if accepted is None or (steps is None and drafted is None):
            return None
        for name in _FLOATS:
            # SGLang's own floats are not used (the counts define ours), but a NaN or a
            # string where the engine sends a number means the payload is corrupt.
            if name in details and finite_number(details[name]) is None:
                return None
        raw_hist = first_present(details, *_HISTOGRAM)
        hist = None
        k = None
        if raw_hist is not None:
            hist = dense_histogram(raw_hist)
            if hist is None or not raw_hist:
                return None
            # SGLang's dense histogram has one bucket per possible accepted count, 0..k.
            k = len(raw_hist) - 1
        return build_record(
            cls.engine,
            responses,
            mean_acceptance_length=derived_mean_acceptance_length(accepted, steps),
            draft_acceptance_rate=derived_rate(accepted, drafted),
            acceptance_histogram=hist,
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
            num_spec_steps=steps,
            num_spec_tokens=k,
        )

    @staticmethod
    def _last_details(responses: Sequence[ParsedResponse]) -> Any:
        for response in reversed(responses):
            details = _sglext_details(response)
            if isinstance(details, list):
                # One entry per choice: more than one sequence means no request-level record.
                if len(details) != 1:
                    return None
                details = details[0]
            if is_present(details):
                return details
            for choice in reversed(response.choices):
                meta = choice.get("meta_info")
                if isinstance(meta, Mapping) and _meta_has_spec(choice):
                    return meta
        return None
