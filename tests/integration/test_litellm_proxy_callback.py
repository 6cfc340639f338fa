"""spec-decode-otel INSIDE the real LiteLLM proxy: what it records, per route and engine.

One ``litellm --config`` process (LiteLLM 1.110.2, the venv scripts/install-litellm-proxy.sh
builds, which also holds spec-decode-otel's requirements with the ``otlp`` extra) runs for
the module with examples/litellm_proxy/ as a user would copy it: its callback module
unchanged, and its config.yaml with each model entry's ``api_base`` pointed at the
session simulator, one copy of each entry (route) per engine shape, and a master key.
The proxy imports the work tree's src/ (PYTHONPATH). The callback module's
``setup(span_processors=[RecordsFileProcessor(...)])`` writes the records file that is
read here: one JSON line per call the proxy recorded.

Every call goes through the proxy with plain ``httpx`` (nothing is instrumented in this
process); the same seeded request sent straight to the simulator gives what the engine
sent, hence the record an instrumented client of the engine would get.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from instrumentation_helpers import MODEL, expected_outcome
from test_litellm_proxy import (
    ENGINES,
    SEED,
    Case,
    direct,
    litellm_executable,
    model_name,
    post,
    running_proxy,
)

from spec_decode_otel import record_from_json
from spec_decode_otel.record import SpecDecodeAcceptanceRecord

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "litellm_proxy"
ROUTES = ("hosted_vllm", "openai")
#: Transport faults some calls meet: the server cuts the stream, or sends it slowly (a
#: client can leave mid-way).
FAULTS = ("drop-mid-stream", "slow", "http-500")
#: Shapes measured (each one's engine is in the proxy config): vLLM merged and pre-merge,
#: SGLang, TensorRT-LLM (and its released mean-only form), llama.cpp, smg's usage pair.
SHAPES = ("vllm", "vllm-premerge", "sglang", "trtllm", "trtllm-released", "llamacpp", "smg")
#: Deployments of each ``retried-<route>`` group, by ``order``: all answer 429 but the
#: last (a deployment that answers 429 is cooled down at once, so each retry goes on).
RETRIED_ORDERS = 3
#: Surfaces the proxy's spec_decode_otel log (a handler on its logger, DEBUG) in its log.
SITECUSTOMIZE = """\
import logging, sys
_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("SPEC_DECODE_OTEL_LOG %(levelname)s %(message)s"))
logging.getLogger("spec_decode_otel").addHandler(_handler)
logging.getLogger("spec_decode_otel").setLevel(logging.DEBUG)


def _log_span_durations():
    # Each span the records file gets, with its duration, in the log (see SPAN_LINE).
    from spec_decode_otel.records import RecordsFileProcessor

    own = RecordsFileProcessor.on_end

    def on_end(self, span):
        if span.context is not None and span.start_time and span.end_time:
            seconds = (span.end_time - span.start_time) / 1e9
            print(f"SPEC_DECODE_OTEL_SPAN {span.context.span_id:016x} {seconds:.3f}",
                  file=sys.stderr, flush=True)
        own(self, span)

    RecordsFileProcessor.on_end = on_end


_log_span_durations()
"""
#: A span's id and duration (seconds) as SITECUSTOMIZE logs them.
SPAN_LINE = re.compile(r"^SPEC_DECODE_OTEL_SPAN ([0-9a-f]{16}) ([0-9.]+)$", re.MULTILINE)

#: The proxy's flags after the config: loopback, one worker, then the port.

__all__ = ["litellm_executable"]  # the fixture, shared with test_litellm_proxy.py


# --------------------------------------------------------------------------- the proxy


@dataclass
class Proxy:
    base_url: str
    key: str
    records: Path
    log: Path
    #: Rows the calls so far must have given.
    given: int = 0

    def rows(self) -> list[dict[str, Any]]:
        text = self.records.read_text() if self.records.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def call(self, case: Case, records: int) -> list[dict[str, Any]]:
        """One call through the proxy; then the ``records`` rows it gave (see :meth:`wait`).
        A row more than expected shows up as the next call's check fails, or the last
        test's."""
        assert len(self.rows()) == self.given, "an earlier call gave more records"
        self.send(case)
        return self.wait(records)

    def send(self, case: Case) -> Any:
        body = {**case.body(), "model": model_name(case.route, case.engine)}
        return post(self.base_url + case.path(), body, {"authorization": f"Bearer {self.key}"})

    def wait(self, records: int) -> list[dict[str, Any]]:
        """The ``records`` rows the calls just sent gave (waits for them: the callback's
        span ends in LiteLLM's logging task, after the answer)."""
        self.given += records
        deadline = time.monotonic() + 15
        while len(rows := self.rows()) < self.given:
            assert time.monotonic() < deadline, "no record for the call:\n" + self.log_text()
            time.sleep(0.02)
        return rows[self.given - records :]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def span_seconds(self, span_id: str) -> float:
        """The duration of the span ``span_id`` (its row's), as the proxy logged it."""
        durations = {m[1]: float(m[2]) for m in SPAN_LINE.finditer(self.log_text())}
        return durations[span_id]


def example_config(simulator_url: str, key: str) -> dict[str, Any]:
    """examples/litellm_proxy/config.yaml with each entry copied per engine shape, its
    ``api_base`` the simulator's, and ``extra_headers`` naming the shape and seed."""
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    templates = {e["litellm_params"]["model"].split("/")[0]: e for e in config["model_list"]}
    assert sorted(templates) == sorted((*ROUTES, "custom_openai"))
    config["model_list"] = (
        [
            {
                "model_name": model_name(route, engine),
                "litellm_params": {
                    **templates[route]["litellm_params"],
                    "model": f"{route}/{MODEL}",
                    "api_base": simulator_url,
                    "extra_headers": {"x-spec-decode-engine": engine, "x-sim-seed": str(SEED)},
                },
            }
            for route in ROUTES
            for engine in ENGINES
        ]
        + [
            {
                "model_name": f"{model_name(route, engine)}-{fault}",
                "litellm_params": {
                    **templates[route]["litellm_params"],
                    "model": f"{route}/{MODEL}",
                    "api_base": simulator_url,
                    "extra_headers": {
                        "x-spec-decode-engine": engine,
                        "x-sim-seed": str(SEED),
                        "x-sim-fault": fault,
                        # slow enough that the proxy sees the client leave mid-stream
                        **({"x-sim-delay-ms": "300"} if fault == "slow" else {}),
                    },
                },
            }
            for route in ROUTES
            for engine in ("vllm", "sglang")
            for fault in FAULTS
        ]
        + [
            {  # a group whose Router retries twice before its third deployment answers
                "model_name": f"retried-{route}",
                "litellm_params": {
                    **templates[route]["litellm_params"],
                    "model": f"{route}/{MODEL}",
                    "api_base": simulator_url,
                    "order": order,
                    "extra_headers": {
                        "x-spec-decode-engine": "vllm",
                        "x-sim-seed": str(SEED + order - RETRIED_ORDERS),
                        **({"x-sim-fault": "http-429"} if order < RETRIED_ORDERS else {}),
                    },
                },
            }
            for route in ROUTES
            for order in range(1, RETRIED_ORDERS + 1)
        ]
        + [
            {  # the example's entry for Anthropic Messages clients
                "model_name": model_name("custom_openai", "vllm"),
                "litellm_params": {
                    **templates["custom_openai"]["litellm_params"],
                    "model": f"custom_openai/{MODEL}",
                    "api_base": simulator_url,
                    "extra_headers": {"x-spec-decode-engine": "vllm", "x-sim-seed": str(SEED)},
                },
            }
        ]
    )
    config.setdefault("general_settings", {})["master_key"] = key
    return config


@pytest.fixture(scope="module")
def proxy(
    simulator_url: str, litellm_executable: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    """The proxy with the example's callback module, on a free loopback port."""
    workdir = tmp_path_factory.mktemp("litellm-proxy-callback")
    key = "sk-" + secrets.token_hex(32)
    for path in EXAMPLE.iterdir():
        if path.suffix == ".py":
            shutil.copy(path, workdir / path.name)
    (workdir / "config.yaml").write_text(yaml.safe_dump(example_config(simulator_url, key)))
    hooks = workdir / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "SPEC_DECODE_OTEL_")) and k not in ("DATABASE_URL",)
    }
    env["PYTHONPATH"] = os.pathsep.join((str(REPO / "src"), str(hooks)))
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["SPEC_DECODE_RECORDS_FILE"] = str(workdir / "records.jsonl")
    with running_proxy(litellm_executable, workdir / "config.yaml", env) as base:
        yield Proxy(base + "/v1", key, workdir / "records.jsonl", workdir / "proxy.log")


# --------------------------------------------------------------------------- the calls


def cases() -> list[Case]:
    return [
        Case(route, shape, api, stream)
        for route in ROUTES
        for shape in SHAPES
        for api in ("chat", "completions")
        for stream in (False, True)
    ]


def case_id(case: Case) -> str:
    return f"{case.route}-{case.shape}-{case.api}-{'sse' if case.stream else 'json'}"


def as_recorded(record: SpecDecodeAcceptanceRecord | None) -> dict[str, Any] | None:
    """The record's JSON as the records file gives it: per-step lists only go on the
    span with ``record_per_step`` (off by default)."""
    if record is None:
        return None
    return record.model_copy(
        update={"per_step_accepted": None, "per_step_drafted": None}
    ).model_dump(mode="json")


def expected_rows(case: Case, engine: SpecDecodeAcceptanceRecord) -> list[dict[str, Any]]:
    """(outcome, record) of each row the call gives, as observed with LiteLLM 1.110.2.

    - Not streamed, every route and API: one row, the engine's record.
    - Streamed text completions, both routes (LiteLLM sends every text completion through
      the openai SDK): one row, the openai wrapper's, with the engine's record. The proxy
      runs the call in three contexts that share no context variable (a worker thread
      in ``atext_completion``, litellm/main.py; the first chunk's task in
      ``_buffer_first_chunk_honoring_disconnect``, litellm/proxy/common_request_processing.py;
      Starlette's response task), so the callback knows the call by the response id of
      the stream the wrapper read (``CustomStreamWrapper`` keeps the engine's chunk id as
      the response's id, litellm/litellm_core_utils/streaming_handler.py). Before that,
      these calls gave a second row, the callback's ``no_stats``.
    - ``openai/`` chat streams: one row, the engine's record (the openai wrapper read the
      engine's stream inside the proxy, before the proxy rebuilt it).
    - ``hosted_vllm/`` chat streams: one row from the callback, ``no_stats`` (LiteLLM's
      handler rebuilt the chunks), except smg's usage pair, which survives.
    """
    kept = {"outcome": expected_outcome(engine), "record": as_recorded(engine)}
    lost = {"outcome": "no_stats", "record": None} if case.shape != "smg" else kept
    if not case.stream or case.api == "completions" or case.route == "openai":
        return [kept]
    return [lost]


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_in_proxy_records(case: Case, proxy: Proxy, simulator_url: str) -> None:
    """LiteLLM 1.110.2 proxy, real process, spec-decode-otel inside it as
    examples/litellm_proxy/ sets it up: each call's rows in the records file (see
    :func:`expected_rows`), against the engine's direct answer to the same seeded
    request."""
    engine = record_from_json(direct(simulator_url, case), case.body())
    assert engine is not None
    expected = expected_rows(case, engine)
    rows = proxy.call(case, len(expected))
    host, port = urlsplit(simulator_url).hostname, urlsplit(simulator_url).port
    for row in rows:
        assert (row["model"], row["server"]) == (MODEL, f"{host}:{port}")
        assert row["trace_id"] and row["span_id"]
    assert sorted(
        ({"outcome": r["outcome"], "record": r["record"]} for r in rows), key=str
    ) == sorted(expected, key=str)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("shape", ["vllm", "llamacpp"])
@pytest.mark.parametrize("route", ROUTES)
def test_in_proxy_responses_api_calls_give_one_row_each(
    route: str, shape: str, stream: bool, proxy: Proxy, simulator_url: str
) -> None:
    """The proxy's ``/v1/responses``, both routes: LiteLLM 1.110.2 posts them to the
    engine's ``/v1/responses`` itself and reports each (call type ``aresponses``) with the
    completed response. One row per call, ``no_stats``: vLLM 0.34.0 puts timing
    ``metrics`` only on a Responses response, and llama.cpp's ``timings`` ride on the
    ``response.completed`` event, which LiteLLM does not keep (an openai client of the
    engine itself reads them: the direct answer below)."""
    case = Case(route, shape, "responses", stream)
    answer = direct(simulator_url, case)
    completed = answer[-1]["response"] if stream else answer
    assert record_from_json(completed) is None
    assert (record_from_json(answer) is not None) == (shape == "llamacpp" and stream)
    (row,) = proxy.call(case, 1)
    assert (row["outcome"], row["record"]) == ("no_stats", None)
    host, port = urlsplit(simulator_url).hostname, urlsplit(simulator_url).port
    assert (row["model"], row["server"]) == (MODEL, f"{host}:{port}")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("route", [*ROUTES, "custom_openai"])
def test_in_proxy_anthropic_messages_give_one_row_each(
    route: str, stream: bool, proxy: Proxy, simulator_url: str
) -> None:
    """The proxy's ``/v1/messages`` (Anthropic's Messages API, which Claude Code speaks),
    LiteLLM 1.110.2: it answers from a call to the engine, reported to callbacks as call
    type ``anthropic_messages``; one row per call.

    - ``hosted_vllm/``: a chat completion through LiteLLM's own handler: the engine's
      record when not streamed, ``no_stats`` when streamed (rebuilt chunks).
    - ``openai/``: a Responses API call to the engine, whose Responses carry no stats
      (vLLM 0.34.0): ``no_stats``.
    - ``custom_openai/``: a chat completion through the openai SDK, read from the wire
      by the instrumentation inside the proxy: the engine's record, streamed or not.
    """
    case = Case(route, "vllm", "messages", stream)
    chat = Case(route, "vllm", "chat", stream)
    engine = record_from_json(direct(simulator_url, chat), chat.body())
    assert engine is not None
    kept = route == "custom_openai" or (route == "hosted_vllm" and not stream)
    (row,) = proxy.call(case, 1)
    expected = (expected_outcome(engine), as_recorded(engine)) if kept else ("no_stats", None)
    assert (row["outcome"], row["record"]) == expected


def test_two_text_streams_at_once_give_one_row_each(proxy: Proxy, simulator_url: str) -> None:
    """Two streamed text completions sent to the proxy at the same time (two threads),
    through ``openai/`` to vLLM and ``hosted_vllm/`` to SGLang: two rows, each the
    engine's record of its own call. The callback tells the openai wrapper's calls by
    the response id of the stream it read, one note per stream: had one call's callback
    taken the other's note, the other would give a third row, ``no_stats``."""
    cases = [
        Case("openai", "vllm", "completions", True),
        Case("hosted_vllm", "sglang", "completions", True),
    ]
    engines = [record_from_json(direct(simulator_url, case), case.body()) for case in cases]
    assert engines[0] is not None and engines[1] is not None
    assert engines[0].engine != engines[1].engine
    assert len(proxy.rows()) == proxy.given, "an earlier call gave more records"
    both = threading.Barrier(2)

    def send(case: Case) -> Any:
        both.wait()
        return proxy.send(case)

    with ThreadPoolExecutor(2) as pool:
        assert all(pool.map(send, cases))
    rows = proxy.wait(2)
    time.sleep(1.0)  # a third row would come now
    assert len(proxy.rows()) == proxy.given
    assert sorted(
        ({"outcome": r["outcome"], "record": r["record"]} for r in rows), key=str
    ) == sorted(
        ({"outcome": expected_outcome(e), "record": as_recorded(e)} for e in engines), key=str
    )


def send_and_read(proxy: Proxy, case: Case, fault: str, lines: int | None = None) -> int:
    """One streamed call to the entry of ``case`` with ``fault``; reads ``lines`` lines of
    the answer (all of them when None) and leaves; the number of lines read."""
    body = {**case.body(), "model": f"{model_name(case.route, case.engine)}-{fault}"}
    headers = {"authorization": f"Bearer {proxy.key}"}
    read = 0
    with httpx.stream(
        "POST", proxy.base_url + case.path(), json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        for _ in response.iter_lines():
            read += 1
            if read == lines:
                break
    return read


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("route", ROUTES)
def test_a_stream_the_server_cuts_gives_one_error_row(route: str, api: str, proxy: Proxy) -> None:
    """The engine cuts a stream mid-way (simulator fault ``drop-mid-stream``, after three
    chunks) behind the real LiteLLM 1.110.2 proxy: one row, ``error``.

    For a text completion (both routes) or an ``openai/`` chat call the openai wrapper
    reads the stream inside the proxy and ends its span with the error; LiteLLM then
    reports the call's failure to the callback without the stream's response id
    (``CustomStreamWrapper._dispatch_stream_failure``,
    litellm/litellm_core_utils/streaming_handler.py: only the exception, in a task
    created from Starlette's response task, which shares no context variable with the
    worker thread that started the call). Its exception is the SDK stream's error or
    has it in its ``__cause__``/``__context__`` chain, which the wrapper noted. Before
    that, a text completion gave a second row, the callback's ``error``."""
    assert len(proxy.rows()) == proxy.given, "an earlier call gave more records"
    send_and_read(proxy, Case(route, "vllm", api, True), "drop-mid-stream")
    (row,) = proxy.wait(1)
    time.sleep(1.0)  # a second row would come now
    assert len(proxy.rows()) == proxy.given
    assert (row["outcome"], row["record"]) == ("error", None)


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("route", ROUTES)
def test_a_stream_the_client_leaves_gives_one_row(route: str, api: str, proxy: Proxy) -> None:
    """The client reads a few lines of a slow stream (simulator fault ``slow``) and hangs
    up: the one row is ``not_read_to_end``. On ``openai/`` it is the openai wrapper's.
    On ``hosted_vllm/`` LiteLLM 1.110.2 reports a chat stream left so as a success built
    from the chunks read, with a made-up ``stop`` (``_bill_partial_streamed_spend_on_
    disconnect``, proxy/common_request_processing.py), which gave ``no_stats``; it marks
    it ``client_disconnected``."""
    assert len(proxy.rows()) == proxy.given, "an earlier call gave more records"
    assert send_and_read(proxy, Case(route, "vllm", api, True), "slow", 6) == 6
    (row,) = proxy.wait(1)
    time.sleep(1.0)
    assert len(proxy.rows()) == proxy.given
    assert (row["outcome"], row["record"]) == ("not_read_to_end", None)


@pytest.mark.parametrize("lines", [6, 18], ids=["before-text", "after-text"])
@pytest.mark.parametrize("route", ROUTES)
def test_a_responses_stream_the_client_leaves_gives_one_row_at_once(
    route: str, lines: int, proxy: Proxy
) -> None:
    """A streamed ``/v1/responses`` call the client leaves mid-way (``lines`` SSE lines of
    a slow stream, simulator fault ``slow``: two events, before any output text, or six,
    after some), either route: its one row, ``not_read_to_end``, comes within seconds of
    the client leaving, with a span that ends when it left.

    The LiteLLM 1.110.2 proxy reports such a call's end only when it relayed output text
    to bill: a success event for the ``response.incomplete`` event it builds
    (``_bill_partial_streamed_spend_on_disconnect``, proxy/common_request_processing.py;
    ``partial_response_on_disconnect``, responses/streaming_iterator.py, None before any
    text). Its Router does close the server's stream (``stream_with_fallbacks``,
    litellm/router_rust/invoke/streaming.py), which ends the call now. Before that, a
    stream left before any text gave its row only when the cyclic collector freed
    LiteLLM's iterator, which the Router's per-call wrapper class holds
    (``wrap_responses_stream``, same file): tens of seconds later on ``openai/``, its
    span that much longer, and on ``hosted_vllm/`` at times never."""
    assert len(proxy.rows()) == proxy.given, "an earlier call gave more records"
    assert send_and_read(proxy, Case(route, "vllm", "responses", True), "slow", lines) == lines
    left = time.monotonic()
    proxy.given += 1
    while len(proxy.rows()) < proxy.given:
        assert time.monotonic() - left < 5, "no record within 5 s:\n" + proxy.log_text()
        time.sleep(0.02)
    time.sleep(1.0)  # a second row would come now
    assert len(proxy.rows()) == proxy.given
    row = proxy.rows()[-1]
    assert (row["outcome"], row["record"]) == ("not_read_to_end", None)
    # a few events of a stream sent 300 ms apart, then the hang-up
    assert proxy.span_seconds(row["span_id"]) < 5


@pytest.mark.parametrize("route", ROUTES)
def test_each_failed_attempt_the_router_retries_gives_one_error_row(
    route: str, proxy: Proxy, simulator_url: str
) -> None:
    """A chat call with ``num_retries`` to a group whose first two deployments answer 429
    (``retried-<route>``): three attempts, three rows, ``error``, ``error``, then the
    answer's record.

    The LiteLLM 1.110.2 proxy runs every attempt of a request on the request's one
    ``Logging`` object, which logs one failure a request (``should_run_logging``,
    litellm/litellm_core_utils/litellm_logging.py; ``failure_already_logged``,
    litellm/router_rust/surface/health.py): the second attempt's failure reaches no
    callback. On ``openai/`` the openai wrapper records it from the wire; on
    ``hosted_vllm/`` it had no row (two rows for three attempts). Its details carry the
    logged failure (``has_logged_async_failure``) when it starts, so the next attempt's
    start on them ends it."""
    case = Case(route, "vllm", "chat", False)
    engine = record_from_json(direct(simulator_url, case), case.body())
    assert engine is not None
    assert len(proxy.rows()) == proxy.given, "an earlier call gave more records"
    body = {**case.body(), "model": f"retried-{route}", "num_retries": RETRIED_ORDERS}
    response = httpx.post(
        proxy.base_url + case.path(),
        json=body,
        headers={"authorization": f"Bearer {proxy.key}"},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.headers["x-litellm-attempted-retries"] == str(RETRIED_ORDERS - 1)
    rows = proxy.wait(RETRIED_ORDERS)
    time.sleep(1.0)  # a fourth row would come now
    assert len(proxy.rows()) == proxy.given
    assert [(r["outcome"], r["record"]) for r in rows] == [
        *[("error", None)] * (RETRIED_ORDERS - 1),
        (expected_outcome(engine), as_recorded(engine)),
    ]


def test_no_stray_record_and_no_internal_error(proxy: Proxy) -> None:
    """After the calls above: no late extra row, no internal error of spec_decode_otel in
    the proxy's log (its logger is shown there at DEBUG), and the hint that
    ``hosted_vllm/`` streams lose their stats was logged."""
    time.sleep(1.0)
    assert len(proxy.rows()) == proxy.given
    log = proxy.log_text()
    ours = [line for line in log.splitlines() if line.startswith("SPEC_DECODE_OTEL_LOG")]
    assert not [line for line in ours if "internal error" in line], log
    if proxy.given:
        assert any("LiteLLM rebuilds the chunks" in line for line in ours), log


def test_a_record_line_is_on_disk_when_the_span_ends(tmp_path: Path) -> None:
    """A long-running process (the proxy) is read while it runs, and uvicorn ends it on
    SIGTERM by re-raising the signal, so no atexit flush ever runs: each line must reach
    the file when its span ends. (Before the fix the lines sat in the file's buffer: the
    proxy's records file stayed empty, even after the proxy stopped.)"""
    from opentelemetry.sdk.trace import TracerProvider

    from spec_decode_otel.records import RecordsFileProcessor

    path = tmp_path / "records.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(RecordsFileProcessor(path))
    try:
        with provider.get_tracer("test").start_as_current_span("chat m") as span:
            span.set_attribute("spec_decode.outcome", "no_stats")
        (row,) = [json.loads(line) for line in path.read_text().splitlines()]
        assert row["outcome"] == "no_stats" and row["record"] is None
    finally:
        provider.shutdown()
