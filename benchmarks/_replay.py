"""Replaying recorded simulator bodies into the real ``openai`` SDK, in process.

The SDK's transport is swapped for ``httpx2.MockTransport`` answering every request with
a body recorded from the simulator (``record_payloads.py``), so no socket, server or
event loop is involved: what a benchmark times is the client's own CPU work — the SDK's
request building and response parsing plus whatever instrumentation wraps it.

Also here: the real OpenTelemetry SDK providers every instrumented configuration uses
(spans go through a ``BatchSpanProcessor`` to an exporter that drops them; metrics are
aggregated by a ``MeterProvider`` whose reader is never collected during timing), and
the configurations the overhead benchmark compares.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"

MESSAGES = [{"role": "user", "content": "Summarise speculative decoding in two paragraphs."}]

#: name → (label, description). A is the baseline every overhead is measured against.
CONFIGS: dict[str, tuple[str, str]] = {
    "A": ("bare SDK", "openai SDK, no instrumentation"),
    "B": (
        "ours (full)",
        "spec_decode_otel, default settings: own span + attributes + all its metrics",
    ),
    "C": ("ours enrich + openai-v2", "openai-v2 span, spec_decode_otel enriching it"),
    "D": ("openai-v2", "opentelemetry-instrumentation-openai-v2 alone"),
    "E": ("floor", "SDK call + one bare span (same attribute count) + same metric records"),
    "G": (
        "minimal wrapper",
        "a yardstick, not an instrumentation: E plus a wrapper that makes the span "
        "current and reads the stats with no validation (benchmarks/_minimal.py)",
    ),
    "F": (
        "genai-openai",
        "opentelemetry-instrumentation-genai-openai alone (own venv: it needs a newer "
        "opentelemetry-util-genai than openai-v2 can import)",
    ),
}


@dataclass(frozen=True)
class Payloads:
    nonstream: bytes
    nonstream_type: str
    stream: bytes
    stream_type: str
    stream_chunks: int
    stream_content_chunks: int
    stream_short: bytes
    stream_short_chunks: int
    model: str


def load_payloads(data: Path = DATA) -> Payloads:
    manifest = json.loads((data / "manifest.json").read_text())
    ns, st, short = manifest["nonstream"], manifest["stream"], manifest["stream_short"]
    return Payloads(
        nonstream=(data / ns["file"]).read_bytes(),
        nonstream_type=ns["content_type"],
        stream=(data / st["file"]).read_bytes(),
        stream_type=st["content_type"],
        stream_chunks=st["chunks"],
        stream_content_chunks=st["content_chunks"],
        stream_short=(data / short["file"]).read_bytes(),
        stream_short_chunks=short["chunks"],
        model=manifest["model"],
    )


def replay_client(body: bytes, content_type: str, asynchronous: bool = False) -> Any:
    """An ``openai.OpenAI`` (``AsyncOpenAI`` when ``asynchronous``) whose every request is
    answered with ``body`` in process. One sync handler serves both: ``MockTransport``
    awaits a handler's result only when it is awaitable."""
    import httpx2
    import openai

    headers = {"content-type": content_type}

    def handler(request: Any) -> Any:
        return httpx2.Response(200, headers=headers, content=body)

    sdk, http = (
        (openai.AsyncOpenAI, httpx2.AsyncClient) if asynchronous else (openai.OpenAI, httpx2.Client)
    )
    return sdk(
        base_url="http://127.0.0.1:8000/v1",
        api_key="sk-bench",
        max_retries=0,
        http_client=http(transport=httpx2.MockTransport(handler)),
    )


#: What a batch times: a non-streaming call, the long stream, the short stream.
KINDS = ("nonstream", "stream", "stream_short")
#: The same three through ``AsyncOpenAI`` (coroutine functions: ``overhead.py --async``
#: and ``attribution.py --kind async_*``).
ASYNC_KINDS = ("async_nonstream", "async_stream", "async_stream_short")


class Calls:
    """The calls every configuration times, each on its own replaying client."""

    def __init__(self, payloads: Payloads) -> None:
        self.payloads = payloads
        self.model = payloads.model
        self.nonstream_client = replay_client(payloads.nonstream, payloads.nonstream_type)
        self.stream_client = replay_client(payloads.stream, payloads.stream_type)
        self.stream_short_client = replay_client(payloads.stream_short, payloads.stream_type)

    def create(self, client: Any) -> Any:
        """The non-streaming request (a coroutine on an async client)."""
        return client.chat.completions.create(model=self.model, messages=MESSAGES, max_tokens=256)

    def nonstream(self) -> Any:
        return self.create(self.nonstream_client)

    def open_stream(self, client: Any) -> Any:
        """The streaming request (a coroutine on an async client)."""
        return client.chat.completions.create(
            model=self.model,
            messages=MESSAGES,
            max_tokens=512,
            stream=True,
            stream_options={"include_usage": True},
        )

    def stream(self) -> int:
        n = 0
        for _chunk in self.open_stream(self.stream_client):
            n += 1
        return n

    def stream_short(self) -> int:
        n = 0
        for _chunk in self.open_stream(self.stream_short_client):
            n += 1
        return n

    def by_kind(self) -> dict[str, Callable[[], Any]]:
        return {
            "nonstream": self.nonstream,
            "stream": self.stream,
            "stream_short": self.stream_short,
        }

    @cached_property
    def async_by_kind(self) -> dict[str, Callable[[], Any]]:
        """Coroutine functions for ASYNC_KINDS, on async clients made on first use (the
        in-process transport binds to no event loop)."""
        p = self.payloads
        nonstream = replay_client(p.nonstream, p.nonstream_type, asynchronous=True)
        long_stream = replay_client(p.stream, p.stream_type, asynchronous=True)
        short_stream = replay_client(p.stream_short, p.stream_type, asynchronous=True)

        async def call() -> Any:
            return await self.create(nonstream)

        async def read(client: Any) -> int:
            n = 0
            async for _chunk in await self.open_stream(client):
                n += 1
            return n

        return {
            "async_nonstream": call,
            "async_stream": lambda: read(long_stream),
            "async_stream_short": lambda: read(short_stream),
        }


# -- real OpenTelemetry SDK providers that drop what they produce -------------------------


class DroppingSpanExporter:
    """A SpanExporter that keeps nothing but a count (and the last span's shape)."""

    def __init__(self) -> None:
        self.exported = 0
        self.last_attribute_count = 0
        self.last_scope = ""

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if spans:
            self.exported += len(spans)
            last = spans[-1]
            self.last_attribute_count = len(last.attributes or {})
            self.last_scope = last.instrumentation_scope.name
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class Providers:
    """TracerProvider (BatchSpanProcessor → dropping exporter), MeterProvider (a reader
    that is never collected while timing), LoggerProvider (batch → dropping exporter)."""

    def __init__(self, sync_spans: bool = False) -> None:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import (
            BatchLogRecordProcessor,
            LogRecordExporter,
            LogRecordExportResult,
        )
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        class DroppingLogExporter(LogRecordExporter):  # type: ignore[misc]
            def export(self, batch: Any) -> Any:
                return LogRecordExportResult.SUCCESS

            def shutdown(self) -> None:
                pass

            def force_flush(self, timeout_millis: int = 30_000) -> bool:
                return True

        self.span_exporter = DroppingSpanExporter()
        self.tracer_provider = TracerProvider()
        # sync_spans (the memory run): each span handed to the dropping exporter as it
        # ends, so no export queue (bounded at 2,048 spans, filled faster than a starved
        # export thread drains it) moves the RSS high-water mark during the run.
        processor = SimpleSpanProcessor if sync_spans else BatchSpanProcessor
        self.tracer_provider.add_span_processor(processor(self.span_exporter))
        self.metric_reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metric_reader])
        self.logger_provider = LoggerProvider()
        self.logger_provider.add_log_record_processor(
            BatchLogRecordProcessor(DroppingLogExporter())
        )

    def flush(self) -> None:
        self.tracer_provider.force_flush()
        self.logger_provider.force_flush()

    def metric_totals(self) -> tuple[int, int]:
        """Synchronous histogram records so far (the sum of every histogram point's
        count), and the sum of every counter point's value (all counters together)."""
        records = counted = 0
        data = self.metric_reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in metric.data.data_points:
                        if hasattr(point, "count"):
                            records += point.count or 0
                        else:
                            counted += point.value
        return records, counted


# -- the configurations ------------------------------------------------------------------


def instrument_ours(providers: Providers, **settings: Any) -> None:
    import spec_decode_otel

    spec_decode_otel.instrument(
        tracer_provider=providers.tracer_provider,
        meter_provider=providers.meter_provider,
        **settings,
    )


def instrument_genai_openai(providers: Providers) -> None:
    from opentelemetry.instrumentation.genai.openai import (  # type: ignore[import-not-found]
        OpenAIInstrumentor,
    )

    OpenAIInstrumentor().instrument(
        tracer_provider=providers.tracer_provider,
        meter_provider=providers.meter_provider,
        logger_provider=providers.logger_provider,
    )


def instrument_openai_v2(providers: Providers) -> None:
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(
        tracer_provider=providers.tracer_provider,
        meter_provider=providers.meter_provider,
        logger_provider=providers.logger_provider,
    )


def reference_attributes(model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The span start attributes and the spec-decode metric attribute set that B gives
    the replayed calls, for the reference configurations (E, G) to emit as well."""
    from spec_decode_otel import telemetry as t

    start = {
        t.GEN_AI_OPERATION_NAME: "chat",
        t.GEN_AI_PROVIDER_NAME: "openai",
        t.GEN_AI_REQUEST_MODEL: model,
        t.SERVER_ADDRESS: "127.0.0.1",
        t.SERVER_PORT: 8000,
    }
    spec = {**start, t.GEN_AI_RESPONSE_MODEL: model, t.SD_ENGINE: "vllm", t.SD_NUM_SPEC_TOKENS: 4}
    return start, spec


class Floor:
    """Config E: the SDK call plus exactly the OTel work our wrapper ends up doing —
    one span started and ended with the same number of attributes, and the same number
    of synchronous histogram records with attribute sets of the same sizes, recorded
    with the span's context — and nothing else: no wrapping, no parsing, no detection."""

    def __init__(self, providers: Providers, calls: Calls) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        from spec_decode_otel import telemetry as t

        self.calls = calls
        self._set_span_in_context = trace.set_span_in_context
        self._kind = SpanKind.CLIENT
        meter = providers.meter_provider.get_meter("bench.floor")
        self.tracer = providers.tracer_provider.get_tracer("bench.floor")
        self.h_len = meter.create_histogram(t.M_ACCEPTANCE_LENGTH, unit="{token}")
        self.h_rate = meter.create_histogram(t.M_DRAFT_ACCEPTANCE_RATE, unit="1")
        model = calls.model
        self.name = f"chat {model}"
        self.start_attrs, self.m_sd = reference_attributes(model)
        self.end_attrs = {
            t.GEN_AI_RESPONSE_MODEL: model,
            t.GEN_AI_USAGE_INPUT_TOKENS: 11,
            t.GEN_AI_USAGE_OUTPUT_TOKENS: 256,
            t.GEN_AI_RESPONSE_FINISH_REASONS: ["length"],
            t.SD_ENGINE: "vllm",
            t.SD_MEAN_ACCEPTANCE_LENGTH: 2.84,
            t.SD_DRAFT_ACCEPTANCE_RATE: 0.46,
            t.SD_NUM_SPEC_STEPS: 90,
            t.SD_NUM_ACCEPTED_DRAFT_TOKENS: 166,
            t.SD_NUM_DRAFT_TOKENS: 360,
            t.SD_NUM_SPEC_TOKENS: 4,
            t.SD_ACCEPTANCE_HISTOGRAM: [25, 17, 13, 12, 23],
        }

    def _finish(self, span: Any) -> None:
        span.set_attributes(self.end_attrs)
        ctx = self._set_span_in_context(span)
        self.h_len.record(2.84, self.m_sd, context=ctx)
        self.h_rate.record(0.46, self.m_sd, context=ctx)
        span.end()

    def nonstream(self) -> Any:
        span = self.tracer.start_span(self.name, kind=self._kind, attributes=self.start_attrs)
        result = self.calls.nonstream()
        self._finish(span)
        return result

    def _stream(self, client: Any) -> int:
        span = self.tracer.start_span(self.name, kind=self._kind, attributes=self.start_attrs)
        n = 0
        for _chunk in self.calls.open_stream(client):
            n += 1
        self._finish(span)
        return n

    def by_kind(self) -> dict[str, Callable[[], Any]]:
        return {
            "nonstream": self.nonstream,
            "stream": lambda: self._stream(self.calls.stream_client),
            "stream_short": lambda: self._stream(self.calls.stream_short_client),
        }

    @cached_property
    def async_by_kind(self) -> dict[str, Callable[[], Any]]:
        """The async kinds, each bare async call (a stream read to its end) in one span."""

        def around(call: Callable[[], Any]) -> Callable[[], Any]:
            async def floor_call() -> Any:
                span = self.tracer.start_span(
                    self.name, kind=self._kind, attributes=self.start_attrs
                )
                result = await call()
                self._finish(span)
                return result

            return floor_call

        return {kind: around(call) for kind, call in self.calls.async_by_kind.items()}


#: The class attributes instrumentors replace (sync and async).
WRAPPED_ATTRIBUTES = (
    ("openai._base_client", "SyncAPIClient", "request"),
    ("openai._base_client", "AsyncAPIClient", "request"),
    ("openai.resources.chat.completions", "Completions", "create"),
    ("openai.resources.chat.completions", "AsyncCompletions", "create"),
)


class Switch:
    """Turns a configuration's instrumentation off and on again between batches.

    Instrumentors replace class attributes process-wide; this snapshots those attributes
    before and after instrumenting and puts either snapshot back, so one worker process
    times its configuration and the bare SDK alternately, with the same heap, the same
    imports and the same providers (the instrumentation's caches stay warm).
    """

    def __init__(self) -> None:
        self.before = self._snapshot()
        self.after: dict[tuple[str, str, str], Any] = {}
        self.enabled = True

    @staticmethod
    def _snapshot() -> dict[tuple[str, str, str], Any]:
        import importlib

        out = {}
        for module, cls, attr in WRAPPED_ATTRIBUTES:
            owner = getattr(importlib.import_module(module), cls)
            out[(module, cls, attr)] = owner.__dict__.get(attr)
        return out

    def instrumented(self) -> None:
        self.after = self._snapshot()

    def set(self, enabled: bool) -> None:
        import importlib

        if enabled == self.enabled:
            return
        source = self.after if enabled else self.before
        for (module, cls, attr), value in source.items():
            setattr(getattr(importlib.import_module(module), cls), attr, value)
        self.enabled = enabled


@dataclass
class Configuration:
    """One configuration's calls (by kind), providers, and a switch back to the bare SDK."""

    calls: dict[str, Callable[[], Any]]
    providers: Providers | None
    set_enabled: Callable[[bool], None]
    #: Coroutine functions for ASYNC_KINDS, switched with ``calls``.
    acalls: dict[str, Callable[[], Any]]


def setup_config(name: str, payloads: Payloads, sync_spans: bool = False) -> Configuration:
    calls = Calls(payloads)
    if name == "A":
        return Configuration(calls.by_kind(), None, lambda enabled: None, calls.async_by_kind)
    providers = Providers(sync_spans)
    if name == "E":
        floor = Floor(providers, calls)
        config = Configuration(
            floor.by_kind(), providers, lambda enabled: None, floor.async_by_kind
        )

        def set_floor(enabled: bool) -> None:
            config.calls = floor.by_kind() if enabled else calls.by_kind()
            config.acalls = floor.async_by_kind if enabled else calls.async_by_kind

        config.set_enabled = set_floor
        return config
    switch = Switch()
    if name == "B":
        instrument_ours(providers)
    elif name == "C":
        instrument_openai_v2(providers)
        instrument_ours(providers, mode="auto")
    elif name == "D":
        instrument_openai_v2(providers)
    elif name == "F":
        instrument_genai_openai(providers)
    elif name == "G":
        from _minimal import Minimal

        Minimal(providers, calls.model).install()
    else:
        raise ValueError(f"unknown configuration {name!r}")
    switch.instrumented()
    return Configuration(calls.by_kind(), providers, switch.set, calls.async_by_kind)
