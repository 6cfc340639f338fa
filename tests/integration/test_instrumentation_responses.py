"""The SDK's other ways to call: raw responses, streaming responses, ``parse()``, the
``stream()`` helper, and the Responses API (which must pass through untouched).

Each comparison runs the same seeded request once without instrumentation and once with
it: headers, types and parsed content must be the same, and the instrumented call's span
must carry the record of the body it actually received.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import openai
import pydantic
import pytest
from instrumentation_helpers import (
    MESSAGES,
    MODEL,
    SPEC_DECODE_METRICS,
    Otel,
    dumps_without_volatile,
    expected_span_attributes,
    raw_payload,
    spec_decode_attributes,
)
from opentelemetry.trace import StatusCode

import spec_decode_otel

#: Headers that may differ between two answers to the same request.
VOLATILE_HEADERS = {"date"}


def kwargs_for(stream: bool, seed: int = 21) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "extra_headers": {"x-spec-decode-engine": "vllm", "x-sim-seed": str(seed)},
    }
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


def headers_of(response: Any) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower() not in VOLATILE_HEADERS}


def assert_span_has_record_of(otel: Otel, payload: Any) -> None:
    record = spec_decode_otel.record_from_json(payload)
    assert record is not None
    span = otel.only_span()
    assert span.status.status_code is StatusCode.UNSET
    assert spec_decode_attributes(span.attributes) == expected_span_attributes(record)


async def consume(parsed: Any) -> list[Any]:
    if isinstance(parsed, openai.AsyncStream):
        return [chunk async for chunk in parsed]
    if isinstance(parsed, openai.Stream):
        return list(parsed)
    return [parsed]


# -- with_raw_response -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_with_raw_response_is_unchanged_and_recorded(
    mode: str,
    stream: bool,
    otel: Otel,
    openai_client: Any,
    async_openai_client: Any,
    simulator_url: str,
) -> None:
    kwargs = kwargs_for(stream)

    async def fetch() -> tuple[Any, Any, list[Any]]:
        if mode == "sync":
            raw = openai_client.chat.completions.with_raw_response.create(**kwargs)
        else:
            raw = await async_openai_client.chat.completions.with_raw_response.create(**kwargs)
        parsed = raw.parse()
        return raw, parsed, await consume(parsed)

    bare_raw, bare_parsed, bare_items = await fetch()
    otel.instrument()
    raw, parsed, items = await fetch()

    assert isinstance(raw, type(bare_raw))
    assert raw.__class__ is bare_raw.__class__
    assert (raw.status_code, raw.http_request.method, str(raw.http_request.url)) == (
        bare_raw.status_code,
        bare_raw.http_request.method,
        str(bare_raw.http_request.url),
    )
    assert headers_of(raw) == headers_of(bare_raw)
    assert parsed.__class__ is bare_parsed.__class__
    if not stream:
        assert type(parsed) is type(bare_parsed)  # the very object, not a proxy
    assert dumps_without_volatile(items) == dumps_without_volatile(bare_items)
    if stream:
        assert_span_has_record_of(otel, raw_payload(simulator_url, "chat", kwargs))
    else:
        # the exact body this call received, as the user can read it
        assert_span_has_record_of(otel, json.loads(raw.text))
        assert raw.parse() is parsed  # the SDK's cache still works through us


# -- with_streaming_response -------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_with_streaming_response_is_unchanged_and_recorded(
    mode: str,
    stream: bool,
    otel: Otel,
    openai_client: Any,
    async_openai_client: Any,
    simulator_url: str,
) -> None:
    kwargs = kwargs_for(stream)

    async def fetch() -> tuple[dict[str, str], type, list[Any], int]:
        if mode == "sync":
            with openai_client.chat.completions.with_streaming_response.create(**kwargs) as resp:
                parsed = resp.parse()
                items = await consume(parsed)
                return headers_of(resp), parsed.__class__, items, resp.status_code
        async with async_openai_client.chat.completions.with_streaming_response.create(
            **kwargs
        ) as resp:
            parsed = await resp.parse()
            items = await consume(parsed)
            return headers_of(resp), parsed.__class__, items, resp.status_code

    bare = await fetch()
    otel.instrument()
    ours = await fetch()
    assert ours[0] == bare[0]
    assert ours[1] is bare[1]
    assert dumps_without_volatile(ours[2]) == dumps_without_volatile(bare[2])
    assert ours[3] == bare[3] == 200
    assert_span_has_record_of(otel, raw_payload(simulator_url, "chat", kwargs))


# -- the client's own post() ---------------------------------------------------------------


# typing.Dict[str, object]: openai 1 and 2 construct no bare dict (construct_type unpacks
# its type arguments) and openai 1.40 no dict[str, object] (issubclass() of an alias),
# with or without us
@pytest.mark.parametrize(
    "cast_to",
    [object, typing.Dict[str, object], str, bytes],  # noqa: UP006
    ids=["object", "dict", "str", "bytes"],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_post_cast_to_a_plain_type_is_recorded_from_its_body(
    mode: str,
    cast_to: type,
    otel: Otel,
    openai_client: Any,
    async_openai_client: Any,
) -> None:
    """``client.post("/chat/completions", cast_to=object)`` (or a dict type, ``str``,
    ``bytes``), as code calling an endpoint the SDK has no method for does: the SDK
    (openai 3.x ``_response.py`` ``_parse``) hands back the body as a dict or as text,
    unchanged by us, and the span carries the record of that body."""
    body = {"model": MODEL, "messages": MESSAGES}
    options = {"headers": {"x-spec-decode-engine": "vllm", "x-sim-seed": "41"}}

    async def fetch() -> Any:
        if mode == "sync":
            return openai_client.post(
                "/chat/completions", body=body, cast_to=cast_to, options=options
            )
        return await async_openai_client.post(
            "/chat/completions", body=body, cast_to=cast_to, options=options
        )

    bare = await fetch()
    otel.instrument()
    ours = await fetch()
    assert type(ours) is type(bare)
    payload = ours if isinstance(ours, dict) else json.loads(ours)
    assert dumps_without_volatile([payload]) == dumps_without_volatile(
        [bare if isinstance(bare, dict) else json.loads(bare)]
    )
    assert_span_has_record_of(otel, payload)


# -- parse() and the stream() helper ------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_chat_completions_parse_is_recorded(
    mode: str,
    otel: Otel,
    openai_client: Any,
    async_openai_client: Any,
    simulator_url: str,
) -> None:
    # The simulator answers with filler text whatever response_format asks for, so the
    # structured-output check is left to the SDK: parse() here has no response_format.
    kwargs = kwargs_for(False, seed=33)

    async def fetch() -> Any:
        if mode == "sync":
            return openai_client.chat.completions.parse(**kwargs)
        return await async_openai_client.chat.completions.parse(**kwargs)

    bare = await fetch()
    otel.instrument()
    ours = await fetch()
    assert type(ours) is type(bare)
    assert isinstance(ours, openai.types.chat.ParsedChatCompletion)
    assert dumps_without_volatile([ours]) == dumps_without_volatile([bare])
    assert_span_has_record_of(otel, raw_payload(simulator_url, "chat", kwargs))


class _Answer(pydantic.BaseModel):
    verdict: str


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_parse_that_fails_on_a_streaming_response_ends_as_the_plain_parse_does(
    mode: str, otel: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    """``parse()`` with a ``response_format`` the content does not meet (the simulator's
    filler text is no JSON object): the SDK raises, on the plain client and on
    ``with_streaming_response`` alike. The plain call's span says ``error``; the
    streaming response's said ``not_read_to_end`` (``read_to_end`` false, no
    ``error.type``), though the SDK had read the whole body: only a parse that returned
    ended its call, so the block's exit took it for a body left unread (found by a
    helper). Now the same error ends both."""
    kwargs = {**kwargs_for(False, seed=34), "response_format": _Answer}

    async def plain() -> None:
        if mode == "sync":
            openai_client.chat.completions.parse(**kwargs)
        else:
            await async_openai_client.chat.completions.parse(**kwargs)

    async def streaming() -> None:
        if mode == "sync":
            with openai_client.chat.completions.with_streaming_response.parse(**kwargs) as r:
                r.parse()
        else:
            client = async_openai_client.chat.completions.with_streaming_response
            async with client.parse(**kwargs) as r:
                await r.parse()

    otel.instrument()
    ends = []
    for call in (plain, streaming):
        with pytest.raises(pydantic.ValidationError):
            await call()
        span = otel.spans()[-1]
        ends.append(
            (
                span.status.status_code,
                span.attributes.get("error.type"),
                span.attributes["spec_decode.outcome"],
                span.attributes.get("spec_decode.read_to_end"),
            )
        )
    assert ends == [(StatusCode.ERROR, "ValidationError", "error", None)] * 2


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_stream_helper_is_recorded_from_its_chunks(
    mode: str,
    otel: Otel,
    openai_client: Any,
    async_openai_client: Any,
    simulator_url: str,
) -> None:
    kwargs = kwargs_for(True, seed=44)
    del kwargs["stream"]  # the helper sets it

    async def events() -> tuple[list[str], Any]:
        if mode == "sync":
            with openai_client.chat.completions.stream(**kwargs) as helper:
                kinds = [event.type for event in helper]
                return kinds, helper.get_final_completion()
        async with async_openai_client.chat.completions.stream(**kwargs) as helper:
            kinds = [event.type async for event in helper]
            return kinds, await helper.get_final_completion()

    bare_kinds, bare_final = await events()
    otel.instrument()
    kinds, final = await events()
    assert kinds == bare_kinds and "chunk" in kinds
    assert final.choices[0].message.content == bare_final.choices[0].message.content
    assert_span_has_record_of(otel, raw_payload(simulator_url, "chat", {**kwargs, "stream": True}))


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_stream_helper_left_early_ends_its_span_at_exit(
    mode: str, instrumented: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    kwargs = kwargs_for(True)
    del kwargs["stream"]
    if mode == "sync":
        with openai_client.chat.completions.stream(**kwargs) as helper:
            for _ in helper:
                break
            assert instrumented.spans() == []
    else:
        async with async_openai_client.chat.completions.stream(**kwargs) as helper:
            async for _ in helper:
                break
            assert instrumented.spans() == []
    # ended by the helper's close (through stream.response), not later by the GC
    span = instrumented.only_span()
    assert "error.type" not in span.attributes
    assert span.status.status_code is StatusCode.UNSET
    del helper


# -- the Responses API --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_other_endpoints_pass_through_untouched(
    mode: str, otel: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    async def attempt() -> openai.NotFoundError:
        with pytest.raises(openai.NotFoundError) as info:
            if mode == "sync":
                openai_client.embeddings.create(model=MODEL, input="hello")
            else:
                await async_openai_client.embeddings.create(model=MODEL, input="hello")
        return info.value

    bare = await attempt()
    otel.instrument()
    ours = await attempt()
    assert type(ours) is type(bare)
    assert (ours.status_code, ours.body) == (bare.status_code, bare.body)
    assert otel.spans() == []
    metrics = otel.metrics()
    assert not otel.points(metrics, "gen_ai.client.operation.duration")
    assert not [n for n in SPEC_DECODE_METRICS if otel.points(metrics, n)]
