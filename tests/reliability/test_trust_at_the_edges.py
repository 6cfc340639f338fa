"""Issue "Trust at the edges": each case it reproduced, through the real ``openai`` client
and a real HTTP server on loopback (``loopback.py``) or the simulator subprocess.

- Bounded cost: the 200-byte pre-merge body whose histogram key is 30,000,000 took one
  ``chat.completions.create()`` 16.6 s and 520 MB before (a key of 10**9 was OOM-killed),
  and so did ``num_spec_tokens: 100000000`` with an empty histogram. Now: no record
  (outcome ``invalid``), milliseconds, flat memory.
- Trace propagation: ``inject_traceparent`` sent the caller's baggage
  (``user.email=...``) and overwrote the caller's own ``baggage`` header.
- Enrich mode: never status, ``error.type`` or ``gen_ai.usage.*`` on a span that is not a
  GenAI span; a second call under an enriched span gets a child span instead of
  overwriting the first call's figures.
- The library logger prints nothing unless the application configures logging; the
  first internal error is one WARNING, later ones DEBUG.
- Misuse is loud: instrument() again with other settings, setup() twice, an unknown
  engine in ``request_engine_stats``.
- Metric attributes with unknown values are left out, never sent as ``""``.
- Choices that are not a list of objects, and a Responses event type or status that is a
  list (the SDK never checks them), give no record and no internal error.
- A body or SSE event read raw that is not JSON (a gateway's page, or nested too deep
  for ``json``) gives a debug log and no record, not an internal-error warning.

A stream stopped early (status unset, ``spec_decode.read_to_end=false``) is covered by
tests/integration/test_instrumentation_streams.py for every way out.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
from loopback import LoopbackServer
from opentelemetry import baggage, context, propagate
from opentelemetry.trace import StatusCode
from reliability_helpers import (
    API_KEY,
    Otel,
    instrumented,
    internal_errors,
    no_litellm_call_open,
    uninstrumented,
)

from otlp_values import clean_env
from record_json import WIRE_EXAMPLES
from spec_decode_otel import SpecDecodeInstrumentor, instrument_client
from spec_decode_otel._logging import RateLimitedLog
from spec_decode_otel.instrumentation import responses
from spec_decode_otel.instrumentation.call import MAX_SERVER_TEXT
from spec_decode_otel.integrations._litellm_kwargs import logged_body
from spec_decode_otel.record import MAX_SPEC_TOKENS
from spec_decode_otel.sse import MAX_EVENT_CHARS
from spec_decode_otel.telemetry import (
    ERROR_TYPE,
    GEN_AI_RESPONSE_MODEL,
    M_REQUESTS,
    M_VERIFY_STEPS,
    SCOPE_NAME,
    SD_ENGINE,
    SD_NUM_SPEC_STEPS,
    SD_OUTCOME,
)

HERE = Path(__file__).resolve().parent
MESSAGES = [{"role": "user", "content": "hi"}]


def chat_body(choice_extra: dict[str, Any] | None = None, **root: Any) -> bytes:
    """A chat completion; ``choice_extra`` goes on the choice, ``root`` on the body."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "ok"},
        "finish_reason": "stop",
        **(choice_extra or {}),
    }
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m"}
    body |= {"choices": [choice], **root}
    return json.dumps(body).encode()


def premerge(key: int) -> bytes:
    """The pre-merge vLLM body of the issue: self-consistent, one step accepting ``key``."""
    stats = {
        "acceptance_histogram": {str(key): 1},
        "num_spec_steps": 1,
        "num_accepted_draft_tokens": key,
        "num_draft_tokens": key,
    }
    return chat_body({"speculative_decoding_stats": stats})


def merged_huge_k() -> bytes:
    """Merged vLLM stats with ``num_spec_tokens: 100000000`` and an empty histogram."""
    stats = {
        "mean_acceptance_length": 1.0,
        "draft_acceptance_rate": 0.0,
        "acceptance_histogram": [],
        "num_spec_steps": 0,
        "num_accepted_draft_tokens": 0,
        "num_draft_tokens": 0,
        "num_spec_tokens": 100_000_000,
    }
    return chat_body(metrics={"speculative_decoding": stats})


def stream_with(stats: dict[str, Any]) -> bytes:
    """A two-chunk stream whose final chunk carries ``stats`` on its choice."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        base | {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]},
        base
        | {
            "choices": [
                {
                    "index": 0,
                    "delta": {},
                    "finish_reason": "stop",
                    "speculative_decoding_stats": stats,
                }
            ]
        },
    ]
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as running:
        yield running


def client_for(server: LoopbackServer) -> openai.OpenAI:
    return openai.OpenAI(api_key=API_KEY, base_url=server.url, max_retries=0)


def seen_alike(client: openai.OpenAI, seen: Callable[[], Any], otel: Otel) -> list[str]:
    """``seen()`` (what the user sees of a call) bare, then instrumented into ``otel``,
    where it must be the same; the internal errors reported meanwhile. Closes ``client``."""
    try:
        bare = seen()
        with internal_errors() as reported, instrumented(otel):
            assert seen() == bare
    finally:
        client.close()
    return reported


def read(client: openai.OpenAI, stream: bool) -> Any:
    """One chat call as the user sees it (a stream read to its end)."""
    if stream:
        chunks = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        return [c.model_dump() for c in chunks]
    return client.chat.completions.create(model="m", messages=MESSAGES).model_dump()


# --------------------------------------------------------------------------- 1. bounds


@pytest.mark.parametrize(
    ("body", "stream"),
    [
        (premerge(30_000_000), False),
        (premerge(10**9), False),
        (merged_huge_k(), False),
        (stream_with(json.loads(premerge(30_000_000))["choices"][0]["speculative_decoding_stats"]), True),  # noqa: E501
    ],
    ids=["premerge-key-3e7", "premerge-key-1e9", "merged-k-1e8-empty", "stream-key-3e7"],
)  # fmt: skip
def test_a_tiny_hostile_body_costs_milliseconds_and_gives_no_record(
    body: bytes, stream: bool, server: LoopbackServer, otel: Otel
) -> None:
    assert len(body) < 1_000
    server.reply(body)
    client = client_for(server)
    try:
        bare = read(client, stream)
        with instrumented(otel):
            read(client, stream)  # the first call imports and builds what later ones reuse
            otel.exporter.clear()
            tracemalloc.start()
            started = time.process_time()
            seen = read(client, stream)
            cpu = time.process_time() - started
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    finally:
        client.close()
    assert seen == bare  # the user is untouched
    assert cpu < 0.25, f"{cpu:.3f} s of CPU (16.6 s before the bound)"
    assert peak < 8 << 20, f"{peak / 2**20:.1f} MiB traced (520 MB before the bound)"
    (span,) = otel.spans()
    assert span.attributes[SD_OUTCOME] == "invalid"
    assert SD_ENGINE not in span.attributes
    for value in span.attributes.values():
        assert not isinstance(value, tuple) or len(value) <= MAX_SPEC_TOKENS + 1
    outcomes = {p.attributes[SD_OUTCOME]: p.value for p in otel.points(M_REQUESTS)}
    assert outcomes == {"invalid": 2}
    assert otel.points(M_VERIFY_STEPS) == []


def line_flood_body() -> bytes:
    """A chat completion whose non-standard field spreads a list over 2,000,000 lines."""
    head = chat_body()[:-1]  # the closing brace comes after the list
    return head + b', "x": [' + b"1,\n" * 2_000_000 + b"1]}"


def blank_line_flood_stream() -> bytes:
    """A stream with 8,000,000 blank lines between its last chunk and its end."""
    chunks, done = stream_with({}).split(b"data: [DONE]")
    return chunks + b"\n" * 8_000_000 + b"data: [DONE]" + done


def cut_string_flood_stream() -> bytes:
    """An SSE event whose JSON string holds 2,000,000 line ends: ``iter_lines()`` hands
    it over as that many lines, each of which continues the cut string."""
    event = b'data: {"x": "' + b"ab\n" * 2_000_000 + b'"}\n\n'
    return stream_with({}).replace(b"data: [DONE]", event + b"data: [DONE]")


def read_raw(client: openai.OpenAI, how: str, stream: bool) -> int:
    """Read a call's body raw, as ``how`` says; what the user got (lines or bytes)."""
    kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": stream}
    with client.chat.completions.with_streaming_response.create(**kwargs) as response:
        if how == "read":
            return len(response.read())
        if how == "iter_bytes":
            return sum(len(piece) for piece in response.iter_bytes())
        return sum(1 for _ in response.iter_lines())


@pytest.mark.parametrize(
    ("body", "stream", "how"),
    [
        (line_flood_body(), False, "iter_lines"),
        (blank_line_flood_stream(), True, "read"),
        (cut_string_flood_stream(), True, "iter_lines"),
    ],
    ids=["json-body-of-short-lines", "blank-line-flood", "cut-string-of-short-lines"],
)
def test_a_body_read_raw_as_a_flood_of_lines_costs_under_ten_times_its_size(
    body: bytes, stream: bool, how: str, server: LoopbackServer, otel: Otel
) -> None:
    """SECURITY.md's memory bound (extra memory under 10x the body) for bodies read raw,
    which we split and decode where the user reads bytes or lines. Each line of these
    bodies cost a Python object of its own, 50 bytes or more, where it carries two or
    three characters: a JSON body read by ``iter_lines()`` kept each line apart, a stream
    read whole split into a list of one entry per blank line, and a JSON string cut by
    ``iter_lines()`` kept each piece apart (17 to 25 times the body, found by a probe of
    hostile servers)."""
    server.reply(body)
    client = client_for(server)

    def peak_of_read() -> tuple[int, int]:
        tracemalloc.start()
        seen = read_raw(client, how, stream)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return seen, peak

    try:
        bare, bare_peak = peak_of_read()
        with instrumented(otel), internal_errors() as reported:
            seen, peak = peak_of_read()
    finally:
        client.close()
    assert seen == bare  # the user is untouched
    assert reported == []
    assert otel.counter.open == 0 and len(otel.spans()) == 1
    extra = peak - bare_peak
    assert extra < 10 * len(body), f"{extra / len(body):.1f} times the body"


def test_a_litellm_body_over_the_decode_bound_is_read_from_litellms_own_object(
    server: LoopbackServer, otel: Otel
) -> None:
    """LiteLLM (1.110.2) hands its success callback the body's JSON text
    (``original_response``), which it has already decoded once. A text over
    ``MAX_EVENT_CHARS`` is not decoded again: the record comes from LiteLLM's own
    ``ModelResponse``, which keeps vLLM's root ``metrics`` for ``hosted_vllm/``."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    import litellm

    example = json.loads((WIRE_EXAMPLES / "vllm_merged_summary_chat.json").read_text())
    body = example["response"]
    body["choices"][0]["message"]["content"] = "x" * (MAX_EVENT_CHARS + 1)
    text = json.dumps(body)
    assert logged_body(text) is None
    assert logged_body(text.replace("x" * (MAX_EVENT_CHARS + 1), "x")) is not None
    server.reply(text.encode())
    with instrumented(otel):
        answer = litellm.completion(
            model="hosted_vllm/m", api_base=server.url, api_key=API_KEY, messages=MESSAGES
        )
        deadline = time.monotonic() + 10  # LiteLLM runs its success callbacks in a thread
        while not otel.spans() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(answer.choices[0].message.content) == MAX_EVENT_CHARS + 1
    (span,) = otel.spans()
    stats = body["metrics"]["speculative_decoding"]
    assert span.attributes[SD_ENGINE] == "vllm"
    assert span.attributes[SD_NUM_SPEC_STEPS] == stats["num_spec_steps"]
    assert span.attributes[SD_OUTCOME] == "recorded"


# --------------------------------------------------------------------------- 2. privacy


def test_traceparent_injection_carries_no_baggage_and_the_users_headers_win(
    server: LoopbackServer, otel: Otel
) -> None:
    server.reply(chat_body())
    secret = baggage.set_baggage("user.email", "alice@example.com")
    # The global propagator is the default (trace context + baggage): it WOULD send it.
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=secret)
    assert "alice%40example.com" in carrier.get("baggage", "")

    client = client_for(server)
    token = context.attach(secret)
    try:
        handler = otel.tracer_provider.get_tracer("app").start_as_current_span("handler")
        with instrumented(otel, inject_traceparent=True), handler:
            client.chat.completions.create(model="m", messages=MESSAGES)
            client.chat.completions.create(
                model="m", messages=MESSAGES, extra_headers={"baggage": "mine=1"}
            )
            theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            client.chat.completions.create(
                model="m", messages=MESSAGES, extra_headers={"TraceParent": theirs}
            )
    finally:
        context.detach(token)
        client.close()

    plain, own_baggage, own_traceparent = server.requests
    ours = {s.context.span_id: s for s in otel.spans()}
    _, trace_id, span_id, _ = plain.headers["traceparent"].split("-")
    assert int(span_id, 16) in ours  # the call's own span, not the caller's
    assert int(trace_id, 16) == ours[int(span_id, 16)].context.trace_id
    assert "baggage" not in plain.headers
    assert "alice" not in json.dumps(plain.header_lines)
    assert own_baggage.headers["baggage"] == "mine=1"
    assert [v for k, v in own_baggage.header_lines if k.lower() == "baggage"] == ["mine=1"]
    assert [v for k, v in own_traceparent.header_lines if k.lower() == "traceparent"] == [theirs]
    assert "baggage" not in own_traceparent.headers


# --------------------------------------------------------------------------- 4. enrich mode


def test_enrich_mode_sets_only_spec_decode_on_a_user_span(otel: Otel, simulator_url: str) -> None:
    """Two recorded calls and a failing one under one user span: the first call's figures
    stay on it, the later calls get child spans of their own, and the user's span gets
    no status, no error.type and no gen_ai.* from us."""
    client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
    headers = {"x-spec-decode-engine": "vllm"}
    try:
        with instrumented(otel, mode="enrich"):
            tracer = otel.tracer_provider.get_tracer("app")
            with tracer.start_as_current_span("agent step") as step:
                step.set_attribute("app.step", 1)
                for seed in ("1", "2"):
                    client.chat.completions.create(
                        model="spec-sim",
                        messages=MESSAGES,
                        extra_headers=headers | {"x-sim-seed": seed},
                    )
                with pytest.raises(openai.InternalServerError):
                    client.chat.completions.create(
                        model="spec-sim",
                        messages=MESSAGES,
                        extra_headers=headers | {"x-sim-fault": "http-500"},
                    )
    finally:
        client.close()
    spans = otel.spans(scope=None)
    (user,) = [s for s in spans if s.name == "agent step"]
    children = [s for s in spans if s is not user]
    assert user.status.status_code is StatusCode.UNSET
    assert {k for k in user.attributes if not k.startswith("spec_decode.")} == {"app.step"}
    assert len(children) == 2
    assert all(c.parent is not None and c.parent.span_id == user.context.span_id for c in children)
    assert all(c.instrumentation_scope.name == SCOPE_NAME for c in children)
    recorded, failed = sorted(children, key=lambda s: ERROR_TYPE in s.attributes)
    # Each recorded call's own figures, on its own span (seeds 1 and 2 differ).
    assert recorded.attributes[SD_ENGINE] == user.attributes[SD_ENGINE] == "vllm"
    assert recorded.attributes[SD_NUM_SPEC_STEPS] != user.attributes[SD_NUM_SPEC_STEPS]
    assert failed.attributes[ERROR_TYPE] == "InternalServerError"
    assert failed.status.status_code is StatusCode.ERROR


# --------------------------------------------------------------------------- logging


LOGGING_APP = """
import logging, os, sys
import openai
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from spec_decode_otel import SpecDecodeInstrumentor

if os.environ["CONFIGURE_LOGGING"] == "1":
    logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")

class Broken(SpanProcessor):
    # An exporter pipeline that fails: our span cannot start, so the call runs untraced.
    def on_start(self, span, parent_context=None):
        if span.instrumentation_scope.name == "spec_decode_otel" and span.name.endswith("broken"):
            raise RuntimeError("processor failure")

provider = TracerProvider()
provider.add_span_processor(Broken())
SpecDecodeInstrumentor().instrument(tracer_provider=provider, meter_provider=MeterProvider())
client = openai.OpenAI(base_url=os.environ["URL"], api_key="sk-test", max_retries=0)
for model in ("ok", "ok", "broken", "broken", "broken"):
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
client.close()
"""


def run_logging_app(url: str, configure: bool) -> str:
    env = clean_env(URL=url, CONFIGURE_LOGGING="1" if configure else "0")
    done = subprocess.run(
        [sys.executable, "-c", LOGGING_APP], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_library_is_silent_unless_logging_is_configured(server: LoopbackServer) -> None:
    """An invalid payload (a WARNING hint) and three internal errors (our span cannot
    start): nothing on stderr by default; with logging configured, the hint and the first
    internal error at WARNING, the later ones at DEBUG only."""
    server.reply(premerge(30_000_000))
    assert run_logging_app(server.url, configure=False) == ""

    lines = run_logging_app(server.url, configure=True).splitlines()
    ours = [line for line in lines if line.split(" ", 2)[1:2] == ["spec_decode_otel:"]]
    warned = [line for line in ours if line.startswith("WARNING")]
    assert len(warned) == 2, ours
    assert "rejected as invalid" in warned[0]
    assert "internal error in start" in warned[1]
    assert "later internal errors are logged at DEBUG" in warned[1]
    assert any(line.startswith("DEBUG") and "internal error in start" in line for line in ours)


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("body", "stream", "logged"),
    [
        (b"<html>a gateway's error page</html>", False, "body read raw is not JSON"),
        (DEEP, False, "body read raw is not JSON"),
        (b"data: " + DEEP + b"\n\ndata: [DONE]\n\n", True, "SSE event read raw is not JSON"),
    ],
    ids=["body-not-json", "body-too-deep", "stream-event-too-deep"],
)
def test_a_raw_body_or_event_that_is_not_json_gets_a_debug_log_and_no_record(
    body: bytes,
    stream: bool,
    logged: str,
    server: LoopbackServer,
    otel: Otel,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``with_raw_response`` decodes its own copy of the body when the call returns, and
    ``with_streaming_response``'s raw reads decode each SSE event. A 200 body that is not
    JSON (a gateway's page), or a body or event nested too deep for ``json`` (which raises
    RecursionError, not ValueError), was reported as an internal error of ours: a WARNING
    with a traceback. Bad input from a server gets a debug log and no record, and the user
    sees what they see without instrumentation (``parse()``'s error, the server's lines)."""
    monkeypatch.setattr(responses, "rate_limited", RateLimitedLog())  # no earlier test's
    server.reply(body)
    client = client_for(server)

    def seen() -> Any:
        if stream:
            kwargs: Any = {"model": "m", "messages": MESSAGES, "stream": True}
            with client.chat.completions.with_streaming_response.create(**kwargs) as response:
                return list(response.iter_lines())
        raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
        with pytest.raises(Exception) as caught:
            raw.parse()
        return type(caught.value)

    with caplog.at_level(logging.DEBUG, logger="spec_decode_otel"):
        assert seen_alike(client, seen, otel) == []  # no internal error
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("spec_decode_otel")]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], ours
    assert [m for m in ours if logged in m], ours
    (span,) = otel.spans()
    assert span.attributes[SD_OUTCOME] == "no_stats"


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize(
    "choices",
    [5, {"index": 0}, "abc", [5], [None], ["x"]],
    ids=["int", "object", "string", "list-of-int", "list-of-null", "list-of-string"],
)
def test_choices_the_sdk_never_checked_give_no_record_and_no_internal_error(
    choices: Any, stream: bool, server: LoopbackServer, otel: Otel
) -> None:
    """The ``openai`` SDK (3.60) builds its objects from the server's JSON without
    validating it, so ``choices`` reaches us as whatever the server sent. An int or an
    object there, or a choice that is not an object, was an internal error of ours
    (TypeError, AttributeError): a WARNING with a traceback, and for a body the call's
    end was cut short, so the call was counted under no outcome at all. Now the user
    sees what they see without us, and the call is counted once, as ``no_stats``."""
    root = {"id": "c", "created": 1, "model": "m", "choices": choices}
    if stream:
        server.reply(f"data: {json.dumps(root | {'object': 'chat.completion.chunk'})}\n\n".encode())
    else:
        server.reply(json.dumps(root | {"object": "chat.completion"}).encode())
    client = client_for(server)

    def seen() -> list[Any]:
        if stream:
            chunks = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            return [chunk.choices for chunk in chunks]
        return [client.chat.completions.create(model="m", messages=MESSAGES).choices]

    assert seen_alike(client, seen, otel) == []  # no internal error
    (span,) = otel.spans()
    assert span.attributes[SD_OUTCOME] == "no_stats"
    assert {p.attributes[SD_OUTCOME]: p.value for p in otel.points(M_REQUESTS)} == {"no_stats": 1}


RESPONSE_WITH_LIST_STATUS = {"id": "r", "object": "response", "status": ["x"], "output": []}


@pytest.mark.parametrize(
    ("body", "read"),
    [
        (json.dumps(RESPONSE_WITH_LIST_STATUS).encode(), "create"),
        (
            b"".join(
                f"data: {json.dumps(event)}\n\n".encode()
                for event in (
                    {"type": [], "response": RESPONSE_WITH_LIST_STATUS},
                    {"type": "response.completed", "response": RESPONSE_WITH_LIST_STATUS},
                )
            ),
            "stream",
        ),
    ],
    ids=["body", "stream"],
)
@pytest.mark.parametrize("raw", [False, True], ids=["objects", "raw-read"])
def test_a_responses_type_or_status_that_is_a_list_gives_no_internal_error(
    body: bytes, read: str, raw: bool, server: LoopbackServer, otel: Otel
) -> None:
    """The Responses API: an event ``type`` or a response ``status`` the server sent as a
    list (unhashable) was looked up in a set or dict, a TypeError reported as an internal
    error; for a body the call's end was cut short, so it was counted under no outcome."""
    server.reply(body)
    client = client_for(server)
    stream = read == "stream"

    def seen() -> Any:
        kwargs: Any = {"model": "m", "input": "hi", "stream": stream}
        if raw:
            with client.responses.with_streaming_response.create(**kwargs) as response:
                return list(response.iter_lines()) if stream else response.read()
        result = client.responses.create(**kwargs)
        return [event.type for event in result] if stream else result.status

    assert seen_alike(client, seen, otel) == []  # no internal error
    (span,) = otel.spans()
    assert span.attributes[SD_OUTCOME] == "no_stats"
    assert {p.attributes[SD_OUTCOME]: p.value for p in otel.points(M_REQUESTS)} == {"no_stats": 1}


# --------------------------------------------------------------------------- misuse


def test_instrumenting_again_with_other_settings_warns_and_keeps_the_first(
    otel: Otel, simulator_url: str
) -> None:
    client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
    try:
        with instrumented(otel, mode="span"):
            with warnings.catch_warnings(record=True) as same:
                warnings.simplefilter("always")
                SpecDecodeInstrumentor().instrument(
                    tracer_provider=otel.tracer_provider,
                    meter_provider=otel.meter_provider,
                    mode="span",
                )
            assert [w for w in same if issubclass(w.category, RuntimeWarning)] == []
            with pytest.warns(RuntimeWarning, match="the first settings stay"):
                SpecDecodeInstrumentor().instrument(mode="enrich")
            call_in_a_handler_span(otel, client)
    finally:
        client.close()
    assert_span_mode_held(otel)


def call_in_a_handler_span(otel: Otel, client: openai.OpenAI) -> None:
    with otel.tracer_provider.get_tracer("app").start_as_current_span("handler"):
        client.chat.completions.create(model="spec-sim", messages=MESSAGES)


def assert_span_mode_held(otel: Otel) -> None:
    """``mode="span"``: our own child span recorded the call, the handler is not enriched."""
    (ours,) = otel.spans()
    assert ours.attributes[SD_ENGINE] == "vllm"
    (handler,) = [s for s in otel.spans(scope=None) if s.name == "handler"]
    assert not any(k.startswith("spec_decode.") for k in handler.attributes)


def test_instrumenting_a_client_again_with_other_settings_warns_and_keeps_the_first(
    otel: Otel, simulator_url: str
) -> None:
    """As ``instrument()`` does. A second ``instrument_client`` with other providers or
    settings was ignored without a word (found by probing client lifecycles), and one
    with a keyword that does not exist was not even checked."""
    client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
    providers = {"tracer_provider": otel.tracer_provider, "meter_provider": otel.meter_provider}
    try:
        with uninstrumented():
            instrument_client(client, mode="span", **providers)
            with warnings.catch_warnings(record=True) as same:
                warnings.simplefilter("always")
                instrument_client(client, mode="span", **providers)
                instrument_client(client)  # asks for nothing
            assert [w for w in same if issubclass(w.category, RuntimeWarning)] == []
            with pytest.warns(RuntimeWarning, match="the first settings stay") as other:
                instrument_client(client, **providers)  # mode from the environment: enrich
            assert other[0].filename == __file__  # said at the caller's line
            with pytest.raises(TypeError, match="no_such_setting"):
                instrument_client(client, no_such_setting=True)
            call_in_a_handler_span(otel, client)
    finally:
        client.close()
    assert_span_mode_held(otel)


@pytest.mark.parametrize("how", ["instrument", "instrument_client"])
def test_an_unknown_engine_in_request_engine_stats_is_a_configuration_error(how: str) -> None:
    with pytest.raises(ValueError, match="sglnag"):
        if how == "instrument":
            SpecDecodeInstrumentor().instrument(request_engine_stats=("sglnag",))
        else:
            instrument_client(openai.OpenAI(api_key=API_KEY), request_engine_stats="sglnag")
    assert not SpecDecodeInstrumentor().is_instrumented_by_opentelemetry


def test_setup_twice_warns_and_returns_the_same_providers() -> None:
    script = """
import warnings, json
import spec_decode_otel
first = spec_decode_otel.setup("one", set_global=False)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    second = spec_decode_otel.setup("two", set_global=False, mode="enrich")
print(json.dumps({
    "same": second is first,
    "warnings": [(w.category.__name__, str(w.message), w.filename) for w in caught],
    "service": second.tracer_provider.resource.attributes["service.name"],
}))
"""
    env = clean_env()
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["same"] is True
    assert report["service"] == "one"
    ((category, message, where),) = report["warnings"]
    assert category == "RuntimeWarning" and "already called" in message
    assert where == "<string>"  # the caller's line (python -c), not the library's


# --------------------------------------------------------------------------- metric attrs


def test_unknown_values_are_left_out_of_metric_attributes(
    server: LoopbackServer, otel: Otel
) -> None:
    """A server that names no model (and sends no stats): no gen_ai.response.model, no
    spec_decode.engine on any point, and no attribute anywhere is an empty string."""
    body = json.loads(chat_body())
    del body["model"]
    server.reply(json.dumps(body).encode())
    client = client_for(server)
    try:
        with instrumented(otel, genai_metrics=True):
            client.chat.completions.create(model="m", messages=MESSAGES)
    finally:
        client.close()
    data = otel.reader.get_metrics_data()
    points = [
        point
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        if sm.scope.name == SCOPE_NAME
        for metric in sm.metrics
        for point in metric.data.data_points
    ]
    assert points, "the call recorded no metric at all"
    for point in points:
        attrs = dict(point.attributes)
        assert GEN_AI_RESPONSE_MODEL not in attrs
        assert SD_ENGINE not in attrs
        assert "" not in attrs.values(), attrs
    (requests,) = otel.points(M_REQUESTS)
    assert dict(requests.attributes)[SD_OUTCOME] == "no_stats"
    assert dict(requests.attributes)["gen_ai.request.model"] == "m"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_server_sent_name_too_long_to_be_one_is_left_out(
    stream: bool, server: LoopbackServer, otel: Otel
) -> None:
    """A server's ``model`` and ``finish_reason`` go on the span and (the model) into a
    metric series: a megabyte-long one would ride on every span and stay in the meter
    for good. Past ``MAX_SERVER_TEXT`` characters each is left out as unknown (a cut
    name would be one the server never sent), while the call keeps its record; a name
    of exactly the limit is kept."""
    stats = {
        "acceptance_histogram": {"0": 1, "2": 1},
        "num_spec_steps": 2,
        "num_accepted_draft_tokens": 2,
        "num_draft_tokens": 4,
    }
    too_long, longest = "m" * 1_000_000, "x" * MAX_SERVER_TEXT
    client = client_for(server)
    try:
        with instrumented(otel, genai_metrics=True):
            for model, reason in ((too_long, "r" * (MAX_SERVER_TEXT + 1)), (longest, "stop")):
                if stream:
                    body = stream_with(stats).replace(
                        b'"model": "m"', f'"model": "{model}"'.encode()
                    )
                    body = body.replace(
                        b'"finish_reason": "stop"', f'"finish_reason": "{reason}"'.encode()
                    )
                else:
                    body = chat_body(
                        {"speculative_decoding_stats": stats, "finish_reason": reason}, model=model
                    )
                server.reply(body)
                read(client, stream)
    finally:
        client.close()
    hidden, kept = otel.spans()
    assert GEN_AI_RESPONSE_MODEL not in hidden.attributes
    assert "gen_ai.response.finish_reasons" not in hidden.attributes
    assert hidden.attributes[SD_OUTCOME] == "recorded"
    assert hidden.attributes[SD_NUM_SPEC_STEPS] == 2
    assert kept.attributes[GEN_AI_RESPONSE_MODEL] == longest
    assert kept.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    models = {
        dict(point.attributes).get(GEN_AI_RESPONSE_MODEL)
        for rm in otel.reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        for point in metric.data.data_points
    }
    assert models == {None, longest}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_server_sent_name_with_a_lone_surrogate_is_left_out(
    stream: bool, server: LoopbackServer, otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON can spell a lone UTF-16 surrogate (``"\\ud800"``) and Python's decoder keeps
    it, but such a string has no UTF-8 form: the OTLP encoder of opentelemetry-exporter-
    otlp-proto-common 1.45.2 (``_internal._encode_attributes``) logs an error with its
    traceback and drops the attribute, on every span and, for ``gen_ai.response.model``
    (a metric attribute), on every metric export from then on. So a server-sent model or
    finish reason that cannot be encoded is left out as unknown, and the call keeps its
    record; the user still gets the server's strings as sent."""
    from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import (
        encode_metrics,
    )
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    stats = {
        "acceptance_histogram": {"0": 1, "2": 1},
        "num_spec_steps": 2,
        "num_accepted_draft_tokens": 2,
        "num_draft_tokens": 4,
    }
    model, reason = "m\\ud800", "\\udfffstop"  # JSON escapes, as a server would send them
    if stream:
        body = stream_with(stats).replace(b'"model": "m"', f'"model": "{model}"'.encode())
        body = body.replace(b'"finish_reason": "stop"', f'"finish_reason": "{reason}"'.encode())
    else:
        body = chat_body(
            {"speculative_decoding_stats": stats, "finish_reason": "REASON"}, model="MODEL"
        )
        body = body.replace(b'"MODEL"', f'"{model}"'.encode())
        body = body.replace(b'"REASON"', f'"{reason}"'.encode())
    client = client_for(server)
    try:
        with instrumented(otel, genai_metrics=True):
            server.reply(body)
            seen = read(client, stream)
    finally:
        client.close()
    assert (seen[0] if stream else seen)["model"] == "m\ud800"  # the user sees it as sent
    (span,) = otel.spans()
    assert GEN_AI_RESPONSE_MODEL not in span.attributes
    assert "gen_ai.response.finish_reasons" not in span.attributes
    assert span.attributes[SD_OUTCOME] == "recorded"
    with caplog.at_level(logging.DEBUG):
        encode_spans([span]).SerializeToString()
        encode_metrics(otel.reader.get_metrics_data()).SerializeToString()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records


def test_a_server_sent_response_id_is_kept_in_memory_only_when_short_and_needed(
    server: LoopbackServer, otel: Otel
) -> None:
    """While a LiteLLM call is open (the LiteLLM proxy), the wrapper keeps each stream's
    response id, with the server's ``host:port``, until the LiteLLM callback takes it, so
    the callback can tell the proxy's streams it recorded (``spec_decode_otel.
    integrations``). With no LiteLLM call open nothing is kept: an application that only
    imports LiteLLM would otherwise hold an id per stream (4,096 at most). The server
    chooses the id: one longer than ``MAX_RESPONSE_ID`` characters is never kept (4,096
    kept ids of a megabyte each would hold 4 GiB), one of exactly the limit is."""
    from spec_decode_otel.integrations import (
        MAX_RESPONSE_ID,
        set_open_litellm_calls,
        took_openai_stream,
    )

    unneeded, too_long, longest = "b" * 8, "c" * 1_000_000, "d" * MAX_RESPONSE_ID
    client = client_for(server)

    def stream_with_id(response_id: str) -> None:
        server.reply(stream_with({}).replace(b'"chatcmpl-1"', f'"{response_id}"'.encode()))
        read(client, stream=True)

    try:
        with no_litellm_call_open(), instrumented(otel):
            stream_with_id(unneeded)
            set_open_litellm_calls(1)  # as the LiteLLM callback does for a call it saw start
            try:
                stream_with_id(too_long)
                stream_with_id(longest)
            finally:
                set_open_litellm_calls(0)
    finally:
        client.close()
    where = urlsplit(server.url).netloc  # the host:port the wrapper calls
    assert not took_openai_stream(unneeded, where, 0)
    assert not took_openai_stream(too_long, where, 0)
    assert took_openai_stream(longest, where, 0)


def test_the_package_logger_has_a_null_handler() -> None:
    import logging

    handlers = logging.getLogger("spec_decode_otel").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)
