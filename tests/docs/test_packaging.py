"""What the distribution advertises is what CI runs.

The version matrix (``scripts/test-matrix.sh``) runs the oldest Python that
``requires-python`` allows and the newest ones; the main run covers the one in between.
The trove classifiers name exactly that contiguous range, so a packager reading them is
told no more than CI checks.
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
MATRIX = (REPO / "scripts" / "test-matrix.sh").read_text(encoding="utf-8")


def _minor(version: str) -> int:
    major, minor = version.split(".")
    assert major == "3", version
    return int(minor)


def test_classifiers_name_the_pythons_the_matrix_spans() -> None:
    oldest = re.search(r"^OLDEST_PYTHON=(3\.\d+)$", MATRIX, re.M)
    latest = re.search(r"^LATEST_PYTHONS=\(([\d. ]+)\)$", MATRIX, re.M)
    assert oldest and latest, "test-matrix.sh no longer sets OLDEST_PYTHON / LATEST_PYTHONS"
    low, high = _minor(oldest.group(1)), max(_minor(v) for v in latest.group(1).split())
    prefix = "Programming Language :: Python :: 3."
    advertised = {int(c[len(prefix) :]) for c in PROJECT["classifiers"] if c.startswith(prefix)}
    assert advertised == set(range(low, high + 1))


def test_requires_python_starts_at_the_oldest_python_ci_runs() -> None:
    oldest = re.search(r"^OLDEST_PYTHON=(3\.\d+)$", MATRIX, re.M)
    assert oldest
    assert PROJECT["requires-python"] == f">={oldest.group(1)}"


def test_the_typed_classifier_ships_with_its_marker() -> None:
    assert "Typing :: Typed" in PROJECT["classifiers"]
    assert (REPO / "src" / "spec_decode_otel" / "py.typed").is_file()
