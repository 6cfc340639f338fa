"""pydantic-ai (the real ``pydantic-ai-slim[openai]`` 2.78.0) against the simulator over HTTP.

How pydantic-ai 2.78.0 calls the ``openai`` SDK (read in the installed source):

- ``pydantic_ai/models/openai/_chat_model.py``: ``OpenAIChatModel`` (the class that was
  ``OpenAIModel`` before 2.0; that name now raises) with ``OpenAIProvider(base_url=...)``
  (``pydantic_ai/providers/openai.py``; ``providers/vllm.py`` is the same client with
  vLLM model profiles) builds an ``AsyncOpenAI`` and sends every request, ``run_sync``
  included, through ``await client.chat.completions.create(...)``: no
  ``with_raw_response``, no ``with_streaming_response``. A stream always carries
  ``stream_options={"include_usage": True}`` (``_get_stream_options``), so vLLM's merged
  shape sends its stats on the usage chunk. ``ModelSettings["max_retries"]`` sends the
  request through ``client.with_options(...)`` (``models/_sdk_retries.py``), a derived
  client, which the process-wide instrumentor covers too.
- ``request_stream`` wraps the SDK stream in ``async with response:``, which closes it
  (``AsyncStream.close``) when the agent's stream context ends.
- ``pydantic_ai/agent/abstract.py`` ``run_stream``: the graph reads model events only up to
  the ``FinalResultEvent`` (``_FinalResultCut.events`` breaks there), then yields the
  ``StreamedRunResult``; the rest of the SDK stream, the usage chunk included, is read
  only by ``stream_text()`` / ``stream_output()`` / ``get_output()``
  (``pydantic_ai/result.py``, ``AgentStream.get_output``: ``async for _ in self``). Read to
  the end, pydantic-ai itself consumes the usage chunk (its ``usage`` counts the output
  tokens), so our record lands. Left early (the context exited unread, or a ``break`` out
  of ``stream_text``), the stream is closed before the usage chunk: our span says
  ``not_read_to_end`` (the caller's choice, README "Outcomes"), and pydantic-ai's own usage
  has no output tokens either.
- ``OpenAIResponsesModel`` (``_responses_model.py``) posts ``client.responses.create`` over
  HTTP (its ``openai_transport="websocket"`` setting would bypass the HTTP request path;
  not tested: the simulator speaks no WebSocket).
- Its own instrumentation: ``Agent`` no longer takes ``instrument=``; it is
  ``capabilities=[Instrumentation(settings=InstrumentationSettings(...))]``
  (``capabilities/instrumentation.py``) or the ``agent.instrument`` property. Its
  ``chat {model}`` span (``_instrumentation.py`` ``open_model_request_span``: kind CLIENT,
  ``gen_ai.operation.name = "chat"``) is current while the SDK call runs and, for streams,
  until the SDK stream is closed, so ``mode="auto"`` recognises it
  (``coexistence.is_foreign_genai_span``), writes ``spec_decode.*`` on it, makes no span of
  its own and leaves the GenAI metrics to pydantic-ai's meter (scope ``pydantic-ai``).

Every check compares with the same seeded request sent without any instrumentation
(``x-sim-seed``: the sample depends on the seed alone), and the agent's output and usage
with those of the same run before instrumenting.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import httpx
import httpx2
import openai
import pytest
from instrumentation_helpers import (
    ENGINES,
    MODEL,
    PROMPT,
    Otel,
    expected_outcome,
    expected_span_attributes,
    payload_usage,
    raw_payload,
    request_kwargs,
    spec_decode_attributes,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RunUsage

import spec_decode_otel
from reliability.reliability_helpers import SpanCounter
from spec_decode_otel.payloads import parse_payloads
from spec_decode_otel.record import SpecDecodeAcceptanceRecord
from spec_decode_otel.telemetry import SCOPE_NAME

#: How a user drives an agent; every one ends with the whole answer read.
PATTERNS = ("run", "run_sync", "run_stream_text", "run_stream_get_output", "run_stream_sync")
STREAMED = frozenset({"run_stream_text", "run_stream_get_output", "run_stream_sync"})
T = TypeVar("T")
GENAI_METRICS = (
    "gen_ai.client.operation.duration",
    "gen_ai.client.token.usage",
    "gen_ai.client.operation.time_to_first_chunk",
)


def seed_for(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode()) % 100_000 + 1


@dataclass
class Answer:
    """What the user's code sees of one run."""

    output: str
    texts: list[str]
    input_tokens: int
    output_tokens: int
    requests: int

    @classmethod
    def of(cls, output: str, texts: list[str], usage: RunUsage) -> Answer:
        return cls(output, texts, usage.input_tokens, usage.output_tokens, usage.requests)


def settings_for(engine: str, seed: int, **extra: Any) -> ModelSettings:
    """The model settings that send the same headers and body fields as ``request_kwargs``."""
    kwargs = request_kwargs(engine, "chat", False, seed)
    settings: dict[str, Any] = {"extra_headers": kwargs["extra_headers"], **extra}
    if "extra_body" in kwargs:
        settings["extra_body"] = kwargs["extra_body"]
    return cast(ModelSettings, settings)


class Harness:
    """Agents on HTTP clients this test owns, all driven on one event loop.

    ``run_sync`` runs on the thread's current event loop (``pydantic_ai._utils.
    get_event_loop``), so the async patterns run on that same loop, and the clients are
    closed on it afterwards: a pooled connection left on a closed loop would leak its
    socket.
    """

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.http_clients: list[httpx2.AsyncClient] = []

    def provider(self) -> OpenAIProvider:
        http_client = httpx2.AsyncClient()
        self.http_clients.append(http_client)
        return OpenAIProvider(base_url=self.base_url, api_key="sk-t", http_client=http_client)

    def chat_agent(self, **agent_kwargs: Any) -> Agent[None, str]:
        return Agent(OpenAIChatModel(MODEL, provider=self.provider()), **agent_kwargs)

    def responses_agent(self) -> Agent[None, str]:
        return Agent(OpenAIResponsesModel(MODEL, provider=self.provider()))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def drive(self, agent: Agent[None, str], pattern: str, settings: ModelSettings) -> Answer:
        """Run ``agent`` as ``pattern``, to the end of its answer."""
        if pattern == "run_sync":
            result = agent.run_sync(PROMPT, model_settings=settings)
            return Answer.of(result.output, [], result.usage)
        if pattern == "run_stream_sync":
            stream = agent.run_stream_sync(PROMPT, model_settings=settings)
            texts = list(stream.stream_text(delta=True, debounce_by=None))
            return Answer.of(stream.get_output(), texts, stream.usage)
        return self.run(drive_async(agent, pattern, settings))

    def close(self) -> None:
        for client in self.http_clients:
            self.run(client.aclose())
        self.loop.close()
        asyncio.set_event_loop(None)


@pytest.fixture
def harness(simulator_url: str) -> Iterator[Harness]:
    h = Harness(simulator_url)
    try:
        yield h
    finally:
        h.close()


async def drive_async(agent: Agent[None, str], pattern: str, settings: ModelSettings) -> Answer:
    if pattern == "run":
        result = await agent.run(PROMPT, model_settings=settings)
        return Answer.of(result.output, [], result.usage)
    async with agent.run_stream(PROMPT, model_settings=settings) as stream:
        texts: list[str] = []
        if pattern == "run_stream_text":
            texts = [t async for t in stream.stream_text(delta=True, debounce_by=None)]
        output = await stream.get_output()
        return Answer.of(output, texts, stream.usage)


def chat_payload(base_url: str, engine: str, seed: int, stream: bool) -> Any:
    """The server's answer to the request pydantic-ai sends, fetched with plain httpx."""
    extra = {"stream_options": {"include_usage": True}} if stream else {}
    return raw_payload(base_url, "chat", request_kwargs(engine, "chat", stream, seed, **extra))


def responses_payload(base_url: str, engine: str, seed: int, stream: bool) -> Any:
    headers = {"x-spec-decode-engine": engine, "x-sim-seed": str(seed)}
    body = {"model": MODEL, "input": PROMPT, "stream": stream}
    response = httpx.post(base_url + "/responses", json=body, headers=headers, timeout=30)
    response.raise_for_status()
    return parse_payloads(response.text) if stream else response.json()


def scope_of(span: ReadableSpan) -> str | None:
    scope = span.instrumentation_scope
    return None if scope is None else scope.name


def check_record(span: Any, record: SpecDecodeAcceptanceRecord | None) -> None:
    attrs = dict(span.attributes)
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    assert span.name == f"chat {MODEL}"
    assert spec_decode_attributes(attrs) == (
        {} if record is None else expected_span_attributes(record)
    )
    assert attrs["spec_decode.outcome"] == expected_outcome(record)
    assert "spec_decode.read_to_end" not in attrs


# -- every call pattern, every engine shape ----------------------------------------------


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("engine", ENGINES)
def test_each_model_request_of_a_chat_agent_gets_one_span_with_its_response_record(
    engine: str,
    pattern: str,
    otel: Otel,
    span_counter: SpanCounter,
    harness: Harness,
    no_internal_errors: None,
) -> None:
    """``OpenAIChatModel`` + ``OpenAIProvider(base_url=...)``, driven as users do: one span
    of ours per model request, carrying the record of the body the server sent, and the
    agent's output and usage exactly as without instrumentation. For streams, pydantic-ai's
    usage equal to the payload's shows it read the usage chunk (vLLM's stats) itself."""
    seed = seed_for(engine, pattern)
    settings = settings_for(engine, seed)
    bare = harness.drive(harness.chat_agent(), pattern, settings)
    assert otel.spans() == []

    otel.instrument()
    answer = harness.drive(harness.chat_agent(), pattern, settings)
    assert answer == bare
    assert answer.requests == 1
    if pattern in ("run_stream_text", "run_stream_sync"):
        assert "".join(answer.texts) == answer.output

    payload = chat_payload(harness.base_url, engine, seed, pattern in STREAMED)
    usage = payload_usage(payload)
    assert usage is not None
    assert (answer.input_tokens, answer.output_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    record = spec_decode_otel.record_from_json(payload)
    assert (record is None) == (engine == "none")
    (span,) = otel.spans()
    assert scope_of(span) == SCOPE_NAME
    check_record(span, record)
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {expected_outcome(record): 1}


def test_a_run_that_retries_gets_one_span_per_model_request(
    otel: Otel, span_counter: SpanCounter, harness: Harness, no_internal_errors: None
) -> None:
    """An output validator's ``ModelRetry`` makes the run ask the model twice: two spans,
    each with the record of its own answer (the same seed, so the same record)."""
    seed = seed_for("retry")
    otel.instrument()
    agent = harness.chat_agent()
    asked: list[str] = []

    @agent.output_validator
    def once_more(output: str) -> str:
        asked.append(output)
        if len(asked) == 1:
            raise ModelRetry("once more")
        return output

    result = agent.run_sync(PROMPT, model_settings=settings_for("vllm", seed))
    assert result.usage.requests == 2
    record = spec_decode_otel.record_from_json(chat_payload(harness.base_url, "vllm", seed, False))
    assert record is not None
    spans = otel.spans()
    assert len(spans) == 2
    for span in spans:
        check_record(span, record)
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {"recorded": 2}


def test_max_retries_setting_goes_through_a_derived_client_that_is_still_covered(
    otel: Otel, harness: Harness, no_internal_errors: None
) -> None:
    """``ModelSettings["max_retries"]`` sends the call through ``client.with_options()``
    (``models/_sdk_retries.py``): a new client object, covered because the instrumentor
    wraps the request path of every client in the process."""
    seed = seed_for("max_retries")
    otel.instrument()
    settings = settings_for("vllm", seed, max_retries=1)
    harness.drive(harness.chat_agent(), "run", settings)
    record = spec_decode_otel.record_from_json(chat_payload(harness.base_url, "vllm", seed, False))
    (span,) = otel.spans()
    check_record(span, record)


def test_max_retries_derived_client_of_an_instrument_client_is_covered(
    otel: Otel, harness: Harness, no_internal_errors: None
) -> None:
    """The same derived client when only the client handed to pydantic-ai is instrumented
    (``instrument_client``, no process-wide instrumentor): the copy ``with_options()``
    makes is covered with the chosen client's providers, one span, the engine's record."""
    seed = seed_for("max_retries_instrument_client")
    http_client = httpx2.AsyncClient()
    harness.http_clients.append(http_client)
    client = openai.AsyncOpenAI(base_url=harness.base_url, api_key="sk-t", http_client=http_client)
    spec_decode_otel.instrument_client(
        client, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
    )
    agent = Agent(OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client)))
    harness.drive(agent, "run", settings_for("vllm", seed, max_retries=1))
    record = spec_decode_otel.record_from_json(chat_payload(harness.base_url, "vllm", seed, False))
    (span,) = otel.spans()
    check_record(span, record)


# -- run_stream left before the end -------------------------------------------------------


async def leave_run_stream(
    agent: Agent[None, str], leave: str, settings: ModelSettings
) -> RunUsage:
    """Enter ``run_stream`` and leave it ``unread`` or after one text delta (``break``)."""
    async with agent.run_stream(PROMPT, model_settings=settings) as stream:
        if leave == "break":
            async for _ in stream.stream_text(delta=True, debounce_by=None):
                break
        return stream.usage


@pytest.mark.parametrize("leave", ["unread", "break"])
def test_run_stream_left_before_the_end_is_not_read_to_end(
    leave: str, otel: Otel, span_counter: SpanCounter, harness: Harness, no_internal_errors: None
) -> None:
    """``run_stream`` hands over the result at the ``FinalResultEvent`` (the first text
    delta); pydantic-ai reads the rest only when asked. Leaving the context without reading
    (``unread``) or after one delta (``break``) closes the SDK stream before vLLM's usage
    chunk: our span says ``not_read_to_end`` with no record (never an error), and
    pydantic-ai's own usage shows it never got the usage chunk either."""
    seed = seed_for("leave", leave)
    otel.instrument()
    usage = harness.run(leave_run_stream(harness.chat_agent(), leave, settings_for("vllm", seed)))
    assert usage.output_tokens == 0
    (span,) = otel.spans()
    attrs = dict(span.attributes or {})
    assert span.status.status_code is StatusCode.UNSET
    assert attrs["spec_decode.outcome"] == "not_read_to_end"
    assert attrs["spec_decode.read_to_end"] is False
    assert spec_decode_attributes(attrs) == {}
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {"not_read_to_end": 1}


# -- the Responses model ------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["run", "run_stream_get_output"])
@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_the_responses_model_gets_one_span_with_its_response_record(
    engine: str,
    pattern: str,
    otel: Otel,
    span_counter: SpanCounter,
    harness: Harness,
    no_internal_errors: None,
) -> None:
    """``OpenAIResponsesModel`` posts ``/responses``: llama.cpp's ``timings`` on the
    ``response.completed`` event give a streamed run its (partial) record; vLLM's
    Responses ``metrics`` and a non-streamed llama.cpp answer carry none (README, "The
    Responses API"), so those runs get ``no_stats``. Output unchanged either way."""
    seed = seed_for("responses", engine, pattern)
    settings = ModelSettings(
        extra_headers={"x-spec-decode-engine": engine, "x-sim-seed": str(seed)}
    )
    bare = harness.drive(harness.responses_agent(), pattern, settings)
    otel.instrument()
    answer = harness.drive(harness.responses_agent(), pattern, settings)
    assert answer == bare

    payload = responses_payload(harness.base_url, engine, seed, pattern in STREAMED)
    record = spec_decode_otel.record_from_json(payload)
    assert (record is not None) == (engine == "llamacpp" and pattern in STREAMED)
    (span,) = otel.spans()
    assert scope_of(span) == SCOPE_NAME
    check_record(span, record)
    assert span_counter.open == 0


# -- with pydantic-ai's own instrumentation ------------------------------------------------


def instrumented_agent(harness: Harness, otel: Otel, how: str) -> Agent[None, str]:
    settings = InstrumentationSettings(
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
        include_content=False,
    )
    if how == "capability":
        return harness.chat_agent(capabilities=[Instrumentation(settings=settings)])
    agent = harness.chat_agent()
    agent.instrument = settings
    return agent


@pytest.mark.parametrize("pattern", ["run", "run_stream_text"])
@pytest.mark.parametrize("how", ["capability", "agent.instrument"])
def test_with_pydantic_ai_instrumentation_the_record_lands_on_its_chat_span(
    how: str,
    pattern: str,
    otel: Otel,
    span_counter: SpanCounter,
    harness: Harness,
    no_internal_errors: None,
) -> None:
    """Both on the same TracerProvider and MeterProvider, ours with ``genai_metrics=True``:
    pydantic-ai's ``chat spec-sim`` CLIENT span is current during the SDK call, so auto mode
    writes the record on it and makes no span; the GenAI metrics come from pydantic-ai alone
    (one token-usage point per token type, none from us); ``spec_decode.*`` metrics once."""
    seed = seed_for("coexist", how, pattern)
    settings = settings_for("vllm", seed)
    bare = harness.drive(harness.chat_agent(), pattern, settings)
    otel.instrument(genai_metrics=True)
    answer = harness.drive(instrumented_agent(harness, otel, how), pattern, settings)
    assert answer == bare

    record = spec_decode_otel.record_from_json(
        chat_payload(harness.base_url, "vllm", seed, pattern in STREAMED)
    )
    assert record is not None
    assert otel.our_spans() == []
    chat = [s for s in otel.spans() if s.name == f"chat {MODEL}"]
    assert len(chat) == 1
    assert scope_of(chat[0]) == "pydantic-ai"
    check_record(chat[0], record)
    others = [s for s in otel.spans() if s is not chat[0]]
    assert [s.name for s in others] == ["invoke_agent agent"]
    assert spec_decode_attributes(others[0].attributes or {}) == {}
    assert span_counter.open == 0

    metrics = otel.metrics()
    for name in GENAI_METRICS:
        assert otel.points(metrics, name) == [], name
    token_points = otel.points(metrics, "gen_ai.client.token.usage", scope="pydantic-ai")
    assert sorted((p.attributes["gen_ai.token.type"], p.count) for p in token_points) == [
        ("input", 1),
        ("output", 1),
    ]
    assert otel.requests_by_outcome() == {"recorded": 1}
