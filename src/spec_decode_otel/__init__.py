"""spec-decode-otel: per-request speculative-decoding acceptance as OpenTelemetry.

Public API lives here only; submodules are implementation detail.
"""

from spec_decode_otel.adapters import SpecDecodeAdapter, detect
from spec_decode_otel.attributes import attributes
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.config import Settings
from spec_decode_otel.configure import Telemetries, setup
from spec_decode_otel.instrumentation import (
    SpecDecodeInstrumentor,
    instrument,
    instrument_client,
    uninstrument,
)
from spec_decode_otel.parsing import record_from_json, record_from_text
from spec_decode_otel.record import SpecDecodeAcceptanceRecord
from spec_decode_otel.version import __version__

__all__ = [
    "ParsedResponse",
    "Settings",
    "SpecDecodeAcceptanceRecord",
    "SpecDecodeAdapter",
    "SpecDecodeInstrumentor",
    "Telemetries",
    "__version__",
    "attributes",
    "detect",
    "instrument",
    "instrument_client",
    "record_from_json",
    "record_from_text",
    "setup",
    "uninstrument",
]
