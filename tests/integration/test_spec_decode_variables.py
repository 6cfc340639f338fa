"""Every ``SPEC_DECODE_OTEL_*`` variable given a value it cannot take: instrumenting never
raises (under ``opentelemetry-instrument`` an error would stop every instrumentation of
the process: opentelemetry-instrumentation 0.66b2, ``auto_instrumentation/_load.py``
``_load_instrumentors`` re-raises), the setting is README's documented default, a
``RuntimeWarning`` names the variable and its value (an empty or blank value is unset,
and silent), and a call is still recorded.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
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


MISSPELT = [
    ("RECORD_PER_STEPS", "RECORD_PER_STEP"),
    ("PER_STEP_MAX_LEN", "PER_STEP_MAX_LENGTH"),
    ("INJECT_USAGE", "INJECT_INCLUDE_USAGE"),
    ("INCLUDE_USAGE", "INJECT_INCLUDE_USAGE"),
    ("TRACEPARENT", "INJECT_TRACEPARENT"),
    ("GENAI_METRIC", "GENAI_METRICS"),
    ("METRICS_ATTRIBUTES", "METRIC_ATTRIBUTES"),
    ("REQUEST_ENGINE_STAT", "REQUEST_ENGINE_STATS"),
    ("MODES", "MODE"),
]


@pytest.mark.parametrize(("typo", "meant"), MISSPELT, ids=[typo for typo, _ in MISSPELT])
def test_a_misspelt_variable_warns_and_names_the_one_it_is_close_to(
    typo: str, meant: str, monkeypatch: pytest.MonkeyPatch, otel: Otel
) -> None:
    """``SPEC_DECODE_OTEL_RECORD_PER_STEPS=true`` was never read and said nothing: the
    user saw no per-step arrays and no reason. A name close to one of README's variables
    warns, naming both; the setting keeps its default (the misspelt name is not read)."""
    monkeypatch.setenv(f"SPEC_DECODE_OTEL_{typo}", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        otel.instrument()
    (message,) = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert message.startswith(f"SPEC_DECODE_OTEL_{typo} is not a spec-decode-otel variable")
    assert message.endswith(f"did you mean SPEC_DECODE_OTEL_{meant}?")
    instrumentation = SpecDecodeInstrumentor._instrumentation
    assert instrumentation is not None
    default = getattr(Settings(), meant.lower())
    assert getattr(instrumentation.settings, meant.lower()) == default


def _variables_of_scripts_and_tests() -> set[str]:
    root = Path(__file__).resolve().parents[2]
    files = [*root.glob("scripts/*.sh"), *root.glob("tests/**/*.py"), root / ".ci" / "run"]
    found = set()
    for path in files:
        if path.resolve() == Path(__file__).resolve():  # this file's typos are on purpose
            continue
        found.update(re.findall(r"\bSPEC_DECODE_OTEL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    return found - {f"SPEC_DECODE_OTEL_{name.upper()}" for name in Settings.__dataclass_fields__}


def test_the_variables_of_the_projects_scripts_and_tests_pass_in_silence(
    monkeypatch: pytest.MonkeyPatch, otel: Otel
) -> None:
    """The prefix is shared with the install scripts' and tests' own variables (paths to
    the collector, Prometheus, venvs; load sizes): none of them is taken for a typo."""
    others = _variables_of_scripts_and_tests()
    assert {"SPEC_DECODE_OTEL_OTELCOL", "SPEC_DECODE_OTEL_COEXISTENCE_VENVS"} <= others
    for name in others:
        monkeypatch.setenv(name, "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        otel.instrument()
    assert [str(w.message) for w in caught if w.category is RuntimeWarning] == []
