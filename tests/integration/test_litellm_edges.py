"""LiteLLM 1.110.2 at its edges: one span per call when calls interleave, fail, or are
left unread, against the simulator over real HTTP.

Fixtures, leak filters and helpers come from ``test_litellm``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm
import openai
import pytest
from framework_relay import Recorded, Relay
from instrumentation_helpers import (
    MODEL,
    Otel,
    expected_span_attributes,
    request_kwargs,
    spec_decode_attributes,
)
from opentelemetry.trace import StatusCode
from test_litellm import (  # noqa: F401  # the fixtures are used by name
    collect_litellm_leaks,
    litellm_callbacks,
    litellm_clients,
    litellm_kwargs,
    pytestmark,
    seed_for,
    settled_spans,
)

import spec_decode_otel


@pytest.fixture(autouse=True)
def no_call_left_open() -> Iterator[None]:
    """Streams these tests drop stay open calls for LiteLLM (it never reports their end),
    which would leave the stream notes of later tests' openai SDK calls on: forget them."""
    from spec_decode_otel.integrations import litellm as callback_module
    from spec_decode_otel.integrations import set_open_litellm_calls

    yield
    callback_module._calls = callback_module._Calls()
    set_open_litellm_calls(0)


def open_stream(api: str, mode: str, base_url: str, seed: str) -> Any:
    """A stream LiteLLM reads with its own handler (``hosted_vllm/``): its chat
    completion, or its Responses call (posted to the server's ``/v1/responses``)."""
    if api == "chat":
        kwargs = litellm_kwargs(
            "hosted_vllm", request_kwargs("vllm", "chat", True, seed_for(seed)), base_url
        )
        return litellm.acompletion(**kwargs) if mode == "async" else litellm.completion(**kwargs)
    kwargs = {
        "model": f"hosted_vllm/{MODEL}",
        "input": "Name three stripes.",
        "stream": True,
        "api_base": base_url,
        "api_key": "sk-t",
        "extra_headers": {"x-sim-seed": str(seed_for(seed))},
    }
    return litellm.aresponses(**kwargs) if mode == "async" else litellm.responses(**kwargs)


@pytest.mark.parametrize("between", ["openai SDK", "litellm openai/"])
@pytest.mark.parametrize(("api", "mode"), [("chat", "async"), ("responses", "async"),
                                           ("responses", "sync")])  # fmt: skip
async def test_a_stream_read_around_an_sdk_call_in_the_same_context_keeps_its_span(
    api: str, mode: str, between: str, otel: Otel, simulator_url: str
) -> None:
    """A ``hosted_vllm/`` stream (chat or Responses) read in part, then an openai SDK
    call (the app's own, or LiteLLM's ``openai/`` route) in the same task or thread, then
    the rest of the stream: two calls, two spans.

    LiteLLM 1.110.2 reports a stream's end from the context that read it to its end
    (``CustomStreamWrapper.__anext__`` creates the logging task from the reading task,
    litellm/litellm_core_utils/streaming_handler.py; the Responses iterators likewise,
    litellm/responses/streaming_iterator.py). The callback took any SDK request made in
    that context after the call started for the call's own, and skipped the stream as
    the openai wrapper's, though LiteLLM had already logged its answer (the call's mark
    decided) without one: the user saw the SDK call's span and none for the stream."""
    otel.instrument()
    sdk_request = request_kwargs("vllm", "chat", False, seed_for("between", api, mode))
    client = openai.AsyncOpenAI(api_key="sk-t", base_url=simulator_url, max_retries=0)
    sync_client = openai.OpenAI(api_key="sk-t", base_url=simulator_url, max_retries=0)
    via_litellm = litellm_kwargs("openai", sdk_request, simulator_url)
    try:
        if mode == "async":
            stream = await open_stream(api, mode, simulator_url, f"{api}-{between}")
            assert await stream.__anext__()
            if between == "openai SDK":
                await client.chat.completions.create(**sdk_request)
            else:
                await litellm.acompletion(**via_litellm)
            assert [chunk async for chunk in stream]
        else:

            def read_around() -> None:  # in a thread without an event loop, as in a script
                stream = iter(open_stream(api, mode, simulator_url, f"{api}-{between}"))
                assert next(stream)
                if between == "openai SDK":
                    sync_client.chat.completions.create(**sdk_request)
                else:
                    litellm.completion(**via_litellm)
                assert list(stream)

            await asyncio.to_thread(read_around)
    finally:
        await client.close()
        sync_client.close()

    spans = await settled_spans(otel, 2)
    # the SDK call's record, and the stream's span (LiteLLM's own handler keeps no stats)
    assert sorted(s.attributes["spec_decode.outcome"] for s in spans) == ["no_stats", "recorded"]
    assert otel.requests_by_outcome() == {"no_stats": 1, "recorded": 1}


class FailsFirst(Relay):
    """The simulator behind a relay that answers its first request 500, as an engine
    restarting or overloaded does, and forwards the rest."""

    def forward(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        with self._lock:
            first = not self.requests
            if first:
                self.requests.append(Recorded(path, headers, body))
        if first:
            return 500, "application/json", b'{"error": {"message": "overloaded"}}'
        return super().forward(path, headers, body)


async def test_an_answer_litellm_retried_for_has_its_record(otel: Otel, simulator_url: str) -> None:
    """``await litellm.acompletion(model="hosted_vllm/...", num_retries=2)``: the first
    request gets a 500, LiteLLM's retry gets the answer, with its stats. The user saw the
    first attempt's error span and nothing for the answer.

    LiteLLM 1.110.2 logs the first attempt's failure (``wrapper_async``, utils.py), then
    retries through ``acompletion_with_retries`` (main.py) with ``original_function``,
    the undecorated ``acompletion``: the retry never passes through the wrapper that
    sends the success event, so no callback hears of the answer, then or later. It does
    log the answer's body (``log_post_api_call``), where the callback now records it."""
    otel.instrument()
    request = request_kwargs("vllm", "chat", False, seed_for("retried"))
    with FailsFirst(simulator_url) as relay:
        kwargs = {**litellm_kwargs("hosted_vllm", request, relay.url), "num_retries": 2}
        response = await litellm.acompletion(**kwargs)
        assert response.choices[0].message.content
        assert len(relay.requests) == 2
        record = spec_decode_otel.record_from_json(relay.replay(1))
    assert record is not None

    failed, answer = sorted(await settled_spans(otel, 2), key=lambda s: s.start_time)
    assert failed.status.status_code is StatusCode.ERROR
    assert answer.status.status_code is StatusCode.UNSET
    assert spec_decode_attributes(answer.attributes) == expected_span_attributes(record)
    assert otel.requests_by_outcome() == {"error": 1, "recorded": 1}


async def test_calls_litellm_never_ends_are_kept_at_most_max_calls(
    otel: Otel, simulator_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams read in part and dropped, or closed: LiteLLM 1.110.2 reports their end
    only when read to the end (``CustomStreamWrapper``, streaming_handler.py; its
    ``close()`` sends nothing), so they get no span from the callback and stay open.
    What is kept of them is bounded: past ``MAX_CALLS``, the oldest is forgotten. They
    are forgotten only so (nothing tells a dropped stream from a slow one), so the count
    of open calls never falls back to zero; a later call is still recorded."""
    from spec_decode_otel import integrations
    from spec_decode_otel.integrations import litellm as callback_module

    monkeypatch.setattr(callback_module, "MAX_CALLS", 2)
    otel.instrument()
    for index in range(4):
        request = request_kwargs("vllm", "chat", True, seed_for("dropped", str(index)))
        stream = litellm.completion(**litellm_kwargs("hosted_vllm", request, simulator_url))
        assert next(iter(stream))
        stream.close()
    assert len(callback_module._calls._started) == 2
    assert integrations._open_litellm_calls == 2

    request = request_kwargs("vllm", "chat", False, seed_for("after the dropped ones"))
    await litellm.acompletion(**litellm_kwargs("hosted_vllm", request, simulator_url))
    (span,) = await settled_spans(otel)
    assert span.attributes["spec_decode.outcome"] == "recorded"
    # its start pushed out one more dropped stream; its end closed it
    assert integrations._open_litellm_calls == len(callback_module._calls._started) == 1


@pytest.mark.parametrize("route", ["hosted_vllm", "openai"])
def test_a_call_kept_open_keeps_no_prediction_content(
    route: str, otel: Otel, simulator_url: str
) -> None:
    """A ``prediction`` (OpenAI's Predicted Outputs, which LiteLLM 1.110.2 sends on both
    routes) is the text the model is expected to write: content, often a whole file. The
    callback keeps each call's request body, without its content, until LiteLLM reports
    the call's end, which for a dropped stream it never does (up to ``MAX_CALLS`` calls).
    So what is kept of the prediction is only that there was one, which is all the
    ``usage`` pair's reading needs (a request with a prediction has its usage counts read
    as Predicted Outputs, not speculative decoding)."""
    from spec_decode_otel.integrations import litellm as callback_module

    otel.instrument()
    predicted = "the predicted text " * 1000
    request = request_kwargs("vllm", "chat", True, seed_for("prediction", route))
    kwargs = litellm_kwargs(route, request, simulator_url)
    stream = litellm.completion(**kwargs, prediction={"type": "content", "content": predicted})
    try:
        assert next(iter(stream))
        kept = [started.request for started in callback_module._calls._started.values()]
    finally:
        stream.close()
    assert kept and kept[-1] is not None
    assert kept[-1]["prediction"] == {"type": "content"}
    assert "the predicted text" not in repr(kept)


#: LiteLLM 1.110.2 leaves its logging worker's task on the loop that closes, and says so
#: when the task is collected.
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <coroutine object LoggingWorker._worker_loop"
    ":pytest.PytestUnraisableExceptionWarning"
)
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_async_call_whose_loop_ends_with_it_has_its_span(
    api: str, otel: Otel, simulator_url: str
) -> None:
    """``asyncio.run(litellm.acompletion(model="hosted_vllm/...", ...))``, as a script, a
    CLI or a sync web handler makes one async call: the call returned, its stats were on
    the response, and it had no span, nor metric points, while the program ran; at exit,
    LiteLLM's atexit flush gave it one if the tracer provider was not shut down yet
    (lost when ``litellm`` was imported before the providers were made: their atexit
    shutdown runs first).

    LiteLLM 1.110.2 sends a non-streamed async call's success event to a callback with
    an async hook only through its logging worker's queue
    (``_client_async_logging_helper``, utils.py; ``LoggingWorker``,
    litellm_core_utils/logging_worker.py), which runs on the caller's loop; ``asyncio.run``
    closes that loop as the call returns, and the queued event waits for the next loop
    LiteLLM runs, or exit (``_flush_on_exit``). LiteLLM logged the answer's body as it
    came (``log_post_api_call``)."""
    otel.instrument()
    seed = seed_for("loop ends", api)
    if api == "chat":
        request = litellm_kwargs(
            "hosted_vllm", request_kwargs("vllm", "chat", False, seed), simulator_url
        )
        call = litellm.acompletion
    else:
        request = {
            "model": f"hosted_vllm/{MODEL}",
            "input": "Name three stripes.",
            "api_base": simulator_url,
            "api_key": "sk-t",
            "extra_headers": {"x-sim-seed": str(seed)},
        }
        call = litellm.aresponses

    def script() -> Any:
        async def main() -> Any:
            return await call(**request)

        return asyncio.run(main())

    assert await asyncio.to_thread(script)
    (span,) = await settled_spans(otel)
    expected = "recorded" if api == "chat" else "no_stats"  # vLLM's Responses: no stats
    assert span.attributes["spec_decode.outcome"] == expected
    assert otel.requests_by_outcome() == {expected: 1}
