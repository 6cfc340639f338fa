"""Engine adapters, and the API for writing one.

A plug-in adapter imports :class:`SpecDecodeAdapter` (the protocol),
:class:`ParsedResponse` (what it reads), :class:`InvalidPayload` (how it rejects) and
:func:`detect` (to test itself against the built-ins) from here, and registers under the
entry-point group ``spec_decode_otel.adapters``.
"""

from spec_decode_otel.adapters.llamacpp import LlamaCppAdapter
from spec_decode_otel.adapters.protocol import InvalidPayload, SpecDecodeAdapter
from spec_decode_otel.adapters.registry import (
    BUILTIN_ADAPTERS,
    ENTRY_POINT_GROUP,
    Detection,
    detect,
    detect_outcome,
    registered_adapters,
    reload_adapters,
)
from spec_decode_otel.adapters.sglang import SglangAdapter
from spec_decode_otel.adapters.trtllm import TensorRtLlmAdapter
from spec_decode_otel.adapters.usage_details import UsageDetailsAdapter
from spec_decode_otel.adapters.vllm import VllmAdapter
from spec_decode_otel.capture import ParsedResponse

__all__ = [
    "BUILTIN_ADAPTERS",
    "ENTRY_POINT_GROUP",
    "Detection",
    "InvalidPayload",
    "LlamaCppAdapter",
    "ParsedResponse",
    "SglangAdapter",
    "SpecDecodeAdapter",
    "TensorRtLlmAdapter",
    "UsageDetailsAdapter",
    "VllmAdapter",
    "detect",
    "detect_outcome",
    "registered_adapters",
    "reload_adapters",
]
