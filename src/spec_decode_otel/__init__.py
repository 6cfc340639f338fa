"""spec-decode-otel: per-request speculative-decoding acceptance as OpenTelemetry.

Public API lives here only; submodules are implementation detail.
"""

from spec_decode_otel.adapters import SpecDecodeAdapter, detect
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.parsing import record_from_json, record_from_text
from spec_decode_otel.record import SpecDecodeAcceptanceRecord
from spec_decode_otel.version import __version__

__all__ = [
    "ParsedResponse",
    "SpecDecodeAcceptanceRecord",
    "SpecDecodeAdapter",
    "__version__",
    "detect",
    "record_from_json",
    "record_from_text",
]
