"""Check that spec-decode-otel finds the installed XSpec adapter through its entry point.

Run (after ``pip install examples/custom_adapter``):  python examples/custom_adapter/check_plugin.py
"""

from __future__ import annotations

import spec_decode_otel
from spec_decode_otel.adapters import registered_adapters

BODY = {
    "id": "cmpl-1",
    "object": "chat.completion",
    "model": "xspec-7b",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 33, "total_tokens": 38},
    "x_spec": {"steps": 12, "accepted": 21, "drafted": 36},
}

print("adapters:", ", ".join(a.engine for a in registered_adapters()))
record = spec_decode_otel.record_from_json(BODY)
print("record:", record.model_dump_json() if record else None)
