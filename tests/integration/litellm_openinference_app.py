"""A LiteLLM application next to OpenInference's LiteLLM instrumentation
(``test_litellm_openinference.py`` runs it in the coexistence venv that holds both).

Environment:
  SIMULATOR_URL  the simulator's base URL
  COEX_ORDER     theirs-first | ours-first | theirs-only | ours-only

Every call runs under a root span of its own named ``call <label>``. The script prints
one JSON object: every finished span (scope, name, ids, attributes) and, by metric name,
the sum of every metric's points (a counter's value, a histogram's count).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm
from app_probes import metric_totals
from openinference.instrumentation.litellm import LiteLLMInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spec_decode_otel import SpecDecodeInstrumentor

URL = os.environ["SIMULATOR_URL"]
ORDER = os.environ["COEX_ORDER"]
MESSAGES = [{"role": "user", "content": "Name three prime numbers."}]
#: label -> (LiteLLM provider route, streamed)
CALLS = {
    "hosted-chat": ("hosted_vllm", False),
    "hosted-chat-stream": ("hosted_vllm", True),
    "openai-chat": ("openai", False),
    "openai-chat-stream": ("openai", True),
}


def kwargs(label: str, seed: int) -> dict[str, Any]:
    route, stream = CALLS[label]
    out: dict[str, Any] = {
        "model": f"{route}/m",
        "api_base": URL,
        "api_key": "sk-test",
        "messages": MESSAGES,
        "max_tokens": 48,
        "extra_headers": {"x-spec-decode-engine": "vllm", "x-sim-seed": str(seed)},
    }
    if stream:
        out |= {"stream": True, "stream_options": {"include_usage": True}}
    return out


async def main() -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    steps = {
        "theirs": lambda: LiteLLMInstrumentor().instrument(tracer_provider=tracer_provider),
        "ours": lambda: SpecDecodeInstrumentor().instrument(
            tracer_provider=tracer_provider, meter_provider=meter_provider
        ),
    }
    for who in {
        "theirs-first": ("theirs", "ours"),
        "ours-first": ("ours", "theirs"),
        "theirs-only": ("theirs",),
        "ours-only": ("ours",),
    }[ORDER]:
        steps[who]()

    tracer = tracer_provider.get_tracer("coexistence-app")
    for seed, label in enumerate(CALLS, start=7100):
        with tracer.start_as_current_span(f"call {label}"):
            if label == "openai-chat":
                await litellm.acompletion(**kwargs(label, seed))  # one async call
                continue
            answer = litellm.completion(**kwargs(label, seed))
            if CALLS[label][1]:
                for _ in answer:
                    pass

    # LiteLLM reports a call's end from a logging thread or task, after the answer.
    expected = 0 if ORDER == "theirs-only" else len(CALLS)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ours = [s for s in exporter.get_finished_spans() if s.attributes.get("spec_decode.outcome")]
        if len(ours) >= expected:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # anything late (a second record) shows too

    spans = [
        {
            "scope": s.instrumentation_scope.name,
            "name": s.name,
            "trace_id": s.context.trace_id,
            "span_id": s.context.span_id,
            "parent_id": s.parent.span_id if s.parent else None,
            "attributes": {k: str(v) for k, v in (s.attributes or {}).items()},
        }
        for s in exporter.get_finished_spans()
    ]
    print(json.dumps({"spans": spans, "metrics": metric_totals(reader)}))


asyncio.run(main())
