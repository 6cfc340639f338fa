"""Tools the suite needs that live outside the test environment, built by a script.

``scripts/test.sh`` runs each install script once (each caches what it builds) and
exports the path it prints; a bare pytest run gets the same path by running the script
here. Never a skip: a test that needs the tool fails with the script's own error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def built_by(script: str, env_var: str) -> Path:
    """The path ``scripts/<script>`` prints last, or ``$env_var`` when it is set."""
    given = os.environ.get(env_var)
    if given:
        return Path(given)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / script)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"scripts/{script} failed:\n{done.stderr[-3000:]}"
    return Path(done.stdout.strip().splitlines()[-1])
