"""An ``openai`` application next to another OpenAI instrumentation, for the coexistence
matrix (``test_coexistence_matrix.py`` runs it in a fresh process per case).

Environment:
  SIMULATOR_URL  the simulator's base URL
  COEX_WAY       ``instrument``: this script sets up SDK providers exporting OTLP/HTTP to
                 ``OTLP_ENDPOINT`` and instruments in ``COEX_ORDER``; ``zero-code``: it
                 runs under ``opentelemetry-instrument``, which did all of that already
  COEX_OTHER     openai-v2 | genai-openai | openinference | openllmetry
  COEX_ORDER     theirs-first | ours-first | theirs-only | ours-only
  COEX_EXTRA     set: the instrument way makes only the calls of ``EXTRA_CALLS`` instead
  COEX_SAMPLER   ``always_on`` | ``always_off``: the instrument way's tracer provider
                 samples so, and the report tells, call by call, how many GenAI client
                 metric points each scope recorded (``genai``)

Every call runs under a root span of its own named ``call <label>``, so the test groups
the exported spans by call. In the instrument way the script then uninstruments
spec-decode-otel, makes one more call, and makes two calls through a client instrumented
with ``instrument_client``. It prints one JSON line: which wrappers sat where.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import os
import threading
from typing import Any

import openai
from opentelemetry import trace

from spec_decode_otel import SpecDecodeInstrumentor, instrument_client

URL = os.environ["SIMULATOR_URL"]
WAY = os.environ["COEX_WAY"]
OTHER = os.environ["COEX_OTHER"]
ORDER = os.environ["COEX_ORDER"]
SAMPLER = os.environ.get("COEX_SAMPLER")
MESSAGES = [{"role": "user", "content": "Name three prime numbers."}]
GENAI_METRICS = ("gen_ai.client.operation.duration", "gen_ai.client.token.usage")

#: The other instrumentation's instrumentor class, by the matrix's name for it.
INSTRUMENTORS = {
    "openai-v2": "opentelemetry.instrumentation.openai_v2",
    "genai-openai": "opentelemetry.instrumentation.genai.openai",
    "openinference": "openinference.instrumentation.openai",
    "openllmetry": "opentelemetry.instrumentation.openai",
}

#: (class, attribute) pairs that some instrumentation wraps: ours, or one of the others.
WATCHED = (
    ("openai._base_client", "SyncAPIClient", "request"),
    ("openai._base_client", "AsyncAPIClient", "request"),
    ("openai", "OpenAI", "request"),
    ("openai", "AsyncOpenAI", "request"),
    ("openai.resources.chat.completions", "Completions", "create"),
    ("openai.resources.chat.completions", "AsyncCompletions", "create"),
    ("openai.resources.completions", "Completions", "create"),
)


def snapshot() -> dict[str, Any]:
    """What each watched class holds in its own ``__dict__`` (None: inherited)."""
    out = {}
    for module, cls, name in WATCHED:
        klass = getattr(importlib.import_module(module), cls)
        out[f"{module}.{cls}.{name}"] = klass.__dict__.get(name)
    return out


def expected(key: str, snapshots: dict[str, dict[str, Any]], current: dict[str, Any]) -> Any:
    """What ``key`` must hold once ours is uninstrumented."""
    if "before ours" not in snapshots:
        return current[key]  # never instrumented: uninstrument changes nothing
    if ORDER == "ours-first" and snapshots["after theirs"][key] is not snapshots["after ours"][key]:
        return snapshots["after theirs"][key]  # theirs, put there after us
    return snapshots["before ours"][key]


#: Calls whose body is read after ``create`` returned (``with_streaming_response``,
#: ``with_raw_response``), or whose stream is dropped unread: some instrumentations end
#: their span before that.
EXTRA_CALLS = ("raw-stream", "async-raw-stream", "dropped-stream", "raw-response-stream")


def extra_calls(client: openai.OpenAI, async_client: openai.AsyncOpenAI, seed: int) -> None:
    tracer = trace.get_tracer("coexistence-app")
    kwargs: dict[str, Any] = {
        "model": "spec-sim",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with (
        tracer.start_as_current_span("call raw-stream"),
        client.chat.completions.with_streaming_response.create(
            **kwargs, extra_headers=headers(seed)
        ) as response,
    ):
        for _ in response.parse():
            pass

    async def read_async() -> None:
        async with async_client.chat.completions.with_streaming_response.create(
            **kwargs, extra_headers=headers(seed + 1)
        ) as response:
            async for _ in await response.parse():
                pass
        await async_client.close()

    with tracer.start_as_current_span("call async-raw-stream"):
        asyncio.run(read_async())
    with tracer.start_as_current_span("call dropped-stream"):
        stream = client.chat.completions.create(**kwargs, extra_headers=headers(seed + 2))
        next(iter(stream))
        del stream
        gc.collect()
    with tracer.start_as_current_span("call raw-response-stream"):
        raw = client.chat.completions.with_raw_response.create(
            **kwargs, extra_headers=headers(seed + 3)
        )
        for _ in raw.parse():
            pass


def headers(seed: int) -> dict[str, str]:
    return {"x-sim-seed": str(seed)}


class PerCall:
    """The GenAI client metric points each scope recorded, call by call: the totals an
    in-memory reader (cumulative) holds after a call, less those before it."""

    def __init__(self) -> None:
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        self.reader = InMemoryMetricReader()
        self.seen: dict[str, int] = {}
        self.calls: dict[str, dict[str, int]] = {}

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name in GENAI_METRICS:
                        key = f"{sm.scope.name} {metric.name}"
                        points = metric.data.data_points  # histograms: each has a count
                        out[key] = out.get(key, 0) + sum(p.count for p in points)
        return out

    def note(self, label: str) -> None:
        now = self.totals()
        self.calls[label] = {k: n - self.seen.get(k, 0) for k, n in now.items()}
        self.calls[label] = {k: n for k, n in self.calls[label].items() if n}
        self.seen = now


#: Set when COEX_SAMPLER is: each call's GenAI metric points.
PER_CALL: PerCall | None = None


def note(label: str) -> None:
    if PER_CALL is not None:
        PER_CALL.note(label)


def sync_calls(client: openai.OpenAI, labels: tuple[str, ...], seed: int) -> None:
    tracer = trace.get_tracer("coexistence-app")
    for i, label in enumerate(labels):
        with tracer.start_as_current_span(f"call {label}"):
            kwargs: dict[str, Any] = {"model": "spec-sim", "extra_headers": headers(seed + i)}
            if label.endswith("completions"):
                client.completions.create(prompt="Name three prime numbers.", **kwargs)
            elif label.endswith("stream"):
                stream = client.chat.completions.create(
                    messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **kwargs
                )
                for _ in stream:
                    pass
            else:
                client.chat.completions.create(messages=MESSAGES, **kwargs)
        note(label)


async def async_calls(client: openai.AsyncOpenAI, seed: int) -> None:
    tracer = trace.get_tracer("coexistence-app")
    with tracer.start_as_current_span("call async-chat"):
        await client.chat.completions.create(
            model="spec-sim", messages=MESSAGES, extra_headers=headers(seed)
        )
    note("async-chat")
    with tracer.start_as_current_span("call async-chat-stream"):
        stream = await client.chat.completions.create(
            model="spec-sim",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers(seed + 1),
        )
        async for _ in stream:
            pass
    note("async-chat-stream")
    await client.close()


def providers() -> tuple[Any, Any]:
    """SDK providers exporting over OTLP/HTTP (the instrument way sets its own up)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    global PER_CALL
    endpoint = os.environ["OTLP_ENDPOINT"]
    sampler = {None: None, "always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}[SAMPLER]
    tracer_provider = TracerProvider(sampler=sampler)
    tracer_provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"))
    )
    readers: list[Any] = [
        PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics"), export_interval_millis=600_000
        )
    ]
    if SAMPLER is not None:
        PER_CALL = PerCall()
        readers.append(PER_CALL.reader)
    meter_provider = MeterProvider(metric_readers=readers)
    trace.set_tracer_provider(tracer_provider)
    return tracer_provider, meter_provider


def main() -> None:
    from importlib.metadata import entry_points

    # The order opentelemetry-instrument loads instrumentors in (it walks this list).
    loaders = entry_points(group="opentelemetry_instrumentor")
    report: dict[str, Any] = {
        "entry_points": [ep.name for ep in loaders if ep.name in ("openai", "spec_decode")]
    }
    tracer_provider = meter_provider = None
    if WAY == "instrument":
        tracer_provider, meter_provider = providers()
        telemetry = {"tracer_provider": tracer_provider, "meter_provider": meter_provider}
        theirs = importlib.import_module(INSTRUMENTORS[OTHER]).OpenAIInstrumentor()
        steps = {
            "theirs-first": ("theirs", "ours"),
            "ours-first": ("ours", "theirs"),
            "theirs-only": ("theirs",),
            "ours-only": ("ours",),
        }[ORDER]
        snapshots = {"start": snapshot()}
        for step in steps:
            if step == "ours":
                snapshots["before ours"] = snapshot()
                SpecDecodeInstrumentor().instrument(**telemetry)
                snapshots["after ours"] = snapshot()
            else:
                theirs.instrument(**telemetry)
                snapshots["after theirs"] = snapshot()

    client = openai.OpenAI(base_url=URL, api_key="sk-test", max_retries=0)
    async_client = openai.AsyncOpenAI(base_url=URL, api_key="sk-test", max_retries=0)
    if os.environ.get("COEX_EXTRA"):
        extra_calls(client, async_client, seed=61)
        client.close()
        finish(tracer_provider, meter_provider)
        print(json.dumps(report))
        return
    sync_calls(client, ("chat", "chat-stream", "completions"), seed=21)
    asyncio.run(async_calls(async_client, seed=31))

    if WAY == "instrument":
        # Uninstrument ours: each attribute holds what it held before we came, unless the
        # other instrumentation put something there after us (then that stays).
        before_uninstrument = snapshot()
        SpecDecodeInstrumentor().uninstrument()
        after = snapshot()
        report["restored"] = {
            key: after[key] is expected(key, snapshots, before_uninstrument) for key in after
        }
        sync_calls(client, ("after-uninstrument",), seed=41)
        # instrument_client on a fresh client, the process-wide instrumentation gone.
        one = openai.OpenAI(base_url=URL, api_key="sk-test", max_retries=0)
        if ORDER != "theirs-only":
            instrument_client(one, **telemetry)
        sync_calls(one, ("client-chat", "client-chat-stream"), seed=51)
        one.close()
        now = snapshot()
        report["instrument_client_kept_classes"] = all(now[key] is after[key] for key in now)

    if PER_CALL is not None:
        report["genai"] = PER_CALL.calls
    client.close()
    finish(tracer_provider, meter_provider)
    print(json.dumps(report))


def finish(tracer_provider: Any, meter_provider: Any) -> None:
    """Wait for the ends of the calls whose streams were reclaimed (spec-decode-otel's
    finalizer thread runs them in order: a marker queued after them runs after them, as
    in tests/reclaimed.py), then flush."""
    from spec_decode_otel.instrumentation import finalizer

    gc.collect()
    done = threading.Event()
    finalizer.start()
    finalizer.defer(done.set)
    assert done.wait(10), "the finalizer thread ended nothing for 10 s"
    if tracer_provider is not None:
        tracer_provider.shutdown()
        meter_provider.shutdown()


if __name__ == "__main__":
    main()
