"""The OpenAI Agents SDK (the real ``openai-agents`` 0.24.0, ``import agents``) on the
simulator, with ``SpecDecodeInstrumentor`` bound to the real OTel SDK.

Users point agents at vLLM and the like with
``OpenAIChatCompletionsModel(model=..., openai_client=AsyncOpenAI(base_url=...))`` or
``OpenAIResponsesModel``; the SDK then calls that client, so the instrumentation covers it
with no help from the Agents SDK. How it calls (openai-agents 0.24.0):

- ``agents/models/openai_chatcompletions.py`` (``_fetch_response``): plain
  ``chat.completions.create(**create_kwargs)``, streamed or not; no ``with_raw_response``.
  ``stream_options`` comes from ``chatcmpl_helpers.py``
  (``ChatCmplHelpers.get_stream_options_param``): ``include_usage`` is sent only when
  ``ModelSettings.include_usage`` is set or the client's base URL is
  ``https://api.openai.com`` (``openai_client_utils.is_official_openai_client``). So a
  streamed agent on vLLM asks for no usage chunk, where vLLM puts its stats: the call is
  ``no_stats`` unless the user sets ``ModelSettings(include_usage=True)`` or instruments
  with ``inject_include_usage=True`` (pinned below).
- ``agents/models/openai_responses.py`` (``_fetch_response``): ``responses.create(...)``
  when not streamed; streamed, ``responses.with_streaming_response.create(...)`` then
  ``await api_response.parse()``, the event stream wrapped in
  ``_ResponseStreamWithRequestId`` and closed by the model's ``stream_response``.
- ``agents/result.py`` (``RunResultStreaming``): ``Runner.run_streamed`` runs the model
  call in a background task (``run_loop_task``) that feeds a queue; ``stream_events()``
  reads the queue. Breaking out of ``stream_events()`` does not stop that task (the
  generator's ``finally`` even awaits it), while ``cancel()`` (mode ``immediate``)
  cancels it mid-stream.

Every model call must end with exactly one span of ours whose ``spec_decode.*`` equal
``record_from_json`` of the same request (captured off the wire with an event hook on the
client's ``httpx2`` client, then sent again with plain ``httpx``, which nothing
instruments; ``x-sim-seed`` makes the answer depend on the seed alone), no span left
open, no internal error logged, and the agent's output, usage and requests the same as
without the instrumentation; also with a guardrail agent's call in flight beside the
main one. openai-agents 0.24.0 requires openai>=3 (and Python>=3.10).

The Agents SDK's own tracing (which would export to OpenAI's trace ingest) is turned off
process-wide with ``agents.set_tracing_disabled(True)``: it is not OpenTelemetry and is
not what is tested here. Agents are text-only (no tools, no handoffs).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import agents
import httpx
import httpx2
import openai
import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    TResponseInputItem,
    input_guardrail,
)
from instrumentation_helpers import (
    MODEL,
    Otel,
    expected_outcome,
    expected_span_attributes,
    spec_decode_attributes,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from reliability.reliability_helpers import SpanCounter
from spec_decode_otel import record_from_json
from spec_decode_otel.payloads import parse_payloads
from spec_decode_otel.record import SpecDecodeAcceptanceRecord

agents.set_tracing_disabled(True)

INSTRUCTIONS = "Answer in three words."
TURNS = ("Describe a zebra-unicorn.", "Now describe a draft model.")
MODEL_CLASSES = {"chat": OpenAIChatCompletionsModel, "responses": OpenAIResponsesModel}
#: ``spec_decode.engine`` of each simulator shape used here
ENGINE_NAME = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm", "llamacpp": "llamacpp"}
#: (api, engine): every stats placement of chat, and both Responses shapes
CASES = [
    ("chat", "vllm"),
    ("chat", "sglang"),
    ("chat", "trtllm"),
    ("chat", "llamacpp"),
    ("responses", "vllm"),
    ("responses", "llamacpp"),
]
#: Calls whose server answer carries no spec-decode stats, so ``no_stats`` is right:
#: a vLLM chat stream without the usage chunk (the Agents SDK does not ask for it), every
#: non-streamed Responses answer and vLLM's streamed one (vLLM 0.33/0.34 and llama.cpp
#: b11312, as ``test_responses_api.py`` pins).
NO_STATS = {
    ("chat", "vllm", True),
    ("responses", "vllm", False),
    ("responses", "vllm", True),
    ("responses", "llamacpp", False),
}


@dataclass
class Wire:
    """Every request a client sent: (url, headers, body bytes), seen by an event hook of
    the client's ``httpx2`` transport (openai 3's)."""

    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)

    async def hook(self, request: httpx2.Request) -> None:
        self.requests.append((str(request.url), dict(request.headers), request.read()))

    def bodies(self) -> list[Any]:
        """The request bodies, without ids (the Responses history carries the ids of the
        earlier answers' items, new on every answer)."""

        def without_ids(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: without_ids(v) for k, v in value.items() if k != "id"}
            if isinstance(value, list):
                return [without_ids(v) for v in value]
            return value

        return [without_ids(json.loads(body)) for *_, body in self.requests]

    def replay(self, index: int) -> Any:
        """Request ``index`` sent again without any instrumentation: the decoded body,
        or the list of stream events."""
        url, headers, body = self.requests[index]
        keep = {k: v for k, v in headers.items() if k.startswith("x-") or k == "content-type"}
        response = httpx.post(url, content=body, headers=keep, timeout=30)
        response.raise_for_status()
        return parse_payloads(response.text) if json.loads(body).get("stream") else response.json()


@dataclass
class Agents:
    """An Agents SDK model on its own ``AsyncOpenAI`` client, whose wire is recorded."""

    api: str
    simulator_url: str
    wire: Wire = field(default_factory=Wire)
    client: openai.AsyncOpenAI = field(init=False)

    def __post_init__(self) -> None:
        self.client = openai.AsyncOpenAI(
            api_key="sk-test",
            base_url=self.simulator_url,
            max_retries=0,
            # the client the SDK makes when given none, plus the hook
            http_client=openai.DefaultAsyncHttpxClient(event_hooks={"request": [self.wire.hook]}),
        )

    def agent(self, engine: str, seed: int, **settings: Any) -> Agent[Any]:
        headers = {"x-spec-decode-engine": engine, "x-sim-seed": str(seed)}
        headers.update(settings.pop("extra_headers", {}))
        extra_body = {"return_spec_tokens_details": True} if engine == "sglang" else None
        return Agent(
            name="assistant",
            instructions=INSTRUCTIONS,
            model=MODEL_CLASSES[self.api](model=MODEL, openai_client=self.client),
            model_settings=ModelSettings(extra_headers=headers, extra_body=extra_body, **settings),
        )


async def run(agent: Agent[Any], given: list[TResponseInputItem] | str, streamed: bool) -> Any:
    """One ``Runner`` run; streamed runs are read through ``stream_events()`` to the end."""
    result: Any
    if streamed:
        result = Runner.run_streamed(agent, given)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, given)
    return result


async def conversation(
    agents_: Agents, engine: str, seed: int, streamed: bool, **settings: Any
) -> list[tuple[Any, Any]]:
    """Two turns, the second given the first's history; each turn's (output, usage)."""
    seen: list[tuple[Any, Any]] = []
    history: list[TResponseInputItem] = []
    for turn, text in enumerate(TURNS):
        given: list[TResponseInputItem] = [*history, {"role": "user", "content": text}]
        result = await run(agents_.agent(engine, seed + turn, **settings), given, streamed)
        usage = result.context_wrapper.usage
        counts = (usage.requests, usage.input_tokens, usage.output_tokens)
        seen.append((result.final_output, counts))
        history = result.to_input_list()
    return seen


def check_span(span: ReadableSpan, record: SpecDecodeAcceptanceRecord | None) -> None:
    attrs = dict(span.attributes or {})
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    assert attrs["gen_ai.request.model"] == MODEL
    assert attrs["spec_decode.outcome"] == expected_outcome(record)
    assert "spec_decode.read_to_end" not in attrs
    assert spec_decode_attributes(attrs) == (
        {} if record is None else expected_span_attributes(record)
    )


# -- every model class, every run mode ------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize(("api", "engine"), CASES)
async def test_each_agent_model_call_has_one_span_with_the_record_of_its_response(
    api: str,
    engine: str,
    streamed: bool,
    otel: Otel,
    span_counter: SpanCounter,
    simulator_url: str,
    no_internal_errors: None,
) -> None:
    """A two-turn conversation, once bare and once instrumented: each model call (one per
    turn: text-only agents) gets one span of ours with the record of the server's answer
    to exactly the request the Agents SDK sent, and the agent answers the same."""
    seed = 7100 + CASES.index((api, engine)) * 10 + streamed * 5
    bare = Agents(api, simulator_url)
    try:
        expected = await conversation(bare, engine, seed, streamed)
    finally:
        await bare.client.close()

    otel.instrument()
    seen = Agents(api, simulator_url)
    try:
        outputs = await conversation(seen, engine, seed, streamed)
    finally:
        await seen.client.close()
    assert outputs == expected
    assert all(isinstance(output, str) and output for output, _ in outputs)
    # and the server was asked the same (nothing injected by default)
    assert seen.wire.bodies() == bare.wire.bodies()

    assert span_counter.open == 0
    spans = otel.our_spans()
    assert len(spans) == len(seen.wire.requests) == len(TURNS)
    outcomes: list[str] = []
    for index, span in enumerate(spans):
        record = record_from_json(seen.wire.replay(index))
        assert (record is None) == ((api, engine, streamed) in NO_STATS)
        if record is not None:
            assert record.engine == ENGINE_NAME[engine]
        check_span(span, record)
        assert span.name == f"chat {MODEL}"
        outcomes.append(expected_outcome(record))
    requests = otel.points(otel.metrics(), "spec_decode.requests")
    assert sorted((p.attributes["spec_decode.outcome"], p.value) for p in requests) == sorted(
        (outcome, outcomes.count(outcome)) for outcome in set(outcomes)
    )


@pytest.mark.parametrize("ask", ["model_settings", "inject_include_usage"])
async def test_agent_streams_on_vllm_get_the_record_once_the_usage_chunk_is_asked_for(
    ask: str,
    otel: Otel,
    span_counter: SpanCounter,
    simulator_url: str,
    no_internal_errors: None,
) -> None:
    """vLLM sends streaming stats on the usage chunk, which the Agents SDK asks only
    api.openai.com for. ``ModelSettings(include_usage=True)`` asks for it (the agent then
    also gets the usage); ``inject_include_usage=True`` asks for it and hides the chunk,
    so the agent sees what it sees bare (no usage) and the span has the record."""
    settings = {"include_usage": True} if ask == "model_settings" else {}
    bare = Agents("chat", simulator_url)
    try:
        expected = await conversation(bare, "vllm", 7300, True, **settings)
    finally:
        await bare.client.close()

    otel.instrument(inject_include_usage=ask == "inject_include_usage")
    seen = Agents("chat", simulator_url)
    try:
        outputs = await conversation(seen, "vllm", 7300, True, **settings)
    finally:
        await seen.client.close()
    assert outputs == expected
    has_usage = ask == "model_settings"
    assert all((usage[2] > 0) == has_usage for _, usage in outputs)

    assert span_counter.open == 0
    spans = otel.our_spans()
    assert len(spans) == len(seen.wire.requests) == len(TURNS)
    for index, span in enumerate(spans):
        assert json.loads(seen.wire.requests[index][2])["stream_options"] == {"include_usage": True}
        record = record_from_json(seen.wire.replay(index))
        assert record is not None and record.engine == "vllm"
        check_span(span, record)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize(("api", "engine"), [("chat", "sglang"), ("responses", "llamacpp")])
async def test_a_guardrail_agent_running_beside_the_model_call_gets_its_own_span(
    api: str,
    engine: str,
    streamed: bool,
    otel: Otel,
    span_counter: SpanCounter,
    simulator_url: str,
    no_internal_errors: None,
) -> None:
    """An input guardrail that runs an agent of its own runs beside the main model call
    (``run_in_parallel=True``, the default): two calls on one client at once, each with
    one span of ours carrying its own answer's record, both children of the span the user
    had open around the run (the run's tasks copy the caller's context)."""
    seen = Agents(api, simulator_url)
    slow = {"x-sim-fault": "slow", "x-sim-delay-ms": "10"}  # so the two calls overlap
    guard = seen.agent(engine, 7601, extra_headers=slow)

    @input_guardrail
    async def checked(ctx: Any, agent: Any, given: Any) -> GuardrailFunctionOutput:
        verdict = await Runner.run(guard, given, context=ctx.context)
        return GuardrailFunctionOutput(output_info=verdict.final_output, tripwire_triggered=False)

    main = seen.agent(engine, 7600, extra_headers=slow).clone(input_guardrails=[checked])
    otel.instrument()
    try:
        with otel.tracer.start_as_current_span("user turn") as user_span:
            result = await run(main, TURNS[0], streamed)
    finally:
        await seen.client.close()
    assert isinstance(result.final_output, str) and result.final_output
    assert result.input_guardrail_results[0].output.output_info  # the guard agent answered

    assert span_counter.open == 0
    spans = otel.our_spans()
    assert len(spans) == len(seen.wire.requests) == 2
    first, second = sorted(spans, key=lambda span: span.start_time or 0)
    assert (second.start_time or 0) < (first.end_time or 0)  # in flight together
    user = user_span.get_span_context()
    assert all(span.parent is not None and span.parent.span_id == user.span_id for span in spans)

    def key(attributes: Any) -> str:
        """A span's outcome and record, comparable whatever order the calls ended in."""
        record_part = spec_decode_attributes(attributes)
        return json.dumps([attributes["spec_decode.outcome"], record_part], sort_keys=True)

    expected = []
    for index, (_, _, body) in enumerate(seen.wire.requests):
        record = record_from_json(seen.wire.replay(index))
        # the guard's own run is never streamed: Runner.run inside the guardrail
        call_streamed = bool(json.loads(body).get("stream"))
        assert (record is None) == ((api, engine, call_streamed) in NO_STATS)
        attributes = {} if record is None else expected_span_attributes(record)
        expected.append(key({**attributes, "spec_decode.outcome": expected_outcome(record)}))
    got = [key(dict(span.attributes or {})) for span in spans]
    assert sorted(got) == sorted(expected)


# -- a consumer that stops early --------------------------------------------------------------

#: the simulator's ``slow`` fault: this long between stream events, so a stream that is
#: stopped at its first text delta is stopped well before its end
SLOW = {"x-sim-fault": "slow", "x-sim-delay-ms": "40"}


async def first_text_delta(events: AsyncIterator[Any]) -> None:
    async for event in events:
        if event.type == "raw_response_event" and "delta" in event.data.type:
            return
    raise AssertionError("the stream ended before any text delta")


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_breaking_out_of_stream_events_leaves_the_model_call_running_to_its_record(
    api: str, otel: Otel, span_counter: SpanCounter, simulator_url: str, no_internal_errors: None
) -> None:
    """``break`` out of ``stream_events()`` stops the consumer, not the run: the run loop
    task keeps reading the model stream into the queue, so the span stays open until the
    stream ends, then ends with the full record (not ``not_read_to_end``). Closing the
    abandoned generator (as its finalizer would) awaits that task (``result.py``,
    ``stream_events``'s ``finally``)."""
    otel.instrument()
    seen = Agents(api, simulator_url)
    try:
        result = Runner.run_streamed(seen.agent("llamacpp", 7400, extra_headers=SLOW), TURNS[0])
        events = result.stream_events()
        await first_text_delta(events)
        assert span_counter.open == 1  # still being read, by the run loop task
        assert not result.is_complete
        await events.aclose()  # type: ignore[attr-defined]
        assert result.is_complete
        assert isinstance(result.final_output, str) and result.final_output
        assert await span_counter.open_after_async(10) == 0
    finally:
        await seen.client.close()

    (span,) = otel.our_spans()
    record = record_from_json(seen.wire.replay(0))
    assert record is not None and record.engine == "llamacpp"
    check_span(span, record)


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_cancelling_a_streamed_run_ends_the_span_not_read_to_end(
    api: str, otel: Otel, span_counter: SpanCounter, simulator_url: str, no_internal_errors: None
) -> None:
    """``result.cancel()`` (mode ``immediate``) cancels the run loop task mid-stream; the
    model's ``stream_response`` then closes the openai stream (``except
    asyncio.CancelledError``: ``_schedule_async_iterator_close``). The span ends then:
    status unset, ``spec_decode.outcome = not_read_to_end``, ``read_to_end = false``,
    and no record, since llama.cpp's timings come at the end the stream never reached."""
    otel.instrument()
    seen = Agents(api, simulator_url)
    try:
        result = Runner.run_streamed(seen.agent("llamacpp", 7500, extra_headers=SLOW), TURNS[0])
        events = result.stream_events()
        await first_text_delta(events)
        result.cancel()
        async for _ in events:  # as the Agents SDK asks: read on after cancel()
            pass
        assert result.is_complete and result.final_output is None
        assert await span_counter.open_after_async(10) == 0
    finally:
        await seen.client.close()

    (span,) = otel.our_spans()
    attrs = dict(span.attributes or {})
    assert span.status.status_code is StatusCode.UNSET
    assert attrs["spec_decode.outcome"] == "not_read_to_end"
    assert attrs["spec_decode.read_to_end"] is False
    assert spec_decode_attributes(attrs) == {}
    # the stats were there, at the end of the stream the run stopped reading
    assert record_from_json(seen.wire.replay(0)) is not None
