"""Slicing acceptance by workload and tenant.

Shows: ``spec_decode_otel.attributes(workload=..., tenant=...)`` tags every call made in
its block (a context variable: it follows threads and asyncio tasks, never leaking into
others). Every such key lands on the span; only keys allow-listed in
``metric_attributes`` also become metric attributes, so a high-cardinality key (a tenant
id) stays on traces and cannot multiply metric time series. The script then reads the
emitted OpenTelemetry metrics back and prints acceptance per workload, the way a
dashboard would group them.

The simulator serves two models whose drafters accept differently; here the "code"
workload runs on one and the "chat" workload on the other.

Run:  python examples/workload_dimensions.py
"""

from __future__ import annotations

from collections import defaultdict

import openai
from _simulator import API_KEY, openai_base_url
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import spec_decode_otel

MODELS = {"code": "qwen2.5-coder-eagle3", "chat": "llama-3.1-8b-ngram"}
#: Per-position conditional acceptance of each model's drafter, for the simulator.
ACCEPTANCE = {
    "qwen2.5-coder-eagle3": (0.9, 0.85, 0.8, 0.7),
    "llama-3.1-8b-ngram": (0.5, 0.4, 0.3, 0.2),
}
TENANTS = ("acme", "globex", "initech")


def per_workload(reader: InMemoryMetricReader) -> tuple[dict[str, dict[str, float]], set[str]]:
    """Requests, acceptance-length sum, drafted and accepted per ``workload``; and every
    attribute key seen on our metrics."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    keys: set[str] = set()
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    keys.update(point.attributes)
                    workload = point.attributes.get("workload")
                    if workload is None:
                        continue
                    row = totals[workload]
                    if metric.name == "spec_decode.acceptance_length":
                        row["requests"] += point.count
                        row["length_sum"] += point.sum
                    elif metric.name == "spec_decode.draft_tokens":
                        row["drafted"] += point.value
                    elif metric.name == "spec_decode.accepted_draft_tokens":
                        row["accepted"] += point.value
    return totals, keys


def main() -> None:
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    spec_decode_otel.SpecDecodeInstrumentor().instrument(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        metric_attributes=("workload",),  # or SPEC_DECODE_OTEL_METRIC_ATTRIBUTES=workload
    )
    try:
        with openai_base_url(model_alphas=ACCEPTANCE) as base_url:
            client = openai.OpenAI(base_url=base_url, api_key=API_KEY)
            for i in range(12):
                workload = "code" if i % 3 else "chat"
                with spec_decode_otel.attributes(workload=workload, tenant=TENANTS[i % 3]):
                    client.chat.completions.create(
                        model=MODELS[workload],
                        messages=[{"role": "user", "content": f"task {i}"}],
                        max_tokens=64,
                    )
            client.close()
        totals, keys = per_workload(reader)
    finally:
        spec_decode_otel.SpecDecodeInstrumentor().uninstrument()

    for workload, row in sorted(totals.items()):
        print(
            f"workload={workload} requests={int(row['requests'])} "
            f"mean_acceptance_length={row['length_sum'] / row['requests']:.3f} "
            f"draft_acceptance_rate={row['accepted'] / row['drafted']:.3f}"
        )
    tagged = sum("tenant" in span.attributes for span in spans.get_finished_spans())
    print(f"tenant is a metric attribute: {'tenant' in keys}; spans with a tenant: {tagged}")


if __name__ == "__main__":
    main()
