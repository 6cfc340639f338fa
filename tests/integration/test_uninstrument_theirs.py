"""Uninstrumenting another instrumentation while ours stays on.

Of the instrumentations in the coexistence matrix, only OpenInference wraps the attribute
ours wraps (``OpenAI.request``); the others wrap the SDK's resource methods. OpenInference
0.1.66 (``openinference/instrumentation/openai/__init__.py``) saves ``OpenAI.request``
when it instruments and assigns it back in ``_uninstrument``. Loaded before ours, what it
saved is the SDK's plain function, and assigning it back drops the wrapper ours put over
its own: ours records nothing more, and nothing of ours runs to notice. Loaded after ours,
what it saved is our wrapper, and ours goes on recording. Uninstrumenting and
instrumenting ours again brings it back, without bringing back OpenInference's wrapper
(our ``uninstrument()`` leaves an attribute that no longer holds ours as it is). This
pins that behaviour of theirs, which README's coexistence section states.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from installed import built_by
from otlp_values import clean_env

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        (["ours-first"], [["spec_decode_otel", "recorded"]]),
        (["theirs-first"], []),
        (["theirs-first", "then-ours-again"], [["spec_decode_otel", "recorded"]]),
    ],
    ids=["ours-first", "theirs-first", "theirs-first-then-ours-again"],
)
def test_openinference_uninstrumented_drops_ours_if_loaded_first_until_ours_is_redone(
    simulator_url: str, order: list[str], expected: list[list[str]]
) -> None:
    venvs = built_by("install-coexistence-venvs.sh", "SPEC_DECODE_OTEL_COEXISTENCE_VENVS")
    done = subprocess.run(
        [
            str(venvs / "openinference" / "bin" / "python"),
            str(HERE / "uninstrument_theirs_app.py"),
            *order,
        ],
        env=clean_env("PYTHON", SIMULATOR_URL=simulator_url, PYTHONPATH=str(REPO / "src")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected
