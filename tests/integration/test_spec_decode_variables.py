"""Every ``SPEC_DECODE_OTEL_*`` variable given a value it cannot take: instrumenting never
raises (under ``opentelemetry-instrument`` an error would stop every instrumentation of
the process: opentelemetry-instrumentation 0.66b2, ``auto_instrumentation/_load.py``
``_load_instrumentors`` re-raises), the setting is README's documented default, a
``RuntimeWarning`` names the variable and its value (an empty or blank value is unset,
and silent), and a call is still recorded.
"""

from __future__ import annotations

import warnings
from typing import Any

import openai
import pytest
from instrumentation_helpers import Otel

from spec_decode_otel import SpecDecodeInstrumentor
from spec_decode_otel.instrumentation.settings import Settings

BOOLEANS = ["INJECT_INCLUDE_USAGE", "INJECT_TRACEPARENT", "RECORD_PER_STEP", "GENAI_METRICS"]

CASES: list[tuple[str, str, str, Any]] = [
    *((name, "", "", False) for name in BOOLEANS),
    *((name, " \t", "", False) for name in BOOLEANS),
    *((name, "enabled", "not a boolean", False) for name in BOOLEANS),
    *((name, "2", "not a boolean", False) for name in BOOLEANS),
    ("MODE", "", "", "auto"),
    ("MODE", "spam", "not one of auto, span, enrich", "auto"),
    ("MODE", "-1", "not one of auto, span, enrich", "auto"),
    ("PER_STEP_MAX_LENGTH", "", "", 1024),
    ("PER_STEP_MAX_LENGTH", "lots", "not an integer", 1024),
    ("PER_STEP_MAX_LENGTH", "1e3", "not an integer", 1024),
    ("PER_STEP_MAX_LENGTH", "3.5", "not an integer", 1024),
    ("PER_STEP_MAX_LENGTH", "9" * 5000, "not an integer", 1024),
    ("PER_STEP_MAX_LENGTH", "-1", "negative", 1024),
    ("PER_STEP_MAX_LENGTH", "-99999999999999999999", "negative", 1024),
    ("REQUEST_ENGINE_STATS", "", "", ()),
    ("REQUEST_ENGINE_STATS", ",, ,", "", ()),
    ("REQUEST_ENGINE_STATS", "sglnag", "unknown engine(s) sglnag left out", ()),
    ("REQUEST_ENGINE_STATS", "sglang,sglnag", "unknown engine(s) sglnag left out", ("sglang",)),
    ("METRIC_ATTRIBUTES", ",, ,", "", ()),
]


@pytest.mark.parametrize(
    ("variable", "value", "warned", "setting"),
    CASES,
    ids=[f"{name}={value[:12]!r}" for name, value, _, _ in CASES],
)
def test_a_variable_with_a_bad_value_warns_and_gives_the_documented_default(
    variable: str,
    value: str,
    warned: str,
    setting: Any,
    monkeypatch: pytest.MonkeyPatch,
    otel: Otel,
    openai_client: openai.OpenAI,
) -> None:
    """README (Configuration): "A variable's bad value is not an error but a
    ``RuntimeWarning`` naming the variable, and a fallback". A negative
    ``SPEC_DECODE_OTEL_PER_STEP_MAX_LENGTH`` was taken as it came, silently: no per-step
    array is ever that short, so ``record_per_step`` recorded nothing and said nothing.
    It warns and gives 1024, as an unparsable value does."""
    monkeypatch.setenv(f"SPEC_DECODE_OTEL_{variable}", value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        otel.instrument()
    told = [str(w.message) for w in caught if w.category is RuntimeWarning]
    if warned:
        (message,) = told
        assert message.startswith(f"SPEC_DECODE_OTEL_{variable}=")
        assert warned in message
    else:
        assert told == []
    instrumentation = SpecDecodeInstrumentor._instrumentation
    assert instrumentation is not None
    assert getattr(instrumentation.settings, variable.lower()) == setting
    openai_client.chat.completions.create(
        model="spec-sim", messages=[{"role": "user", "content": "hi"}]
    )
    (span,) = otel.our_spans()
    assert span.attributes is not None
    assert span.attributes["spec_decode.outcome"] == "recorded"


def test_a_negative_per_step_max_length_keyword_is_an_error() -> None:
    """As a keyword of the wrong type is (README, Configuration): a code's mistake is an
    error where it is made; ``per_step_max_length=-1`` was accepted and recorded no
    per-step array ever."""
    with pytest.raises(ValueError, match="per_step_max_length"):
        Settings.from_env(per_step_max_length=-1)
    assert Settings.from_env(per_step_max_length=0).per_step_max_length == 0
