"""Privacy: no prompt, completion, API key or request id in anything we export.

The session-wide scan lives in ``privacy_plugin.py`` (it watches every test of the suite
and fails the session on a leak). Here: its rules are checked on known values, its three
hooks are shown to be live (a planted canary IS caught, in a quarantine that keeps the
session verdict clean), and every API shape is driven with canary prompts and every
opt-in feature switched on, through the simulator subprocess, with errors and faults too.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from oteltap import OtelTapHttpProtobufReceiver, OtelTapHttpProtobufReceiverSettings
from reliability_helpers import API_KEY, Otel, canary, canary_messages, instrumented

import spec_decode_otel
from ports import free_port
from spec_decode_otel.telemetry import SCOPE_NAME, SD_ENGINE, SD_PER_STEP_ACCEPTED

# The plugin module is registered by tests/conftest.py under this name; importing it under
# the same name gives the same registry.
from reliability.privacy_plugin import REGISTRY, scan_text  # isort: skip


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (canary(), "canary prompt"),
        (f"prefix {canary()} suffix", "canary prompt"),
        ("Memory model kernel tensor prefix", "completion text"),
        ("draft verify accept", "completion text"),
        ("sk-test", "api key"),
        ("Bearer sk-live-123", "api key"),
        ("demo", "api key"),
        ("chatcmpl-0123456789abcdef", "response id"),
        ("cmpl-abc", "response id"),
        ("id=chatcmpl-s1", "response id"),
    ],
)
def test_the_rules_catch_what_they_must(value: str, rule: str) -> None:
    assert rule in scan_text(value)


@pytest.mark.parametrize(
    "value",
    [
        "chat spec-sim", "text_completion", "vllm", "tensorrt_llm", "spec_decode.engine",
        "gen_ai.request.model", "RateLimitError", "abandoned", "127.0.0.1", "_OTHER",
        "draft verify", "tensor", "spec-decode-otel-demo", "demo-tenant", "task-12",
        "meta-llama/Llama-3.1-8B-Instruct",
    ],
)  # fmt: skip
def test_the_rules_leave_ordinary_values_alone(value: str) -> None:
    assert scan_text(value) == []


async def test_the_hooks_are_live() -> None:
    """A canary planted in our scope is caught on every path: span, metric, OTLP."""
    secret = canary()
    port = free_port()
    async with OtelTapHttpProtobufReceiver(OtelTapHttpProtobufReceiverSettings(port)) as tap:
        # oteltap hands a message only to waiters already registered (it keeps none), and
        # the exports below are synchronous: wait first, or a message the poller delivers
        # while the test awaits the other one is lost.
        trace_seen = asyncio.ensure_future(
            tap.await_trace(lambda span: span.name == "planted", timeout=10)
        )
        metric_seen = asyncio.ensure_future(
            tap.await_metric(lambda m: m.name == "spec_decode.planted", timeout=10)
        )
        await asyncio.sleep(0)  # both waiters are registered now
        with REGISTRY.quarantine() as caught:
            tracer_provider = TracerProvider(shutdown_on_exit=False)
            tracer_provider.add_span_processor(
                SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces"))
            )
            tracer_provider.get_tracer(SCOPE_NAME).start_span(
                "planted", attributes={"spec_decode.planted": secret}
            ).end()
            reader = InMemoryMetricReader()
            exporting = PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=f"http://127.0.0.1:{port}/v1/metrics"),
                export_interval_millis=60_000,
            )
            meters = MeterProvider(metric_readers=[reader, exporting], shutdown_on_exit=False)
            meters.get_meter(SCOPE_NAME).create_counter("spec_decode.planted").add(
                1, {"spec_decode.planted": secret}
            )
            reader.get_metrics_data()
            meters.force_flush()
            await trace_seen
            await metric_seen
            deadline = time.monotonic() + 5
            while len({f.source for f in caught}) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            tracer_provider.shutdown()
            meters.shutdown()
    sources = {f.source for f in caught if f.rule == "canary prompt"}
    assert sources == {"span", "metric", "otlp-span", "otlp-metric"}, caught
    assert all(f.fatal for f in caught)


def _drive_every_shape(client: openai.OpenAI) -> int:
    """Every API shape with canary content; returns the number of calls made."""
    calls = 0
    engines = ("vllm", "vllm-premerge", "sglang", "trtllm", "trtllm-released", "llamacpp")
    for engine in engines:
        headers = {"x-spec-decode-engine": engine}
        client.chat.completions.create(
            model="spec-sim", messages=canary_messages(), max_tokens=12, extra_headers=headers
        )
        for _ in client.chat.completions.create(
            model="spec-sim", messages=canary_messages(), max_tokens=12, stream=True,
            extra_headers=headers,
        ):  # fmt: skip
            pass
        calls += 2
    client.completions.create(model="spec-sim", prompt=canary(), max_tokens=12)
    legacy = client.completions.create(
        model="spec-sim", prompt=canary(), max_tokens=12, stream=True
    )
    for _ in legacy:
        pass
    raw = client.chat.completions.with_raw_response.create(
        model="spec-sim", messages=canary_messages(), max_tokens=12
    )
    raw.parse()
    with client.chat.completions.with_streaming_response.create(
        model="spec-sim", messages=canary_messages(), max_tokens=12, stream=True
    ) as response:
        for _ in response.parse():
            pass
    with client.chat.completions.stream(
        model="spec-sim", messages=canary_messages(), max_tokens=12
    ) as stream:
        for _ in stream:
            pass
    client.chat.completions.create(model="spec-sim", messages=canary_messages(), n=2)
    calls += 6
    for fault in ("http-429", "http-500", "drop-mid-stream", "malformed-types", "nan"):
        try:
            for _ in client.chat.completions.create(
                model="spec-sim", messages=canary_messages(), max_tokens=12, stream=True,
                extra_headers={"x-sim-fault": fault},
            ):  # fmt: skip
                pass
        except Exception:  # the failure itself is what gets exported
            pass
        calls += 1
    return calls


def test_every_api_shape_with_canaries_leaks_nothing(simulator_url: str) -> None:
    fatal_before = REGISTRY.fatal_total
    own_spans_before = REGISTRY.own_spans
    own_points_before = REGISTRY.own_metric_points
    otel = Otel()
    client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
    try:
        with (
            instrumented(
                otel,
                inject_include_usage=True,
                inject_traceparent=True,
                record_per_step=True,
                request_engine_stats=("sglang",),
                metric_attributes=("tenant",),
            ),
            spec_decode_otel.attributes(tenant="acme"),
        ):
            calls = _drive_every_shape(client)
        otel.reader.get_metrics_data()  # a collection: scanned by the plugin's hook
    finally:
        client.close()
        otel.shutdown()
    spans = otel.spans()
    assert len(spans) == calls
    assert any(SD_PER_STEP_ACCEPTED in s.attributes for s in spans)  # opt-ins were on
    assert sum(SD_ENGINE in s.attributes for s in spans) >= 12
    assert REGISTRY.own_spans - own_spans_before >= calls
    assert REGISTRY.own_metric_points > own_points_before
    assert REGISTRY.fatal_total == fatal_before, [str(f) for f in REGISTRY.fatal]
    # And locally, without the plugin's word for it:
    for span in spans:
        values = [span.name, *map(str, span.attributes.values())]
        assert not [v for v in values if scan_text(v)], span.attributes
