"""benchmarks/attribution.py charges each py-spy sample to the right owner.

The script's figures (our own µs per call, the SDK running slower next to ours) are only
as good as this charging rule, so it is pinned here on hand-written raw stacks.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SITE = "/venv/lib/python3.11/site-packages"
LOOP = f"<module> ({BENCHMARKS}/_worker.py:160);main ({BENCHMARKS}/_worker.py:148);"
LOOP += f"Worker.loop ({BENCHMARKS}/_worker.py:120)"


@pytest.fixture(scope="module")
def attribution() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("attribution", BENCHMARKS / "attribution.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["attribution"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def line(*frames: str, count: int = 1) -> str:
    return ";".join(frames) + f" {count}"


OURS = f"Call._end ({SITE}/spec_decode_otel/instrumentation/call.py:241)"
RECORD = f"Histogram.record ({SITE}/opentelemetry/sdk/metrics/_internal/instrument.py:321)"
SDK = f"SyncAPIClient.request ({SITE}/openai/_base_client.py:990)"
STDLIB = "Lock.acquire (/usr/lib/python3.11/threading.py:300)"
WRAPPER = f"Instrumentation.sync_request ({SITE}/spec_decode_otel/instrumentation/wrappers.py:243)"


def test_samples_outside_the_call_loop_are_ignored(attribution: ModuleType) -> None:
    result = attribution.attribute(
        [
            line("Thread._bootstrap (/usr/lib/python3.11/threading.py:1002)", count=50),
            line(LOOP, OURS, count=3),
        ]
    )
    assert result.samples == 3
    assert result.by_owner["ours"] == 3


def test_a_standard_library_leaf_is_charged_to_its_caller(attribution: ModuleType) -> None:
    result = attribution.attribute([line(LOOP, OURS, STDLIB, count=4)])
    assert result.by_owner == {"ours": 4}
    assert result.by_function["ours"] == {"Call._end (instrumentation/call.py)": 4}


def test_the_sdk_called_from_our_wrapper_is_the_sdks(attribution: ModuleType) -> None:
    result = attribution.attribute(
        [line(LOOP, WRAPPER, SDK, STDLIB, count=7), line(LOOP, WRAPPER, count=1)]
    )
    assert result.by_owner["sdk"] == 7
    assert result.by_owner["ours"] == 1


def test_opentelemetry_called_from_our_code_is_opentelemetrys(attribution: ModuleType) -> None:
    result = attribution.attribute([line(LOOP, OURS, RECORD, STDLIB, count=2)])
    assert result.by_owner == {"otel": 2}


def test_shares_scale_to_microseconds_per_call(attribution: ModuleType) -> None:
    result = attribution.attribute(
        [line(LOOP, OURS, count=1), line(LOOP, SDK, count=3), line("garbage")]
    )
    us = result.us_per_call(800.0)
    assert us["ours"] == pytest.approx(200.0)
    assert us["sdk"] == pytest.approx(600.0)
    assert sum(us.values()) == pytest.approx(800.0)
