"""Fixtures shared by every test directory.

- ``simulator_url``: one simulator SUBPROCESS for the whole session (vLLM merged shape,
  level detailed, k=4, alpha=0.7, seed 1234). Tests reach the other engine shapes through
  the ``x-spec-decode-engine`` header instead of starting more servers.
- ``start_simulator(*args)``: a session-scoped factory for simulators with other flags;
  the same arguments return the same (already running) process.
- ``openai_client`` / ``async_openai_client``: real ``openai`` SDK clients pointed at
  ``simulator_url`` (api key ``sk-test``, ``max_retries=0`` so fault tests see errors).

Imports of optional extras happen inside the fixtures, so collecting the unit tests does
not need them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulator_process import SimulatorProcess

DEFAULT_SIMULATOR_ARGS = (
    "--engine", "vllm", "--level", "detailed", "--k", "4", "--alpha", "0.7", "--seed", "1234",
)  # fmt: skip


@pytest.fixture(scope="session")
def start_simulator() -> Iterator[Callable[..., str]]:
    """Factory: ``start_simulator("--engine", "sglang")`` -> base URL (``.../v1``)."""
    running: dict[tuple[str, ...], SimulatorProcess] = {}

    def start(*args: str) -> str:
        key = tuple(str(a) for a in args)
        if key not in running:
            proc = SimulatorProcess(key)
            proc.start()
            running[key] = proc
        return running[key].base_url

    yield start
    for proc in running.values():
        proc.stop()


@pytest.fixture(scope="session")
def simulator_url(start_simulator: Callable[..., str]) -> str:
    return start_simulator(*DEFAULT_SIMULATOR_ARGS)


@pytest.fixture
def openai_client(simulator_url: str):  # type: ignore[no-untyped-def]
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0)
    yield client
    client.close()


@pytest.fixture
async def async_openai_client(simulator_url: str):  # type: ignore[no-untyped-def]
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0)
    yield client
    await client.close()


pytest_plugins = ["reliability.privacy_plugin"]  # session-wide privacy scan (issue 7)
