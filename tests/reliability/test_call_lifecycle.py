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
import contextlib
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import StatusCode
from reliability_helpers import (
    API_KEY,
    Otel,
    canary_messages,
    instrumented,
    internal_errors,
    uninstrumented,
)

import spec_decode_otel
from reclaimed import collect
from spec_decode_otel import SpecDecodeInstrumentor, record_from_json
from spec_decode_otel._logging import rate_limited
from spec_decode_otel.adapters import registry
from spec_decode_otel.instrumentation import finalizer
from spec_decode_otel.instrumentation.hints import hints
from spec_decode_otel.records import RecordsFileProcessor
from spec_decode_otel.telemetry import (
    ERROR_TYPE,
    SD_MEAN_ACCEPTANCE_LENGTH,
    SD_NUM_ACCEPTED_DRAFT_TOKENS,
    SD_NUM_SPEC_STEPS,
    SD_OUTCOME,
    SD_READ_TO_END,
    instruments_for,
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
    api: str, otel: Otel, async_openai_client: openai.AsyncOpenAI
) -> None:
    """``task.cancel()`` while a stream waits for its next chunk (a chat UI's "stop", a
    server whose client went away): the task ends cancelled, as with the bare SDK, and
    the call ends once as a stream the caller stopped reading — not an error. OTel
    Python counts only ``Exception`` as an error (``use_span``, opentelemetry-sdk 1.45;
    opentelemetry-python#4484), as util-genai 1.1b0's stream wrappers and
    ``GenAIInvocation.__exit__`` do; a cancellation is a ``BaseException``."""
    with uninstrumented():
        bare = await cancel_while_waiting(async_openai_client, READERS[api])
    assert bare.cancelled()
    context = otel_context.get_current()
    with instrumented(otel, genai_metrics=True):
        ours = await cancel_while_waiting(async_openai_client, READERS[api])
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
    awaited: str, otel: Otel, async_openai_client: openai.AsyncOpenAI
) -> None:
    """``asyncio.wait_for`` around the next chunk, or around a non-streamed ``create()``
    the server holds back: the caller gets ``TimeoutError`` as from the bare SDK; inside,
    the call was cancelled, so it ends once, stopped rather than failed."""

    async def call_with_deadline() -> BaseException:
        if awaited == "response":
            pending = async_openai_client.chat.completions.create(
                **chat(12, stream=False, held=True)
            )
            with pytest.raises(BaseException) as info:
                await asyncio.wait_for(pending, 0.2)
            return info.value
        stream = await async_openai_client.chat.completions.create(**chat(12, held=True))
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
    otel: Otel, openai_client: openai.OpenAI
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
            openai_client.chat.completions.create(**chat(13, held=True)) as stream,
        ):
            for _ in stream:
                first.set()
        interrupter.join()
    span = only_span(otel)
    assert span.status.status_code is StatusCode.UNSET
    assert ERROR_TYPE not in span.attributes
    assert requests_by_outcome(otel) == {"not_read_to_end": 1}


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_while_the_call_ends_is_raised_and_still_ends_its_span(
    raised: type[BaseException], otel: Otel, openai_client: openai.OpenAI
) -> None:
    """Ctrl-C (or ``sys.exit()`` from the app's own handler) landing while the call ends,
    here in the app's log handler writing the include-usage hint that the end logs: the
    user gets it, and the span still ends. The call was already marked ended when it
    came, and only an ``Exception`` ended the span on the way out, so the span stayed
    open for good: no close, exit or collection ended it any more. (Found by sending the
    process SIGINT from such a handler.)"""

    class RaisesOnAWarning(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                raise raised("pressed while a log line was written")

    handler = RaisesOnAWarning()
    log = logging.getLogger("spec_decode_otel")
    hints.reset()  # the include-usage hint is said once per server
    log.addHandler(handler)
    kwargs = chat(14)
    del kwargs["stream_options"]  # no usage chunk: the stream's end logs the hint
    try:
        with instrumented(otel), pytest.raises(raised):
            # The same server's stats, not streamed: said once this stream lacks them.
            openai_client.chat.completions.create(**chat(15, stream=False))
            stream = openai_client.chat.completions.create(**kwargs)
            with stream:
                for _ in stream:
                    pass
    finally:
        log.removeHandler(handler)
        hints.reset()
    assert otel.counter.open == 0
    assert [s.name for s in otel.spans()] == ["chat spec-sim"] * 2
    assert requests_by_outcome(otel) == {"recorded": 1, "no_stats": 1}


# -- threads ---------------------------------------------------------------------------------


def in_thread(work: Callable[[], Any]) -> Any:
    """``work()``'s result, run on a thread of its own (its exception re-raised here)."""
    out: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


@pytest.mark.parametrize("end", ["closed", "collected"])
def test_a_stream_handed_between_threads_ends_once_when_the_last_one_is_done_with_it(
    end: str, otel: Otel, openai_client: openai.OpenAI
) -> None:
    """Opened on one thread, read on a second, closed or dropped on a third (a worker
    pool, a queue of streams): the call ends once, when the third thread closes it (or,
    dropped, once the collector has reclaimed it), with the caller's context untouched on
    every thread."""
    context = otel_context.get_current()
    with instrumented(otel, genai_metrics=True):
        streams = [in_thread(lambda: openai_client.chat.completions.create(**chat(14)))]
        chunks = in_thread(lambda: [next(streams[0]), next(streams[0])])
        assert len(chunks) == 2 and otel.counter.ended == 0
        if end == "closed":
            in_thread(lambda: streams[0].close())
        else:
            in_thread(lambda: (streams.clear(), collect()))
        assert otel.counter.ended == 1
    assert otel_context.get_current() is context
    span = only_span(otel)
    assert span.attributes[SD_OUTCOME] == "not_read_to_end"
    assert requests_by_outcome(otel) == {"not_read_to_end": 1}


@pytest.mark.parametrize("kind", ["stream", "raw-response"])
def test_a_reclaimed_call_never_ends_on_the_thread_the_collector_interrupted(
    kind: str, otel: Otel, openai_client: openai.OpenAI
) -> None:
    """The garbage collector runs a dropped proxy's ``__del__`` on whatever thread it
    interrupts, at any allocation, also inside a lock that ending the call needs. Here a
    span processor holds its lock while the collector runs. In a stress run (abandoned
    streams in reference cycles, a metric reader collecting, GenAI metrics on) the same
    happened inside the SDK's histogram lock: the reader's thread deadlocked within
    seconds on Python 3.11 and 3.13, and every thread after it. Now the call ends
    once, on the finalizer thread, and the interrupted thread goes on."""
    lock = threading.Lock()
    ended_on: list[int] = []

    class Guarded(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            with lock:
                ended_on.append(threading.get_ident())

    otel.tracer_provider.add_span_processor(Guarded())
    with instrumented(otel):
        if kind == "stream":
            dropped: Any = openai_client.chat.completions.create(**chat(22))
            next(dropped)
        else:
            dropped = openai_client.chat.completions.with_raw_response.create(**chat(22))
        cycle: list[Any] = [dropped]
        cycle.append(cycle)  # only the cyclic collector can reclaim it
        del dropped, cycle
        assert otel.counter.ended == 0
        collected = threading.Event()

        def collect_holding_the_lock() -> None:
            with lock:
                gc.collect()
            collected.set()

        interrupted = threading.Thread(target=collect_holding_the_lock, daemon=True)
        interrupted.start()
        assert collected.wait(10), "the thread the collector interrupted deadlocked"
        collect()
    assert ended_on and interrupted.ident not in ended_on
    assert only_span(otel).attributes[SD_OUTCOME] == "not_read_to_end"
    assert requests_by_outcome(otel) == {"not_read_to_end": 1}


def test_a_reclaimed_call_is_dated_when_it_was_reclaimed_not_when_it_was_ended(
    otel: Otel, openai_client: openai.OpenAI
) -> None:
    """The finalizer thread may get to a reclaimed call late (behind a slow span
    processor, or starved of the GIL by a busy thread): the span's end and the GenAI
    duration are the moment the collector reclaimed the stream all the same. Here the
    first reclaimed call's end waits on a span processor's lock for half a second, and
    the second one waits behind it."""
    lock = threading.Lock()

    class Slow(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            with lock:
                pass

    otel.tracer_provider.add_span_processor(Slow())
    reclaimed: list[int] = []
    with instrumented(otel, genai_metrics=True):
        streams = [openai_client.chat.completions.create(**chat(23 + i)) for i in range(2)]
        for stream in streams:
            next(stream)
        del stream
        with lock:
            for _ in range(2):
                reclaimed.append(time.time_ns())
                del streams[0]  # reclaimed now (no cycle): its end goes to the finalizer
            time.sleep(0.5)
        collect()
    spans = sorted(otel.spans(), key=lambda span: span.end_time)
    assert len(spans) == 2 and otel.counter.open == 0
    for span, at in zip(spans, reclaimed, strict=True):
        assert at <= span.end_time < at + 100_000_000  # within 0.1 s of it, not 0.5 s later
    durations = [p.max for p in otel.points("gen_ai.client.operation.duration")]
    assert durations and max(durations) < 0.4


class Exiting(BaseException):
    """Neither an ``Exception`` nor one of Python's own: what ``except Exception`` lets by."""


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt, GeneratorExit, Exiting])
def test_a_span_processor_raising_a_base_exception_leaves_later_reclaimed_calls_ended(
    raised: type[BaseException], otel: Otel, openai_client: openai.OpenAI
) -> None:
    """A span processor's ``on_end`` that raises what is not an ``Exception``
    (``sys.exit()`` in a misbehaving exporter, ``KeyboardInterrupt`` or ``GeneratorExit``
    re-raised from its own code) while the finalizer thread ends a reclaimed call: the
    finalizer caught only ``Exception``, so the thread died (CPython's
    ``threading.excepthook`` ends a thread quietly on ``SystemExit``), and every call
    reclaimed after it kept its span open for ever. In a thread other than the main one
    none of these stops the process (``sys.exit()`` ends only its thread, and signals are
    delivered to the main thread): the finalizer reports it and goes on."""
    raising = [True]

    class RaisesOnce(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            if raising.pop() if raising else False:
                raise raised("a span processor's own")

    otel.tracer_provider.add_span_processor(RaisesOnce())
    with instrumented(otel), internal_errors() as reported:
        for seed in (24, 25):
            dropped = openai_client.chat.completions.create(**chat(seed))
            next(dropped)
            del dropped  # reclaimed now (no cycle): its end goes to the finalizer
            collect()
    assert raising == []
    assert len(reported) == 1 and "internal error in finalizer" in reported[0], reported
    assert raised.__name__ in reported[0]
    assert otel.counter.open == 0 and len(otel.spans()) == 2
    assert requests_by_outcome(otel) == {"not_read_to_end": 2}


def test_concurrent_calls_on_one_client_each_record_their_own_response(
    otel: Otel, openai_client: openai.OpenAI
) -> None:
    """16 threads x 8 calls at once on one client, streamed and not, each with its own
    seed and length: every call's span carries the record of the response that call
    returned (what its own chunks or body give), never another call's. tests/reliability/
    test_load.py checks parents and attributes under load; this checks the records."""
    threads, calls = 16, 8
    start = threading.Barrier(threads)
    returned: dict[int, Any] = {}
    failed: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            start.wait()
            for c in range(calls):
                seed = 100 + t * calls + c
                stream = c % 2 == 0
                with spec_decode_otel.attributes(call=seed):
                    result = openai_client.chat.completions.create(**chat(seed, stream=stream))
                    body: Any = [x.model_dump() for x in result] if stream else result.model_dump()
                returned[seed] = body
        except BaseException as exc:
            failed.append(exc)

    with instrumented(otel):
        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    assert not failed, failed
    assert otel.counter.open == 0
    spans = otel.spans()
    assert sorted(s.attributes["call"] for s in spans) == sorted(returned)
    assert otel.counter_total(REQUESTS) == threads * calls
    fields = (SD_MEAN_ACCEPTANCE_LENGTH, SD_NUM_SPEC_STEPS, SD_NUM_ACCEPTED_DRAFT_TOKENS)
    seen = set()
    for span in spans:
        record = record_from_json(returned[span.attributes["call"]])
        assert record is not None
        expected = (
            record.mean_acceptance_length,
            record.num_spec_steps,
            record.num_accepted_draft_tokens,
        )
        assert tuple(span.attributes[f] for f in fields) == expected
        seen.add(expected)
    assert len(seen) > threads  # the records differ, so a swap could not go unnoticed


# -- instrument / uninstrument / fork ----------------------------------------------------------


def test_a_stream_open_across_uninstrument_ends_once_where_it_started(
    openai_client: openai.OpenAI,
) -> None:
    """``uninstrument()`` (and a new ``instrument()`` with other providers) while a stream
    is open: the stream still ends its call once, into the providers it started with;
    calls made while uninstrumented are not recorded; calls after go to the new ones."""
    first, second = Otel(), Otel()
    try:
        with instrumented(first):
            stream = openai_client.chat.completions.create(**chat(15))
            next(stream)
            SpecDecodeInstrumentor().uninstrument()
            list(openai_client.chat.completions.create(**chat(16)))
            SpecDecodeInstrumentor().instrument(
                tracer_provider=second.tracer_provider, meter_provider=second.meter_provider
            )
            list(openai_client.chat.completions.create(**chat(17)))
            assert (first.counter.started, first.counter.ended) == (1, 0)
            rest = list(stream)
        assert rest and first.counter.open == 0 and second.counter.open == 0
        assert only_span(first).attributes[SD_OUTCOME] == "recorded"
        assert requests_by_outcome(first) == {"recorded": 1}
        assert only_span(second).attributes[SD_OUTCOME] == "recorded"
        assert requests_by_outcome(second) == {"recorded": 1}
    finally:
        second.shutdown()
        first.shutdown()


def forked(work: Callable[[], str]) -> Callable[[], tuple[int, str]]:
    """Fork. The child runs ``work`` (a deadlock ends it after 20 s, with no report),
    writes what it returns through a pipe and exits without returning into pytest. The
    parent gets a function that waits for the child: (its exit code, its report)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 1
        try:
            signal.alarm(20)
            os.write(write, work().encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)

    def wait() -> tuple[int, str]:
        with os.fdopen(read) as pipe:
            report = pipe.read()
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), report

    return wait


def test_a_forked_child_records_its_own_calls_and_the_parent_keeps_its_stream(
    otel: Otel, simulator_url: str, openai_client: openai.OpenAI
) -> None:
    """``os.fork()`` (gunicorn, multiprocessing) while the parent has an instrumented
    stream open: the child's calls are each recorded once, without a deadlock on our
    locks, and the parent's stream still ends once in the parent."""
    with instrumented(otel):
        stream = openai_client.chat.completions.create(**chat(18))
        next(stream)

        def child() -> str:
            started, ended = otel.counter.started, otel.counter.ended
            client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
            list(client.chat.completions.create(**chat(19)))
            with client.chat.completions.create(**chat(20)) as early:
                next(early)
            client.close()
            outcomes = sorted(requests_by_outcome(otel))
            return f"{otel.counter.started - started} {otel.counter.ended - ended} {outcomes}"

        assert forked(child)() == (0, "2 2 ['not_read_to_end', 'recorded']")
        assert otel.counter.ended == 0
        list(stream)
    assert only_span(otel).attributes[SD_OUTCOME] == "recorded"
    assert requests_by_outcome(otel) == {"recorded": 1}


@pytest.mark.parametrize("loaded", [True, False], ids=["loaded", "loading"])
def test_a_child_forked_while_another_thread_holds_the_adapter_registry_detects(
    otel: Otel, simulator_url: str, openai_client: openai.OpenAI, loaded: bool
) -> None:
    """Detection asks the adapter registry for its adapters on every call. It took the
    registry's lock each time, so a ``fork()`` while another thread was in there (or was
    importing plug-ins, on the process's first call) gave the child a lock held for good,
    and every call of the child hung at its end. Here another thread holds the lock as
    the parent forks, with the adapters loaded or (as at the first call) still loading;
    the child's call is recorded."""
    with instrumented(otel):
        openai_client.chat.completions.create(**chat(31, stream=False))
        saved = registry._adapters
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with registry._lock:
                held.set()
                release.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait()
        if not loaded:
            registry._adapters, registry._loading = None, True
        try:

            def child() -> str:
                client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
                client.chat.completions.create(**chat(32, stream=False))
                client.close()
                return str(requests_by_outcome(otel))

            wait = forked(child)
        finally:
            registry._adapters, registry._loading = saved, False
            release.set()
            holder.join()
        assert wait() == (0, "{'recorded': 2}")


def test_a_forked_child_dropping_its_copy_of_the_parents_stream_ends_nothing(
    otel: Otel, simulator_url: str, openai_client: openai.OpenAI
) -> None:
    """A forked child inherits the parent's open stream (multiprocessing, a gunicorn
    preload). When the child drops its copy, the garbage collector reclaims it there; the
    child's finalizer used to end that copy, exporting the parent's call a second time
    from the child, as a stream not read to its end. Now only the child's own calls end
    in the child (here one it drops too), and the parent's stream ends once, in the
    parent."""
    with instrumented(otel):
        inherited = [openai_client.chat.completions.create(**chat(27))]
        next(inherited[0])

        def child() -> str:
            ended = otel.counter.ended
            client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
            own = client.chat.completions.create(**chat(28))
            next(own)
            del own  # starts the child's finalizer, which ends the child's own call
            inherited.clear()
            collect()
            client.close()
            return f"{otel.counter.ended - ended} {requests_by_outcome(otel)}"

        assert forked(child)() == (0, "1 {'not_read_to_end': 1}")
        list(inherited[0])
    assert only_span(otel).attributes[SD_OUTCOME] == "recorded"
    assert requests_by_outcome(otel) == {"recorded": 1}


@pytest.mark.parametrize("how", ["close", "with-exit"])
def test_a_forked_child_closing_its_copy_of_the_parents_stream_ends_nothing(
    otel: Otel, openai_client: openai.OpenAI, how: str
) -> None:
    """The child closes the inherited stream (``close()``, or leaving the parent's
    ``with`` block, as a worker that exits does) instead of dropping it. Only the
    reclaim and exit paths checked the process, so the child ended the parent's call as
    ``not_read_to_end`` and exported the parent's span id; the parent then exported it
    again (found by a helper, 3 of 3 runs)."""
    with instrumented(otel):
        inherited = openai_client.chat.completions.create(**chat(29))
        next(inherited)

        def child() -> str:
            ended = otel.counter.ended
            if how == "close":
                inherited.close()
            else:
                with inherited:
                    pass
            return f"{otel.counter.ended - ended} {requests_by_outcome(otel)}"

        assert forked(child)() == (0, "0 {}")
        list(inherited)
    assert only_span(otel).attributes[SD_OUTCOME] == "recorded"
    assert requests_by_outcome(otel) == {"recorded": 1}


GEVENT_APP = """
import gc, sys, faulthandler
faulthandler.dump_traceback_later(30, exit=True)
# This app does not use trio. httpcore2 imports trio when it is installed, and trio before
# 0.23 cannot be imported once gevent has patched select (a class body reads select.epoll):
# openai.OpenAI() then fails with no instrumentation at all.
sys.modules["trio"] = None
if sys.argv[2] == "first":
    from gevent import monkey
    monkey.patch_all()
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from spec_decode_otel import SpecDecodeInstrumentor
spans = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
from spec_decode_otel.records import RecordsFileProcessor
tracer_provider.add_span_processor(RecordsFileProcessor(sys.argv[3]))
SpecDecodeInstrumentor().instrument(
    tracer_provider=tracer_provider, meter_provider=MeterProvider()
)
if sys.argv[2] == "after":
    from gevent import monkey
    monkey.patch_all()
import gevent, openai, platform
# The SDK's first request runs platform.uname(), which forks under gevent; gevent's own
# fork handling hangs now and then without any instrumentation, so fork here, first.
platform.platform()
client = openai.OpenAI(base_url=sys.argv[1], api_key="x", max_retries=0)
def work(seed):
    headers = {"x-spec-decode-engine": "vllm", "x-sim-seed": str(seed)}
    messages = [{"role": "user", "content": "hi"}]
    stream = client.chat.completions.create(
        model="spec-sim", messages=messages, stream=True, extra_headers=headers
    )
    next(stream)
    del stream
    gc.collect()
    client.chat.completions.create(model="spec-sim", messages=messages, extra_headers=headers)
workers = [gevent.spawn(work, seed) for seed in range(8)]
gevent.joinall(workers, timeout=20)
gevent.sleep(0.5)
print(sum(w.successful() for w in workers),
      sorted(s.attributes["spec_decode.outcome"] for s in spans.get_finished_spans()))
"""


@pytest.mark.parametrize("patched", ["first", "after"])
def test_a_gevent_app_keeps_running_when_a_stream_is_dropped(
    simulator_url: str, patched: str, tmp_path: Path
) -> None:
    """gevent (26.9) monkey-patched first, as gevent asks, or after the instrumentation
    was imported, as under ``opentelemetry-instrument`` with a gunicorn gevent worker,
    whose patching runs after the instrumentors load. Patched after, the finalizer's
    queue was made at import, a C ``SimpleQueue``, and its thread at the first dropped
    stream, by then a greenlet: waiting on the C queue it blocked the only OS thread, for
    good (faulthandler's dump showed it in ``finalizer._run``). Patched either way, the
    finalizer held its lock while its thread started, which under gevent switches to
    other greenlets, one of which could wait for that lock (1 run in 6 hung). Eight
    greenlets each drop a stream and make one more call: all finish, every call's span is
    ended, and each has its records line.

    Forks are kept out: gevent's own fork handling hangs now and then with no
    instrumentation at all (3 runs in 15 of this app without it, forking in
    ``platform.uname()``). That our locks no longer hang a forked gevent child (they were
    held across the fork, and gevent runs other greenlets in the child before the
    after-fork hooks release them) was checked by hand with those ``platform.uname()``
    forks: before, every run hung (one greenlet of four finished); after, none did but
    for gevent's own occasional hang."""
    records = tmp_path / "records.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", GEVENT_APP, simulator_url, patched, str(records)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert sorted(row["outcome"] for row in rows) == ["not_read_to_end"] * 8 + ["recorded"] * 8
    assert done.stdout.split(maxsplit=1) == [
        "8",
        str(["not_read_to_end"] * 8 + ["recorded"] * 8) + "\n",
    ]


def test_a_child_forked_while_the_finalizer_thread_starts_gets_its_own(
    otel: Otel, simulator_url: str, openai_client: openai.OpenAI
) -> None:
    """The first stream or raw response of a process starts the finalizer thread, holding
    the finalizer's lock while ``Thread.start()`` waits for it. A ``fork()`` from another
    thread in that moment (multiprocessing in a threaded app) gave the child a lock that
    nobody would ever release: its first stream hung, and every one after it (4 of 20
    forked children in /tmp/exp9/audit/fork_finalizer_start.py). The lock is held here
    across the fork. The child now makes and drops streams, each ended once in the child;
    and an end still queued in the parent at the fork stays the parent's."""
    with instrumented(otel):
        held, release, queued = threading.Event(), threading.Event(), threading.Event()

        def start_holding_the_lock() -> None:
            with finalizer._lock:
                held.set()
                release.wait()

        finalizer.start()  # the parent's thread runs: queue a marker behind a busy end
        finalizer.defer(lambda: (queued.set(), release.wait()))
        queued.wait()
        holder = threading.Thread(target=start_holding_the_lock)
        holder.start()
        held.wait()
        read, write = os.pipe()
        parent = os.getpid()
        finalizer.defer(lambda: os.getpid() == parent or os.write(write, b"parent's end "))
        pid = os.fork()
        if pid == 0:  # the child: report through the pipe, never return into pytest
            os.close(read)
            code = 1
            try:
                signal.alarm(20)  # a deadlock ends the child; the parent sees no report
                client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
                list(client.chat.completions.create(**chat(25)))
                dropped = client.chat.completions.create(**chat(26))
                next(dropped)
                del dropped
                collect()
                client.close()
                report = f"{otel.counter.ended} {sorted(requests_by_outcome(otel))}"
                os.write(write, report.encode())
                code = 0
            finally:
                os._exit(code)
        release.set()
        holder.join()
        collect()  # the parent's marker has run in the parent: the pipe may close
        os.close(write)
        with os.fdopen(read) as pipe:
            child = pipe.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert child == "2 ['not_read_to_end', 'recorded']"


def writing_a_record(thread: threading.Thread) -> bool:
    """``thread`` is inside ``RecordsFileProcessor.on_end`` (its write blocked)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "on_end" and frame.f_code.co_filename.endswith("records.py"):
            return True
        frame = frame.f_back
    return False


def test_a_child_forked_while_a_records_line_is_written_records_its_own_calls(
    otel: Otel, simulator_url: str, openai_client: openai.OpenAI
) -> None:
    """``RecordsFileProcessor`` writes and flushes each line under its lock, in the thread
    that ends the call. A ``fork()`` from another thread in the middle of a write gave the
    child that lock held by a thread it does not have: its first call's span end waited
    forever (56 of 60 children forked while two threads made calls, in
    /tmp/exp9/audit/forkstress.py: the writer releases the GIL inside the write, which is
    when another thread gets to fork). Here the records go to a full pipe, so a write is
    certainly in progress at the fork; the fork now waits for it, and the child's call
    writes its own line."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write, b"\n" * 4096)  # fill the pipe: the next write blocks
    os.set_blocking(write, True)
    target = os.fdopen(write, "w", encoding="utf-8")
    drained: list[bytes] = []

    def drain() -> None:
        time.sleep(0.5)  # well after the fork has started to wait
        while chunk := os.read(read, 65536):
            drained.append(chunk)

    otel.tracer_provider.add_span_processor(RecordsFileProcessor(target))
    with instrumented(otel):
        writer = threading.Thread(
            target=lambda: openai_client.chat.completions.create(**chat(27, stream=False))
        )
        writer.start()
        while not writing_a_record(writer):
            assert writer.is_alive()
            time.sleep(0.01)
        drainer = threading.Thread(target=drain)
        drainer.start()

        def child() -> str:
            client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
            client.chat.completions.create(**chat(28, stream=False))
            client.close()
            return "ended"

        ended = forked(child)()
        writer.join()
    target.close()
    drainer.join()
    assert ended == (0, "ended")
    rows = [json.loads(line) for line in b"".join(drained).decode().splitlines() if line]
    assert len(rows) == 2  # the parent's line, once, and the child's


def test_children_forked_while_threads_write_records_lines_never_wait_for_its_lock(
    tmp_path: Path,
) -> None:
    """Eight threads end spans into a ``RecordsFileProcessor`` while the main thread forks
    twenty children, each of which ends one span. A helper saw 32 of 40 such children
    wait for good for the records lock (``/tmp/s31/h8/fork_hang.py``): the after-fork
    hook released the inherited lock only when ``locked()`` said it was held, and
    CPython 3.11 marks a lock held only once the acquiring thread has the interpreter lock
    back, so a lock just taken by a thread still waiting for it looked free and stayed
    taken. The child now gets a new lock."""
    provider = TracerProvider()
    provider.add_span_processor(RecordsFileProcessor(str(tmp_path / "records.jsonl")))
    tracer = provider.get_tracer("forking-app")
    attributes = {SD_OUTCOME: "error", "gen_ai.request.model": "m"}
    stop = threading.Event()

    def end_spans() -> None:
        while not stop.is_set():
            tracer.start_span("call", attributes=attributes).end()

    def end_one() -> str:
        ender = threading.Thread(
            target=lambda: tracer.start_span("child", attributes=attributes).end(), daemon=True
        )
        ender.start()
        ender.join(5)
        return "waiting" if ender.is_alive() else "ended"

    threads = [threading.Thread(target=end_spans) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.2)
        reports = [forked(end_one)() for _ in range(20)]
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        provider.shutdown()
    assert reports == [(0, "ended")] * 20


def test_a_child_forked_while_another_thread_counts_a_call_records_its_own_calls(
    otel: Otel, simulator_url: str, openai_client: openai.OpenAI
) -> None:
    """Ending a call takes the locks of our counters (``spec_decode.*`` sums, also read
    by the metric reader's thread), of the bounded metric attributes and of the hints,
    each for a moment. A ``fork()`` from another thread in that moment gave the child the
    lock held for good, and its first call waited forever: 9 of 400 children forked while
    two threads made calls and a reader collected (/tmp/exp9/audit/forkstress.py; the 6
    others hung in the SDK's own histogram locks). Here another thread holds them all as
    the parent forks; the child gets them unlocked, and records its call."""
    with instrumented(otel):
        openai_client.chat.completions.create(**chat(29, stream=False))
        instruments = instruments_for(otel.meter_provider)
        sums = (instruments.requests, instruments.draft_tokens, instruments.verify_steps)
        locks = [totals._lock for totals in sums]
        locks += [instruments._bounded_lock, hints._lock, rate_limited._lock]
        held = threading.Event()

        def hold_for_a_moment() -> None:
            with contextlib.ExitStack() as stack:
                for lock in locks:
                    stack.enter_context(lock)
                held.set()
                time.sleep(0.3)

        holder = threading.Thread(target=hold_for_a_moment)
        holder.start()
        held.wait()

        def child() -> str:
            client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
            client.chat.completions.create(**chat(30, stream=False))
            client.close()
            return str(requests_by_outcome(otel))

        ended = forked(child)()
        holder.join()
    assert ended == (0, "{'recorded': 2}")  # the parent's call (before the fork) and its own


# -- what user code sees ---------------------------------------------------------------------

#: extra_body's stream_options -> (a usage chunk reaches the user, the call's outcome)
EXTRA_STREAM_OPTIONS = {
    "include_usage": ({"include_usage": True}, True, "recorded"),
    "no_usage": ({"include_usage": False}, False, "no_stats"),
    "other_option": ({"continuous_usage_stats": False}, False, "recorded"),
}


@pytest.mark.parametrize("case", list(EXTRA_STREAM_OPTIONS))
def test_stream_options_sent_through_extra_body_are_the_users(
    case: str, otel: Otel, openai_client: openai.OpenAI
) -> None:
    """The SDK merges ``extra_body`` over the body it sends (``_build_request``, openai
    3.60), so ``stream_options`` set there are the user's: with ``inject_include_usage``
    on, a user who asked for the usage chunk that way still gets it; one who said no is
    not overridden; and one who sent another stream option gets it plus the injected
    ``include_usage``, hidden from them as usual. Each sees what the bare SDK shows, but
    for the ``system_fingerprint`` vLLM then puts on that hidden chunk."""
    stream_options, usage_seen, outcome = EXTRA_STREAM_OPTIONS[case]
    kwargs = chat(21)
    del kwargs["stream_options"]
    kwargs["extra_body"] = {"stream_options": stream_options}

    def visible() -> list[dict[str, Any]]:
        stream = openai_client.chat.completions.create(**kwargs)
        return [c.model_dump(exclude={"id", "created"}) for c in stream]

    with uninstrumented():
        bare = visible()
    with instrumented(otel, inject_include_usage=True):
        ours = visible()
    if case == "other_option":
        # Our include_usage moves vLLM 0.34.0's system_fingerprint from the finish chunk
        # to the usage chunk we hide (README, inject_include_usage).
        assert bare[-1]["system_fingerprint"]
        bare = [{**chunk, "system_fingerprint": None} for chunk in bare]
    assert ours == bare
    assert (ours[-1]["usage"] is not None) is usage_seen
    assert only_span(otel).attributes[SD_OUTCOME] == outcome
    assert requests_by_outcome(otel) == {outcome: 1}
