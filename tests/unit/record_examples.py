"""A full, self-consistent record's fields, shared by the record tests.

k=3, 14 steps: 5 accepted none, 4 one, 3 two, 2 three -> 4 + 6 + 6 = 16 accepted of 42.
Tests derive variants with ``{**FULL, ...}`` and must not mutate it (the lists are shared).
"""

from __future__ import annotations

from typing import Any

FULL: dict[str, Any] = dict(
    engine="vllm",
    mean_acceptance_length=1 + 16 / 14,
    draft_acceptance_rate=16 / 42,
    acceptance_histogram={0: 5, 1: 4, 2: 3, 3: 2},
    num_accepted_draft_tokens=16,
    num_draft_tokens=42,
    num_spec_steps=14,
    num_spec_tokens=3,
    completion_tokens=31,
    per_step_accepted=[0] * 5 + [1] * 4 + [2] * 3 + [3] * 2,
    per_step_drafted=[3] * 14,
)
