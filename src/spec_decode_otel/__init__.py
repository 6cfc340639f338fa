"""spec-decode-otel: per-request speculative-decoding acceptance as OpenTelemetry.

One obvious way per job:

- ``SpecDecodeInstrumentor().instrument()``: every ``openai`` client in the process (the
  OpenTelemetry convention; ``opentelemetry-instrument`` calls it for you);
- ``setup()``: the OpenTelemetry SDK with OTLP exporters from ``OTEL_*``, then instrument
  (the ``otlp`` extra);
- ``instrument_client(client)``: one client only.

``record_from_json`` / ``record_from_text`` turn saved payloads into records without any
client, and ``attributes(...)`` adds your own dimensions to the calls in a block.
Importing this package loads only the OpenTelemetry API. Adapter authors import from
:mod:`spec_decode_otel.adapters`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spec_decode_otel._attributes import attributes
from spec_decode_otel.instrumentation import SpecDecodeInstrumentor, instrument_client
from spec_decode_otel.outcome import Outcome
from spec_decode_otel.payloads import record_from_json, record_from_text
from spec_decode_otel.record import SpecDecodeAcceptanceRecord
from spec_decode_otel.version import __version__

if TYPE_CHECKING:
    from spec_decode_otel.sdk_setup import Providers


def setup(service_name: str | None = None, **options: Any) -> Providers:
    """Build the OpenTelemetry SDK from ``OTEL_*`` variables, export over OTLP, and
    instrument every ``openai`` client (see :func:`spec_decode_otel.sdk_setup.setup`).

    Needs the ``otlp`` extra; without it, raises ImportError naming the extra.
    """
    from spec_decode_otel.sdk_setup import setup as _setup

    return _setup(service_name, **options)


__all__ = [
    "Outcome",
    "SpecDecodeAcceptanceRecord",
    "SpecDecodeInstrumentor",
    "__version__",
    "attributes",
    "instrument_client",
    "record_from_json",
    "record_from_text",
    "setup",
]
