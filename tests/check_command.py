"""Running ``spec-decode-otel check`` as users run it (a subprocess), and reading its
lines: shared by the simulator tests (tests/integration/test_check_cli.py) and the real
llama.cpp server's (tests/engines/test_llamacpp_server.py)."""

from __future__ import annotations

import re
import subprocess
import sys

#: The labels of the command's three requests, in its order.
PROBES = ("chat", "stream", "stream + include_usage")
COMMAND = (sys.executable, "-m", "spec_decode_otel", "check")


def run_check(base_url: str, *args: str) -> tuple[int, dict[str, str], str]:
    """Run the command: exit status, each probe's line after its label, the whole output.
    A traceback on stderr fails the caller's test."""
    done = subprocess.run([*COMMAND, base_url, *args], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    lines = {}
    for label in PROBES:
        found = re.search(rf"^  {re.escape(label)}\s+(\S.*)$", done.stdout, re.M)
        assert found, done.stdout + done.stderr
        lines[label] = found.group(1)
    return done.returncode, lines, done.stdout
