"""Speculative-decoding counts in ``usage.completion_tokens_details``.

The smg gateway (smg-project/smg PR #2481) fills OpenAI's
``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` with spec-decode counts
for TokenSpeed, SGLang and vLLM back ends (accepted drafts, bonus excluded; rejected =
proposed - accepted): through its gRPC router it is the only form the stats take.
Baseten documents the same pair for speculative decoding.

On OpenAI's own API (and Cerebras') the same two fields count Predicted Outputs, which
is not speculative decoding. So this adapter reads them only when the request is known
and carried no ``prediction``, and only when the pair is not both zero (what OpenAI
sends for every request without one). Without the request it stays off.

Counts only: the record is partial, with accepted = ``accepted_prediction_tokens``,
drafted = accepted + rejected and their rate; no steps, mean or histogram. The engine
behind the gateway is not named on the wire, so the record says
``engine="usage_details"``.

It is a fallback adapter: it is asked only when no other adapter claims the response
(a body that carries an engine's own stats as well is read from those).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from spec_decode_otel.adapters._fields import build_record, derived_rate, exact_int
from spec_decode_otel.adapters.protocol import InvalidPayload
from spec_decode_otel.capture import ParsedResponse, last_usage, request_of
from spec_decode_otel.record import SpecDecodeAcceptanceRecord

DETAILS = "completion_tokens_details"
ACCEPTED = "accepted_prediction_tokens"
REJECTED = "rejected_prediction_tokens"


def _last_details(responses: Sequence[ParsedResponse]) -> Mapping[str, Any] | None:
    """``completion_tokens_details`` of the last non-empty usage block."""
    details = last_usage(responses).get(DETAILS)
    return details if isinstance(details, Mapping) else None


def _without_prediction(request: Mapping[str, Any] | None) -> bool:
    """True when the request is known and asked for no Predicted Outputs."""
    return isinstance(request, Mapping) and request.get("prediction") is None


class UsageDetailsAdapter:
    """Maps the accepted/rejected prediction-token pair when it cannot be Predicted Outputs."""

    engine: ClassVar[str] = "usage_details"
    #: Asked only when no other adapter claims the response.
    fallback: ClassVar[bool] = True
    #: The pair is in ``usage``: a stream has it only on the usage chunk.
    usage_chunk_engines: ClassVar[frozenset[str]] = frozenset({"usage_details"})

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool:
        if not _without_prediction(request_of(responses)):
            return False
        details = _last_details(responses)
        if details is None or details.get(ACCEPTED) is None or details.get(REJECTED) is None:
            return False
        return details.get(ACCEPTED) != 0 or details.get(REJECTED) != 0

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
        details = _last_details(responses)
        if details is None or not _without_prediction(request_of(responses)):
            return None
        accepted = exact_int(details.get(ACCEPTED))
        rejected = exact_int(details.get(REJECTED))
        if accepted is None or rejected is None:
            raise InvalidPayload("usage_details payload: prediction tokens are not counts")
        drafted = accepted + rejected
        return build_record(
            cls.engine,
            responses,
            draft_acceptance_rate=derived_rate(accepted, drafted),
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
        )
