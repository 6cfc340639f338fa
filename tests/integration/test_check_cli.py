"""``spec-decode-otel check``: a live server asked, through the instrumented ``openai``
SDK, whether its responses carry spec-decode stats (README: Why is my dashboard empty?).

The command runs as users run it, a subprocess, against the simulator SUBPROCESS; the
simulator's per-request headers (``--header``) pick the engine shape or a fault. Its
lines are checked against what the same requests give an instrumented application here:
the outcome of each call and the hints the instrumentation logs. The real llama.cpp
server's answers are in tests/engines/test_llamacpp_server.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import threading
import time

import openai
import pytest
from instrumentation_helpers import Otel

import spec_decode_otel
from check_command import COMMAND, PROBES, run_check
from simulator_process import SimulatorProcess
from spec_decode_otel.instrumentation.hints import TURN_STATS_ON, hints


def check(simulator_url: str, *args: str) -> tuple[int, dict[str, str], str]:
    return run_check(simulator_url, "--model", "spec-sim", *args)


def outcomes_in_an_application(simulator_url: str, engine: str) -> list[str]:
    """The outcomes the same three requests get in an instrumented application."""
    otel = Otel()
    hints.reset()
    client = openai.OpenAI(
        api_key="sk-test",
        base_url=simulator_url,
        max_retries=0,
        default_headers={"x-spec-decode-engine": engine},
    )
    try:
        spec_decode_otel.instrument_client(
            client, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
        )
        messages = [{"role": "user", "content": "hi"}]
        usage = {"include_usage": True}
        for extra in ({}, {"stream": True}, {"stream": True, "stream_options": usage}):
            result = client.chat.completions.create(
                model="spec-sim", messages=messages, max_tokens=64, **extra
            )
            if extra:
                list(result)
        return [str(s.attributes["spec_decode.outcome"]) for s in otel.spans()]
    finally:
        client.close()
        otel.close()
        hints.reset()


def test_check_shows_which_calls_of_a_vllm_server_carry_stats_and_the_fix(
    simulator_url: str,
) -> None:
    """The simulator's vLLM shape (0.34.0's): stats on plain calls and on streams that
    ask for the usage chunk, none on a stream that does not. The command says so call by
    call, with the record's figures, and passes on the instrumentation's own
    include-usage hint; it exits 0 since stats do arrive."""
    status, lines, out = check(simulator_url, "--header", "x-spec-decode-engine: vllm")
    expected = outcomes_in_an_application(simulator_url, "vllm")
    assert expected == ["recorded", "no_stats", "recorded"]
    assert [lines[p].split()[0] for p in PROBES] == expected
    assert re.search(r"engine vllm\s+mean acceptance length \d\.\d{3}", lines["chat"])
    assert "hint: 127.0.0.1:" in out and "inject_include_usage=True" in out
    assert status == 0


def test_check_on_a_server_without_stats_says_how_to_turn_them_on_and_fails(
    simulator_url: str,
) -> None:
    """A server that sends no stats (the simulator as a plain OpenAI server): every call
    is no_stats, the command prints where each engine switches its stats on, the same
    words as the instrumentation's quiet-server hint, and exits 1."""
    status, lines, out = check(simulator_url, "--header", "x-spec-decode-engine: none")
    assert [lines[p] for p in PROBES] == ["no_stats"] * 3
    assert outcomes_in_an_application(simulator_url, "none") == ["no_stats"] * 3
    assert TURN_STATS_ON in " ".join(out.split())
    assert status == 1


@pytest.mark.parametrize("timing_metrics", [True, False], ids=["timing-metrics", "default-flags"])
def test_check_names_vllms_switches_when_its_metrics_carry_no_spec_decoding(
    timing_metrics: bool,
) -> None:
    """vLLM 0.34.0 without a speculative config (the simulator's vLLM shape at level
    none): with ``--enable-per-request-metrics``, root ``metrics`` with timing fields and
    ``speculative_decoding`` null; on its default flags, ``"metrics": null``
    (``chat_completion/serving.py`` builds a ``PerRequestMetrics`` only for timing
    metrics or spec-decode stats, and the body is dumped with its nulls; the simulator's
    ``--no-vllm-timing-metrics``). Every call is no_stats, and the command names vLLM's
    two switches instead of every engine's."""
    flag = "--vllm-timing-metrics" if timing_metrics else "--no-vllm-timing-metrics"
    with SimulatorProcess([flag]) as sim:
        status, lines, out = check(
            sim.base_url,
            "--header",
            "x-spec-decode-engine: vllm",
            "--header",
            "x-spec-decode-level: none",
        )
    assert [lines[p] for p in PROBES] == ["no_stats"] * 3
    said = " ".join(out.split())
    assert "sends vLLM's per-request metrics without speculative_decoding" in said
    assert "--speculative-config and --per-request-spec-decode-metrics summary" in said
    assert TURN_STATS_ON not in said
    assert status == 1


def test_check_reports_a_failing_server_without_a_traceback(simulator_url: str) -> None:
    """The server answers HTTP 500 (the simulator's ``http-500`` fault): each call's line
    says so, and the command exits 1, as when nothing has stats."""
    status, lines, out = check(simulator_url, "--header", "x-sim-fault: http-500")
    for probe in PROBES:
        assert re.fullmatch(r"error\s+HTTP 500: .+", lines[probe]), lines[probe]
    assert "No call succeeded" in out and TURN_STATS_ON not in " ".join(out.split())
    assert status == 1


def test_check_reports_a_connection_the_server_cuts_without_a_traceback(
    simulator_url: str,
) -> None:
    """The server drops the connection part-way through each body (``drop-mid-stream``):
    each call is an error with the transport's complaint, never a traceback."""
    status, lines, _ = check(simulator_url, "--header", "x-sim-fault: drop-mid-stream")
    assert all(lines[p].startswith("error") for p in PROBES), lines
    assert status == 1


def test_check_on_no_server_at_all_says_it_could_not_connect(simulator_url: str) -> None:
    """Nothing listens on the port: a connection error per call, exit 1."""
    status, lines, _ = check("http://127.0.0.1:9/v1", "--timeout", "5")
    assert all(lines[p].startswith("error") and "APIConnectionError" in lines[p] for p in PROBES)
    assert status == 1


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--header", "no-colon"], "is not NAME:VALUE"),
        (["--request-engine-stats", "nonesuch"], "unknown engine(s) nonesuch; known:"),
    ],
    ids=["header", "engine"],
)
def test_bad_flags_are_refused_in_one_line(simulator_url: str, flags: list[str], says: str) -> None:
    done = subprocess.run(
        [*COMMAND, simulator_url, "--model", "m", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert says in done.stderr and "Traceback" not in done.stderr


class HungServer:
    """A loopback server that accepts every connection and never answers (a wedged
    engine, a proxy waiting on a dead upstream), or with ``trickle`` answers 200 with an
    event stream and then only an SSE comment every half second, forever (a gateway's
    keep-alive pings before an upstream that never answers)."""

    def __init__(self, trickle: bool = False) -> None:
        self.trickle = trickle
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # the listener closed at the end
            while True:
                conn = self.listener.accept()[0]
                self.held.append(conn)
                if self.trickle:
                    threading.Thread(target=self._ping, args=(conn,), daemon=True).start()

    def _ping(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the client went away
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            while not self.stop.wait(0.5):
                conn.sendall(b"8\r\n: ping\n\n\r\n")

    def __enter__(self) -> HungServer:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(5)
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickle"])
def test_check_against_a_hung_server_stops_at_its_timeout_in_all(trickle: bool) -> None:
    """``--timeout`` bounds the whole check: against a server that accepts and never
    answers, the command ends about ``--timeout`` seconds after its requests begin (its
    first line), each line an error, exit 1. It made its three requests one after the
    other with the whole timeout each (openai 3.63.0's per-request ``timeout``, which
    httpx2, its transport, applies to connect and to each read), so it took three times as long; and
    a server that sends a byte now and then (SSE keep-alive comments) renews httpx's read
    timeout at every read, so no request timeout bounds it at all."""
    timeout = 4.0
    with HungServer(trickle) as server:
        proc = subprocess.Popen(
            [*COMMAND, server.url, "--model", "m", "--timeout", str(timeout)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(server.url)  # the requests have begun
        began = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - began
    assert "Traceback" not in err, err
    # The defects this pins took three times the timeout, or never ended; the margin
    # above the timeout is the interpreter's exit, which a loaded machine stretches.
    assert timeout - 0.5 < took < timeout + 3.0, (took, out)
    for probe in PROBES:
        found = re.search(rf"^  {re.escape(probe)}\s+error\s+\S", out, re.M)
        assert found, out
    assert "No call succeeded" in out
    assert proc.returncode == 1
