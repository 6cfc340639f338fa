"""A call's one end, on the ways out the stream tests do not take: cancellation and
interrupts, threads, ``uninstrument()`` mid-stream and ``fork()``.

Every call goes over HTTP to the simulator SUBPROCESS through the real ``openai`` SDK.
Each test checks the promises of README "What the instrumentation never does": what user
code sees (the exception the bare SDK raises, unchanged), one span ended per call (a
start/end counting span processor), one ``spec_decode.requests`` count per call, and the
caller's OpenTelemetry context untouched. The ``slow`` fault holds the next chunk back
for seconds, so a call is certainly waiting on the server when the test cancels it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import openai
import pytest
from opentelemetry import context as otel_context
from opentelemetry.trace import StatusCode
from reliability_helpers import API_KEY, Otel, canary_messages, instrumented, uninstrumented

from spec_decode_otel.telemetry import (
    ERROR_TYPE,
    SD_OUTCOME,
    SD_READ_TO_END,
)

#: The server holds every chunk after the first this long: far beyond any wait here.
HELD_MS = "5000"
REQUESTS = "spec_decode.requests"


def chat(seed: int, *, stream: bool = True, held: bool = False) -> dict[str, Any]:
    headers = {"x-spec-decode-engine": "vllm", "x-sim-seed": str(seed)}
    if held:
        headers.update({"x-sim-fault": "slow", "x-sim-delay-ms": HELD_MS})
    kwargs: dict[str, Any] = {
        "model": "spec-sim",
        "messages": canary_messages(),
        "max_tokens": 8 + seed % 9,
        "extra_headers": headers,
    }
    if stream:
        kwargs.update(stream=True, stream_options={"include_usage": True})
    return kwargs


def requests_by_outcome(otel: Otel) -> dict[str, int]:
    return {str(p.attributes[SD_OUTCOME]): p.value for p in otel.points(REQUESTS)}


def only_span(otel: Otel) -> Any:
    assert otel.counter.open == 0, "a span was left open"
    (span,) = otel.spans()
    return span


@pytest.fixture
def sync_client(simulator_url: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
    yield client
    client.close()


@pytest.fixture
async def async_client(simulator_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
    yield client
    await client.close()


# -- cancellation and interrupts ----------------------------------------------------------

Reader = Callable[[openai.AsyncOpenAI, asyncio.Event], Coroutine[Any, Any, None]]


async def read_create(client: openai.AsyncOpenAI, first: asyncio.Event) -> None:
    async for _ in await client.chat.completions.create(**chat(11, held=True)):
        first.set()


async def read_stream_helper(client: openai.AsyncOpenAI, first: asyncio.Event) -> None:
    kwargs = chat(11, held=True)
    del kwargs["stream"]
    async with client.chat.completions.stream(**kwargs) as stream:
        async for _ in stream:
            first.set()


async def read_responses(client: openai.AsyncOpenAI, first: asyncio.Event) -> None:
    headers = chat(11, held=True)["extra_headers"]
    stream = await client.responses.create(
        model="spec-sim", input="lifecycle", stream=True, extra_headers=headers
    )
    async for _ in stream:
        first.set()


async def read_raw_lines(client: openai.AsyncOpenAI, first: asyncio.Event) -> None:
    manager = client.chat.completions.with_streaming_response.create(**chat(11, held=True))
    async with manager as response:
        async for _ in response.iter_lines():
            first.set()


READERS: dict[str, Reader] = {
    "create": read_create,
    "stream-helper": read_stream_helper,
    "responses": read_responses,
    "raw-lines": read_raw_lines,
}


async def cancel_while_waiting(client: openai.AsyncOpenAI, reader: Reader) -> asyncio.Task[None]:
    """Cancel ``reader``'s task once it has a chunk and waits for the next (held back)."""
    first = asyncio.Event()
    task = asyncio.create_task(reader(client, first))
    await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return task


@pytest.mark.parametrize("api", list(READERS))
async def test_a_cancelled_stream_ends_once_as_stopped_and_the_cancellation_propagates(
    api: str, otel: Otel, async_client: openai.AsyncOpenAI
) -> None:
    """``task.cancel()`` while a stream waits for its next chunk (a chat UI's "stop", a
    server whose client went away): the task ends cancelled, as with the bare SDK, and
    the call ends once as a stream the caller stopped reading — not an error. OTel
    Python counts only ``Exception`` as an error (``use_span``, opentelemetry-sdk 1.45;
    opentelemetry-python#4484), as util-genai 1.1b0's stream wrappers and
    ``GenAIInvocation.__exit__`` do; a cancellation is a ``BaseException``."""
    with uninstrumented():
        bare = await cancel_while_waiting(async_client, READERS[api])
    assert bare.cancelled()
    context = otel_context.get_current()
    with instrumented(otel, genai_metrics=True):
        ours = await cancel_while_waiting(async_client, READERS[api])
    assert ours.cancelled()
    assert otel_context.get_current() is context
    span = only_span(otel)
    assert span.status.status_code is StatusCode.UNSET
    assert ERROR_TYPE not in span.attributes
    assert span.attributes[SD_OUTCOME] == "not_read_to_end"
    assert span.attributes[SD_READ_TO_END] is False
    assert requests_by_outcome(otel) == {"not_read_to_end": 1}


@pytest.mark.parametrize("awaited", ["next-chunk", "response"])
async def test_a_timeout_around_a_call_raises_the_timeout_and_ends_the_call_once(
    awaited: str, otel: Otel, async_client: openai.AsyncOpenAI
) -> None:
    """``asyncio.wait_for`` around the next chunk, or around a non-streamed ``create()``
    the server holds back: the caller gets ``TimeoutError`` as from the bare SDK; inside,
    the call was cancelled, so it ends once, stopped rather than failed."""

    async def call_with_deadline() -> BaseException:
        if awaited == "response":
            pending = async_client.chat.completions.create(**chat(12, stream=False, held=True))
            with pytest.raises(BaseException) as info:
                await asyncio.wait_for(pending, 0.2)
            return info.value
        stream = await async_client.chat.completions.create(**chat(12, held=True))
        await stream.__anext__()  # the first chunk comes at once; the next is held
        with pytest.raises(BaseException) as info:
            await asyncio.wait_for(stream.__anext__(), 0.2)
        await stream.close()
        return info.value

    with uninstrumented():
        bare = await call_with_deadline()
    with instrumented(otel, genai_metrics=True):
        ours = await call_with_deadline()
    assert type(ours) is type(bare)
    assert isinstance(ours, asyncio.TimeoutError)
    span = only_span(otel)
    assert span.status.status_code is StatusCode.UNSET
    assert ERROR_TYPE not in span.attributes
    assert requests_by_outcome(otel) == {"not_read_to_end": 1}


def test_a_keyboard_interrupt_while_a_stream_waits_is_raised_and_ends_the_call_once(
    otel: Otel, sync_client: openai.OpenAI
) -> None:
    """Ctrl-C while the main thread is blocked reading a stream: the user gets their
    ``KeyboardInterrupt``, unchanged, and the call ends once as stopped, not failed."""
    first = threading.Event()
    main = threading.main_thread().ident
    assert main == threading.get_ident()

    def interrupt() -> None:
        first.wait()
        signal.pthread_kill(main, signal.SIGINT)

    with instrumented(otel, genai_metrics=True):
        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        with (
            pytest.raises(KeyboardInterrupt),
            sync_client.chat.completions.create(**chat(13, held=True)) as stream,
        ):
            for _ in stream:
                first.set()
        interrupter.join()
    span = only_span(otel)
    assert span.status.status_code is StatusCode.UNSET
    assert ERROR_TYPE not in span.attributes
    assert requests_by_outcome(otel) == {"not_read_to_end": 1}
