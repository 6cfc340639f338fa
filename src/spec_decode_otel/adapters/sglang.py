"""SGLang (and TokenSpeed): ``sglext.spec_tokens_details`` (root) or per-choice ``meta_info``.

SGLang renamed its counters across releases, so each count is read through its aliases,
newest first. Its ``spec_accept_length`` counts the prefill token (completion tokens /
verify steps), which is not the record's definition, so the mean acceptance length is
always derived from the counts instead of taken verbatim; the rate likewise.

Draft length k (SGLang 0.5.23): the histogram grows lazily, one bucket past the largest
acceptance seen in the request, so its length says nothing about k. SGLang computes
``spec_num_proposed_drafts = spec_verify_ct * (speculative_num_draft_tokens - 1)``, so k
is that quotient when it divides exactly (with EAGLE top-k > 1 it is the tree size minus
one: an upper bound on any step's acceptance, which is all the record needs), and
unknown otherwise. A missing histogram is sent as ``[]``: with steps > 0 that means "no
histogram", and the record is partial.

That proposed count is computed, not counted: the tokenizer manager multiplies by the
draft length the server started with, while ``--speculative-adaptive`` (EAGLE/EAGLE3,
top-k 1) moves the worker's draft length at run time (``apply_runtime_state`` in
``eagle_worker_v2.py``; by default among 1, 3, 5 and 7 steps at batch size 1). When the
measured counts contradict it (a histogram bucket past k, or more accepted than
proposed), the proposed count, k and the rate are left out and the record is partial;
the steps, accepted drafts and histogram are SGLang's own counts. Moved below the
startup length, the count is too high and the rate reads low: nothing on the wire tells.
Only SGLang's own names are read so; TokenSpeed's counts are held to the rules as sent.

TokenSpeed (SGLang-derived, PR lightseekorg/tokenspeed#1443) sends ``spec_verify_ct``,
``spec_accepted_tokens`` (bonus excluded, as in SGLang) and ``spec_draft_tokens`` in
``meta_info``; its records say ``engine="tokenspeed"``.

A request with no verify step (one token, from the prefill) has a record of 0 steps when
the engine sends one: TokenSpeed sends ``spec_verify_ct: 0`` alone then, and SGLang before
0.5 ``spec_verify_ct: 0`` with its two floats at 0 (both set their counts only when a
step ran): the counts are 0, not missing. SGLang 0.5.23 sends no spec keys and so no
``sglext`` then (``tokenizer_manager.py`` ``_calculate_spec_decoding_metrics``): no
record.
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
    first_present,
    is_present,
    stats_choice_indices,
)
from spec_decode_otel.adapters.protocol import InvalidPayload
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import MAX_SPEC_TOKENS, SpecDecodeAcceptanceRecord, finite_number

_STEPS = ("spec_verify_ct",)
_TOKENSPEED_ACCEPTED = "spec_accepted_tokens"
_TOKENSPEED_DRAFTED = "spec_draft_tokens"
_ACCEPTED = (
    "spec_num_correct_drafts",
    "spec_accepted_drafts",
    "spec_accept_token_num",
    _TOKENSPEED_ACCEPTED,
)
_DRAFTED = (
    "spec_num_proposed_drafts",
    "spec_proposed_drafts",
    "spec_draft_token_num",
    _TOKENSPEED_DRAFTED,
)
_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")
_FLOATS = ("spec_accept_rate", "spec_accept_length")
_SIGNATURE = _STEPS + _ACCEPTED + _DRAFTED + _HISTOGRAM


def _sglext_details(response: ParsedResponse) -> Any:
    sglext = response.root.get("sglext")
    return sglext.get("spec_tokens_details") if isinstance(sglext, Mapping) else None


def _meta_has_spec(choice: Mapping[str, Any]) -> bool:
    meta = choice.get("meta_info")
    return isinstance(meta, Mapping) and any(name in meta for name in _SIGNATURE)


def draft_length(steps: int | None, drafted: int | None) -> int | None:
    """k = drafted / steps when it divides exactly and is within bounds, else unknown."""
    if not steps or drafted is None or drafted % steps:
        return None
    k = drafted // steps
    return k if k <= MAX_SPEC_TOKENS else None


class SglangAdapter:
    """Maps SGLang's spec-token details, whichever of its two locations carries them."""

    engine: ClassVar[str] = "sglang"
    #: SGLang sends its stats only when the request asks for them.
    request_fields: ClassVar[Mapping[str, Any]] = {"return_spec_tokens_details": True}

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool:
        return any(
            is_present(_sglext_details(response)) or any(map(_meta_has_spec, response.choices))
            for response in responses
        )

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
        if len(stats_choice_indices(responses, "meta_info")) > 1:
            return None
        details = cls._last_details(responses)
        if details is None:
            return None
        if not isinstance(details, Mapping):
            raise InvalidPayload("sglang payload: spec_tokens_details is not an object")
        sent = [first_present(details, *names) for names in (_STEPS, _ACCEPTED, _DRAFTED)]
        steps, accepted, drafted = map(exact_int, sent)
        if any(value is not None and exact_int(value) is None for value in sent):
            return None  # present but not an exact count: malformed, not "unreported"
        step_count_only = steps == 0 and accepted is None and drafted is None
        if step_count_only:
            # No verify step (a one-token reply): TokenSpeed and SGLang before 0.5 send
            # the step count and their counts only when it is above 0.
            accepted = drafted = 0
        if accepted is None or (steps is None and drafted is None):
            return None
        for name in _FLOATS:
            # SGLang's own floats are not used (the counts define ours), but a NaN or a
            # string where the engine sends a number means the payload is corrupt.
            if name in details and finite_number(details[name]) is None:
                return None
        k = draft_length(steps, drafted)
        raw_hist = first_present(details, *_HISTOGRAM)
        hist = None
        if raw_hist is not None:
            hist = dense_histogram(raw_hist)
            if hist is None:
                return None
            if not raw_hist and steps:
                hist = None  # SGLang's filler for a histogram it did not keep
        tokenspeed = (
            _TOKENSPEED_ACCEPTED in details and not any(name in details for name in _ACCEPTED[:-1])
        ) or (step_count_only and not any(name in details for name in _FLOATS))
        if not tokenspeed and (
            (k is not None and hist and max(hist) > k)
            or (drafted is not None and accepted > drafted)
        ):
            drafted = k = None  # the proposed count assumed a draft length not used
        return build_record(
            "tokenspeed" if tokenspeed else cls.engine,
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
                if _meta_has_spec(choice):
                    return choice["meta_info"]
        return None
