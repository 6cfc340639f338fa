"""Session fixtures for the engine tests: a real llama.cpp server with speculative decoding.

- ``llama_install``: the binary from ``SPEC_DECODE_OTEL_LLAMA_SERVER`` (FAILS, never
  skips, when it is missing: scripts/test.sh builds and exports it).
- ``tiny_models``: the deterministic target and drafts of tests/engines/tiny_models.py,
  written in seconds into a temporary directory by that install's own ``gguf``.
- ``llama_server(draft, spec=True)``: one server per draft model for the whole session
  (``target.gguf`` with ``-md <draft>.gguf`` and the flags of llama_server.SPEC_ARGS).
- ``telemetry``: this test's instrumentation with fresh SDK providers (in-memory
  exporter and reader), uninstrumented in teardown.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Telemetry, instrumented
from llama_server import (
    LlamaInstall,
    LlamaServer,
    LlamaServerMissing,
    StackError,
    find_llama_server,
    use_gguf,
)


@pytest.fixture(scope="session")
def llama_install() -> LlamaInstall:
    try:
        install = find_llama_server()
    except LlamaServerMissing as exc:
        missing = str(exc)
    else:
        use_gguf(install)
        return install
    pytest.fail(f"no llama.cpp server for the engine tests: {missing}", pytrace=False)


@pytest.fixture(scope="session")
def tiny_models(
    llama_install: LlamaInstall, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    from tiny_models import write_models

    return write_models(tmp_path_factory.mktemp("tiny-models"), llama_install.vocab)


@pytest.fixture(scope="session")
def llama_server(
    llama_install: LlamaInstall,
    tiny_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., LlamaServer]]:
    """Factory: ``llama_server("noisy")`` -> the running server with that draft."""
    workdir = tmp_path_factory.mktemp("llama-server")
    running: dict[tuple[str, bool], LlamaServer] = {}

    def get(draft: str, spec: bool = True) -> LlamaServer:
        key = (draft, spec)
        if key not in running:
            name = f"llama-server-{draft}{'' if spec else '-nospec'}"
            server = LlamaServer(
                llama_install,
                tiny_models["target"],
                tiny_models[draft],
                workdir,
                spec=spec,
                name=name,
            )
            try:
                server.start()
            except StackError as exc:
                pytest.fail(f"{name} did not start: {exc}", pytrace=False)
            running[key] = server
        return running[key]

    try:
        yield get
    finally:
        for server in running.values():
            server.stop()


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    with instrumented() as t:
        yield t
