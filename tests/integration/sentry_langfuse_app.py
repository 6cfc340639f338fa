"""An ``openai`` application beside Sentry's OpenAI integration or Langfuse's drop-in OpenAI
wrapper, for ``test_beside_sentry_and_langfuse.py``, which runs it in a fresh process of
the coexistence venv holding the other (``sentry`` or ``langfuse``).

Environment:
  SIMULATOR_URL   the simulator's base URL
  OTLP_ENDPOINT   where the user's own OpenTelemetry SDK exports (OTLP/HTTP)
  THEIR_ENDPOINT  where the other sends its telemetry: Sentry's DSN host, Langfuse's
                  base URL (both receivers on loopback)
  COEX_OTHER      ``sentry`` | ``langfuse``
  COEX_ORDER      ``theirs-first`` | ``ours-first``: both set up in code, in that order;
                  ``theirs-only`` | ``ours-only``: one of them; ``plain``: neither, and
                  no OpenTelemetry SDK either (the user's results without any telemetry)

The user's OpenTelemetry SDK (a tracer provider exporting every span, a meter provider) is
set up first in every run but ``plain``: Langfuse adds its span processor to it (it
creates a provider of its own only when none is set). Every call runs under a root span of
its own named ``call <label>`` and, with Sentry, a Sentry transaction of the same name.
The script prints one JSON line: each call's content, usage and number of items (or the
error raised), the spans still open at the end, whether Langfuse's generation of
``with-stream`` (``awith-stream``) was still open as its ``with`` (``async with``) block
exited, what was logged at WARNING or above, and how many spans carrying
``spec_decode.*`` ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from typing import Any

import openai
from app_probes import Logged, OpenSpans, content_and_usage, finish

URL = os.environ["SIMULATOR_URL"]
OTHER = os.environ["COEX_OTHER"]
ORDER = os.environ["COEX_ORDER"]
PROMPT = "Name three prime numbers."
MESSAGES = [{"role": "user", "content": PROMPT}]
#: label -> (api, async, streamed, raw): ``raw`` is ``with_raw_response`` then ``parse()``
CALLS: dict[str, tuple[str, bool, bool, bool]] = {
    f"{prefix}{api}{suffix}": (api, is_async, stream, False)
    for prefix, is_async in (("", False), ("a", True))
    for api in ("chat", "text")
    for suffix, stream in (("", False), ("-stream", True))
}
CALLS |= {"raw-chat": ("chat", False, False, True), "raw-chat-stream": ("chat", False, True, True)}
#: Streamed chat calls read one chunk into, in a ``with`` / ``async with`` block, then left.
WITH_STREAM, ASYNC_WITH_STREAM = "with-stream", "awith-stream"
LABELS = (*CALLS, WITH_STREAM, ASYNC_WITH_STREAM)
SETTLE = 20.0
LANGFUSE_SCOPE = "langfuse-sdk"


def result_of(api: str, stream: bool, answer: list[Any]) -> dict[str, Any]:
    """The content, usage and number of items the user got."""
    return {**content_and_usage(api, stream, answer), "items": len(answer)}


def kwargs_for(label: str, seed: int) -> dict[str, Any]:
    api, _, stream, _ = CALLS.get(label, ("chat", False, True, False))
    out: dict[str, Any] = {
        "model": "m",
        "max_tokens": 48,
        "extra_headers": {"x-spec-decode-engine": "vllm", "x-sim-seed": str(seed)},
    }
    out |= {"messages": MESSAGES} if api == "chat" else {"prompt": PROMPT}
    if stream:
        out |= {"stream": True, "stream_options": {"include_usage": True}}
    return out


def sync_call(client: openai.OpenAI, label: str, seed: int) -> list[Any]:
    api, _, stream, raw = CALLS[label]
    resource: Any = client.chat.completions if api == "chat" else client.completions
    kwargs = kwargs_for(label, seed)
    if raw:
        answer = resource.with_raw_response.create(**kwargs).parse()
    else:
        answer = resource.create(**kwargs)
    return list(answer) if stream else [answer]


async def async_call(client: openai.AsyncOpenAI, label: str, seed: int) -> list[Any]:
    api, _, stream, _ = CALLS[label]
    resource: Any = client.chat.completions if api == "chat" else client.completions
    answer = await resource.create(**kwargs_for(label, seed))
    return [c async for c in answer] if stream else [answer]


def with_stream(client: openai.OpenAI, seed: int, spans: OpenSpans) -> tuple[list[Any], bool]:
    """One chunk read in a ``with`` block; whether Langfuse's generation is still open as
    the block has exited (the stream still referenced)."""
    with client.chat.completions.create(**kwargs_for(WITH_STREAM, seed)) as stream:
        first = next(stream)
    open_after_exit = bool(spans.open_of(LANGFUSE_SCOPE))
    del stream
    return [first], open_after_exit


async def async_with_stream(
    client: openai.AsyncOpenAI, seed: int, spans: OpenSpans
) -> tuple[list[Any], bool]:
    """:func:`with_stream`, ``async``."""
    kwargs = kwargs_for(ASYNC_WITH_STREAM, seed)
    async with await client.chat.completions.create(**kwargs) as stream:
        first = await stream.__anext__()
    open_after_exit = bool(spans.open_of(LANGFUSE_SCOPE))
    del stream
    return [first], open_after_exit


def user_telemetry(spans: OpenSpans) -> tuple[Any, Any]:
    """The user's own OpenTelemetry SDK, exporting every span and metric over OTLP/HTTP."""
    from opentelemetry import metrics, trace
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    endpoint = os.environ["OTLP_ENDPOINT"]
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(spans)
    # Batched, as users export: on the processor's thread, outside every call (a span
    # exported from inside a Sentry transaction would be one more http.client span of it).
    tracer_provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"), schedule_delay_millis=50
        )
    )
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics"), export_interval_millis=600_000
    )
    meter_provider = MeterProvider(metric_readers=[reader])
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    return tracer_provider, meter_provider


def set_up_theirs() -> Any:
    """Sentry's or Langfuse's setup, as their documentation gives it."""
    endpoint = os.environ["THEIR_ENDPOINT"]
    if OTHER == "sentry":
        import sentry_sdk
        from sentry_sdk.integrations.openai import OpenAIIntegration

        host = endpoint.removeprefix("http://")
        sentry_sdk.init(
            dsn=f"http://public@{host}/1",
            integrations=[OpenAIIntegration()],
            traces_sample_rate=1.0,
            # An HTTP span slower than 100 ms gets its caller's frame (code.*), so what
            # Sentry sends would depend on the machine's load (consts.py, 2.76.0).
            enable_http_request_source=False,
        )
        return sentry_sdk
    from langfuse import Langfuse

    langfuse = Langfuse(public_key="pk-lf-test", secret_key="sk-lf-test", base_url=endpoint)
    from langfuse.openai import openai as langfuse_openai

    assert langfuse_openai is openai  # the same module, its classes patched
    return langfuse


async def main() -> None:
    report: dict[str, Any] = {}
    logged = Logged()
    logging.getLogger().addHandler(logged)
    spans = OpenSpans()
    theirs: Any = None
    providers: tuple[Any, Any] | None = None
    if ORDER != "plain":
        providers = user_telemetry(spans)
        steps = {
            "theirs-first": ("theirs", "ours"),
            "ours-first": ("ours", "theirs"),
            "theirs-only": ("theirs",),
            "ours-only": ("ours",),
        }[ORDER]
        for step in steps:
            if step == "ours":
                from spec_decode_otel import SpecDecodeInstrumentor

                tracer_provider, meter_provider = providers
                SpecDecodeInstrumentor().instrument(
                    tracer_provider=tracer_provider, meter_provider=meter_provider
                )
            else:
                theirs = set_up_theirs()

    from opentelemetry import trace

    tracer = trace.get_tracer("coexistence-app")
    client = openai.OpenAI(base_url=URL, api_key="sk-test", max_retries=0)
    async_client = openai.AsyncOpenAI(base_url=URL, api_key="sk-test", max_retries=0)
    results: dict[str, Any] = {}
    for seed, label in enumerate(LABELS, start=8100):
        transaction: Any = contextlib.nullcontext()
        if OTHER == "sentry" and theirs is not None:
            transaction = theirs.start_transaction(op="call", name=f"call {label}")
        with tracer.start_as_current_span(f"call {label}"), transaction:
            try:
                if label == WITH_STREAM:
                    answer, report["langfuse_open_after_with"] = with_stream(client, seed, spans)
                    results[label] = result_of("chat", True, answer)
                    continue
                if label == ASYNC_WITH_STREAM:
                    answer, report["langfuse_open_after_async_with"] = await async_with_stream(
                        async_client, seed, spans
                    )
                    results[label] = result_of("chat", True, answer)
                    continue
                api, is_async, stream, _ = CALLS[label]
                if is_async:
                    answer = await async_call(async_client, label, seed)
                else:
                    answer = sync_call(client, label, seed)
                results[label] = result_of(api, stream, answer)
            except Exception as error:  # the test says which call raised what
                results[label] = {"error": f"{type(error).__name__}: {error}"}
    report["results"] = results
    client.close()
    await async_client.close()

    if providers is not None:
        expected = 0 if ORDER == "theirs-only" else len(LABELS)
        deadline = time.monotonic() + SETTLE
        if ORDER != "theirs-only":
            finish()
        while time.monotonic() < deadline and (spans.open or spans.recorded < expected):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything late (a second record) shows too
        report["open_spans"] = sorted(spans.open.values())
        report["recorded"] = spans.recorded
    if OTHER == "sentry" and theirs is not None:
        theirs.flush(timeout=10)
    elif theirs is not None:
        theirs.flush()
    if providers is not None:
        for provider in providers:
            provider.shutdown()
    report["logged"] = logged.records
    print(json.dumps(report))


asyncio.run(main())
