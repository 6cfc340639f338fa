"""Shared set-up for the unit tests of the core (record, capture, adapters, parsing).

- Hypothesis budget: the profile ``spec-decode-otel-fuzz`` runs 200 examples per property
  (modest for CI); set ``SPEC_DECODE_OTEL_FUZZ_EXAMPLES`` to run more, e.g. 20000 for a
  soak. Property tests use it through ``settings.get_profile(FUZZ_PROFILE)``.
- Logging state: the core rate-limits its warnings per key for 60 s and logs an
  isolated adapter's first failure once; both are process-wide, so each test starts
  with them cleared or a warning logged by an earlier test would be swallowed.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from spec_decode_otel._logging import rate_limited
from spec_decode_otel.adapters import registry

FUZZ_PROFILE = "spec-decode-otel-fuzz"

settings.register_profile(
    FUZZ_PROFILE,
    max_examples=int(os.environ.get("SPEC_DECODE_OTEL_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(autouse=True)
def _fresh_log_state():
    """Clear the rate limiter and the once-per-adapter failure memory around each test."""

    def clear() -> None:
        with rate_limited._lock:
            rate_limited._last.clear()
            rate_limited._suppressed.clear()
        registry._failed_once.clear()

    clear()
    yield
    clear()
