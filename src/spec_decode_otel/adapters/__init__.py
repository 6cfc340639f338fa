"""Engine adapters: each maps one engine's wire shape onto the record.

Use :func:`detect`; the adapter classes are public so tests and plug-ins can reuse them.
"""

from spec_decode_otel.adapters.llamacpp import LlamaCppAdapter
from spec_decode_otel.adapters.protocol import SpecDecodeAdapter
from spec_decode_otel.adapters.registry import (
    BUILTIN_ADAPTERS,
    ENTRY_POINT_GROUP,
    detect,
    registered_adapters,
    reload_adapters,
)
from spec_decode_otel.adapters.sglang import SglangAdapter
from spec_decode_otel.adapters.trtllm import TensorRtLlmAdapter
from spec_decode_otel.adapters.vllm import VllmAdapter

__all__ = [
    "BUILTIN_ADAPTERS",
    "ENTRY_POINT_GROUP",
    "LlamaCppAdapter",
    "SglangAdapter",
    "SpecDecodeAdapter",
    "TensorRtLlmAdapter",
    "VllmAdapter",
    "detect",
    "registered_adapters",
    "reload_adapters",
]
