"""End to end with a real engine: llama.cpp (speculative decoding on CPU) -> the
instrumented ``openai`` SDK -> OTLP/gRPC -> the collector built from collector-config/
-> Prometheus and Jaeger, the stack of tests/e2e/conftest.py (``e2e_stack``).

Server: llama.cpp b11312 (commit 0c1e57098, vendored in llama-cpp-python 0.3.36), built
by scripts/install-llama-server.sh and named by ``SPEC_DECODE_OTEL_LLAMA_SERVER``; the
target and its noisy draft are the tiny models of tests/engines/tiny_models.py. The
server's own ``--metrics`` counters are the reference: what Prometheus ends up with for
the run's service must equal their deltas over the run.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_stack import Stack, jaeger_trace_spans, prom_scalar
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import BatchSpanProcessor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines"))

from harness import (
    A_ACCEPTED,
    A_DRAFTED,
    A_RATE,
    Exchanges,
    async_client,
    expected_attributes,
    instrumented,
    spec_attributes,
)
from llama_server import (
    M_ACCEPTED_TOKENS,
    M_DRAFT_TOKENS,
    LlamaServer,
    LlamaServerMissing,
    find_llama_server,
    use_gguf,
)

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.timeout(600)]

REQUESTS = 8
MAX_TOKENS = 16
INGEST_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def noisy_llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-server with the tiny target and its noisy draft (partial acceptance)."""
    try:
        install = find_llama_server()
    except LlamaServerMissing as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:
        pytest.fail(f"no llama.cpp server for the engine e2e test: {missing}", pytrace=False)
    use_gguf(install)
    from tiny_models import MODELS, write_model

    workdir = tmp_path_factory.mktemp("llama-e2e")
    paths = {
        name: write_model(workdir / f"{name}.gguf", install.vocab, seed=seed, noise=noise)
        for name, (seed, noise) in MODELS.items()
        if name in ("target", "noisy")
    }
    server = LlamaServer(install, paths["target"], paths["noisy"], workdir, name="llama-e2e")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _workload(base_url: str, sink: Exchanges) -> None:
    """8 concurrent requests: chat and completions, streaming and not."""

    async def one(client: Any, i: int) -> None:
        prompt = f"End to end request {i} about {i * 11}."
        common = {"model": "tiny-target", "max_tokens": MAX_TOKENS, "temperature": 0}
        if i % 2:
            kwargs = {**common, "messages": [{"role": "user", "content": prompt}]}
            resource = client.chat.completions
        else:
            kwargs = {**common, "prompt": prompt}
            resource = client.completions
        if i % 4 < 2:
            await resource.create(**kwargs)
            return
        stream = await resource.create(**kwargs, stream=True)
        async with stream:
            [c async for c in stream]

    async with async_client(base_url, sink) as client:
        await asyncio.gather(*(one(client, i) for i in range(REQUESTS)))


def _wait_for(prom: httpx.Client, expr: str, want: float) -> float | None:
    deadline = time.monotonic() + INGEST_TIMEOUT_S
    got = None
    while time.monotonic() < deadline:
        got = prom_scalar(prom, expr)
        if got == want:
            return got
        time.sleep(0.25)
    return got


def test_llamacpp_counts_reach_prometheus_equal_to_the_servers_own(
    noisy_llama: LlamaServer, e2e_stack: Stack, prom: httpx.Client, jaeger: httpx.Client
) -> None:
    """Prometheus's spec_decode_draft_tokens_total and
    spec_decode_accepted_draft_tokens_total for the run's service equal the llama.cpp
    server's own /metrics deltas over the run; the rate histogram has one observation
    per request; one request's span reaches Jaeger with its response's counts."""
    service = f"sdo-e2e-llamacpp-{uuid.uuid4().hex[:8]}"
    endpoint = e2e_stack.otlp_endpoint("grpc")
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=endpoint, insecure=True), export_interval_millis=500
    )
    processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True))
    sink = Exchanges()
    before = noisy_llama.metrics()
    with instrumented(
        span_processors=[processor],
        metric_readers=[reader],
        resource=Resource.create({"service.name": service}),
    ) as telemetry:
        asyncio.run(_workload(noisy_llama.base_url, sink))
        spans = telemetry.spans()
        assert telemetry.tracer_provider.force_flush(10_000)
        assert telemetry.meter_provider.force_flush(10_000)
    after = noisy_llama.metrics()

    raws = sink.take()
    assert len(raws) == len(spans) == REQUESTS
    drafted = after[M_DRAFT_TOKENS] - before.get(M_DRAFT_TOKENS, 0.0)
    accepted = after[M_ACCEPTED_TOKENS] - before.get(M_ACCEPTED_TOKENS, 0.0)
    assert drafted == sum(r.timings()["draft_n"] for r in raws) > 0
    assert accepted == sum(r.timings()["draft_n_accepted"] for r in raws)
    assert 0 < accepted < drafted

    job = f'job=~"(.+/)?{service}"'
    prom_drafted = _wait_for(prom, f"sum(spec_decode_draft_tokens_total{{{job}}})", drafted)
    prom_accepted = _wait_for(
        prom, f"sum(spec_decode_accepted_draft_tokens_total{{{job}}})", accepted
    )
    assert (prom_drafted, prom_accepted) == (drafted, accepted), (
        f"Prometheus {prom_drafted}/{prom_accepted} != llama.cpp /metrics deltas "
        f"{drafted}/{accepted}\n{e2e_stack.logs()}"
    )
    rate_count = _wait_for(prom, f"sum(spec_decode_draft_acceptance_rate_count{{{job}}})", REQUESTS)
    assert rate_count == REQUESTS
    rate_sum = prom_scalar(prom, f"sum(spec_decode_draft_acceptance_rate_sum{{{job}}})")
    want_sum = sum(expected_attributes(r.timings())[A_RATE] for r in raws)
    assert rate_sum is not None and math.isclose(rate_sum, want_sum, rel_tol=1e-9)

    span = spans[0]
    trace_id = f"{span.context.trace_id:032x}"
    deadline = time.monotonic() + INGEST_TIMEOUT_S
    stored = None
    while stored is None and time.monotonic() < deadline:
        stored = jaeger_trace_spans(jaeger, trace_id)
        if stored is None:
            time.sleep(0.25)
    assert stored, f"trace {trace_id} never reached Jaeger"
    (stored_span,) = [s for s in stored if s["scope"] == "spec_decode_otel"]
    attrs = spec_attributes(span)
    assert stored_span["resource"]["service.name"] == service
    for key in (A_DRAFTED, A_ACCEPTED, A_RATE, "spec_decode.engine", "spec_decode.partial"):
        assert stored_span["attributes"][key] == attrs[key]
