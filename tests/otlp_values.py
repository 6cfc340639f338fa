"""Decoding OTLP protobuf attributes in tests that receive real OTLP exports."""

from __future__ import annotations

from typing import Any


def otlp_attributes(item: Any) -> dict[str, Any]:
    """An OTLP span's or data point's KeyValue list as a plain dict (arrays as lists)."""
    out: dict[str, Any] = {}
    for kv in item.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [getattr(v, v.WhichOneof("value")) for v in value.array_value.values]
        else:
            out[kv.key] = getattr(value, kind)
    return out
