"""A real llama.cpp ``llama-server`` with speculative decoding, for the engine tests.

Plain helpers (no pytest), used by ``conftest.py`` here and by the end-to-end test in
tests/e2e. Processes, ports and readiness polling reuse tests/e2e/e2e_stack.py.

The binary comes from ``SPEC_DECODE_OTEL_LLAMA_SERVER`` (scripts/test.sh exports it from
scripts/install-llama-server.sh). That script keeps, next to ``bin/llama-server``, the
same source tree's ``gguf`` Python package and tokenizer model under ``share/``; they are
found from the binary's path, so the models are always written by the ``gguf`` of the
server's own llama.cpp version.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from e2e_stack import ManagedProcess, StackError, child_env, wait_until

from ports import free_ports

ENV_LLAMA_SERVER = "SPEC_DECODE_OTEL_LLAMA_SERVER"
INSTALL_HINT = (
    f'export {ENV_LLAMA_SERVER}="$(bash scripts/install-llama-server.sh | tail -n 1)" '
    "(scripts/test.sh does this; the first build takes 10 to 20 minutes on 2 cores)"
)

#: The server's speculative-decoding flags. ``--spec-type draft-simple`` is required: in
#: this llama.cpp (b11312) a plain draft model given with ``-md`` alone is loaded but
#: never drafts from (``--spec-type`` defaults to none; only DFlash/DSpark/MTP drafts are
#: recognised from their GGUF). ``-t 1 -td 1``: one thread each, because two threads on a
#: shared 2-core machine made single requests take anywhere from 0.15 s to 42 s.
SPEC_ARGS = ("--spec-type", "draft-simple", "--spec-draft-n-max", "4")
THREAD_ARGS = ("-t", "1", "-td", "1")

#: The server's own Prometheus counters (``--metrics``) that the tests reconcile with.
M_DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
M_ACCEPTED_TOKENS = "llamacpp:spec_decode_num_accepted_tokens_total"
M_DRAFTS = "llamacpp:spec_decode_num_drafts_total"


class LlamaServerMissing(RuntimeError):
    """The binary (or the files the install script keeps beside it) is not there."""


@dataclass(frozen=True)
class LlamaInstall:
    """The installed server and what the install script kept beside it."""

    binary: Path

    @property
    def share(self) -> Path:
        return self.binary.parent.parent / "share"

    @property
    def gguf_py(self) -> Path:
        return self.share / "gguf-py"

    @property
    def vocab(self) -> Path:
        return self.share / "models" / "ggml-vocab-llama-spm.gguf"

    @property
    def build_info(self) -> str:
        return (self.share / "BUILD_INFO").read_text()


def find_llama_server() -> LlamaInstall:
    """The install named by ``SPEC_DECODE_OTEL_LLAMA_SERVER``; raises with a how-to."""
    path = os.environ.get(ENV_LLAMA_SERVER)
    if not path:
        raise LlamaServerMissing(f"{ENV_LLAMA_SERVER} is not set: {INSTALL_HINT}")
    binary = Path(path)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise LlamaServerMissing(
            f"{ENV_LLAMA_SERVER}={path!r} is not an executable file: {INSTALL_HINT}"
        )
    install = LlamaInstall(binary)
    for needed in (install.gguf_py / "gguf" / "__init__.py", install.vocab):
        if not needed.is_file():
            raise LlamaServerMissing(
                f"{needed} is missing (scripts/install-llama-server.sh keeps it next to "
                f"the binary): {INSTALL_HINT}"
            )
    return install


def use_gguf(install: LlamaInstall) -> None:
    """Make the install's own ``gguf`` package importable (first on sys.path)."""
    gguf_py = str(install.gguf_py)
    if gguf_py not in sys.path:
        sys.path.insert(0, gguf_py)


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus_text(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample of a Prometheus text exposition."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


class LlamaServer:
    """One ``llama-server`` process on a free loopback port (its own process group)."""

    def __init__(
        self,
        install: LlamaInstall,
        target: Path,
        draft: Path | None,
        workdir: Path,
        *,
        spec: bool = True,
        name: str = "llama-server",
        args: Sequence[str] = (),
    ) -> None:
        """``args``: more server flags, after the draft's (e.g. ``--spec-type ngram-mod``,
        which needs no draft model: pass ``draft=None``)."""
        (self.port,) = free_ports(1)
        argv = [str(install.binary), "-m", str(target)]
        if draft is not None:
            argv += ["-md", str(draft)]
            if spec:
                argv += list(SPEC_ARGS)
        argv += [*args, *THREAD_ARGS, "--metrics", "--host", "127.0.0.1", "--port", str(self.port)]
        self.argv = argv
        self.process = ManagedProcess(name, argv, child_env({}), workdir / f"{name}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 120.0) -> None:
        self.process.start()
        try:
            with httpx.Client(timeout=2.0) as http:
                wait_until(
                    f"{self.process.name} /health",
                    lambda: http.get(f"{self.url}/health").status_code == 200,
                    timeout,
                    [self.process],
                )
        except StackError:
            self.process.stop()
            raise

    def stop(self) -> None:
        self.process.stop()

    def metrics(self) -> dict[str, float]:
        """The server's ``/metrics`` now, parsed."""
        with httpx.Client(timeout=10.0) as http:
            r = http.get(f"{self.url}/metrics")
            r.raise_for_status()
            return parse_prometheus_text(r.text)

    def log_tail(self, chars: int = 3000) -> str:
        return self.process.log_tail(chars)
