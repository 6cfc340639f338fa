"""LlamaIndex (the real ``llama-index-llms-openai-like`` 0.8.1, on
``llama-index-llms-openai`` 0.8.3 and ``llama-index-core`` 0.14) on the ``openai`` SDK,
against the simulator over HTTP.

Not in the main test environment: ``llama-index-llms-openai`` 0.8.x requires
``openai<3``, and the main environment runs openai 3 (the ``bench`` extra, openai-agents
0.24). So this module runs in the version matrix's openai 2 venv
(scripts/test-matrix.sh: openai 2.54.0, llama-index-llms-openai-like 0.8.1), and the
runs on openai 3 do not collect it (tests/integration/conftest.py).

How ``OpenAILike`` calls the SDK (read in the installed source):

- ``llama_index/llms/openai/base.py``: the LLM builds its own ``openai.OpenAI`` /
  ``AsyncOpenAI`` (``_get_client`` / ``_get_aclient``, from ``api_base``, ``api_key``,
  ``max_retries``, ``timeout``, ``default_headers``), lazily at its first call, and keeps
  it (``reuse_client=True``, the default); with ``reuse_client=False`` each call makes a
  new client and closes it (``with client:``). Every call is one
  ``client.chat.completions.create`` or ``client.completions.create``; the streaming
  ones (``_stream_chat``, ``_astream_chat``, ``_stream_complete``) iterate the SDK stream
  inside a generator the caller reads.
- ``_get_model_kwargs``: ``additional_kwargs`` go into every request, except
  ``stream_options`` on a non-streamed one; so ``additional_kwargs={"stream_options":
  {"include_usage": True}}`` gets vLLM's streamed stats (sent on the usage chunk).
- ``llama_index/llms/openai_like/base.py``: ``is_chat_model=False`` (the default) sends
  ``complete`` to ``/v1/completions`` and turns ``chat`` into a completion of the
  formatted messages; ``is_chat_model=True`` sends ``chat`` to ``/v1/chat/completions``
  and ``complete`` as a one-message chat.

The same LLM object is used bare, then instrumented: the client it built before
``instrument()`` is covered (the instrumentor wraps the request path of every client).
The relay (``framework_relay.py``) passes the simulator's bytes through unchanged and
records each request, to send it again for the expected record.
"""

from __future__ import annotations

import gc
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from framework_relay import Relay, check_span
from instrumentation_helpers import (
    INCLUDE_USAGE_ENGINES,
    MODEL,
    PROMPT,
    Otel,
    dumps_without_volatile,
    expected_outcome,
)
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

from spec_decode_otel import record_from_json

if TYPE_CHECKING:
    from reliability.reliability_helpers import SpanCounter

#: (call, is_chat_model): the calls users make, with the endpoint each one reaches
CALLS = (
    ("complete", False),
    ("acomplete", False),
    ("stream_complete", False),
    ("complete", True),
    ("chat", True),
    ("achat", True),
    ("stream_chat", True),
    ("astream_chat", True),
    ("chat", False),
)
STREAMED = frozenset({"stream_complete", "stream_chat", "astream_chat"})
SHAPES = ("vllm", "sglang", "trtllm", "llamacpp", "none")
MESSAGES = [ChatMessage(role="user", content=PROMPT)]


def seed_for(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode()) % 100_000 + 1


@pytest.fixture
def relay(simulator_url: str) -> Iterator[Relay]:
    with Relay(simulator_url) as r:
        yield r


def make_llm(base_url: str, engine: str, seed: int, chat_model: bool, **extra: Any) -> OpenAILike:
    additional: dict[str, Any] = {}
    if engine == "sglang":
        additional["extra_body"] = {"return_spec_tokens_details": True}
    if engine in INCLUDE_USAGE_ENGINES:
        additional["stream_options"] = {"include_usage": True}
    return OpenAILike(
        model=MODEL,
        api_base=base_url,
        api_key="sk-t",
        is_chat_model=chat_model,
        max_retries=0,
        default_headers={"x-spec-decode-engine": engine, "x-sim-seed": str(seed)},
        additional_kwargs=additional,
        **extra,
    )


def seen(response: Any) -> Any:
    """A completion or chat response as the caller sees it (the SDK object in ``raw``
    without its id and creation time)."""
    message = getattr(response, "message", None)
    text = response.text if message is None else (message.role, message.content)
    return text, response.delta, response.additional_kwargs, dumps_without_volatile([response.raw])


async def drive(llm: OpenAILike, call: str) -> list[Any]:
    """One call, streams read to the end: every response the caller got."""
    given: Any = MESSAGES if "chat" in call else PROMPT
    if call in ("stream_complete", "stream_chat"):
        return [seen(r) for r in getattr(llm, call)(given)]
    if call == "astream_chat":
        return [seen(r) async for r in await llm.astream_chat(given)]
    if call.startswith("a"):
        return [seen(await getattr(llm, call)(given))]
    return [seen(getattr(llm, call)(given))]


async def close(llm: OpenAILike) -> None:
    """The clients the LLM built (it has no close of its own)."""
    if llm._client is not None:
        llm._client.close()
    if llm._aclient is not None:
        await llm._aclient.close()


@pytest.mark.parametrize("engine", SHAPES)
@pytest.mark.parametrize(("call", "chat_model"), CALLS)
async def test_each_llm_call_gets_one_span_with_its_record_and_the_same_response(
    call: str,
    chat_model: bool,
    engine: str,
    otel: Otel,
    span_counter: SpanCounter,
    relay: Relay,
    no_internal_errors: None,
) -> None:
    """One ``OpenAILike``, called bare, then instrumented: one request, one span of ours
    on the endpoint the call reached, with the record of the server's answer to exactly
    that request, and the responses (streams: every delta) the same as bare."""
    llm = make_llm(relay.url, engine, seed_for(call, str(chat_model), engine), chat_model)
    try:
        bare = await drive(llm, call)
        assert otel.spans() == []
        otel.instrument()
        responses = await drive(llm, call)
    finally:
        await close(llm)
    assert responses == bare
    assert len(responses) > 1 if call in STREAMED else len(responses) == 1

    assert len(relay.requests) == 2
    assert relay.bodies()[1] == relay.bodies()[0]
    assert bool(relay.bodies()[1].get("stream")) == (call in STREAMED)
    path = relay.requests[1].path
    assert path == ("/v1/chat/completions" if chat_model else "/v1/completions")
    record = record_from_json(relay.replay(1))
    assert (record is None) == (engine == "none")
    (span,) = otel.our_spans()
    check_span(span, record, "chat" if chat_model else "text_completion")
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {expected_outcome(record): 1}


@pytest.mark.parametrize("call", ["chat", "astream_chat"])
async def test_a_new_client_per_call_is_covered_too(
    call: str, otel: Otel, span_counter: SpanCounter, relay: Relay, no_internal_errors: None
) -> None:
    """``reuse_client=False``: each call builds its own client (and a non-streamed call
    closes it at once): three calls, three spans, each with its record."""
    otel.instrument()
    llm = make_llm(relay.url, "sglang", seed_for("fresh", call), True, reuse_client=False)
    for _ in range(3):
        assert await drive(llm, call)
    gc.collect()  # the streamed calls' clients, which LlamaIndex leaves to be collected
    assert len(otel.our_spans()) == len(relay.requests) == 3
    for index, span in enumerate(otel.our_spans()):
        record = record_from_json(relay.replay(index))
        assert record is not None and record.engine == "sglang"
        check_span(span, record, "chat")
    assert span_counter.open == 0


async def test_leaving_astream_chat_early_ends_the_span_when_the_stream_is_collected(
    otel: Otel, span_counter: SpanCounter, relay: Relay, no_internal_errors: None
) -> None:
    """The first delta, then ``aclose()`` on LlamaIndex's generator: ``_astream_chat``
    does not close the SDK stream, so our span lasts until it is collected, then ends
    ``not_read_to_end`` (the stats, on vLLM's usage chunk, were never read)."""
    otel.instrument()
    llm = make_llm(relay.url, "vllm", seed_for("early"), True)
    try:
        deltas = await llm.astream_chat(MESSAGES)
        await anext(deltas)
        await deltas.aclose()
        assert span_counter.open == 1
        del deltas
        gc.collect()
        assert await span_counter.open_after_async(10) == 0
    finally:
        await close(llm)
    (span,) = otel.our_spans()
    attrs = dict(span.attributes or {})
    assert attrs["spec_decode.outcome"] == "not_read_to_end"
    assert attrs["spec_decode.read_to_end"] is False
    assert record_from_json(relay.replay(0)) is not None
