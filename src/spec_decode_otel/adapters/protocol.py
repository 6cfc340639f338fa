"""What an adapter is: one engine's wire shape, mapped onto the record.

Adapters are stateless classes with two classmethods, so the registry can hold the
classes themselves and third parties can ship one without instantiation rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import SpecDecodeAcceptanceRecord


class InvalidPayload(ValueError):
    """Raised by ``adapt`` for stats that are present but break a rule or a bound.

    The message names the rule (never a value from the payload): it is what the call's
    ``invalid`` outcome and the one-time hint report.
    """


@runtime_checkable
class SpecDecodeAdapter(Protocol):
    """The contract every adapter (built-in or from an entry point) fulfils.

    ``can_adapt`` must be cheap and side-effect free and recognise only its own engine's
    signature (location plus field names, never a server header): when two adapters
    claim one response, detection yields nothing rather than guess. ``adapt`` returns
    the record, or None / raises :class:`InvalidPayload` for stats it cannot trust; any
    other exception is treated as a bug in the adapter and isolated.

    ``request_fields`` (optional) names the request-body fields that switch the engine's
    stats on, e.g. SGLang's ``return_spec_tokens_details``. The user opts in per engine
    with ``request_engine_stats``; fields the user set are never overwritten.

    ``usage_chunk_engines`` (optional): the engines (``record.engine`` values) among this
    adapter's records whose streams carry the stats only on the usage chunk, which a
    server sends only for ``stream_options.include_usage`` (vLLM's merged shape, mlx-vlm,
    smg's usage pair). Only their servers get the hint to ask for it.

    ``fallback`` (optional, default False): a fallback adapter is asked only when no
    other adapter claims the response (for shapes that another engine's own stats
    supersede, like counts a gateway copied into ``usage``).

    An adapter whose reading depends on the request (e.g. to tell speculative decoding
    from OpenAI's Predicted Outputs) finds the request body in
    ``ParsedResponse.request``, which is None when the request is not known.
    """

    engine: ClassVar[str]

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool: ...

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None: ...


def request_fields(adapter: object) -> Mapping[str, Any]:
    """The adapter's ``request_fields``, or none (the attribute is optional)."""
    fields = getattr(adapter, "request_fields", None)
    return fields if isinstance(fields, Mapping) else {}
