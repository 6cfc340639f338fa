"""Run the simulator as a real subprocess, the way a user runs a server.

``python -m spec_decode_otel.simulator --port 0 ...`` prints ``serving http://HOST:PORT/v1``
once it accepts connections; we read that line, hand out the URL, and at the end stop the
process with SIGTERM (falling back to SIGKILL), keeping its exit status for tests that
check the clean shutdown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

SERVING_PREFIX = "serving "
LIFELINE = str(Path(__file__).with_name("lifeline.py"))


class SimulatorProcess:
    """One simulator subprocess. ``start()`` blocks until the URL line arrives."""

    def __init__(self, args: Sequence[str] = (), start_timeout: float = 20.0) -> None:
        self.args = [str(a) for a in args]
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.base_url: str = ""
        self.returncode: int | None = None
        # a file, not a pipe, so a chatty server never blocks; read back on stop()
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()
        self._stderr_text: str | None = None

    @property
    def command(self) -> list[str]:
        """``python -m spec_decode_otel.simulator``, through tests/lifeline.py so that a
        killed test run leaves no simulator behind."""
        return [
            sys.executable,
            LIFELINE,
            "-m",
            "spec_decode_otel.simulator",
            "--port",
            "0",
            *self.args,
        ]

    def start(self) -> str:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env
        )
        line: list[str] = []
        reader = threading.Thread(
            target=lambda: line.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(self.start_timeout)
        first = line[0].strip() if line else ""
        if not first.startswith(SERVING_PREFIX):
            self.stop()
            raise RuntimeError(
                f"simulator did not announce its URL (got {first!r}); stderr:\n{self.stderr()}"
            )
        self.base_url = first[len(SERVING_PREFIX) :]
        return self.base_url

    def stderr(self) -> str:
        if self._stderr_text is not None:
            return self._stderr_text
        self._stderr.seek(0)
        return self._stderr.read()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        """Signal the process and wait; kill it if it does not exit within ``timeout``."""
        proc = self.proc
        if proc is None:
            return self.returncode
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self.returncode = proc.returncode
        if proc.stdout is not None:
            proc.stdout.close()
        self._stderr_text = self.stderr()
        self._stderr.close()
        self.proc = None
        return self.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> SimulatorProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
