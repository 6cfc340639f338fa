"""Comparing a record with a test vector's ``expected_record``.

The vectors in ``tests/data/wire-examples`` are kept identical to the shared ones, which
predate the record's newer optional fields (``draft_method``). A record matches a
vector when it has the vector's values and every field the vector does not name is
unset (None).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The test vectors (``*.json``: request, response or chunks, and ``expected_record``).
WIRE_EXAMPLES = Path(__file__).resolve().parent / "data" / "wire-examples"


def dump_like(record: Any, expected: dict[str, Any]) -> dict[str, Any] | None:
    """``record``'s JSON form (a record, or its JSON already decoded) restricted to
    ``expected``'s keys; the other fields must be None, or the comparison would hide a
    value the vector does not expect."""
    if record is None:
        return None
    dumped = record if isinstance(record, dict) else record.model_dump(mode="json")
    extra = {k: v for k, v in dumped.items() if k not in expected and v is not None}
    assert not extra, f"fields the vector does not expect: {extra}"
    return {k: v for k, v in dumped.items() if k in expected}
