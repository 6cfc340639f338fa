"""Real ``openai`` clients that keep every raw response, and real OTel SDK providers.

- ``CaptureTransport`` / ``AsyncCaptureTransport``: the SDK's own HTTP transport
  (``httpx2.HTTPTransport``), passing every byte through unchanged while keeping a copy
  of each response body (JSON or SSE) as the server sent it. The tests read each
  response's own ``timings`` from that copy, beside what the instrumentation recorded.
- ``instrumented(...)``: ``SpecDecodeInstrumentor().instrument(tracer_provider=...,
  meter_provider=...)`` with an SDK TracerProvider + InMemorySpanExporter and a
  MeterProvider + InMemoryMetricReader (or any readers/processors given), undone on exit.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spec_decode_otel import SpecDecodeInstrumentor

SCOPE = "spec_decode_otel"

# Span attributes and metric names (README, "Telemetry reference").
A_ENGINE = "spec_decode.engine"
A_DRAFTED = "spec_decode.num_draft_tokens"
A_ACCEPTED = "spec_decode.num_accepted_draft_tokens"
A_RATE = "spec_decode.draft_acceptance_rate"
A_PARTIAL = "spec_decode.partial"
M_DRAFT_TOKENS = "spec_decode.draft_tokens"
M_ACCEPTED_DRAFT_TOKENS = "spec_decode.accepted_draft_tokens"


# --------------------------------------------------------------------------- raw bodies


#: Where an SSE line ends (the event-stream format: CRLF, LF or CR).
SSE_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass
class RawExchange:
    """One request and the raw response body the server sent for it."""

    path: str
    request: dict[str, Any]
    status: int
    content_type: str
    text: str

    @property
    def is_sse(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    def messages(self) -> list[dict[str, Any]]:
        """The JSON body, or every ``data:`` event of an SSE body (``[DONE]`` left out)."""
        if not self.is_sse:
            return [json.loads(self.text)]
        events = []
        # Not str.splitlines, which also splits at U+2028/U+2029: llama.cpp sends those
        # raw inside a JSON string (legal JSON) when the reply holds one.
        for line in SSE_LINE_END.split(self.text):
            if line.startswith("data:"):
                data = line[len("data:") :].strip()
                if data and data != "[DONE]":
                    events.append(json.loads(data))
        return events

    def timings(self) -> dict[str, Any]:
        """The response's final ``timings``: the last message's that carries one.

        Not "exactly one": on a stop-string hit llama.cpp b11312 sends ``timings`` twice,
        on the partial chunk of the token that completed the stop and on the final chunk
        (``send_partial_response`` in ``tools/server/server-context.cpp`` fills ``stats``
        once ``slot.stop`` is set, which ``find_stopping_strings`` does before that
        partial goes out), and ``timings_per_token`` puts running ones on every chunk.
        The last is the request's, as the adapter reads it."""
        return self.timings_message()["timings"]

    def timings_message(self) -> dict[str, Any]:
        """The last message carrying ``timings`` (there must be one)."""
        found = [m for m in self.messages() if "timings" in m]
        assert found, f"no message carries timings in {self.text[:2000]}"
        return found[-1]


class _Tee:
    def __init__(self, request: httpx2.Request, response: httpx2.Response, sink: Exchanges):
        self._request = request
        self._response = response
        self._sink = sink
        self._buf = bytearray()
        self._done = False

    def add(self, chunk: bytes) -> bytes:
        self._buf += chunk
        return chunk

    def finish(self) -> None:
        if self._done:
            return
        self._done = True
        headers = self._response.headers
        assert not headers.get("content-encoding"), "compressed body: cannot keep it raw"
        body = self._request.content
        self._sink.add(
            RawExchange(
                path=self._request.url.path,
                request=json.loads(body) if body else {},
                status=self._response.status_code,
                content_type=headers.get("content-type", ""),
                text=self._buf.decode("utf-8"),
            )
        )


class _TeeStream(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, tee: _Tee) -> None:
        self._inner = inner
        self._tee = tee

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            yield self._tee.add(chunk)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._tee.finish()


class _AsyncTeeStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, tee: _Tee) -> None:
        self._inner = inner
        self._tee = tee

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield self._tee.add(chunk)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._tee.finish()


@dataclass
class Exchanges:
    """Every raw exchange of the clients made with it, in the order they completed."""

    items: list[RawExchange] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, exchange: RawExchange) -> None:
        with self._lock:
            self.items.append(exchange)

    def take(self) -> list[RawExchange]:
        with self._lock:
            items, self.items = self.items, []
        return items


class CaptureTransport(httpx2.HTTPTransport):
    def __init__(self, sink: Exchanges) -> None:
        super().__init__()
        self._sink = sink

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = super().handle_request(request)
        tee = _Tee(request, response, self._sink)
        assert isinstance(response.stream, httpx2.SyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_TeeStream(response.stream, tee),
            extensions=response.extensions,
            request=request,
        )


class AsyncCaptureTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, sink: Exchanges) -> None:
        super().__init__()
        self._sink = sink

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        tee = _Tee(request, response, self._sink)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_AsyncTeeStream(response.stream, tee),
            extensions=response.extensions,
            request=request,
        )


def sync_client(base_url: str, sink: Exchanges) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=base_url,
        api_key="sk-none",
        max_retries=0,
        timeout=120.0,
        http_client=openai.DefaultHttpxClient(transport=CaptureTransport(sink)),
    )


def async_client(base_url: str, sink: Exchanges) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key="sk-none",
        max_retries=0,
        timeout=120.0,
        http_client=openai.DefaultAsyncHttpxClient(transport=AsyncCaptureTransport(sink)),
    )


# --------------------------------------------------------------------------- telemetry


@dataclass
class Telemetry:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self) -> list[ReadableSpan]:
        """Finished spans of this instrumentation, in the order they ended."""
        return [
            s
            for s in self.exporter.get_finished_spans()
            if s.instrumentation_scope is not None and s.instrumentation_scope.name == SCOPE
        ]

    def take_spans(self) -> list[ReadableSpan]:
        spans = self.spans()
        self.exporter.clear()
        return spans

    def counter_total(self, name: str) -> float:
        """Sum over every data point (all attribute sets) of the cumulative counter."""
        total = 0.0
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        total += sum(p.value for p in metric.data.data_points)
        return total


@contextlib.contextmanager
def instrumented(
    *,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
    resource: Any = None,
    **options: Any,
) -> Iterator[Telemetry]:
    """Instrument every ``openai`` client with fresh SDK providers; undo it on exit."""
    exporter = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    kwargs: dict[str, Any] = {} if resource is None else {"resource": resource}
    tracer_provider = TracerProvider(**kwargs)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    for processor in span_processors:
        tracer_provider.add_span_processor(processor)
    meter_provider = MeterProvider(metric_readers=[reader, *metric_readers], **kwargs)
    instrumentor = SpecDecodeInstrumentor()
    # Another test's leftover instrumentation would make this instrument() a no-op and
    # send our calls to its providers.
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    instrumentor.instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider, **options
    )
    try:
        yield Telemetry(tracer_provider, meter_provider, exporter, reader)
    finally:
        SpecDecodeInstrumentor().uninstrument()
        meter_provider.shutdown()
        tracer_provider.shutdown()


def expected_attributes(timings: dict[str, Any]) -> dict[str, Any]:
    """The span attributes llama.cpp's ``timings`` must give (README, "The record")."""
    drafted, accepted = timings["draft_n"], timings["draft_n_accepted"]
    return {
        A_ENGINE: "llamacpp",
        A_DRAFTED: drafted,
        A_ACCEPTED: accepted,
        A_RATE: accepted / drafted if drafted else 0.0,
        A_PARTIAL: True,
    }


def spec_attributes(span: ReadableSpan) -> dict[str, Any]:
    return {k: v for k, v in (span.attributes or {}).items() if k.startswith("spec_decode.")}
