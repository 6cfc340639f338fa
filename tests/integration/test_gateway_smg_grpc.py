"""smg's gRPC router: the engine's spec-decode counts become the usage pair.

In gRPC mode smg (1.13.0, the gateways venv of scripts/install-gateways.sh) talks to the
engine over its gRPC service, tokenizes and detokenizes itself and writes the OpenAI JSON.
The engine here is tests/integration/grpc_engine.py: the real generated stubs of
``smg-grpc-proto`` 0.4.28 (SGLang ``SglangScheduler``, vLLM ``VllmEngine``, TokenSpeed
``TokenSpeedScheduler``, TensorRT-LLM ``TrtllmService``), one fixed answer, and a
``GenerateComplete`` with chosen ``spec_accepted_tokens`` / ``spec_draft_tokens`` (what
``smg-grpc-servicer`` 0.14.1's servicers fill in). smg is started with
``python -m smg launch --worker-urls grpc://127.0.0.1:E --tokenizer-path D`` and finds
the runtime itself (its registration tries each service's ``HealthCheck``: sglang, vllm,
trtllm, mlx, tokenspeed; ``GET /workers`` then names it).

Observed, every runtime alike: ``usage.completion_tokens_details`` carries
``accepted_prediction_tokens`` = ``spec_accepted_tokens`` and
``rejected_prediction_tokens`` = ``spec_draft_tokens`` - ``spec_accepted_tokens``
(clamped at 0), chat and completions, in the body and in the ``include_usage`` chunk.
With both counts 0 chat still sends the pair as 0/0, completions no details at all.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from gateway_cases import ENV_GATEWAYS, INSTALL_HINT, api_path, post, sdk_call
from instrumentation_helpers import (
    MESSAGES,
    PROMPT,
    Otel,
    only_attributes,
    spec_decode_attributes,
)

from installed import built_by
from ports import free_ports

ENGINE = Path(__file__).resolve().parent / "grpc_engine.py"
PINS = {"smg": "1.13.0", "smg-grpc-proto": "0.4.28", "tokenizers": "0.23.3"}
#: runtime -> (spec_accepted_tokens, spec_draft_tokens) its engine reports
COUNTS = {"sglang": (5, 8), "vllm": (4, 6), "tokenspeed": (2, 9), "trtllm": (3, 5)}
CALLS = [(api, stream) for api in ("chat", "completions") for stream in (False, True)]


@pytest.fixture(scope="module")
def gateway_bin() -> Path:
    """The gateways venv's bin directory, holding the pinned smg, proto stubs and
    tokenizers (an older venv lacks the last two: rebuild it). Never skipped."""
    given = built_by("install-gateways.sh", ENV_GATEWAYS)
    probe = "import importlib.metadata as m, sys; print([m.version(d) for d in sys.argv[1:]])"
    done = subprocess.run(
        [str(given / "python"), "-c", probe, *PINS], capture_output=True, text=True, timeout=60
    )
    why = (done.stderr.strip().splitlines() or [""])[-1]
    assert done.stdout.strip() == str(list(PINS.values())), (
        f"{given} lacks {PINS} ({why}); a venv older than them is rebuilt by: {INSTALL_HINT}"
    )
    return given


class Stack:
    """The fake engine and smg in front of it; ``base_url`` is smg's, ``model`` the id
    its ``GET /v1/models`` lists (the engine's served name, or TRT-LLM's model path)."""

    def __init__(self, bin_dir: Path, workdir: Path, runtime: str, counts: tuple[int, int]):
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_path = workdir / f"{runtime}-{counts[0]}-{counts[1]}.log"
        self.log: IO[str] = self.log_path.open("w+")
        try:
            self.start(bin_dir, workdir, runtime, counts)
        except BaseException:
            self.close()
            raise

    def start(self, bin_dir: Path, workdir: Path, runtime: str, counts: tuple[int, int]) -> None:
        engine_port, port, metrics_port = free_ports(3)
        tokenizer = workdir / f"tokenizer-{runtime}"
        python = str(bin_dir / "python")
        engine = [python, str(ENGINE), runtime, str(engine_port), str(tokenizer)]
        self.spawn([*engine, *map(str, counts)])
        # smg retries a worker it could not reach only after 30 s: the engine goes first
        self.wait(lambda: "ready" in self.log_path.read_text(), "engine")
        self.spawn([
            python, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", f"grpc://127.0.0.1:{engine_port}",
            "--tokenizer-path", str(tokenizer), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics_port), "--log-level", "warn",
            "--shutdown-grace-period-secs", "0",
        ])  # fmt: skip
        self.base_url = f"http://127.0.0.1:{port}"
        self.model = ""
        self.wait(self.listed, "smg")
        (worker,) = httpx.get(self.base_url + "/workers").json()["workers"]
        assert (worker["connection_mode"], worker["runtime_type"]) == ("grpc", runtime)

    def spawn(self, command: list[str]) -> None:
        self.procs.append(
            subprocess.Popen(
                command, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.log_path.parent
            )
        )

    def listed(self) -> bool:
        try:
            models = httpx.get(self.base_url + "/v1/models", timeout=2).json().get("data")
        except (httpx.TransportError, ValueError):
            return False
        self.model = models[0]["id"] if models else ""
        return bool(models)

    def wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + 30
        while not ready():
            alive = all(p.poll() is None for p in self.procs)
            assert alive and time.monotonic() < deadline, (
                f"{what} not ready:\n{self.log_path.read_text()[-3000:]}"
            )
            time.sleep(0.05)

    def body(self, api: str, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "stream": stream}
        body.update({"messages": MESSAGES} if api == "chat" else {"prompt": PROMPT})
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)
        self.log.close()


class Stacks:
    """At most one stack alive; the tests come ordered by stack."""

    def __init__(self, bin_dir: Path, workdir: Path) -> None:
        self.bin_dir, self.workdir = bin_dir, workdir
        self.key: tuple[str, tuple[int, int]] | None = None
        self.current: Stack | None = None

    def get(self, runtime: str, counts: tuple[int, int]) -> Stack:
        if self.current is None or self.key != (runtime, counts):
            self.close()
            self.current = Stack(self.bin_dir, self.workdir, runtime, counts)
            self.key = (runtime, counts)
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


@pytest.fixture(scope="module")
def stacks(gateway_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stacks]:
    pool = Stacks(gateway_bin, tmp_path_factory.mktemp("smg-grpc"))
    try:
        yield pool
    finally:
        pool.close()


def pair_through(stack: Stack, call: tuple[str, bool]) -> tuple[int, int] | None:
    """(accepted, rejected) of smg's raw answer, body or ``include_usage`` chunk; None
    when its usage has no ``completion_tokens_details``."""
    answer = post(stack.base_url + api_path(call[0]), stack.body(*call))
    (usage,) = [c["usage"] for c in (answer if isinstance(answer, list) else [answer])
                if c.get("usage")]  # fmt: skip
    details = usage.get("completion_tokens_details")
    if details is None:
        return None
    return details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]


def span_of_call(stack: Stack, call: tuple[str, bool], otel: Otel) -> dict[str, Any]:
    """The attributes of the span of the same request made by the instrumented SDK."""
    assert sdk_call(stack.base_url, "smg", stack.body(*call))
    return only_attributes(otel)


def call_id(call: tuple[str, bool]) -> str:
    return f"{call[0]}-{'sse' if call[1] else 'json'}"


@pytest.mark.parametrize("call", CALLS, ids=call_id)
@pytest.mark.parametrize("runtime", list(COUNTS))
def test_smg_grpc_router_turns_the_engines_spec_counts_into_the_usage_pair(
    runtime: str, call: tuple[str, bool], stacks: Stacks, instrumented: Otel
) -> None:
    """smg 1.13.0 in gRPC mode, each runtime's real proto (smg-grpc-proto 0.4.28):
    ``accepted_prediction_tokens`` is the engine's ``spec_accepted_tokens`` and
    ``rejected_prediction_tokens`` its ``spec_draft_tokens`` minus that; the span of the
    instrumented ``openai`` call reads the pair as ``usage_details`` (counts only, so
    ``partial``): accepted, drafted = accepted + rejected, and their rate."""
    accepted, drafted = COUNTS[runtime]
    stack = stacks.get(runtime, COUNTS[runtime])
    assert pair_through(stack, call) == (accepted, drafted - accepted)
    attrs = span_of_call(stack, call, instrumented)
    assert attrs["spec_decode.outcome"] == "partial"
    assert spec_decode_attributes(attrs) == {
        "spec_decode.engine": "usage_details",
        "spec_decode.num_accepted_draft_tokens": accepted,
        "spec_decode.num_draft_tokens": drafted,
        "spec_decode.draft_acceptance_rate": pytest.approx(accepted / drafted),
        "spec_decode.partial": True,
    }


@pytest.mark.parametrize("call", CALLS, ids=call_id)
def test_smg_grpc_router_without_spec_decoding_sends_a_zero_pair_or_none(
    call: tuple[str, bool], stacks: Stacks, instrumented: Otel
) -> None:
    """An engine that drafted nothing (both counts 0, as a servicer fills them without
    speculative decoding): smg 1.13.0's chat usage still carries the pair as 0/0, its
    completions usage no ``completion_tokens_details``. Either way no record: the call
    is ``no_stats`` (a 0/0 pair is what OpenAI sends for every request as well)."""
    stack = stacks.get("sglang", (0, 0))
    assert pair_through(stack, call) == ((0, 0) if call[0] == "chat" else None)
    attrs = span_of_call(stack, call, instrumented)
    assert attrs["spec_decode.outcome"] == "no_stats"
    assert spec_decode_attributes(attrs) == {}


@pytest.mark.parametrize("call", CALLS, ids=call_id)
def test_smg_grpc_router_clamps_rejected_at_zero(
    call: tuple[str, bool], stacks: Stacks, instrumented: Otel
) -> None:
    """An engine whose ``spec_accepted_tokens`` exceeds its ``spec_draft_tokens`` (7 and
    3): smg 1.13.0 sends ``rejected_prediction_tokens`` 0, not a negative count, so the
    span says 7 of 7 drafts accepted (rate 1.0): the pair cannot tell this apart."""
    stack = stacks.get("sglang", (7, 3))
    assert pair_through(stack, call) == (7, 0)
    attrs = span_of_call(stack, call, instrumented)
    assert attrs["spec_decode.outcome"] == "partial"
    assert attrs["spec_decode.num_accepted_draft_tokens"] == 7
    assert attrs["spec_decode.num_draft_tokens"] == 7
    assert attrs["spec_decode.draft_acceptance_rate"] == 1.0
