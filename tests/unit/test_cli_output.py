"""What the commands do when standard output takes nothing: a reader that left (``| head``),
stopped quietly; a full disk (``> /dev/full``) or a descriptor closed before the command
started (``>&-``), as ``cat`` does: one line on stderr naming the failure and exit status
1. Before, ``parse > /dev/full`` ended with an
``OSError`` traceback and ``parse >&-`` with an ``AttributeError`` one (``sys.stdout`` is
None there, and ``print`` drops text without a word, so only the final flush failed).
The commands run as users run them, a subprocess of ``python -m spec_decode_otel``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

PAYLOADS = Path(__file__).resolve().parents[1] / "data" / "payloads"
CAPTURE = PAYLOADS / "vllm_merged_stream.sse"


def _argv(command: str, tmp_path: Path) -> list[str]:
    if command == "parse":
        return ["parse", str(CAPTURE)]
    rows = tmp_path / "records.jsonl"
    rows.write_text("")
    return ["summarize", str(rows)]


def _run(
    argv: list[str], stdout: Any, before: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spec_decode_otel", *argv],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=before,
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="Linux's /dev/full")
@pytest.mark.parametrize("command", ["parse", "summarize"])
def test_a_full_disk_is_one_line_on_stderr_and_exit_1(command: str, tmp_path: Path) -> None:
    with open("/dev/full", "wb") as full:
        done = _run(_argv(command, tmp_path), full)
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"spec-decode-otel {command}: cannot write the output: No space left on device\n"
    )


@pytest.mark.parametrize("command", ["parse", "summarize"])
def test_a_closed_stdout_is_one_line_on_stderr_and_exit_1(command: str, tmp_path: Path) -> None:
    done = _run(_argv(command, tmp_path), subprocess.DEVNULL, before=lambda: os.close(1))
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"spec-decode-otel {command}: cannot write the output: standard output is closed\n"
    )


@pytest.mark.parametrize("command", ["parse", "summarize"])
def test_a_reader_that_leaves_early_gets_no_traceback(command: str, tmp_path: Path) -> None:
    """``spec-decode-otel parse F | head -1``: when the reader closes the pipe, the
    command stops quietly with status 1 (Python's advice for SIGPIPE), not with a
    BrokenPipeError traceback on the user's terminal."""
    reader_gone, child_end = os.pipe()
    os.close(reader_gone)  # the reader left before the first byte
    try:
        done = _run(_argv(command, tmp_path), child_end)
    finally:
        os.close(child_end)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_the_output_still_reaches_a_working_stdout(tmp_path: Path) -> None:
    """The guard changes nothing when the write succeeds: the record, exit status 0."""
    done = _run(_argv("parse", tmp_path), subprocess.PIPE)
    assert done.returncode == 0, done.stderr
    assert '"engine": "vllm"' in done.stdout
