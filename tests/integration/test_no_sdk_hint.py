"""The ``no-sdk`` hint: calls instrumented while the OpenTelemetry API still has its
stand-in providers (no SDK configured) lose their spans, their metrics or both, and the
dashboard stays empty with nothing said. The hint says which, once per process.

Each case runs in its own process (global providers can be set only once), with the real
OpenTelemetry API and SDK, the real ``openai`` SDK and the simulator. The zero-code case
runs under the real ``opentelemetry-instrument`` with ``OTEL_PYTHON_CONFIGURATOR`` naming
no installed configurator: what happens when ``opentelemetry-distro`` (the package that
registers the SDK's configurator, opentelemetry-distro ``pyproject.toml`` entry point
``opentelemetry_configurator``) is not installed, as ``_load_configurators`` in
opentelemetry-instrumentation's ``auto_instrumentation/_load.py`` shows: no
configurator, no SDK.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from otlp_values import clean_env, run_under_opentelemetry_instrument

APP = Path(__file__).resolve().parent / "no_sdk_app.py"
HINT = "calls are instrumented but no OpenTelemetry SDK is configured for "


def _hints(output: str) -> list[str]:
    assert "calls done" in output, output
    return [line.split(HINT, 1)[1] for line in output.splitlines() if HINT in line]


def _run(case: str, simulator_url: str) -> str:
    done = subprocess.run(
        [sys.executable, str(APP)],
        env=clean_env(NO_SDK_CASE=case, SIMULATOR_URL=simulator_url),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("none", "traces and metrics, so the spec-decode data recorded there is dropped"),
        ("tracing", "metrics (spans keep the record), so"),
    ],
)
def test_calls_with_no_sdk_for_a_signal_say_so_once(
    case: str, said: str, simulator_url: str
) -> None:
    (hint,) = _hints(_run(case, simulator_url))
    assert hint.startswith(said)
    assert "opentelemetry-distro" in hint


@pytest.mark.parametrize("case", ["late", "passed"])
def test_an_sdk_in_place_by_the_first_call_says_nothing(case: str, simulator_url: str) -> None:
    """``late``: instruments made on the API's proxy before ``set_meter_provider()``
    record into the provider set later, so nothing is lost. ``passed``: the application's
    own providers, not the global ones, take the data."""
    assert _hints(_run(case, simulator_url)) == []


def test_a_client_instrumented_before_the_sdk_and_one_after_add_to_the_same_counts(
    simulator_url: str,
) -> None:
    """One client instrumented at import, while the API's stand-in is the meter provider,
    and one after the app set its own: both clients' calls are counted. The second got
    instruments of its own, whose counters the SDK had already registered (through the
    stand-in, with the first's callbacks): its calls added to sums nothing read, and
    ``spec_decode.requests`` showed 2 of 4 calls, with nothing said (found by probing
    start-up orders)."""
    output = _run("clients", simulator_url)
    assert _hints(output) == []
    totals = json.loads(output.split("metrics: ", 1)[1])
    assert totals["spec_decode.requests"] == 4
    assert totals["spec_decode.acceptance_length"] == 4  # the histograms counted all along
    assert totals["spec_decode.verify_steps"] > 0


def test_opentelemetry_instrument_without_a_configurator_says_so(simulator_url: str) -> None:
    done = run_under_opentelemetry_instrument(
        APP,
        NO_SDK_CASE="zero-code",
        SIMULATOR_URL=simulator_url,
        OTEL_PYTHON_CONFIGURATOR="no-such-configurator",
    )
    assert done.returncode == 0, done.stderr
    (hint,) = _hints(done.stdout)
    assert hint.startswith("traces and metrics")


def test_opentelemetry_instrument_with_the_distro_says_nothing(simulator_url: str) -> None:
    """The distro's configurator sets both providers, exporters or not (``none`` is a
    choice, not a missing SDK)."""
    done = run_under_opentelemetry_instrument(
        APP,
        NO_SDK_CASE="zero-code",
        SIMULATOR_URL=simulator_url,
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    assert done.returncode == 0, done.stderr
    assert _hints(done.stdout) == []


def test_opentelemetry_instrument_with_the_sdk_disabled_says_nothing(simulator_url: str) -> None:
    """``OTEL_SDK_DISABLED=true`` turns telemetry off on purpose: no hint."""
    done = run_under_opentelemetry_instrument(
        APP, NO_SDK_CASE="zero-code", SIMULATOR_URL=simulator_url, OTEL_SDK_DISABLED="true"
    )
    assert done.returncode == 0, done.stderr
    assert _hints(done.stdout) == []
