"""benchmarks/overhead.py turns paired batch timings into figures and their intervals.

The issue's targets are read off these figures, and whether a miss is within one run's
noise is read off the intervals, so both computations are pinned here on made-up
timings, where the right answer is known.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
CHUNKS, SHORT = 103, 8


@pytest.fixture(scope="module")
def overhead() -> ModuleType:
    path = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("overhead", BENCHMARKS / "overhead.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["overhead"] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = path


def diffs(nonstream: list[float], stream: list[float], short: list[float]) -> dict:
    return {"nonstream": nonstream, "stream": stream, "stream_short": short}


def test_the_per_chunk_figure_is_the_slope_between_the_two_streams(
    overhead: ModuleType,
) -> None:
    over = overhead.overheads({"B": diffs([190.0], [345.0], [250.0])}, CHUNKS, SHORT)
    assert over["B"]["nonstream"] == 190.0
    assert over["B"]["per_chunk"] == pytest.approx((345.0 - 250.0) / 95)
    assert over["B"]["per_chunk_vs_nonstream"] == pytest.approx((345.0 - 190.0) / 103)


def test_paired_differences_subtract_each_off_batch_from_its_own_on_batch(
    overhead: ModuleType,
) -> None:
    kinds = ("nonstream", "stream", "stream_short")
    samples = {
        name: {kind: {"on": [10.0, 30.0], "off": [4.0, 5.0]} for kind in kinds}
        for name in overhead.NAMES
    }
    found = overhead.paired_differences(samples)
    assert "A" not in found
    assert found["B"]["stream"] == [6.0, 25.0]


def test_an_interval_without_spread_is_the_figure_itself(overhead: ModuleType) -> None:
    constant = {
        "B": diffs([190.0] * 20, [345.0] * 20, [250.0] * 20),
        "D": diffs([150.0] * 20, [560.0] * 20, [180.0] * 20),
        "E": diffs([100.0] * 20, [150.0] * 20, [90.0] * 20),
        "G": diffs([110.0] * 20, [170.0] * 20, [130.0] * 20),
    }
    found = overhead.intervals(constant, CHUNKS, SHORT, overhead.both_figures, iterations=50)
    assert found["overhead_vs_floor"] == pytest.approx((1.9, 1.9))
    assert found["minimal_vs_openai_v2"] == pytest.approx((110 / 150, 110 / 150))
    assert found["stream_us_per_chunk"] == pytest.approx((1.0, 1.0))


def test_an_interval_holds_the_figure_and_widens_with_the_spread(overhead: ModuleType) -> None:
    def spread(width: float) -> dict:
        noise = [width * ((i * 7) % 11 - 5) for i in range(40)]
        return {
            "B": diffs([190 + n for n in noise], [345 + n for n in noise], [250.0] * 40),
            "D": diffs([150.0] * 40, [560.0] * 40, [180.0] * 40),
            "E": diffs([100.0] * 40, [150.0] * 40, [90.0] * 40),
            "G": diffs([110.0] * 40, [170.0] * 40, [130.0] * 40),
        }

    narrow = overhead.intervals(spread(1.0), CHUNKS, SHORT, overhead.both_figures, seed=1)
    wide = overhead.intervals(spread(4.0), CHUNKS, SHORT, overhead.both_figures, seed=1)
    point = overhead.both_figures(overhead.overheads(spread(4.0), CHUNKS, SHORT))
    lo, hi = wide["stream_us_per_chunk"]
    assert lo < point["stream_us_per_chunk"] < hi
    assert hi - lo > 2 * (narrow["stream_us_per_chunk"][1] - narrow["stream_us_per_chunk"][0])
    assert overhead.intervals(spread(4.0), CHUNKS, SHORT, overhead.both_figures, seed=1) == wide
