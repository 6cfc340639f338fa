"""What an adapter is: one engine's wire shape, mapped onto the record.

Adapters are stateless classes with two classmethods, so the registry can hold the
classes themselves and third parties can ship one without instantiation rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol, runtime_checkable

from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import SpecDecodeAcceptanceRecord


@runtime_checkable
class SpecDecodeAdapter(Protocol):
    """The contract every adapter (built-in or from an entry point) fulfils.

    ``can_adapt`` must be cheap and side-effect free and recognise only its own engine's
    signature (location plus field names, never a server header): when two adapters
    claim one response, detection yields nothing rather than guess. ``adapt`` must not
    raise; a malformed or contradictory payload gives None.
    """

    engine: ClassVar[str]

    @classmethod
    def can_adapt(cls, responses: Sequence[ParsedResponse]) -> bool: ...

    @classmethod
    def adapt(cls, responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None: ...
