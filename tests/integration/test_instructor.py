"""Instructor (the real ``instructor`` 1.17.0) on the ``openai`` SDK, against the simulator
over HTTP.

Not in the main test environment: Instructor 1.17.0 requires ``jiter<0.15`` and every
openai 3.x from 3.3.1 on requires ``jiter>=0.16``, and the main environment runs openai 3
(the ``bench`` extra, openai-agents 0.24). So this module runs in the version matrix's
openai 2 venv (scripts/test-matrix.sh: openai 2.54.0, instructor 1.17.0), and the runs
on openai 3 do not collect it (tests/integration/conftest.py).

How Instructor 1.17.0 calls the SDK (read in the installed source, ``instructor/v2``):

- ``providers/openai/client.py`` ``from_openai``: takes ``client.chat.completions.create``
  (a bound method, captured once) and wraps it (``core/patch.py`` ``patch_v2``); the
  request still goes through the client's ``request`` method, which is what the
  instrumentor wraps, so a client handed to Instructor before ``instrument()`` is
  covered too.
- ``core/retry.py`` ``retry_sync_v2`` / ``retry_async_v2``: each attempt is one call of
  that ``create``; a ``ValidationError`` (or a JSON decode error) in parsing makes the
  reask handler append the error to the messages and call again, up to
  ``max_retries + 1`` attempts (``stop_after_attempt(max(max_retries, 0) + 1)``), then
  ``InstructorRetryException``.
- ``providers/openai/handlers.py`` ``_parse_streaming_response``: a sync ``Partial``
  stream is read whole inside the attempt (``list(generator)``; ``create_partial``
  returns a ``ListResponse``); a sync ``Iterable`` and both async ones are returned as
  generators that read the SDK stream as the caller iterates. ``extract_streaming_json``
  iterates the SDK stream and never closes it: a caller that stops early leaves the SDK
  stream open until it is collected, and our span with it (then ``not_read_to_end``,
  ended by our finalizer).
- The modes: ``TOOLS`` (the default: a tool call's arguments), ``JSON``, ``MD_JSON``,
  ``JSON_SCHEMA`` (the message text). The simulator writes filler words, so the relay
  (``framework_relay.py``) answers each request with the JSON the test's model describes,
  as text or as a call of the request's tool, keeping the engine's stats.
"""

from __future__ import annotations

import gc
import json
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import instructor
import openai
import pytest
from framework_relay import Relay, check_span
from instructor.core import InstructorRetryException
from instrumentation_helpers import (
    ENGINES,
    INCLUDE_USAGE_ENGINES,
    MODEL,
    PROMPT,
    Otel,
    dumps_without_volatile,
    expected_outcome,
    spec_decode_attributes,
)
from pydantic import BaseModel, ValidationInfo, field_validator

from spec_decode_otel import record_from_json

if TYPE_CHECKING:
    from reliability.reliability_helpers import SpanCounter

Mode = instructor.Mode


class Person(BaseModel):
    name: str
    age: int


PEOPLE = [{"name": "Ada", "age": 36}, {"name": "Alan", "age": 41}, {"name": "Grace", "age": 85}]
PATTERNS = (
    "create",
    "create_with_completion",
    "create_partial",
    "create_iterable",
    "async_create",
    "async_create_partial",
    "async_create_iterable",
)
STREAMED = frozenset(p for p in PATTERNS if p.endswith(("_partial", "_iterable")))
#: (pattern, mode, engine shape): every pattern in the default mode on three shapes, the
#: other modes on the plain and streamed calls, the other shapes on two patterns
CASES = [
    *((p, "TOOLS", e) for p in PATTERNS for e in ("vllm", "sglang", "llamacpp")),
    *(
        (p, m, "vllm")
        for p in ("create", "create_partial", "async_create_iterable")
        for m in ("JSON", "MD_JSON", "JSON_SCHEMA")
    ),
    *(
        (p, "TOOLS", e)
        for p in ("create", "async_create_partial")
        for e in ENGINES
        if e not in ("vllm", "sglang", "llamacpp")
    ),
]


def seed_for(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode()) % 100_000 + 1


def answer_for(request: dict[str, Any]) -> str:
    """The JSON the request's response model describes (Instructor names the model of an
    ``Iterable[Person]`` ``IterablePerson``)."""
    if "IterablePerson" in json.dumps(request):
        return json.dumps({"tasks": PEOPLE})
    return json.dumps(PEOPLE[0])


@pytest.fixture
def relay(simulator_url: str) -> Iterator[Relay]:
    with Relay(simulator_url, answer_for) as r:
        yield r


def call_kwargs(engine: str, seed: int, streamed: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "extra_headers": {"x-spec-decode-engine": engine, "x-sim-seed": str(seed)},
    }
    if engine == "sglang":
        kwargs["extra_body"] = {"return_spec_tokens_details": True}
    if streamed and engine in INCLUDE_USAGE_ENGINES:
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


def dumped(value: Any) -> Any:
    """What the caller got, comparable across runs (SDK objects without id/created)."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, tuple):
        model, completion = value
        return dumped(model), dumps_without_volatile([completion])
    return [dumped(item) for item in value]


async def drive(base_url: str, pattern: str, mode: str, kwargs: dict[str, Any]) -> Any:
    """One Instructor call on a fresh client, read to its end, as the caller sees it."""
    if pattern.startswith("async_"):
        aclient = openai.AsyncOpenAI(base_url=base_url, api_key="sk-t", max_retries=0)
        try:
            patched = instructor.from_openai(aclient, mode=Mode[mode]).chat.completions
            if pattern == "async_create":
                return dumped(await patched.create(response_model=Person, **kwargs))
            method = getattr(patched, pattern[len("async_") :])
            return dumped([item async for item in method(response_model=Person, **kwargs)])
        finally:
            await aclient.close()
    with openai.OpenAI(base_url=base_url, api_key="sk-t", max_retries=0) as client:
        sync = instructor.from_openai(client, mode=Mode[mode]).chat.completions
        if pattern == "create_partial":  # a ListResponse: read whole inside the call
            return dumped(list(sync.create_partial(response_model=Person, **kwargs)))
        if pattern == "create_iterable":
            return dumped(list(sync.create_iterable(response_model=Person, **kwargs)))
        return dumped(getattr(sync, pattern)(response_model=Person, **kwargs))


def check_spans(otel: Otel, relay: Relay, first: int = 0) -> list[str]:
    """Our spans, one per request the relay saw from ``first`` on, each with its own
    answer's record; their outcomes."""
    spans = otel.our_spans()
    assert len(spans) == len(relay.requests) - first
    outcomes = []
    for index, span in enumerate(spans, start=first):
        record = record_from_json(relay.replay(index))
        check_span(span, record)
        outcomes.append(expected_outcome(record))
    return outcomes


# -- every call pattern --------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "mode", "engine"), CASES)
async def test_each_structured_call_gets_one_span_with_its_record_and_the_same_result(
    pattern: str,
    mode: str,
    engine: str,
    otel: Otel,
    span_counter: SpanCounter,
    relay: Relay,
    no_internal_errors: None,
) -> None:
    """Once bare, once instrumented: one request, one span of ours with the record of the
    server's answer to exactly that request, and Instructor's result (the model, the
    partials, the items, the completion) the same as without instrumentation."""
    streamed = pattern in STREAMED
    kwargs = call_kwargs(engine, seed_for(pattern, mode, engine), streamed)
    bare = await drive(relay.url, pattern, mode, kwargs)
    assert otel.spans() == []

    otel.instrument()
    seen = await drive(relay.url, pattern, mode, kwargs)
    assert seen == bare
    people = PEOPLE if pattern.endswith("_iterable") else PEOPLE[:1]
    last = seen[0] if pattern == "create_with_completion" else seen
    assert (last[-len(people) :] if isinstance(last, list) else [last]) == people

    assert len(relay.requests) == 2
    assert relay.bodies()[1] == relay.bodies()[0]
    assert bool(relay.bodies()[1].get("stream")) == streamed
    (outcome,) = check_spans(otel, relay, first=1)
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {outcome: 1}


# -- retries -------------------------------------------------------------------------------


class CheckedPerson(BaseModel):
    """Rejects the first answer it is given (the validation context counts them)."""

    name: str
    age: int

    @field_validator("age")
    @classmethod
    def not_the_first_answer(cls, age: int, info: ValidationInfo) -> int:
        seen: list[int] = info.context["seen"] if info.context else []
        seen.append(age)
        if len(seen) == 1:
            raise ValueError("check the age again")
        return age


async def checked(base_url: str, pattern: str, kwargs: dict[str, Any]) -> Any:
    context: dict[str, Any] = {"seen": []}
    if pattern == "async_create":
        aclient = openai.AsyncOpenAI(base_url=base_url, api_key="sk-t", max_retries=0)
        try:
            patched = instructor.from_openai(aclient).chat.completions
            result = await patched.create(
                response_model=CheckedPerson, max_retries=2, context=context, **kwargs
            )
        finally:
            await aclient.close()
    else:
        with openai.OpenAI(base_url=base_url, api_key="sk-t", max_retries=0) as client:
            result = instructor.from_openai(client).chat.completions.create(
                response_model=CheckedPerson, max_retries=2, context=context, **kwargs
            )
    assert len(context["seen"]) == 2
    return result.model_dump()


@pytest.mark.parametrize("pattern", ["create", "async_create"])
async def test_a_validation_retry_gets_one_span_per_attempt(
    pattern: str,
    otel: Otel,
    span_counter: SpanCounter,
    relay: Relay,
    no_internal_errors: None,
) -> None:
    """A validator rejects the first answer: Instructor asks again with the error
    appended (``reask_handler``), so two requests, two spans, each with the record of
    its own answer, and the same model as without instrumentation."""
    kwargs = call_kwargs("sglang", seed_for("retry", pattern), False)
    bare = await checked(relay.url, pattern, kwargs)
    otel.instrument()
    assert await checked(relay.url, pattern, kwargs) == bare == PEOPLE[0]

    assert len(relay.requests) == 4
    first, second = relay.bodies()[2:]
    assert len(second["messages"]) > len(first["messages"])  # the reask
    assert check_spans(otel, relay, first=2) == ["recorded", "recorded"]
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {"recorded": 2}


def exhaust(base_url: str, kwargs: dict[str, Any]) -> tuple[str, int]:
    """A JSON-mode call whose every answer is filler words: Instructor's error."""
    with openai.OpenAI(base_url=base_url, api_key="sk-t", max_retries=0) as client:
        patched = instructor.from_openai(client, mode=Mode.JSON).chat.completions
        with pytest.raises(InstructorRetryException) as caught:
            patched.create(response_model=Person, max_retries=2, **kwargs)
    return type(caught.value).__name__, caught.value.n_attempts


def test_retries_that_all_fail_raise_instructors_error_and_each_attempt_has_a_span(
    otel: Otel, span_counter: SpanCounter, relay: Relay, no_internal_errors: None
) -> None:
    """The server's answers never parse (the simulator's own filler words): with
    ``max_retries=2`` Instructor tries three times and raises
    ``InstructorRetryException``, the same as without instrumentation. Each attempt was
    a good HTTP call: three spans, status unset, each with its answer's record."""
    relay.answer = None
    kwargs = call_kwargs("trtllm", seed_for("exhausted"), False)
    bare = exhaust(relay.url, kwargs)
    otel.instrument()
    assert exhaust(relay.url, kwargs) == bare == ("InstructorRetryException", 3)
    assert check_spans(otel, relay, first=3) == ["recorded"] * 3
    assert span_counter.open == 0


def test_a_client_given_to_instructor_before_instrument_is_covered(
    otel: Otel, relay: Relay, no_internal_errors: None
) -> None:
    """``from_openai`` captured ``client.chat.completions.create`` before the
    instrumentor ran; the call still goes through the client's ``request``: one span."""
    with openai.OpenAI(base_url=relay.url, api_key="sk-t", max_retries=0) as client:
        patched = instructor.from_openai(client).chat.completions
        otel.instrument()
        kwargs = call_kwargs("vllm", seed_for("before"), False)
        assert patched.create(response_model=Person, **kwargs).model_dump() == PEOPLE[0]
    assert check_spans(otel, relay) == ["recorded"]


# -- a caller that stops early ---------------------------------------------------------------


def test_leaving_a_create_iterable_early_ends_the_span_when_the_stream_is_collected(
    otel: Otel, span_counter: SpanCounter, relay: Relay, no_internal_errors: None
) -> None:
    """The first item, then the generator closed: Instructor does not close the SDK
    stream, so our span stays open while the stream lives, and ends, ``not_read_to_end``,
    when it is collected (the user's choice to stop; no record, as the usage chunk with
    vLLM's stats was never read)."""
    otel.instrument()
    kwargs = call_kwargs("vllm", seed_for("early"), True)
    with openai.OpenAI(base_url=relay.url, api_key="sk-t", max_retries=0) as client:
        patched = instructor.from_openai(client).chat.completions
        items = patched.create_iterable(response_model=Person, **kwargs)
        assert next(items).model_dump() == PEOPLE[0]
        items.close()
        assert span_counter.open == 1
        del items
        gc.collect()
        assert span_counter.open_after(10) == 0
    (span,) = otel.our_spans()
    attrs = dict(span.attributes or {})
    assert attrs["spec_decode.outcome"] == "not_read_to_end"
    assert attrs["spec_decode.read_to_end"] is False
    assert spec_decode_attributes(attrs) == {}
    assert record_from_json(relay.replay(0)) is not None  # the stats came after the stop


async def test_leaving_an_async_create_partial_early_ends_the_span_when_collected(
    otel: Otel, span_counter: SpanCounter, relay: Relay, no_internal_errors: None
) -> None:
    """The same with the async ``create_partial``: ``aclose()`` on Instructor's generator
    leaves the ``AsyncStream`` open; once collected, the span ends ``not_read_to_end``."""
    otel.instrument()
    kwargs = call_kwargs("llamacpp", seed_for("early", "async"), True)
    aclient = openai.AsyncOpenAI(base_url=relay.url, api_key="sk-t", max_retries=0)
    try:
        partials = instructor.from_openai(aclient).chat.completions.create_partial(
            response_model=Person, **kwargs
        )
        await anext(partials)
        await partials.aclose()
        assert span_counter.open == 1
        del partials
        gc.collect()
        assert await span_counter.open_after_async(10) == 0
    finally:
        await aclient.close()
    (span,) = otel.our_spans()
    attrs = dict(span.attributes or {})
    assert attrs["spec_decode.outcome"] == "not_read_to_end"
    assert attrs["spec_decode.read_to_end"] is False
