"""Shared helpers of the reliability tests (imported by basename: this directory is on
``sys.path`` while its tests are collected).

- ``Otel``: a fresh TracerProvider (in-memory exporter + a start/end counter) and a fresh
  MeterProvider (in-memory reader) with readers for the numbers the tests compare;
- ``instrumented(otel, **settings)``: process-wide instrumentation bound to those
  providers, undone on exit (a fresh pair per use, so no instrument outlives its test);
- ``mock_client`` / ``async_mock_client``: real ``openai`` clients over an in-process
  ``httpx2.MockTransport`` (the SDK's own transport type; nothing of the SDK is replaced);
- ``async_client(base_url, transport)``: an ``AsyncOpenAI`` on the SDK's default
  transport (``httpx``) or its aiohttp one (``openai.DefaultAioHttpClient``);
- ``canary()``: a prompt the privacy scan recognises if it ever shows up in telemetry;
- ``internal_errors()``: every internal error the library reports inside the block.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import spec_decode_otel
from spec_decode_otel import _logging
from spec_decode_otel.instrumentation import SpecDecodeInstrumentor
from spec_decode_otel.telemetry import SCOPE_NAME

API_KEY = "sk-test"
MOCK_BASE_URL = "http://simulator.invalid/v1"


def canary() -> str:
    """A prompt nobody else sends; the session privacy scan fails if it is ever exported."""
    return f"CANARY-PROMPT-{uuid.uuid4().hex}"


def canary_messages() -> list[dict[str, str]]:
    return [{"role": "user", "content": canary()}]


class _InternalErrors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "internal error" in message:
            self.messages.append(f"{message}: {record.exc_info and record.exc_info[1]!r}")


@contextlib.contextmanager
def internal_errors() -> Iterator[list[str]]:
    """Every internal error the library reports inside the block, as it reports them:
    the first of the process as a WARNING, the later ones at DEBUG, here with no rate
    limit so none is missed. What a server sends must never cause one: bad input gets
    a debug log of its own and no record."""
    logger = logging.getLogger("spec_decode_otel")
    handler = _InternalErrors()
    saved_level, saved_limit = logger.level, _logging.rate_limited
    _logging.rate_limited = _logging.RateLimitedLog(interval=0.0)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved_level)
        _logging.rate_limited = saved_limit


@contextlib.contextmanager
def no_litellm_call_open() -> Iterator[None]:
    """No LiteLLM call counts as open inside the block, whatever earlier tests left.

    While a LiteLLM call is open the openai wrapper notes each SDK stream for the LiteLLM
    callback (``integrations.note_openai_stream``, a cache bounded at ``MAX_STREAMS``).
    A call an earlier test left (its stream not yet reclaimed, or its end still queued in
    LiteLLM's logging worker) is still open here, and that worker, running events of
    earlier tests, sets the count of open calls again from the callback's table whenever a
    call ends. So the table is swapped for an empty one too (when the callback's module is
    loaded at all).
    """
    import sys

    from spec_decode_otel import integrations

    callback_module = sys.modules.get("spec_decode_otel.integrations.litellm")
    saved_count = integrations._open_litellm_calls
    saved_calls = getattr(callback_module, "_calls", None)
    if callback_module is not None:
        callback_module._calls = callback_module._Calls()
    integrations.set_open_litellm_calls(0)
    try:
        yield
    finally:
        if callback_module is not None:
            callback_module._calls = saved_calls
        integrations.set_open_litellm_calls(saved_count)


class SpanCounter(SpanProcessor):
    """Counts spans started and ended (open spans = started - ended)."""

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0
        self._lock = threading.Lock()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        with self._lock:
            self.started += 1

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self.ended += 1

    @property
    def open(self) -> int:
        return self.started - self.ended

    def open_after(self, seconds: float) -> int:
        """Spans still open once ``seconds`` have passed with some open: a stream the
        user dropped is ended on the finalizer's thread, a moment after its proxy goes."""
        deadline = time.monotonic() + seconds
        while self.open and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.open

    async def open_after_async(self, seconds: float) -> int:
        """:meth:`open_after` for a test on an event loop: waits without blocking the loop
        that may still be reading the stream."""
        deadline = time.monotonic() + seconds
        while self.open and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return self.open


@dataclass
class Otel:
    """Fresh providers whose output a test can read back."""

    keep_spans: bool = True
    tracer_provider: TracerProvider = field(init=False)
    meter_provider: MeterProvider = field(init=False)
    exporter: InMemorySpanExporter = field(init=False)
    reader: InMemoryMetricReader = field(init=False)
    counter: SpanCounter = field(init=False)

    def __post_init__(self) -> None:
        self.tracer_provider = TracerProvider(shutdown_on_exit=False)
        self.counter = SpanCounter()
        self.tracer_provider.add_span_processor(self.counter)
        self.exporter = InMemorySpanExporter()
        if self.keep_spans:
            self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader], shutdown_on_exit=False)

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()

    def spans(self, scope: str | None = SCOPE_NAME) -> list[ReadableSpan]:
        spans = self.exporter.get_finished_spans()
        if scope is None:
            return list(spans)
        return [s for s in spans if s.instrumentation_scope.name == scope]

    def points(self, name: str) -> list[Any]:
        """Every data point of metric ``name`` in one fresh collection."""
        data = self.reader.get_metrics_data()
        out: list[Any] = []
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        out.extend(metric.data.data_points)
        return out

    def counter_total(self, name: str) -> int:
        return sum(p.value for p in self.points(name))

    def histogram_count(self, name: str) -> int:
        return sum(p.count for p in self.points(name))


@contextlib.contextmanager
def instrumented(otel: Otel, **settings: Any) -> Iterator[Otel]:
    """Process-wide instrumentation into ``otel``'s providers for the ``with`` block."""
    if SpecDecodeInstrumentor().is_instrumented_by_opentelemetry:
        # Left over by an earlier test: undo it, or our providers would see nothing.
        spec_decode_otel.SpecDecodeInstrumentor().uninstrument()
    spec_decode_otel.SpecDecodeInstrumentor().instrument(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider, **settings
    )
    try:
        yield otel
    finally:
        spec_decode_otel.SpecDecodeInstrumentor().uninstrument()


@contextlib.contextmanager
def uninstrumented() -> Iterator[None]:
    """Assert nothing wraps the SDK in the block (the bare-SDK side of a comparison)."""
    if SpecDecodeInstrumentor().is_instrumented_by_opentelemetry:
        spec_decode_otel.SpecDecodeInstrumentor().uninstrument()
    yield


Handler = Callable[[httpx2.Request], httpx2.Response]


def mock_client(handler: Handler, **kwargs: Any) -> openai.OpenAI:
    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    return openai.OpenAI(
        api_key=API_KEY, base_url=MOCK_BASE_URL, http_client=http, max_retries=0, **kwargs
    )


def async_mock_client(handler: Handler, **kwargs: Any) -> openai.AsyncOpenAI:
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    return openai.AsyncOpenAI(
        api_key=API_KEY, base_url=MOCK_BASE_URL, http_client=http, max_retries=0, **kwargs
    )


def async_client(base_url: str, transport: str) -> openai.AsyncOpenAI:
    """``transport``: ``httpx``, the SDK's default, or ``aiohttp``, the one the SDK
    recommends for concurrent async code."""
    http = openai.DefaultAioHttpClient() if transport == "aiohttp" else None
    return openai.AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0, http_client=http)


def sse(chunks: list[Any]) -> bytes:
    """A chunk list as the SSE body an OpenAI-compatible server streams."""
    import json

    parts = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


def json_response(body: Any) -> httpx2.Response:
    return httpx2.Response(200, json=body)


def sse_response(body: bytes) -> httpx2.Response:
    return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})
