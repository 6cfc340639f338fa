"""spec-decode-otel: per-request speculative-decoding acceptance as OpenTelemetry."""

from spec_decode_otel.version import __version__

__all__ = ["__version__"]
