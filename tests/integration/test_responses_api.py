"""The Responses API (``client.responses.create``), instrumented, over real HTTP.

llama.cpp (b11312, PR ggml-org/llama.cpp#25348; checked against that build's
``llama-server``) puts root ``timings`` on the ``response.completed`` stream event and
nothing on a non-streamed response; vLLM 0.33.0 and 0.34.0 put root ``metrics`` (timing
fields only, ``build_per_request_timing_metrics``; ``responses/serving.py`` is the same file
in both) on the response. The simulator subprocess
speaks both; the same adapters read them. Usage comes as ``input_tokens`` /
``output_tokens``. In ``auto`` mode a genai-openai Responses span (operation ``chat``)
is enriched instead of getting a second span.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from instrumentation_helpers import MODEL, Otel
from opentelemetry.trace import SpanKind

from openai_sdk import http as sdk_http
from openai_sdk import mock_client
from spec_decode_otel import record_from_json
from spec_decode_otel.payloads import parse_payloads

INPUT = "Describe a zebra-unicorn in exactly three words."


def create_kwargs(engine: str, seed: int, *, stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "input": INPUT,
        "max_output_tokens": 40,
        "stream": stream,
        "extra_headers": {"x-spec-decode-engine": engine, "x-sim-seed": str(seed)},
    }


def raw(simulator_url: str, kwargs: dict[str, Any]) -> Any:
    """The same request through plain httpx: the body, or the list of stream events."""
    body = {k: v for k, v in kwargs.items() if k != "extra_headers"}
    response = httpx.post(
        simulator_url + "/responses", json=body, headers=kwargs["extra_headers"], timeout=30
    )
    response.raise_for_status()
    return parse_payloads(response.text) if body["stream"] else response.json()


def our_span(otel: Otel) -> Any:
    (span,) = otel.our_spans()
    return span


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_llamacpp_responses_stream_gives_the_timings_record(
    instrumented: Otel,
    openai_client: openai.OpenAI,
    async_openai_client: openai.AsyncOpenAI,
    simulator_url: str,
    mode: str,
) -> None:
    kwargs = create_kwargs("llamacpp", 6101, stream=True)
    if mode == "sync":
        events = list(openai_client.responses.create(**kwargs))
    else:
        events = [e async for e in await async_openai_client.responses.create(**kwargs)]
    assert events[-1].type == "response.completed"
    assert "timings" in events[-1].model_extra  # the user still sees every event whole
    payload = raw(simulator_url, kwargs)
    timings = payload[-1]["timings"]
    usage = payload[-1]["response"]["usage"]
    span = our_span(instrumented)
    attrs = dict(span.attributes or {})
    assert span.name == f"chat {MODEL}" and span.kind is SpanKind.CLIENT
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["spec_decode.outcome"] == "partial"
    assert attrs["spec_decode.engine"] == "llamacpp"
    assert attrs["spec_decode.num_draft_tokens"] == timings["draft_n"]
    assert attrs["spec_decode.num_accepted_draft_tokens"] == timings["draft_n_accepted"]
    assert attrs["gen_ai.usage.input_tokens"] == usage["input_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == usage["output_tokens"]
    assert attrs["gen_ai.response.model"] == MODEL
    assert list(attrs["gen_ai.response.finish_reasons"]) == ["stop"]
    # the Responses API's max_output_tokens is the convention's gen_ai.request.max_tokens
    assert attrs["gen_ai.request.max_tokens"] == kwargs["max_output_tokens"]
    assert attrs["gen_ai.request.stream"] is True
    record = record_from_json(payload)
    assert record is not None and record.completion_tokens == usage["output_tokens"]
    assert attrs["spec_decode.draft_acceptance_rate"] == record.draft_acceptance_rate


def test_the_responses_stream_helper_gives_the_same_record(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str
) -> None:
    kwargs = create_kwargs("llamacpp", 6102, stream=True)
    helper_kwargs = {k: v for k, v in kwargs.items() if k != "stream"}
    with openai_client.responses.stream(**helper_kwargs) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.usage is not None
    timings = raw(simulator_url, kwargs)[-1]["timings"]
    attrs = dict(our_span(instrumented).attributes or {})
    assert attrs["spec_decode.outcome"] == "partial"
    assert attrs["spec_decode.num_draft_tokens"] == timings["draft_n"]


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_non_streamed_responses_today_carry_no_spec_decode_stats(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str, engine: str
) -> None:
    """vLLM 0.33.0/0.34.0's Responses ``metrics`` holds timing fields only; llama.cpp b11312
    sends no ``timings`` on a non-streamed response. The call still gets its span."""
    kwargs = create_kwargs(engine, 6103, stream=False)
    response = openai_client.responses.create(**kwargs)
    body = raw(simulator_url, kwargs)
    if engine == "vllm":
        assert response.model_extra["metrics"]["speculative_decoding"] is None
        assert body["metrics"]["tokens_per_second"] > 0
    else:
        assert "timings" not in body
    attrs = dict(our_span(instrumented).attributes or {})
    assert attrs["spec_decode.outcome"] == "no_stats"
    assert attrs["gen_ai.usage.output_tokens"] == body["usage"]["output_tokens"]
    assert attrs["gen_ai.usage.input_tokens"] == body["usage"]["input_tokens"]
    assert list(attrs["gen_ai.response.finish_reasons"]) == ["stop"]
    assert record_from_json(body) is None


def test_responses_with_raw_response_ends_the_call_with_the_body(
    instrumented: Otel, openai_client: openai.OpenAI
) -> None:
    kwargs = create_kwargs("vllm", 6104, stream=False)
    raw_response = openai_client.responses.with_raw_response.create(**kwargs)
    parsed = raw_response.parse()
    attrs = dict(our_span(instrumented).attributes or {})
    assert attrs["spec_decode.outcome"] == "no_stats"
    assert attrs["gen_ai.usage.output_tokens"] == parsed.usage.output_tokens
    # the status's finish reason, as for the parsed response
    assert parsed.status == "completed"
    assert list(attrs["gen_ai.response.finish_reasons"]) == ["stop"]


def test_auto_mode_enriches_a_genai_openai_responses_span(
    otel: Otel, openai_client: openai.OpenAI, simulator_url: str
) -> None:
    """genai-openai 1.3b0 wraps ``Responses.create`` and names the span ``chat``
    (util-genai's inference default); its span is current when our request-path wrapper
    runs, so ``auto`` mode adds ``spec_decode.*`` to it and makes no second span."""
    otel.instrument(mode="auto")
    theirs = otel.tracer_provider.get_tracer("opentelemetry.instrumentation.genai.openai")
    kwargs = create_kwargs("llamacpp", 6105, stream=True)
    with theirs.start_as_current_span(
        f"chat {MODEL}", kind=SpanKind.CLIENT, attributes={"gen_ai.operation.name": "chat"}
    ):
        list(openai_client.responses.create(**kwargs))
    spans = otel.spans()
    assert len(spans) == 1
    attrs = dict(spans[0].attributes or {})
    assert spans[0].instrumentation_scope.name == "opentelemetry.instrumentation.genai.openai"
    assert attrs["spec_decode.outcome"] == "partial"
    assert (
        attrs["spec_decode.num_draft_tokens"]
        == raw(simulator_url, kwargs)[-1]["timings"]["draft_n"]
    )
    assert "gen_ai.usage.output_tokens" not in attrs  # theirs to set, not ours


def test_responses_requests_are_never_amended(
    otel: Otel, openai_client: openai.OpenAI, simulator_url: str
) -> None:
    """The Responses API has neither ``stream_options.include_usage`` nor engines'
    request fields: opt-in amendments leave its requests as the user wrote them."""
    otel.instrument(inject_include_usage=True, request_engine_stats=("sglang",))
    seen: list[bytes] = []

    def record_request(request: httpx.Request) -> None:
        seen.append(request.read())

    with openai.OpenAI(
        api_key="sk-test",
        base_url=simulator_url,
        max_retries=0,
        http_client=httpx.Client(event_hooks={"request": [record_request]}),
    ) as client:
        list(client.responses.create(**create_kwargs("llamacpp", 6106, stream=True)))
    (body,) = seen
    assert b"include_usage" not in body and b"return_spec_tokens_details" not in body
    assert dict(our_span(otel).attributes or {})["spec_decode.outcome"] == "partial"


def _response_body(status: str, details: dict[str, str] | None) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": status,
        "incomplete_details": details,
        "model": MODEL,
        "output": [],
        "usage": {"input_tokens": 5, "output_tokens": 40, "total_tokens": 45},
    }


#: (status, incomplete_details, the stream event that ends such a response, or None when
#: none does, and the finish reasons expected).
STATUSES = [
    ("completed", None, "response.completed", ["stop"]),
    ("incomplete", {"reason": "max_output_tokens"}, "response.incomplete", ["length"]),
    ("incomplete", {"reason": "content_filter"}, "response.incomplete", ["content_filter"]),
    ("incomplete", {"reason": "a_new_reason"}, "response.incomplete", ["a_new_reason"]),
    ("incomplete", None, "response.incomplete", ["incomplete"]),
    ("failed", None, "response.failed", ["error"]),
    ("cancelled", None, None, ["error"]),
    ("in_progress", None, None, None),
]
CASES = [(*case, False) for case in STATUSES] + [(*c, True) for c in STATUSES if c[2]]


@pytest.mark.parametrize(("status", "details", "terminal", "reasons", "stream"), CASES)
def test_a_responses_status_gives_the_finish_reason_genai_openai_gives(
    instrumented: Otel, status: str, details: Any, terminal: Any, reasons: Any, stream: bool
) -> None:
    """``gen_ai.response.finish_reasons`` of a Responses API call, mapped from its status
    as genai-openai maps it (opentelemetry-python-genai main, ``response_extractors.py``,
    ``_finish_reason_from_status``): a response cut at ``max_output_tokens`` is
    ``incomplete`` with that reason (the OpenAI API's ``response.incomplete`` event ends
    its stream), which dashboards expect as ``length``. It was ``incomplete``, and
    ``failed`` and ``cancelled`` were passed through as such."""
    body = _response_body(status, details)
    events = [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": {**body, "status": "in_progress"},
        },
        {"type": terminal, "sequence_number": 1, "response": body},
    ]

    def answer(request: Any) -> Any:
        if not stream:
            return sdk_http.Response(200, json=body)
        sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
        return sdk_http.Response(200, headers={"content-type": "text/event-stream"}, text=sse)

    result = mock_client(answer).responses.create(model=MODEL, input=INPUT, stream=stream)
    if stream:
        assert [event.type for event in result] == [e["type"] for e in events]
    else:
        assert result.status == status
    attrs = dict(our_span(instrumented).attributes or {})
    got = attrs.get("gen_ai.response.finish_reasons")
    assert (None if got is None else list(got)) == reasons
    assert attrs["gen_ai.usage.output_tokens"] == 40


def _failed_events(ending: str) -> list[dict[str, Any]]:
    """A Responses stream the server ends by saying the response failed."""
    failed = _response_body("failed", None) | {
        "error": {"code": "server_error", "message": "The model crashed."}
    }
    created = {"type": "response.created", "sequence_number": 0, "response": failed}
    created["response"] = {**failed, "status": "in_progress", "error": None}
    if ending == "response.failed":
        return [created, {"type": "response.failed", "sequence_number": 1, "response": failed}]
    error = {"type": "error", "sequence_number": 1, "code": "server_error", "param": None}
    return [created, error | {"message": "The model crashed."}]


@pytest.mark.parametrize(
    ("ending", "read"),
    [
        ("response.failed", "parsed"),
        ("response.failed", "raw"),
        ("error", "parsed"),
        ("error", "raw"),
        ("response.failed", "body"),
    ],
)
def test_a_responses_answer_the_server_says_failed_ends_as_an_error(
    instrumented: Otel, ending: str, read: str
) -> None:
    """A 200 answer whose response failed (a ``response.failed`` event, an ``error``
    event, or a body with ``status: failed``) is a failed call, as openai-v2 (2.4b0,
    ``response_wrappers.py``) fails its span on those events; the SDK raises for none of
    them, and the caller still sees every event or the body as sent. ``error.type`` is the
    event's type, a fixed value (the server's code would be unbounded on metrics)."""
    events = _failed_events(ending)

    def answer(request: Any) -> Any:
        if read == "body":
            return sdk_http.Response(200, json=_response_body("failed", None))
        sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
        return sdk_http.Response(200, headers={"content-type": "text/event-stream"}, text=sse)

    responses = mock_client(answer).responses
    if read == "body":
        assert responses.create(model=MODEL, input=INPUT).status == "failed"
    elif read == "parsed":
        seen = [e.type for e in responses.create(model=MODEL, input=INPUT, stream=True)]
        assert seen == [e["type"] for e in events]
    else:
        with responses.with_streaming_response.create(model=MODEL, input=INPUT, stream=True) as raw:
            assert sum(1 for line in raw.iter_lines() if line.startswith("data:")) == 2
    span = our_span(instrumented)
    attrs = dict(span.attributes or {})
    assert attrs["spec_decode.outcome"] == "error"
    assert attrs["error.type"] == ("error" if ending == "error" else "response.failed")
    assert span.status.status_code.name == "ERROR"


@pytest.mark.parametrize("read", ["parsed", "raw"])
def test_a_responses_stream_repeating_its_last_event_has_one_finish_reason(
    instrumented: Otel, read: str
) -> None:
    """One response has one finish reason, however often a server repeats the event that
    ends it (here ``response.completed`` three times)."""
    body = _response_body("completed", None)
    done = {"type": "response.completed", "sequence_number": 1, "response": body}
    sse = "".join(f"data: {json.dumps(done)}\n\n" for _ in range(3))

    def answer(request: Any) -> Any:
        return sdk_http.Response(200, headers={"content-type": "text/event-stream"}, text=sse)

    responses = mock_client(answer).responses
    if read == "parsed":
        assert len(list(responses.create(model=MODEL, input=INPUT, stream=True))) == 3
    else:
        with responses.with_streaming_response.create(model=MODEL, input=INPUT, stream=True) as raw:
            raw.read()
    attrs = dict(our_span(instrumented).attributes or {})
    assert list(attrs["gen_ai.response.finish_reasons"]) == ["stop"]


#: How a test reads a Responses stream: the SDK's events (``create``, or ``parse()`` of
#: ``with_raw_response``), or the server's lines (``with_streaming_response``), sync or
#: async. Each read must give the same record.
STREAM_READS = ["parsed", "raw_parse", "iter_lines", "async_parsed", "async_iter_lines"]


async def _read_stream(events: list[dict[str, Any]], read: str) -> None:
    """Serves ``events`` as a Responses stream and reads it to its end by ``read``."""
    sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)

    def answer(request: Any) -> Any:
        return sdk_http.Response(200, headers={"content-type": "text/event-stream"}, text=sse)

    kwargs: dict[str, Any] = {"model": MODEL, "input": INPUT, "stream": True}
    if not read.startswith("async_"):
        responses = mock_client(answer).responses
        if read == "parsed":
            assert len(list(responses.create(**kwargs))) == len(events)
        elif read == "raw_parse":
            assert len(list(responses.with_raw_response.create(**kwargs).parse())) == len(events)
        else:
            with responses.with_streaming_response.create(**kwargs) as raw_response:
                lines = [line for line in raw_response.iter_lines() if line.startswith("data:")]
            assert len(lines) == len(events)
        return
    transport = sdk_http.MockTransport(answer)
    async with openai.AsyncOpenAI(
        api_key="test",
        base_url="http://engine.test/v1",
        http_client=sdk_http.AsyncClient(transport=transport),
    ) as client:
        if read == "async_parsed":
            assert len([e async for e in await client.responses.create(**kwargs)]) == len(events)
        else:
            create = client.responses.with_streaming_response.create(**kwargs)
            async with create as raw_response:
                lines = [line async for line in raw_response.iter_lines() if line]
            assert len([line for line in lines if line.startswith("data:")]) == len(events)


def _simulated_events(simulator_url: str, engine: str, seed: int) -> list[dict[str, Any]]:
    """The simulator's Responses stream for ``engine``, as sent."""
    events = raw(simulator_url, create_kwargs(engine, seed, stream=True))
    assert events[-1]["type"] == "response.completed"
    return list(events)


@pytest.mark.parametrize("read", STREAM_READS)
async def test_events_after_the_completed_one_leave_the_record_of_the_completed_one(
    instrumented: Otel, simulator_url: str, read: str
) -> None:
    """Events a server sends after ``response.completed`` (here 40 plain text deltas)
    carry nothing an adapter reads: read raw or parsed, the record is that of the
    completed response (llama.cpp b11312's ``timings`` beside it). A raw read kept every
    event in its bounded buffer, so they pushed the completed event out, and the record
    and usage with it, where ``.parse()`` of the same stream kept them."""
    events = _simulated_events(simulator_url, "llamacpp", 6107)
    timings = events[-1]["timings"]
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    await _read_stream(events + [delta] * 40, read)
    attrs = dict(our_span(instrumented).attributes or {})
    assert attrs["spec_decode.outcome"] == "partial"
    assert attrs["spec_decode.num_draft_tokens"] == timings["draft_n"]
    assert attrs["gen_ai.usage.output_tokens"] == events[-1]["response"]["usage"]["output_tokens"]


@pytest.mark.parametrize("read", STREAM_READS)
async def test_stats_on_a_response_still_in_progress_are_not_read_on_any_path(
    instrumented: Otel, simulator_url: str, read: str
) -> None:
    """The stats of a Responses stream are read from the event that ends it and from
    events with fields of their own, on every path: vLLM (0.33.0/0.34.0,
    ``responses/serving.py``) puts its ``metrics`` on the final response, so a
    ``response.in_progress`` snapshot is no source. A raw read kept every event and took
    such a snapshot's speculative stats, where ``.parse()`` gave ``no_stats``."""
    chat = httpx.post(
        simulator_url + "/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": INPUT}]},
        headers={"x-spec-decode-engine": "vllm", "x-sim-seed": "6108"},
        timeout=30,
    ).json()
    assert chat["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0
    events = _simulated_events(simulator_url, "vllm", 6108)
    in_progress = next(e for e in events if e["type"] == "response.in_progress")
    in_progress["response"]["metrics"] = chat["metrics"]
    events[-1]["response"].pop("metrics", None)
    await _read_stream(events, read)
    attrs = dict(our_span(instrumented).attributes or {})
    assert attrs["spec_decode.outcome"] == "no_stats"
    assert "spec_decode.num_draft_tokens" not in attrs


@pytest.mark.parametrize("final_model", ["served-model", None])
@pytest.mark.parametrize("read", STREAM_READS)
async def test_a_responses_stream_names_the_model_of_its_final_response(
    instrumented: Otel, simulator_url: str, read: str, final_model: str | None
) -> None:
    """``gen_ai.response.model`` is the model the finished response names (the
    ``response.completed`` event's, as genai-openai takes it from the final response),
    else the first one named: an early event may name an alias or a gateway's route."""
    events = _simulated_events(simulator_url, "llamacpp", 6109)
    for event in events[:-1]:
        if "response" in event:
            event["response"]["model"] = "alias-model"
    if final_model is None:
        del events[-1]["response"]["model"]
    else:
        events[-1]["response"]["model"] = final_model
    await _read_stream(events, read)
    attrs = dict(our_span(instrumented).attributes or {})
    assert attrs["gen_ai.response.model"] == (final_model or "alias-model")


#: A Responses usage block that also carries the Chat Completions names, other counts.
BOTH_USAGES = {
    "input_tokens": 5,
    "output_tokens": 40,
    "total_tokens": 45,
    "prompt_tokens": 7,
    "completion_tokens": 41,
}


@pytest.mark.parametrize("read", ["body", "raw_body", *STREAM_READS])
async def test_a_responses_usage_with_both_namings_gives_the_responses_counts(
    instrumented: Otel, read: str
) -> None:
    """A Responses answer whose usage also has ``prompt_tokens``/``completion_tokens``
    (a gateway's addition) is counted by its own names, ``input_tokens``/``output_tokens``,
    which the user's code reads (openai 3.63.0's ``ResponseUsage`` declares those alone);
    the Chat Completions names won."""
    body = _response_body("completed", None) | {"usage": BOTH_USAGES}
    if read == "body":
        mock_client(lambda request: sdk_http.Response(200, json=body)).responses.create(
            model=MODEL, input=INPUT
        )
    elif read == "raw_body":
        answer = mock_client(lambda request: sdk_http.Response(200, json=body))
        answer.responses.with_raw_response.create(model=MODEL, input=INPUT).parse()
    else:
        created = {"type": "response.created", "sequence_number": 0, "response": body}
        created["response"] = {**body, "status": "in_progress", "usage": None}
        done = {"type": "response.completed", "sequence_number": 1, "response": body}
        await _read_stream([created, done], read)
    attrs = dict(our_span(instrumented).attributes or {})
    assert attrs["gen_ai.usage.input_tokens"] == 5
    assert attrs["gen_ai.usage.output_tokens"] == 40
