"""``spec-decode-otel check``: a live server asked, through the instrumented ``openai``
SDK, whether its responses carry spec-decode stats (README: Why is my dashboard empty?).

The command runs as users run it, a subprocess, against the simulator SUBPROCESS; the
simulator's per-request headers (``--header``) pick the engine shape or a fault. Its
lines are checked against what the same requests give an instrumented application here:
the outcome of each call and the hints the instrumentation logs. The real llama.cpp
server's answers are in tests/engines/test_llamacpp_server.py.
"""

from __future__ import annotations

import re
import subprocess

import openai
import pytest
from instrumentation_helpers import Otel

import spec_decode_otel
from check_command import COMMAND, PROBES, run_check
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


def test_check_names_vllms_switch_when_its_metrics_come_without_spec_decoding(
    simulator_url: str,
) -> None:
    """The simulator's vLLM shape at level none, as vLLM 0.34.0 answers without a
    speculative config: root ``metrics`` with timing fields and ``speculative_decoding``
    null. Every call is no_stats, and the command names vLLM's two switches instead of
    every engine's."""
    status, lines, out = check(
        simulator_url,
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
