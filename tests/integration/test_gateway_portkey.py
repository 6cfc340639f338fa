"""The real Portkey AI Gateway in front of the simulator: what reaches an instrumented client.

@portkey-ai/gateway 1.15.2 (scripts/install-portkey.sh; its directory in
``$SPEC_DECODE_OTEL_PORTKEY``), started as the package's ``bin`` does:
``node build/start-server.js --port=P --headless`` (``--port=`` and ``--headless`` are the
only flags that file reads; it serves with @hono/node-server without a hostname, i.e. on
every interface, so the tests preload a ``net.Server.listen`` wrapper that binds it to
127.0.0.1). The client points the ``openai`` SDK at ``http://127.0.0.1:P/v1`` with the
headers ``x-portkey-provider: openai`` and ``x-portkey-custom-host: <simulator>/v1``
(127.0.0.1 is in Portkey's default ``TRUSTED_CUSTOM_HOSTS``).

Portkey forwards none of the client's own headers to the upstream unless named in
``x-portkey-forward-headers`` (``nu``/``forwardHeaders`` in ``build/start-server.js``). The
tests name ``x-spec-decode-engine`` and ``x-sim-seed`` there, so one simulator serves every
shape and a seeded request sent straight to it answers with the same sample (no twins).

What the source says and the runs confirm (all in ``build/start-server.js``, minified):

- Request: Portkey rebuilds the body from the provider's parameter table (``vr`` ->
  ``xr``: only keys of the openai ``chatComplete``/``complete`` config are copied). SGLang's
  ``return_spec_tokens_details`` and ``return_meta_info`` are not in it, so they never
  reach the engine, in every compliance mode: SGLang calls are ``no_stats``.
- Response: the openai provider's ``chatComplete``/``complete`` transforms return a 200
  body unchanged, and it has no ``stream-*`` transform, so streams are split on blank
  lines and passed on chunk for chunk (``Cd``). The strict-compliance flag
  (``x-portkey-strict-open-ai-compliance``, default true: ``strictOpenAiCompliance`` is
  false only for the header ``false``) is handed to the transforms, and the openai ones
  ignore it; it strips extras only for providers whose transforms build a new body
  (e.g. Perplexity's ``citations``). So vLLM's ``metrics``, pre-merge vLLM's and
  TRT-LLM's choice fields, llama.cpp's ``timings`` and the usage pair all survive,
  whichever the mode.
- Streams need the @hono/node-server Portkey's lockfile resolves (1.13.5, the
  ``locked`` tree). With the one a plain npm install resolved for ``^1.3.3`` on
  2026-12-04 (1.19.19, pinned in the ``npm`` tree), ``new Response(stream,
  upstreamResponse)`` keeps the upstream's immutable Headers,
  ``ResponseService.updateHeaders`` throws ``TypeError: immutable``, and every streamed
  call gets a 500 (Portkey-AI/gateway#1389).
"""

from __future__ import annotations

import subprocess
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx
import openai
import pytest
from gateway_cases import (
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

ENV_PORTKEY = "SPEC_DECODE_OTEL_PORTKEY"
VERSION = "1.15.2"
ENTRY = Path("node_modules/@portkey-ai/gateway/build/start-server.js")
#: @hono/node-server listens with ``server.listen(port, undefined, cb)``: bind loopback.
LOOPBACK = (
    'import net from "node:net";'
    "const listen = net.Server.prototype.listen;"
    "net.Server.prototype.listen = function (port, host, ...rest) {"
    '  return typeof port === "number" && host === undefined'
    '    ? listen.call(this, port, "127.0.0.1", ...rest) : listen.call(this, port, host, ...rest);'
    "};"
)
SIMULATOR_FLAGS = ("--engine", "vllm", "--level", "detailed", "--k", "4", "--alpha", "0.7")
SIM_HEADERS = "x-spec-decode-engine, x-sim-seed"
#: shapes that need a request field Portkey's parameter table does not carry
DROPPED_SHAPES = {"sglang", "sglang-meta-info"}
#: x-portkey-strict-open-ai-compliance: unset (the default, strict), true, false
STRICT = (None, "true", "false")
FAILURE = {"status": "failure", "message": "Something went wrong"}


# --------------------------------------------------------------------------- processes


@pytest.fixture(scope="module")
def portkey_dir() -> Path:
    """scripts/install-portkey.sh's directory: scripts/test.sh builds it (cached) and
    exports its path; a bare pytest run builds it here. Never skipped."""
    given = built_by("install-portkey.sh", ENV_PORTKEY)
    for tree in ("locked", "npm"):
        assert (given / tree / ENTRY).is_file(), f"no {given / tree / ENTRY}"
    return given


@dataclass
class Portkey:
    base_url: str  # without /v1
    proc: subprocess.Popen[bytes]
    log_path: Path
    log: IO[str]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)
        self.log.close()


def start_portkey(tree: Path, workdir: Path) -> Portkey:
    """``node start-server.js --port=P --headless``; ready once ``GET /`` answers (its
    "AI Gateway says hey!"), 60 s at most."""
    port = free_port()
    log_path = workdir / f"portkey-{tree.name}.log"
    log = log_path.open("w+")
    command = [
        "node", "--import", "data:text/javascript," + quote(LOOPBACK),
        str(tree / ENTRY), f"--port={port}", "--headless",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    gateway = Portkey(f"http://127.0.0.1:{port}", proc, log_path, log)
    deadline = time.monotonic() + 60
    try:
        while True:
            assert proc.poll() is None, f"portkey exited:\n{log_path.read_text()}"
            try:
                if httpx.get(gateway.base_url + "/", timeout=2).status_code == 200:
                    return gateway
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "portkey not ready in 60 s"
            time.sleep(0.1)
    except BaseException:
        gateway.close()
        raise


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    """One simulator (vLLM unless ``x-spec-decode-engine`` says otherwise), without /v1."""
    sim = SimulatorProcess(SIMULATOR_FLAGS)
    sim.start()
    try:
        yield sim.base_url.removesuffix("/v1")
    finally:
        sim.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("portkey")


@pytest.fixture(scope="module")
def portkey(portkey_dir: Path, workdir: Path) -> Iterator[Portkey]:
    """The ``locked`` tree: @hono/node-server as Portkey's own lockfile has it."""
    gateway = start_portkey(portkey_dir / "locked", workdir)
    try:
        yield gateway
    finally:
        gateway.close()


@pytest.fixture(scope="module")
def portkey_npm(portkey_dir: Path, workdir: Path) -> Iterator[Portkey]:
    """The ``npm`` tree: what a plain npm install resolved on 2026-12-04, pinned."""
    gateway = start_portkey(portkey_dir / "npm", workdir)
    try:
        yield gateway
    finally:
        gateway.close()


@pytest.mark.parametrize(
    ("tree", "node_server"), [("locked", "1.13.5"), ("npm", "1.19.19")], ids=["locked", "npm"]
)
def test_portkey_is_the_pinned_version(portkey_dir: Path, tree: str, node_server: str) -> None:
    """The claims here are about @portkey-ai/gateway 1.15.2; the ``locked`` tree runs
    @hono/node-server 1.13.5, the ``npm`` tree 1.19.19 (the streams' failure needs 1.14 or
    later, where the lightweight Response reuses the init's Headers)."""
    modules = portkey_dir / tree / "node_modules"
    versions = "[require(process.argv[1]).version, require(process.argv[2]).version].join(' ')"
    done = subprocess.run(
        [
            "node",
            "-p",
            versions,
            str(modules / "@portkey-ai/gateway/package.json"),
            str(modules / "@hono/node-server/package.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    gateway, server = done.stdout.split()
    assert (gateway, server) == (VERSION, node_server), done.stderr


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Case:
    shape: str
    api: str
    stream: bool
    strict: str | None

    @property
    def engine(self) -> str:
        return SHAPES[self.shape][0]

    @property
    def seed(self) -> str:
        return str(zlib.crc32(case_id(self).encode()) % 100_000)

    def body(self, extra: bool = True) -> dict[str, Any]:
        """The request body: the same through Portkey and straight to the simulator.
        ``extra`` False leaves out the shape's own fields (what Portkey sends on)."""
        return request_body(self.shape, self.api, self.stream, extra)

    def path(self) -> str:
        return api_path(self.api)

    def sim_headers(self) -> dict[str, str]:
        return {"x-spec-decode-engine": self.engine, "x-sim-seed": self.seed}

    def portkey_headers(self, simulator: str, forward: bool = True) -> dict[str, str]:
        """What the client sends Portkey: provider, upstream, mode, the simulator's own."""
        headers = {
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": simulator + "/v1",
            **self.sim_headers(),
        }
        if forward:
            headers["x-portkey-forward-headers"] = SIM_HEADERS
        if self.strict is not None:
            headers["x-portkey-strict-open-ai-compliance"] = self.strict
        return headers


def case_id(case: Case) -> str:
    strict = case.strict or "unset"
    return f"{case.shape}-{case.api}-{'sse' if case.stream else 'json'}-strict_{strict}"


ALL = [
    Case(shape, api, stream, strict)
    for shape in SHAPES
    for api in ("chat", "completions")
    for stream in (False, True)
    for strict in STRICT
]
PASSED = [c for c in ALL if c.shape not in DROPPED_SHAPES]
DROPPED = [c for c in ALL if c.shape in DROPPED_SHAPES]


def call(gateway: Portkey, simulator: str, case: Case) -> list[Any]:
    """One instrumented SDK call through Portkey; every chunk of a stream is read."""
    return sdk_call(gateway.base_url, case.shape, case.body(), case.portkey_headers(simulator))


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("case", PASSED, ids=case_id)
def test_portkey_passes_the_engines_stats_through_in_every_compliance_mode(
    case: Case, portkey: Portkey, simulator: str, instrumented: Otel
) -> None:
    """@portkey-ai/gateway 1.15.2, provider ``openai`` with a custom host, real process:
    vLLM's root ``metrics``, pre-merge vLLM's and TRT-LLM's choice fields, llama.cpp's
    ``timings`` and the usage pair reach the client as the engine sent them, chat and
    completions, streamed with ``include_usage`` or not, with
    ``x-portkey-strict-open-ai-compliance`` unset (strict), ``true`` or ``false``: the
    openai provider's response transforms return a 200 body as is and it has no stream
    transform (``bd.openai.responseTransforms``, ``Kd``/``Cd`` in build/start-server.js),
    so the flag changes nothing here. The span's ``spec_decode.*`` is the record of the
    simulator's own answer, and Portkey's raw answer is the simulator's, chunk for chunk
    (ids and ``created`` aside)."""
    assert call(portkey, simulator, case)
    sent = post(simulator + case.path(), case.body(), case.sim_headers())
    record = record_from_json(sent, case.body())
    assert record is not None

    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == expected_outcome(record)
    assert spec_decode_attributes(attrs) == expected_span_attributes(record)

    through = post(portkey.base_url + case.path(), case.body(), case.portkey_headers(simulator))
    assert comparable(through) == comparable(sent)


@pytest.mark.parametrize("case", DROPPED, ids=case_id)
def test_portkey_drops_sglangs_stats_fields_from_the_request_in_every_mode(
    case: Case, portkey: Portkey, simulator: str, instrumented: Otel
) -> None:
    """@portkey-ai/gateway 1.15.2, real process: ``return_spec_tokens_details`` and
    ``return_meta_info`` do not reach the engine, chat or completions, whatever the
    compliance mode: Portkey rebuilds the upstream body from the openai provider's
    parameter table (``transformToProviderRequest``: ``vr`` -> ``xr`` in
    build/start-server.js copies only the table's keys, and neither field is in
    ``chatComplete`` or ``complete``). SGLang then sends no ``sglext`` or ``meta_info``:
    the call is ``no_stats`` where the engine would have given a record, and a streamed
    chat request with ``return_meta_info``, which SGLang refuses (400), is served.
    Pinned: Portkey's answer is the simulator's answer to the request without the field."""
    assert call(portkey, simulator, case)
    with_field = httpx.post(
        simulator + case.path(), json=case.body(), headers=case.sim_headers(), timeout=30
    )
    if case.shape == "sglang-meta-info" and case.api == "chat" and case.stream:
        assert with_field.status_code == 400  # SGLang refuses it; Portkey did not ask
    else:
        with_field.raise_for_status()
        engine_sent = parse_payloads(with_field.text) if case.stream else with_field.json()
        # SGLang ignores return_meta_info on completions: nothing is lost there
        recorded = not (case.shape == "sglang-meta-info" and case.api == "completions")
        assert (record_from_json(engine_sent, case.body()) is not None) is recorded

    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == "no_stats"
    assert spec_decode_attributes(attrs) == {}

    through = post(portkey.base_url + case.path(), case.body(), case.portkey_headers(simulator))
    sent = post(simulator + case.path(), case.body(extra=False), case.sim_headers())
    assert comparable(through) == comparable(sent)
    assert record_from_json(through, case.body()) is None


def test_portkey_forwards_the_clients_headers_only_when_named(
    portkey: Portkey, simulator: str
) -> None:
    """@portkey-ai/gateway 1.15.2 sends the upstream its own headers plus those named in
    ``x-portkey-forward-headers`` (``forwardHeaders``), no others: without it the
    simulator's ``x-spec-decode-engine: trtllm`` and ``x-sim-seed`` are dropped and the
    answer is in the simulator's own shape (vLLM's root ``metrics``); with it, the answer
    is TRT-LLM's for that seed."""
    case = Case("trtllm", "chat", False, None)
    unnamed = post(
        portkey.base_url + case.path(), case.body(), case.portkey_headers(simulator, False)
    )
    assert "metrics" in unnamed
    named = post(portkey.base_url + case.path(), case.body(), case.portkey_headers(simulator))
    assert "metrics" not in named
    sent = post(simulator + case.path(), case.body(), case.sim_headers())
    assert comparable(named) == comparable(sent)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_portkey_with_a_later_hono_node_server_fails_every_streamed_call(
    api: str, portkey_npm: Portkey, simulator: str, instrumented: Otel
) -> None:
    """@portkey-ai/gateway 1.15.2 as npm resolves it (@hono/node-server 1.14 or later):
    a streamed call gets a 500 ``{"status": "failure", "message": "Something went
    wrong"}`` and the gateway logs ``TypeError: immutable`` from
    ``ResponseService.updateHeaders`` (``ru.updateHeaders``: it appends x-portkey-* headers
    to a Response whose Headers are the upstream fetch's, immutable;
    Portkey-AI/gateway#1389). The SDK raises, the span's outcome is ``error``; the same
    request unstreamed is served with the engine's stats."""
    streamed = Case("vllm", api, True, None)
    with pytest.raises(openai.InternalServerError):
        call(portkey_npm, simulator, streamed)
    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == "error"
    assert spec_decode_attributes(attrs) == {}
    raw = httpx.post(
        portkey_npm.base_url + streamed.path(),
        json=streamed.body(),
        headers=streamed.portkey_headers(simulator),
        timeout=30,
    )
    assert (raw.status_code, raw.json()) == (500, FAILURE)
    assert "TypeError: immutable" in portkey_npm.log_path.read_text()

    instrumented.clear()
    whole = Case("vllm", api, False, None)
    call(portkey_npm, simulator, whole)
    sent = post(simulator + whole.path(), whole.body(), whole.sim_headers())
    record = record_from_json(sent, whole.body())
    assert record is not None
    assert spec_decode_attributes(only_attributes(instrumented)) == expected_span_attributes(record)
