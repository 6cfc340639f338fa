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
import gzip
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


@pytest.mark.parametrize("fault", ["inconsistent", "malformed-types"])
def test_check_on_stats_it_rejects_says_they_were_rejected_not_missing(
    simulator_url: str, fault: str
) -> None:
    """Stats that arrive but break the record's rules (the simulator's payload faults):
    every call is ``invalid``. The verdict said no response carried stats and to switch
    them on, which they were, contradicting the instrumentation's own hint above it."""
    status, lines, out = check(
        simulator_url,
        "--header",
        "x-spec-decode-engine: trtllm",
        "--header",
        f"x-sim-fault: {fault}",
    )
    assert [lines[p].split()[0] for p in PROBES] == ["invalid"] * 3
    said = " ".join(out.split())
    assert "Spec-decode stats arrived but were rejected as invalid" in said
    assert "No response carried spec-decode stats" not in said
    assert TURN_STATS_ON not in said
    assert status == 1


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_check_behind_a_gateway_that_drops_streamed_stats_points_at_the_gateway(
    simulator_url: str, engine: str
) -> None:
    """The simulator as LiteLLM's proxy (``x-sim-gateway: litellm-proxy``; the real proxy,
    1.110.2, answered alike when a helper ran check through it): the plain call has
    stats, no stream has, even with ``include_usage``. The only advice was to send
    ``include_usage`` (vLLM), which the third call had just shown does not help, or
    nothing (SGLang); now it points at what is in front of the engine."""
    status, lines, out = check(
        simulator_url,
        "--header",
        f"x-spec-decode-engine: {engine}",
        "--header",
        "x-sim-gateway: litellm-proxy",
        "--request-engine-stats",
        "sglang",
    )
    assert [lines[p].split()[0] for p in PROBES] == ["recorded", "no_stats", "no_stats"]
    said = " ".join(out.split())
    assert "no stream had, even with stream_options.include_usage" in said
    assert "Through a gateway" in said
    assert "inject_include_usage=True" not in said
    assert status == 0


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


def test_check_names_pre_merge_vllms_own_switch_when_its_choices_carry_null_stats(
    simulator_url: str,
) -> None:
    """A pre-merge vLLM build with its stats off sends ``speculative_decoding_stats:
    null`` on every choice (wire-formats.md, pre-merge vLLM; the simulator's
    ``vllm-premerge`` shape at level none). The verdict named only the merged builds'
    ``--per-request-spec-decode-metrics``, a flag that build does not have."""
    status, lines, out = check(
        simulator_url,
        "--header",
        "x-spec-decode-engine: vllm-premerge",
        "--header",
        "x-spec-decode-level: none",
    )
    assert [lines[p] for p in PROBES] == ["no_stats"] * 3
    said = " ".join(out.split())
    assert "pre-merge vLLM build's per-choice speculative_decoding_stats as null" in said
    assert "--per-request-spec-decode-stats" in said
    assert TURN_STATS_ON not in said
    assert status == 1


def test_check_on_sglang_without_its_request_field_names_checks_own_flag(
    simulator_url: str,
) -> None:
    """SGLang sends its stats only when the request asks (``return_spec_tokens_details``).
    The verdict named the Python setting, so running check again the same way gave the
    same answer; it now names ``--request-engine-stats sglang``, which records all three
    calls."""
    _, lines, out = check(simulator_url, "--header", "x-spec-decode-engine: sglang")
    assert [lines[p] for p in PROBES] == ["no_stats"] * 3
    assert "run check again with --request-engine-stats sglang" in " ".join(out.split())
    status, lines, out = check(
        simulator_url,
        "--header",
        "x-spec-decode-engine: sglang",
        "--request-engine-stats",
        "sglang",
    )
    assert [lines[p].split()[0] for p in PROBES] == ["recorded"] * 3
    assert "--request-engine-stats sglang" not in out
    assert status == 0


@pytest.mark.parametrize(
    ("status_code", "content_type", "body", "shown", "verdict"),
    [
        (
            502,
            "text/html",
            "<html><head><title>502 Bad Gateway</title></head><body><center>"
            "<h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>",
            "502 Bad Gateway 502 Bad Gateway nginx",
            "a gateway or proxy answered for a server behind it that is down",
        ),
        (
            404,
            "application/json",
            json.dumps({"detail": "Not Found"}),
            "Not Found",
            "check the URL (it usually ends in /v1)",
        ),
        (
            429,
            "application/json",
            json.dumps({"error": {"message": "Rate limit reached", "type": "rate_limit"}}),
            "Rate limit reached",
            "is rate-limiting (HTTP 429)",
        ),
        (
            403,
            "text/html",
            "<html><body><h1>Forbidden</h1><p>sign in at https://sso.example.com</p></body></html>",
            "Forbidden sign in at https://sso.example.com",
            "refused the credentials (HTTP 401 or 403): check --api-key",
        ),
    ],
    ids=["nginx-502", "no-v1-404", "rate-limited-429", "sso-403"],
)
def test_check_shows_what_an_error_page_says_and_what_it_points_at(
    status_code: int, content_type: str, body: str, shown: str, verdict: str
) -> None:
    """An error answer that is not an OpenAI error object: nginx's page for a server
    behind it that is down, FastAPI's 404 for a base URL without ``/v1``. openai 3.63
    keeps only a JSON error's ``message`` in ``exc.message``, so each line said just
    ``Error code: 502``, and the verdict blamed the URL, the model and the key for a
    server that was down. (openai 1 and 2 put the body in the message themselves.) A
    rate limit (429) and refused credentials (an SSO page's 403) get verdicts of their
    own."""
    with canned(status_code, content_type, body) as url:
        status, lines, out = run_check(url, "--model", "m", "--timeout", "20")
    for probe in PROBES:
        assert lines[probe].startswith(f"error             HTTP {status_code}: "), lines[probe]
        assert shown in lines[probe], lines[probe]
    assert verdict in " ".join(out.split())
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
        (["--header", "no-colon"], "argument --header: 'no-colon' is not NAME:VALUE"),
        (
            ["--request-engine-stats", "nonesuch"],
            "argument --request-engine-stats: unknown engine 'nonesuch'; known:",
        ),
        (["--timeout", "nan"], "argument --timeout: 'nan' is not a number of seconds"),
        (["--timeout", "inf"], "argument --timeout: 'inf' is not a number of seconds"),
        (["--timeout", "1e300"], "argument --timeout: '1e300' is not a number of seconds"),
        (["--timeout", "0"], "argument --timeout: '0' is not a number of seconds"),
        (["--timeout", "-5"], "argument --timeout: '-5' is not a number of seconds"),
        (["--timeout", "abc"], "argument --timeout: 'abc' is not a number of seconds"),
        (["--base-url-empty"], "argument base_url: the base URL is empty"),
        (["--max-tokens", "0"], "argument --max-tokens: '0' is not a whole number of tokens"),
        (["--max-tokens", "-1"], "argument --max-tokens: '-1' is not a whole number of tokens"),
    ],
    ids=[
        "header", "engine", "nan", "inf", "1e300", "zero", "negative", "not-a-number", "url",
        "max-tokens-zero", "max-tokens-negative",
    ],
)  # fmt: skip
def test_bad_flags_are_usage_errors_with_exit_status_2(
    simulator_url: str, flags: list[str], says: str
) -> None:
    """A mistyped flag is a usage error, argparse's: exit status 2 and the usage, never 1,
    which says the server sent no stats, nor a traceback. The header and the engine were
    refused with 1 (a ``SystemExit`` message from ``run``); a timeout that is not a
    finite number ended in ``Thread.join``'s OverflowError or ValueError traceback, and
    0 or a negative one was taken, every call then reported as not answered in time; an
    empty URL was taken too, each call then a connection error; ``--max-tokens 0`` went
    out, and the server's refusals ended in advice about the URL and the key."""
    url = "" if flags == ["--base-url-empty"] else simulator_url
    flags = [] if url == "" else flags
    done = subprocess.run(
        [*COMMAND, url, "--model", "m", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("usage: spec-decode-otel check"), done.stderr
    assert f"spec-decode-otel check: error: {says}" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_check_piped_into_a_reader_that_leaves_stops_quietly(simulator_url: str) -> None:
    """``check ... | head -1``: the reader leaves after the first line. The command
    stops without a word on stderr and with main's exit status for a reader that left
    (1), as the other commands do. Each call's line was printed by the thread that made
    the requests, where main's ``BrokenPipeError`` handling does not reach: the thread
    died with a BrokenPipeError traceback ("Exception in thread spec-decode-otel-check").
    Unbuffered, as the reproducer's shell had it, so each line is written as printed."""
    with subprocess.Popen(
        [*COMMAND, simulator_url, "--model", "m", "--header", "x-spec-decode-engine: vllm"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(simulator_url.encode())
        proc.stdout.close()  # the reader leaves before the calls' lines
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 1
    assert err == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="Linux's /dev/full")
def test_check_with_a_full_disk_for_stdout_says_so_once(simulator_url: str) -> None:
    """``check ... > /dev/full``: its first line cannot be written. One line on stderr
    and exit status 1, as tests/unit/test_cli_output.py pins for parse and summarize;
    before, an ``OSError`` traceback."""
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [*COMMAND, simulator_url, "--model", "m"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    said = "spec-decode-otel check: cannot write the output: No space left on device\n"
    assert done.stderr == said


class LoopbackServer:
    """A threaded HTTP server on loopback serving ``handler``, for ``with`` blocks."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> LoopbackServer:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class CannedServer(LoopbackServer):
    """A loopback server that answers every POST, streamed or not, with the same status,
    content type, body and extra headers: a login page, another API's JSON, an error
    message made to move a terminal's cursor, a gzip bomb."""

    def __init__(
        self, status: int, content_type: str, body: bytes, headers: Mapping[str, str] = {}
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                with contextlib.suppress(OSError):  # a client that stopped reading
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)


@contextlib.contextmanager
def canned(status: int, content_type: str, body: str) -> Iterator[str]:
    with CannedServer(status, content_type, body.encode()) as server:
        yield server.url


#: C0 and C1 controls, DEL, a line separator and a bidi override: what a terminal acts
#: on (clear the screen, colour, move the cursor, end the line, reverse the text).
CONTROLS = "\x1b[2J\x1b[31m\x9b1A\x7f\r\u2028\u202e"


def test_check_escapes_the_control_characters_of_a_servers_error_message() -> None:
    """A server's error message is printed with its control characters escaped, so it
    can neither clear the screen nor break the table: each call keeps one line, still
    cut at 200 characters of the message. It was printed raw: ESC[2J cleared the
    terminal, and its newlines put the rest of the message under the table's columns."""
    message = f"{CONTROLS}boom\nline2\n" + "E" * 100_000
    body = json.dumps({"error": {"message": message}})
    with canned(500, "application/json", body) as url:
        status, lines, out = run_check(url, "--model", "m", "--timeout", "20")
    escaped = r"\x1b[2J\x1b[31m\x9b1A\x7f\r\u2028\u202eboom\nline2\nEEE"
    for probe in PROBES:
        # openai 3 says the error's message; openai 1 and 2 the error body's repr, which
        # escapes the same characters the same way
        assert lines[probe].startswith("error             HTTP 500: Error code: 500 - ")
        assert escaped in lines[probe], lines[probe]
        assert lines[probe].endswith("E" * 100)
        assert len(lines[probe]) < 300
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u202e]", out), repr(out)
    assert len(out.splitlines()) == 6  # the URL, three calls, a blank line, the verdict
    assert status == 1


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/html", f"<html><title>Sign in</title><body>{CONTROLS}Log in</body></html>"),
        ("application/json", json.dumps({"object": "list", "data": [1, 2, 3]})),
        (
            "text/event-stream",
            "data: "
            + json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": "m",
                    "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}],
                }
            )
            + "\n\ndata: [DONE]\n\n",
        ),
    ],
    ids=["login-page", "other-json", "sse-for-a-plain-call"],
)
def test_check_says_when_the_answers_are_not_chat_completions(content_type: str, body: str) -> None:
    """A proxy's login page (HTTP 200, HTML), another API's JSON (a wrong base URL), an
    event stream for a call that is not streamed: the command says the answers are not
    OpenAI chat completions, shows what came instead, and exits 1. It said every call
    was no_stats and told the user to switch the server's per-request stats on, which
    no engine setting fixes. (The SSE server streams chat chunks for the streamed calls,
    which are chat completions without stats.)"""
    with canned(200, content_type, body) as url:
        status, lines, out = run_check(url, "--model", "m", "--timeout", "20")
    said = " ".join(out.split())
    assert lines["chat"].startswith(f"no_stats          not a chat completion: {content_type}, ")
    if content_type != "text/event-stream":
        for probe in PROBES[1:]:
            wrong = f"not a chat completion stream: {content_type}, 0 events"
            assert lines[probe] == f"no_stats          {wrong}", lines[probe]
    assert "Not every answer was an OpenAI chat completion" in said
    assert "check the base URL" in said and "a login page" in said
    assert TURN_STATS_ON not in said and "\x1b" not in out
    assert status == 1


#: The command, run as ``python -m spec_decode_otel``, then its own peak memory printed on
#: stderr: VmHWM, which starts again at exec (``ru_maxrss`` keeps the parent's peak).
PEAK_MEMORY = """
import runpy, sys
try:
    runpy.run_module("spec_decode_otel", run_name="__main__", alter_sys=True)
finally:
    with open("/proc/self/status") as status:
        print(*[line for line in status if line.startswith("VmHWM")], file=sys.stderr)
"""


def test_check_stops_reading_an_answer_past_16_mib_of_a_gzip_bomb() -> None:
    """A 200 answer of 256 MiB of spaces gzipped into 256 KiB (a gzip bomb; a body that
    never ends is the same read): each call stops once the inflated answer passes 16 MiB,
    an error that says so, and the command's peak memory stays far below the answer's
    size. The SDK read every answer whole, whatever its size: 1.2 GB peak here, several
    GB for the probe's 2 GiB bomb or endless body, until the machine ran out."""
    bomb = gzip.compress(b" " * (256 << 20), compresslevel=1)
    encoded = {"content-encoding": "gzip"}
    with CannedServer(200, "application/json", bomb, encoded) as server:
        done = subprocess.run(
            [sys.executable, "-c", PEAK_MEMORY, "check", server.url, "--model", "m"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert "Traceback" not in done.stderr, done.stderr
    for probe in PROBES:
        found = re.search(rf"^  {re.escape(probe)}\s+error\s+(.*)$", done.stdout, re.M)
        assert found, done.stdout
        # openai 3 lets the error through; openai 1 and 2 wrap a read's error as a
        # connection error, whose cause check says
        too_large = "the answer is over 16 MiB, more than check reads"
        assert found.group(1) in (
            f"AnswerTooLarge: {too_large}",
            f"APIConnectionError: Connection error. ({too_large})",
        )
    peak = re.search(r"^VmHWM:\s+(\d+) kB$", done.stderr, re.M)
    assert peak and int(peak.group(1)) < 200 * 1024, done.stderr  # below 200 MiB
    assert done.returncode == 1


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
    assert "No call was answered within --timeout (4 s for the whole check)" in out
    assert "raise it" in out
    assert proc.returncode == 1


def test_check_says_a_server_that_answers_nothing_in_time_timed_out(simulator_url: str) -> None:
    """The simulator holds its answer (``slow`` fault, 10 s) past ``--timeout``: the
    plain call's line is an error (the SDK's ``APITimeoutError``, or the command's own
    "no answer" when the deadline reaches it first: the request has all the time left)
    and the verdict is the timeout's, now decided from what was raised or not made,
    rather than from the lines' texts."""
    status, lines, out = check(
        simulator_url,
        "--timeout",
        "2",
        "--header",
        "x-sim-fault: slow",
        "--header",
        "x-sim-delay-ms: 10000",
    )
    assert all(lines[probe].startswith("error ") for probe in PROBES), lines
    assert "No call was answered within --timeout (2 s for the whole check)" in out
    assert status == 1


class ErrorQuotingServer(LoopbackServer):
    """A loopback server that answers at once, with errors that carry no HTTP status and
    quote the word "Timeout": a stream gets one SSE error event (as vLLM reports an error
    once its stream has begun, ``data: {"error": ...}``) whose message is "upstream
    Timeout"; a plain call gets the start of its body and then the connection is cut."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["content-length"])))
                self.send_response(200)
                if request.get("stream"):
                    error = {"error": {"message": "upstream Timeout", "type": "server_error"}}
                    body = f"data: {json.dumps(error)}\n\n".encode()
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "1000")
                self.end_headers()
                self.wfile.write(b'{"error": {"message": "upstream Timeout"')
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)


def test_check_does_not_call_errors_that_quote_timeout_a_timeout() -> None:
    """Every call failed at once, without an HTTP status, and the stream's error message
    says "upstream Timeout" (openai 3.63.0 raises it as ``APIError: upstream Timeout``).
    The verdict looked for "Timeout" in the lines' texts, so it said no call was answered
    within ``--timeout`` and told the user to raise it, for a server that answered every
    call within a second of a 60 s timeout. The timeout's verdict now needs a timeout to
    have run out: here it is the verdict for calls that failed."""
    with ErrorQuotingServer() as server:
        status, lines, out = run_check(server.url, "--model", "m", "--timeout", "60")
    assert lines["stream"] == "error             APIError: upstream Timeout", lines["stream"]
    assert lines["chat"].startswith("error             APIConnectionError: "), lines["chat"]
    said = " ".join(out.split())
    assert "No call was answered within --timeout" not in said, out
    assert "No call succeeded: check the URL" in said, out
    assert status == 1
