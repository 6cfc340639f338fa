"""Real Rust model gateways in front of the simulator: what reaches an instrumented client.

The gateways (one venv built by scripts/install-gateways.sh; its bin directory in
``$SPEC_DECODE_OTEL_GATEWAYS``), each started in HTTP mode on a free loopback port with
one simulator worker behind it:

- smg 1.13.0 (the SGLang Model Gateway, smg-project/smg):
  ``python -m smg launch --host 127.0.0.1 --port P --worker-urls http://127.0.0.1:W
  --prometheus-host 127.0.0.1 --prometheus-port M --log-level warn
  --shutdown-grace-period-secs 0``
- sglang-router 0.3.2 (its predecessor): ``python -m sglang_router.launch_router`` with
  the same flags
- vllm-router 0.1.17 (vllm-project's Rust router, forked from the SGLang router; its core
  ``vllm_router_rs`` is in the wheel): ``python -m vllm_router.launch_router``, same
  flags, ``--log-level warning``. It is not the vLLM production-stack router.

``python -m`` because sglang-router 0.3.2 also declares an ``smg`` console script. The
metrics listener is moved off its default ``0.0.0.0:29000`` so runs do not collide.

What they probe on a worker (seen in the simulator's access log): smg ``GET /v1/models``
(model and, from ``owned_by``, engine), ``/version`` (vLLM), ``/server_info`` then
``/get_server_info``, ``/model_info`` then ``/get_model_info``, ``/health``, and its load
monitor's ``/loads`` and ``/v1/loads``; sglang-router an HTTP/2 preface (``PRI *``, its
gRPC detection), the same four info endpoints and ``/health``; vllm-router ``/health``
and ``/v1/models``. The simulator answers 404 to all but ``/v1/models`` and ``/health``,
and every gateway takes that. smg then registers the worker as ``generic``
OpenAI-compatible (``owned_by`` is not an engine's); so ``smg-typed`` below is smg
started without workers, the worker then registered with ``POST /workers {"url": W,
"runtime_type": "vllm" | "sglang" | "trtllm"}``, as smg would classify a real engine: the
same results.

smg and sglang-router forward only a whitelist of client headers (smg
``should_forward_request_header``: authorization, x-request-id(-*), x-correlation-id,
traceparent, tracestate, x-smg-routing-key), so the simulator's ``x-spec-decode-engine``
and ``x-sim-seed`` never reach it through them. So each gateway fronts a simulator
started with ``--engine`` set to one shape and ``--seed`` fixed, and a twin simulator with
the same flags answers the same requests directly: without ``x-sim-seed`` a simulator's
sample depends on its seed and its request count alone, so the twins stay in step as long
as each request through the gateway is followed by the same request to the twin.

Observed: every gateway passes every engine's response through byte for byte (ids and
``created`` aside), chat and completions, streamed (``include_usage``) or not, so the
span's ``spec_decode.*`` is the engine's own record. One loss, on the request side:
sglang-router 0.3.2 drops SGLang's ``return_spec_tokens_details`` and ``return_meta_info``
from a chat request (its ``ChatCompletionRequest`` has no catch-all for unknown fields;
its ``CompletionRequest`` has ``#[serde(flatten)] other``, so completions keep them), so
SGLang sends no stats at all on chat through it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from gateway_cases import (
    ENV_GATEWAYS,
    INSTALL_HINT,
    SHAPES,
    api_path,
    comparable,
    post,
    request_body,
    sdk_call,
)
from instrumentation_helpers import (
    Otel,
    expected_outcome,
    expected_span_attributes,
    only_attributes,
    spec_decode_attributes,
)

from installed import built_by
from ports import free_port
from simulator_process import SimulatorProcess
from spec_decode_otel import record_from_json
from spec_decode_otel.payloads import parse_payloads

SEED = "5150"
SIMULATOR_FLAGS = ("--level", "detailed", "--k", "4", "--alpha", "0.7", "--seed", SEED)


@dataclass(frozen=True)
class Gateway:
    distribution: str
    version: str
    module: tuple[str, ...]
    log_level: str
    #: whether the client's own headers (the simulator's x-sim-*) reach the worker
    forwards_headers: bool
    extra_flags: tuple[str, ...] = ()
    #: engine -> the ``runtime_type`` to register the worker with (``POST /workers``)
    #: instead of ``--worker-urls``; None: every engine, runtime detected by the gateway
    runtime_types: dict[str, str] | None = None

    @property
    def engines(self) -> list[str]:
        return [e for e in ENGINES if self.runtime_types is None or e in self.runtime_types]


GATEWAYS = {
    # on SIGTERM smg waits out a grace period for in-flight requests, even with none
    "smg": Gateway(
        "smg", "1.13.0", ("smg", "launch"), "warn", False, ("--shutdown-grace-period-secs", "0")
    ),
    # the same, told what each worker runs, as smg would find a real vLLM or SGLang
    "smg-typed": Gateway(
        "smg",
        "1.13.0",
        ("smg", "launch"),
        "warn",
        False,
        ("--shutdown-grace-period-secs", "0"),
        {"vllm": "vllm", "vllm-premerge": "vllm", "sglang": "sglang", "trtllm": "trtllm"},
    ),
    "sglang-router": Gateway(
        "sglang-router", "0.3.2", ("sglang_router.launch_router",), "warn", False
    ),
    "vllm-router": Gateway(
        "vllm-router", "0.1.17", ("vllm_router.launch_router",), "warning", True
    ),
}
ENGINES = list(dict.fromkeys(engine for engine, _ in SHAPES.values()))
#: SGLang (0.5.23) answers 400 to a streamed chat request with return_meta_info and
#: ignores the field on completions: a non-streamed chat call is the one that carries it.
ONLY_CHAT_JSON = {"sglang-meta-info"}
#: (gateway, shape, api) whose request loses the shape's body field on the way.
DROPS_REQUEST_FIELDS = {
    ("sglang-router", "sglang", "chat"),
    ("sglang-router", "sglang-meta-info", "chat"),
}


# --------------------------------------------------------------------------- processes


@pytest.fixture(scope="module")
def gateway_bin() -> Path:
    """The gateways venv's bin directory: scripts/test.sh builds it (cached) and exports
    its path; a bare pytest run builds it here. Never skipped."""
    given = built_by("install-gateways.sh", ENV_GATEWAYS)
    python = given / "python"
    assert python.is_file() and os.access(python, os.X_OK), f"no {python}: {INSTALL_HINT}"
    return given


@dataclass
class Route:
    """One gateway process in front of one simulator, and that simulator's twin."""

    gateway: str
    engine: str
    base_url: str  # the gateway's, without /v1
    twin_url: str  # the twin simulator's, without /v1
    proc: subprocess.Popen[bytes]
    sims: tuple[SimulatorProcess, SimulatorProcess]
    log: IO[str]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)
        for sim in self.sims:
            sim.stop()
        self.log.close()


def start_route(gateway: str, engine: str, bin_dir: Path, workdir: Path) -> Route:
    """Twin simulators (``--engine engine``, same seed), then the gateway in front of the
    first; ready once the gateway's ``GET /v1/models`` lists the worker's model."""
    spec = GATEWAYS[gateway]
    pair = (
        SimulatorProcess(["--engine", engine, *SIMULATOR_FLAGS]),
        SimulatorProcess(["--engine", engine, *SIMULATOR_FLAGS]),
    )
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(SimulatorProcess.start, pair))
    port = free_port()
    worker = pair[0].base_url.removesuffix("/v1")
    command = [
        str(bin_dir / "python"),
        "-m",
        *spec.module,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()),
        "--log-level", spec.log_level,
        *spec.extra_flags,
    ]  # fmt: skip
    if spec.runtime_types is None:
        command += ["--worker-urls", worker]
    log_path = workdir / f"{gateway}-{engine}.log"
    log = log_path.open("w+")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    route = Route(
        gateway, engine, f"http://127.0.0.1:{port}", pair[1].base_url.removesuffix("/v1"),
        proc, pair, log,
    )  # fmt: skip
    try:
        wait_for(route, log_path, workers_listed=spec.runtime_types is None)
        if spec.runtime_types is not None:
            runtime = spec.runtime_types[engine]
            added = httpx.post(
                route.base_url + "/workers", json={"url": worker, "runtime_type": runtime}
            )
            assert added.status_code == 202, added.text
            wait_for(route, log_path, workers_listed=True)
            (registered,) = httpx.get(route.base_url + "/workers").json()["workers"]
            assert registered["runtime_type"] == runtime
        return route
    except BaseException:
        route.close()
        raise


def wait_for(route: Route, log_path: Path, workers_listed: bool) -> None:
    """Until the gateway answers ``GET /v1/models`` (``workers_listed``: with 200 and the
    worker's model; smg answers 503 while it has no worker), 60 s at most."""
    deadline = time.monotonic() + 60
    while True:
        assert route.proc.poll() is None, f"{route.gateway} exited:\n{log_path.read_text()}"
        try:
            answer = httpx.get(route.base_url + "/v1/models", timeout=2)
            if not workers_listed or (answer.status_code == 200 and answer.json().get("data")):
                return
        except (httpx.TransportError, ValueError):
            pass
        assert time.monotonic() < deadline, f"{route.gateway} not ready in 60 s"
        time.sleep(0.1)


class Routes:
    """At most one route alive: the tests come ordered by route, and each new route has
    fresh twins, so their request counts start level."""

    def __init__(self, bin_dir: Path, workdir: Path) -> None:
        self.bin_dir, self.workdir = bin_dir, workdir
        self.current: Route | None = None

    def get(self, gateway: str, engine: str) -> Route:
        if self.current and (self.current.gateway, self.current.engine) == (gateway, engine):
            return self.current
        self.close()
        self.current = start_route(gateway, engine, self.bin_dir, self.workdir)
        return self.current

    def close(self) -> None:
        if self.current:
            self.current.close()
            self.current = None


@pytest.fixture(scope="module")
def routes(gateway_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routes]:
    pool = Routes(gateway_bin, tmp_path_factory.mktemp("gateways"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.mark.parametrize("name", ["smg", "sglang-router", "vllm-router"])
def test_the_gateways_are_the_pinned_versions(name: str, gateway_bin: Path) -> None:
    """The claims below are about these versions (the venv's own distributions)."""
    spec = GATEWAYS[name]
    done = subprocess.run(
        [
            str(gateway_bin / "python"),
            "-c",
            f"import importlib.metadata as m; print(m.version({spec.distribution!r}))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == spec.version, done.stderr


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Case:
    gateway: str
    shape: str
    api: str
    stream: bool

    @property
    def engine(self) -> str:
        return SHAPES[self.shape][0]

    def body(self, extra: bool = True) -> dict[str, Any]:
        """The request body: the same through the gateway and to the twin. ``extra``
        False leaves out the shape's own fields (what a gateway that drops them sends)."""
        return request_body(self.shape, self.api, self.stream, extra)

    def path(self) -> str:
        return api_path(self.api)


def case_id(case: Case) -> str:
    return f"{case.gateway}-{case.shape}-{case.api}-{'sse' if case.stream else 'json'}"


def all_cases() -> list[Case]:
    """Ordered by gateway, then engine, so each route starts once per test function."""
    return [
        Case(gateway, shape, api, stream)
        for gateway, spec in GATEWAYS.items()
        for engine in spec.engines
        for shape in SHAPES
        if SHAPES[shape][0] == engine
        for api in ("chat", "completions")
        for stream in (False, True)
        if shape not in ONLY_CHAT_JSON
        or (api == "chat" and (not stream or (gateway, shape, api) in DROPS_REQUEST_FIELDS))
    ]


PASSED = [c for c in all_cases() if (c.gateway, c.shape, c.api) not in DROPS_REQUEST_FIELDS]
DROPPED = [c for c in all_cases() if (c.gateway, c.shape, c.api) in DROPS_REQUEST_FIELDS]


def call(route: Route, case: Case) -> list[Any]:
    """One instrumented SDK call through the gateway; every chunk of a stream is read."""
    return sdk_call(route.base_url, case.shape, case.body())


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("case", PASSED, ids=case_id)
def test_the_gateway_passes_the_engines_stats_through_unchanged(
    case: Case, routes: Routes, instrumented: Otel
) -> None:
    """smg 1.13.0 (worker runtime detected or given), sglang-router 0.3.2, vllm-router
    0.1.17, real processes, HTTP mode:
    every engine's response (vLLM ``metrics``, pre-merge vLLM's and TRT-LLM's choice
    fields, SGLang's ``sglext`` and ``meta_info``, llama.cpp's ``timings``, smg's
    ``usage`` pair), chat and completions, streamed with ``include_usage`` or not,
    reaches the client as the engine sent it: the span's ``spec_decode.*`` is the record
    of the twin's answer to the same request, and the gateway's raw answer to the next
    request is the twin's (ids and ``created`` aside), chunk for chunk."""
    route = routes.get(case.gateway, case.engine)
    assert call(route, case)
    sent = post(route.twin_url + case.path(), case.body())
    record = record_from_json(sent, case.body())
    assert record is not None

    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == expected_outcome(record)
    assert spec_decode_attributes(attrs) == expected_span_attributes(record)

    through = post(route.base_url + case.path(), case.body())
    sent = post(route.twin_url + case.path(), case.body())
    assert comparable(through) == comparable(sent)


@pytest.mark.parametrize("case", DROPPED, ids=case_id)
def test_sglang_router_drops_sglangs_stats_fields_from_a_chat_request(
    case: Case, routes: Routes, instrumented: Otel
) -> None:
    """sglang-router 0.3.2, real process: a chat request's ``return_spec_tokens_details``
    and ``return_meta_info`` do not reach the engine (the router re-serializes the chat
    request from its typed ``ChatCompletionRequest``, which has no field for them and no
    catch-all; its ``CompletionRequest`` flattens unknown fields into ``other``, so text
    completions keep them). SGLang then sends no ``sglext`` or ``meta_info``, so the call
    is ``no_stats`` where the engine would have given a record; and a streamed chat
    request with ``return_meta_info``, which SGLang refuses (400), is served. Pinned: the
    gateway's answer is the twin's answer to the request without the field."""
    route = routes.get(case.gateway, case.engine)
    assert call(route, case)
    with_field = httpx.post(route.twin_url + case.path(), json=case.body(), timeout=30)
    if case.shape == "sglang-meta-info" and case.stream:
        assert with_field.status_code == 400  # SGLang refuses it; the gateway did not ask
    else:
        with_field.raise_for_status()
        engine_sent = parse_payloads(with_field.text) if case.stream else with_field.json()
        assert record_from_json(engine_sent, case.body()) is not None

    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == "no_stats"
    assert spec_decode_attributes(attrs) == {}

    through = post(route.base_url + case.path(), case.body())
    sent = post(route.twin_url + case.path(), case.body(extra=False))
    assert comparable(through) == comparable(sent)
    assert record_from_json(through, case.body()) is None


@pytest.mark.parametrize("name", ["smg", "sglang-router", "vllm-router"])
def test_only_vllm_router_forwards_the_clients_own_headers(name: str, routes: Routes) -> None:
    """vllm-router 0.1.17 forwards a client's headers to the worker, so the simulator's
    ``x-spec-decode-engine`` and ``x-sim-seed`` work through it; smg 1.13.0 and
    sglang-router 0.3.2 forward a whitelist (authorization, request-id and trace headers)
    and drop them, so the worker answers in its own shape and sequence. Through a
    worker started as vLLM, ``x-spec-decode-engine: trtllm``: the answer is TRT-LLM's (no
    root ``metrics``) exactly when the gateway forwards headers."""
    route = routes.get(name, "vllm")
    case = Case(name, "vllm", "chat", False)
    headers = {"x-spec-decode-engine": "trtllm", "x-sim-seed": "9"}
    through = post(route.base_url + case.path(), case.body(), headers)
    forwarded = GATEWAYS[name].forwards_headers
    # a seeded request leaves the twin's count alone, as it left the worker's
    sent = post(route.twin_url + case.path(), case.body(), headers if forwarded else None)
    assert comparable(through) == comparable(sent)
    assert ("metrics" in through) is not forwarded
