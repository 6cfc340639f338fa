"""Why a call has, or has no, record: one word on its span and in a counter.

Users' first question is "why is my dashboard empty?"; every instrumented call answers it
with exactly one of these.
"""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    #: A full record (histogram and counts).
    RECORDED = "recorded"
    #: A record with fields the engine does not report (e.g. llama.cpp: no steps).
    PARTIAL = "partial"
    #: The response carried no spec-decode stats.
    NO_STATS = "no_stats"
    #: n > 1 (or several prompts): stats are request-level, so no record.
    MULTI_SEQUENCE = "multi_sequence"
    #: Stats were present but contradicted themselves or broke a bound.
    INVALID = "invalid"
    #: Two adapters claimed the response.
    AMBIGUOUS = "ambiguous"
    #: The user stopped reading a stream before the stats arrived.
    NOT_READ_TO_END = "not_read_to_end"
    #: The call failed.
    ERROR = "error"
