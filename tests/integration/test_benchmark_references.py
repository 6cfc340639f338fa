"""The overhead benchmark's reference configurations do the OpenTelemetry work ours does.

``overhead_vs_floor`` and the ``minimal_*`` figures divide our overhead by that of the
floor (config E) and of the minimal wrapper (config G). Those ratios only mean something
if the references emit what ours emits: the same spans with as many attributes, the same
synchronous histogram records and, for G, the same counter increases; and if G, which
wraps the SDK as ours does, hands the caller every chunk. Each configuration runs in its
own benchmark worker process (the instrumentations patch ``openai`` process-wide), fed
by the recorded simulator payloads through the real ``openai`` and OTel SDKs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).resolve().parents[2] / "benchmarks" / "_worker.py"
KINDS = ("nonstream", "stream", "stream_short")


def describe(name: str) -> dict[str, Any]:
    """A benchmark worker's own account of one call of each kind."""
    proc = subprocess.run(
        [sys.executable, str(WORKER), name],
        input=json.dumps({"op": "describe"}) + "\n" + json.dumps({"op": "quit"}) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert json.loads(lines[0])["ready"] == name
    return json.loads(lines[1])


@pytest.fixture(scope="module")
def described() -> dict[str, dict[str, Any]]:
    return {name: describe(name) for name in ("A", "B", "E", "G")}


@pytest.mark.parametrize("reference", ["E", "G"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_reference_emits_our_spans_attributes_and_histogram_records(
    described: dict[str, dict[str, Any]], reference: str, kind: str
) -> None:
    ours, theirs = described["B"][kind], described[reference][kind]
    assert ours["spans"] == 1
    assert ours["span_attributes"] >= 17
    assert ours["histogram_records"] == 2
    for key in ("spans", "span_attributes", "histogram_records"):
        assert theirs[key] == ours[key], key


@pytest.mark.parametrize("kind", KINDS)
def test_the_minimal_wrapper_adds_to_the_counters_what_ours_adds(
    described: dict[str, dict[str, Any]], kind: str
) -> None:
    ours = described["B"][kind]["counted"]
    assert ours > 0
    assert described["G"][kind]["counted"] == ours


def test_every_configuration_hands_the_caller_every_chunk(
    described: dict[str, dict[str, Any]],
) -> None:
    bare = described["A"]
    assert (bare["stream_chunks_seen"], bare["stream_short_chunks_seen"]) == (103, 8)
    for name in ("B", "E", "G"):
        seen = (described[name]["stream_chunks_seen"], described[name]["stream_short_chunks_seen"])
        assert seen == (103, 8), name
