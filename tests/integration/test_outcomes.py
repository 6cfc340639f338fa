"""Every call has an outcome, and the hints say why data goes missing (issue 17, part 1).

Over real HTTP, through the real ``openai`` SDK and the real OTel SDK:

- each ``spec_decode.outcome`` value is produced by the kind of call that should produce
  it, and appears both on the call's span and on the ``spec_decode.requests`` counter
  (unit ``{request}``), whose attributes are exactly the bounded metric attributes the
  other counters use, plus the outcome;
- each one-time hint is logged once at WARNING on logger ``spec_decode_otel``, names the
  server, and says how to fix the cause.

Servers: the session simulator subprocess (vLLM merged shape; other shapes and faults per
request through ``x-spec-decode-engine`` / ``x-sim-fault``), a second simulator that
sends no stats at all (``--engine none``), and, for ``ambiguous``, a loopback HTTP
server of this file that answers with a simulator body carrying both vLLM's
``metrics.speculative_decoding`` and SGLang's ``sglext.spec_tokens_details``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest
from instrumentation_helpers import MESSAGES, MODEL, Otel, server_of
from opentelemetry.trace import StatusCode

from spec_decode_otel import record_from_json
from spec_decode_otel.adapters.registry import detect_outcome
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.instrumentation import hints as hints_module
from spec_decode_otel.instrumentation.hints import QUIET_SERVER_CALLS, hints

LOGGER = "spec_decode_otel"
REQUESTS = "spec_decode.requests"
#: Metrics a record adds to, one series per call (the other two add per bucket/position).
RECORD_METRICS = (
    "spec_decode.acceptance_length",
    "spec_decode.draft_acceptance_rate",
    "spec_decode.draft_tokens",
    "spec_decode.accepted_draft_tokens",
)


@pytest.fixture(autouse=True)
def fresh_hints() -> Iterator[None]:
    """Hints are said once per process: start (and leave) every test with none said."""
    hints.reset()
    yield
    hints.reset()


@pytest.fixture
def warnings_log(caplog: pytest.LogCaptureFixture) -> Callable[[str], list[str]]:
    """``warnings_log(text)``: our WARNING messages that contain ``text``."""
    caplog.set_level(logging.WARNING, logger=LOGGER)

    def matching(text: str) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING and text in r.getMessage()
        ]

    return matching


# -- a server both vLLM and SGLang claim -------------------------------------------------


def _simulator_body(base_url: str, engine: str, extra: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(
        base_url + "/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, **extra},
        headers={
            "x-spec-decode-engine": engine,
            "x-spec-decode-level": "summary",
            "x-sim-seed": "5",
        },
        timeout=30,
    )
    response.raise_for_status()
    return response.json()


@pytest.fixture(scope="module")
def ambiguous_body(simulator_url: str) -> dict[str, Any]:
    """One seeded request rendered as vLLM and as SGLang: the vLLM body with SGLang's
    ``sglext`` added. Each part alone is a valid record of its engine."""
    vllm = _simulator_body(simulator_url, "vllm", {})
    sglang = _simulator_body(simulator_url, "sglang", {"return_spec_tokens_details": True})
    assert record_from_json(vllm).engine == "vllm"
    assert record_from_json({**vllm, "metrics": None, "sglext": sglang["sglext"]}).engine == (
        "sglang"
    )
    return {**vllm, "sglext": sglang["sglext"]}


@pytest.fixture(scope="module")
def ambiguous_url(ambiguous_body: dict[str, Any]) -> Iterator[str]:
    """A loopback OpenAI-compatible server that answers every POST with that body."""
    payload = json.dumps(ambiguous_body).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def quiet_url(start_simulator: Callable[..., str]) -> str:
    """A second simulator whose responses never carry stats."""
    return start_simulator("--engine", "none", "--seed", "99")


# -- the outcome of one call, on its span and on the counter -----------------------------


@dataclass
class Case:
    """One kind of call and the outcome it must have."""

    outcome: str
    headers: dict[str, str] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: How the call is made: "create", "stream" (read to the end), "break" (two chunks
    #: read inside ``with``, then left), "unread" (with_streaming_response, body unread).
    how: str = "create"
    #: Metric attributes the record adds (engine, k); None: no record.
    record_series: dict[str, Any] | None = None
    server: str = "simulator"
    raises: type[BaseException] | None = None


CASES = {
    "recorded": Case(
        "recorded",
        record_series={"spec_decode.engine": "vllm", "spec_decode.num_spec_tokens": 4},
    ),
    "recorded-stream": Case(
        "recorded",
        kwargs={"stream": True, "stream_options": {"include_usage": True}},
        how="stream",
        record_series={"spec_decode.engine": "vllm", "spec_decode.num_spec_tokens": 4},
    ),
    "partial-llamacpp": Case(
        "partial",
        headers={"x-spec-decode-engine": "llamacpp"},
        record_series={"spec_decode.engine": "llamacpp"},
    ),
    "partial-trtllm-released": Case(
        "partial",
        headers={"x-spec-decode-engine": "trtllm-released"},
        record_series={"spec_decode.engine": "tensorrt_llm"},
    ),
    "no_stats": Case("no_stats", headers={"x-spec-decode-engine": "none"}),
    "no_stats-level-none": Case("no_stats", headers={"x-spec-decode-level": "none"}),
    "multi_sequence": Case("multi_sequence", kwargs={"n": 2}),
    "invalid": Case("invalid", headers={"x-sim-fault": "inconsistent"}),
    "ambiguous": Case("ambiguous", server="ambiguous"),
    "not_read_to_end": Case("not_read_to_end", kwargs={"stream": True}, how="break"),
    "not_read_to_end-raw-unread": Case("not_read_to_end", how="unread"),
    "error": Case("error", headers={"x-sim-fault": "http-500"}, raises=openai.InternalServerError),
}


def _call(client: openai.OpenAI, case: Case) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "extra_headers": {"x-sim-seed": "11", **case.headers},
        **case.kwargs,
    }
    if case.how == "create":
        client.chat.completions.create(**kwargs)
    elif case.how == "stream":
        assert list(client.chat.completions.create(**kwargs))
    elif case.how == "break":
        with client.chat.completions.create(**kwargs) as stream:
            for i, _ in enumerate(stream):
                if i == 1:
                    break
    elif case.how == "unread":
        with client.chat.completions.with_streaming_response.create(**kwargs) as response:
            assert response.http_response.status_code == 200


def _requests_points(otel: Otel) -> list[tuple[dict[str, Any], int]]:
    return [(dict(p.attributes), p.value) for p in otel.points(otel.metrics(), REQUESTS)]


@pytest.mark.parametrize("name", list(CASES))
def test_each_outcome_is_on_the_span_and_in_the_counter(
    otel: Otel, simulator_url: str, ambiguous_url: str, name: str
) -> None:
    case = CASES[name]
    base_url = ambiguous_url if case.server == "ambiguous" else simulator_url
    otel.instrument()
    client = openai.OpenAI(api_key="sk-test", base_url=base_url, max_retries=0)
    with client:
        if case.raises is not None:
            with pytest.raises(case.raises):
                _call(client, case)
        else:
            _call(client, case)

    span = otel.only_span()
    attrs = dict(span.attributes or {})
    assert attrs["spec_decode.outcome"] == case.outcome
    assert ("spec_decode.engine" in attrs) == (case.record_series is not None)
    if case.outcome == "not_read_to_end":
        assert attrs["spec_decode.read_to_end"] is False
        assert span.status.status_code is StatusCode.UNSET
    if case.outcome == "error":
        assert attrs["error.type"] == "InternalServerError"
        assert span.status.status_code is StatusCode.ERROR

    host, port = server_of(base_url)
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": MODEL,
        "server.address": host,
        "server.port": port,
        **(case.record_series or {}),
        "spec_decode.outcome": case.outcome,
    }
    if "gen_ai.response.model" in attrs:
        expected["gen_ai.response.model"] = attrs["gen_ai.response.model"]
    assert _requests_points(otel) == [(expected, 1)]
    (metric,) = otel.find(otel.metrics(), REQUESTS)
    assert metric.unit == "{request}"

    if case.record_series is not None:
        # The series the record's own metrics use, plus the outcome.
        metrics = otel.metrics()
        series = [
            {**p.attributes, "spec_decode.outcome": case.outcome}
            for name in RECORD_METRICS
            for p in otel.points(metrics, name)
        ]
        assert series and all(s == expected for s in series), series


def test_the_counter_adds_up_calls_per_outcome(otel: Otel, simulator_url: str) -> None:
    """Calls of different outcomes to one server land in one series per outcome, summed."""
    otel.instrument()
    plan = ["recorded", "no_stats", "recorded", "invalid", "no_stats", "recorded"]
    with openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0) as client:
        for name in plan:
            _call(client, CASES[name])
    totals: dict[str, int] = {}
    for attrs, value in _requests_points(otel):
        totals[attrs["spec_decode.outcome"]] = totals.get(attrs["spec_decode.outcome"], 0) + value
    assert totals == {"recorded": 3, "no_stats": 2, "invalid": 1}
    assert [s.attributes["spec_decode.outcome"] for s in otel.spans()] == plan


# -- hints ------------------------------------------------------------------------------


def test_invalid_payloads_are_hinted_once_with_the_first_reason(
    otel: Otel, simulator_url: str, warnings_log: Callable[[str], list[str]]
) -> None:
    otel.instrument()
    case = CASES["invalid"]
    with openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0) as client:
        for _ in range(3):
            _call(client, case)
    # The reason detection gives for the same seeded body, fetched without the SDK.
    body = httpx.post(
        simulator_url + "/chat/completions",
        json={"model": MODEL, "messages": MESSAGES},
        headers={"x-sim-seed": "11", **case.headers},
        timeout=30,
    ).json()
    reason = detect_outcome([ParsedResponse.from_dict(body)]).reason
    assert reason and "histogram counts do not sum to num_spec_steps" in reason

    said = warnings_log("rejected as invalid")
    host, port = server_of(simulator_url)
    assert said == [hints_module.INVALID % (f"{host}:{port}", reason)]
    assert "Supported engines" in said[0] and "spec-decode-otel parse" in said[0]


@pytest.mark.parametrize(
    ("engine", "with_stats"), [("vllm", "recorded"), ("mlx-vlm", "partial"), ("smg", "partial")]
)
def test_streams_without_include_usage_are_hinted_once(
    otel: Otel,
    simulator_url: str,
    warnings_log: Callable[[str], list[str]],
    engine: str,
    with_stats: str,
) -> None:
    """vLLM (0.33.0, wire-formats.md), mlx-vlm (0.7.10) and the smg gateway's ``usage``
    pair send streaming stats only on the usage chunk: a server whose non-streaming
    calls carry stats and whose streams without include_usage carry none is missing
    include_usage. The hint comes whichever of the two is seen first, and once. (A
    llama.cpp stream without counts gets none: tests/engines/test_llamacpp_spec_types.py.)"""
    otel.instrument()
    hint = "stream_options.include_usage"
    headers = {"x-spec-decode-engine": engine}
    with openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0) as client:
        stream = Case("no_stats", headers=headers, kwargs={"stream": True}, how="stream")
        plain = Case(with_stats, headers=headers)
        _call(client, stream)
        assert warnings_log(hint) == []  # no stats seen from this server yet
        _call(client, plain)
        said = warnings_log(hint)
        assert len(said) == 1
        _call(client, stream)
        _call(client, plain)
    assert warnings_log(hint) == said
    host, port = server_of(simulator_url)
    assert said[0].startswith(f"{host}:{port} sends spec-decode stats on non-streaming calls")
    assert "inject_include_usage=True" in said[0]
    assert "--enable-force-include-usage" in said[0]
    outcomes = [s.attributes["spec_decode.outcome"] for s in otel.spans()]
    assert outcomes == ["no_stats", with_stats, "no_stats", with_stats]


def test_no_include_usage_hint_when_streams_ask_for_usage_or_stop_early(
    otel: Otel, simulator_url: str, warnings_log: Callable[[str], list[str]]
) -> None:
    otel.instrument()
    with openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0) as client:
        _call(client, CASES["recorded"])
        _call(client, CASES["recorded-stream"])  # include_usage: stats arrive
        _call(client, CASES["not_read_to_end"])  # stopped early: not the server's doing
    assert warnings_log("include_usage") == []
    outcomes = [s.attributes["spec_decode.outcome"] for s in otel.spans()]
    assert outcomes == ["recorded", "recorded", "not_read_to_end"]


def test_no_include_usage_hint_for_responses_api_streams(
    otel: Otel, simulator_url: str, warnings_log: Callable[[str], list[str]]
) -> None:
    """A Responses API stream has no ``stream_options`` (usage always comes on its
    ``response.completed`` event), and ``inject_include_usage`` never touches it: vLLM's
    streamed Responses carry no stats (0.34.0: timing ``metrics`` only), and that must
    not be blamed on a missing include_usage."""
    otel.instrument()
    with openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0) as client:
        _call(client, CASES["recorded"])
        for stream in (True, False):
            events = client.responses.create(
                model=MODEL, input="hi", max_output_tokens=16, stream=stream
            )
            if stream:
                assert list(events)
    assert warnings_log("include_usage") == []
    outcomes = [s.attributes["spec_decode.outcome"] for s in otel.spans()]
    assert outcomes == ["recorded", "no_stats", "no_stats"]


def test_a_quiet_server_is_hinted_once_after_enough_calls(
    otel: Otel, simulator_url: str, quiet_url: str, warnings_log: Callable[[str], list[str]]
) -> None:
    otel.instrument()
    hint = "calls without spec-decode stats while other servers sent them"
    with (
        openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0) as talker,
        openai.OpenAI(api_key="sk-test", base_url=quiet_url, max_retries=0) as quiet,
    ):
        _call(talker, CASES["recorded"])
        for _ in range(QUIET_SERVER_CALLS - 1):
            _call(quiet, Case("no_stats"))
        assert warnings_log(hint) == []
        _call(quiet, Case("no_stats"))
        said = warnings_log(hint)
        for _ in range(3):
            _call(quiet, Case("no_stats"))
    assert len(said) == 1 and warnings_log(hint) == said
    host, port = server_of(quiet_url)
    assert said[0].startswith(f"{host}:{port} answered {QUIET_SERVER_CALLS} calls")
    assert "--per-request-spec-decode-metrics" in said[0]
    assert "inject_include_usage=True" in said[0]
    assert "gateway" in said[0]


def test_no_quiet_server_hint_without_stats_from_another_server(
    otel: Otel, quiet_url: str, warnings_log: Callable[[str], list[str]]
) -> None:
    """A process that never saw stats from anyone is not told a server is quiet: it may
    not use speculative decoding at all."""
    otel.instrument()
    with openai.OpenAI(api_key="sk-test", base_url=quiet_url, max_retries=0) as quiet:
        for _ in range(QUIET_SERVER_CALLS + 2):
            _call(quiet, Case("no_stats"))
    host, port = server_of(quiet_url)
    assert warnings_log(f"{host}:{port}") == []
    assert {s.attributes["spec_decode.outcome"] for s in otel.spans()} == {"no_stats"}


def test_failing_calls_do_not_make_a_server_quiet(
    otel: Otel, simulator_url: str, quiet_url: str, warnings_log: Callable[[str], list[str]]
) -> None:
    """Errors are no evidence that a server sends no stats."""
    otel.instrument()
    with (
        openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0) as talker,
        openai.OpenAI(api_key="sk-test", base_url=quiet_url, max_retries=0) as failing,
    ):
        _call(talker, CASES["recorded"])
        for _ in range(QUIET_SERVER_CALLS + 2):
            with pytest.raises(openai.InternalServerError):
                _call(failing, CASES["error"])
    host, port = server_of(quiet_url)
    assert warnings_log(f"{host}:{port}") == []
    outcomes = [s.attributes["spec_decode.outcome"] for s in otel.spans()]
    assert outcomes == ["recorded"] + ["error"] * (QUIET_SERVER_CALLS + 2)
