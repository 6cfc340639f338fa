"""Concurrency and load against the simulator SUBPROCESS, all engines at once.

1,000 concurrent async streaming requests on ONE ``AsyncOpenAI`` client (gathered under a
semaphore of 200 to stay within file limits) while 8 threads make sync calls on one
``OpenAI`` client; once on the SDK's default transport, once on its aiohttp one. Every
request must produce exactly one finalized span; the metric totals must equal what the
spans say (acceptance_length count == spans with a mean, verify_steps == the sum of the
spans' histograms, accepted/drafted totals likewise); and no context may bleed: each task
runs under its own parent span and its own ``spec_decode_otel.attributes(task=i)``, and
its span carries exactly those.

``SPEC_DECODE_OTEL_LOAD_REQUESTS`` (async requests, default 1000) and
``SPEC_DECODE_OTEL_LOAD_SYNC_CALLS`` (per thread, default 40) size a bigger run.
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
import time
from collections import Counter
from typing import Any

import openai
import pytest
from reliability_helpers import API_KEY, Otel, async_client, canary_messages, instrumented

import spec_decode_otel
from spec_decode_otel.telemetry import (
    M_ACCEPTANCE_LENGTH,
    M_ACCEPTED_DRAFT_TOKENS,
    M_DRAFT_ACCEPTANCE_RATE,
    M_DRAFT_TOKENS,
    M_VERIFY_STEPS,
    SD_ACCEPTANCE_HISTOGRAM,
    SD_DRAFT_ACCEPTANCE_RATE,
    SD_ENGINE,
    SD_MEAN_ACCEPTANCE_LENGTH,
    SD_NUM_ACCEPTED_DRAFT_TOKENS,
    SD_NUM_DRAFT_TOKENS,
)

ASYNC_REQUESTS = int(os.environ.get("SPEC_DECODE_OTEL_LOAD_REQUESTS", "1000"))
SYNC_THREADS = 8
SYNC_CALLS = int(os.environ.get("SPEC_DECODE_OTEL_LOAD_SYNC_CALLS", "40"))
CONCURRENCY = 200

#: (x-spec-decode-engine, extra body) cycled over the requests: every adapter under load.
SHAPES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("vllm", {}),
    ("vllm-premerge", {}),
    ("sglang", {"return_spec_tokens_details": True}),
    ("trtllm", {}),
    ("llamacpp", {}),
)


def _kwargs(i: int, stream: bool) -> dict[str, Any]:
    engine, extra = SHAPES[i % len(SHAPES)]
    kwargs: dict[str, Any] = {
        "model": "spec-sim",
        "messages": canary_messages(),
        "max_tokens": 16,
        "extra_headers": {"x-spec-decode-engine": engine},
        "extra_body": extra,
    }
    if stream:
        kwargs.update(stream=True, stream_options={"include_usage": True})
    return kwargs


def _sync_worker(client: openai.OpenAI, thread: int, tracer: Any, out: dict, errors: list) -> None:
    try:
        for call in range(SYNC_CALLS):
            stream = call % 2 == 0
            with (
                tracer.start_as_current_span(f"thread-{thread}-{call}") as parent,
                spec_decode_otel.attributes(thread=thread, call=call),
            ):
                result = client.chat.completions.create(**_kwargs(thread + call, stream))
                if stream:
                    for _ in result:
                        pass
                out[(thread, call)] = parent.get_span_context().span_id
    except BaseException as exc:  # surfaced by the test, not lost in the thread
        errors.append(exc)


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
async def test_concurrent_async_streams_and_sync_threads(
    simulator_url: str, transport: str
) -> None:
    """``transport``: the async client's, the SDK's default or its aiohttp one
    (``openai.DefaultAioHttpClient``, which the SDK recommends for concurrent async code)."""
    otel = Otel()
    tracer = otel.tracer_provider.get_tracer("load-test")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    client = async_client(simulator_url, transport)
    sync_client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
    sem = asyncio.Semaphore(CONCURRENCY)
    parents: dict[int, int] = {}
    sync_parents: dict[tuple[int, int], int] = {}
    errors: list[BaseException] = []

    async def one(i: int) -> int:
        async with sem:
            with (
                tracer.start_as_current_span(f"task-{i}") as parent,
                spec_decode_otel.attributes(task=i),
            ):
                stream = await client.chat.completions.create(**_kwargs(i, True))
                chunks = 0
                async for _ in stream:
                    chunks += 1
                    if chunks % 3 == 0:
                        await asyncio.sleep(0)  # interleave tasks mid-stream
                parents[i] = parent.get_span_context().span_id
                return chunks

    started = time.perf_counter()
    try:
        with instrumented(otel):
            threads = [
                threading.Thread(
                    target=_sync_worker, args=(sync_client, t, tracer, sync_parents, errors)
                )
                for t in range(SYNC_THREADS)
            ]
            for thread in threads:
                thread.start()
            chunk_counts = await asyncio.gather(*(one(i) for i in range(ASYNC_REQUESTS)))
            for thread in threads:
                thread.join(timeout=240)
            assert not any(thread.is_alive() for thread in threads)
    finally:
        await client.close()
        sync_client.close()
    elapsed = time.perf_counter() - started
    assert not errors, errors
    assert all(n > 3 for n in chunk_counts)

    # Exactly one finalized span per request, nothing left open.
    assert otel.counter.open == 0
    spans = otel.spans()
    assert len(spans) == ASYNC_REQUESTS + SYNC_THREADS * SYNC_CALLS
    task_spans = [s for s in spans if "task" in s.attributes]
    sync_spans = [s for s in spans if "thread" in s.attributes]
    assert len(task_spans) == ASYNC_REQUESTS and len(sync_spans) == SYNC_THREADS * SYNC_CALLS
    assert Counter(s.attributes["task"] for s in task_spans) == Counter(range(ASYNC_REQUESTS))

    # No context bleed: own parent, own attributes, and nothing of anyone else's.
    for span in task_spans:
        i = span.attributes["task"]
        assert span.parent is not None and span.parent.span_id == parents[i]
        assert "thread" not in span.attributes and "call" not in span.attributes
    for span in sync_spans:
        key = (span.attributes["thread"], span.attributes["call"])
        assert span.parent is not None and span.parent.span_id == sync_parents[key]
        assert "task" not in span.attributes

    # Every request gave a record, and the metrics say exactly what the spans say.
    assert all(SD_ENGINE in s.attributes for s in spans)
    engines = Counter(s.attributes[SD_ENGINE] for s in spans)
    assert set(engines) == {"vllm", "sglang", "tensorrt_llm", "llamacpp"}
    with_mean = [s for s in spans if SD_MEAN_ACCEPTANCE_LENGTH in s.attributes]
    with_rate = [s for s in spans if SD_DRAFT_ACCEPTANCE_RATE in s.attributes]
    assert otel.histogram_count(M_ACCEPTANCE_LENGTH) == len(with_mean)
    assert otel.histogram_count(M_DRAFT_ACCEPTANCE_RATE) == len(with_rate)
    hist_steps = sum(sum(s.attributes.get(SD_ACCEPTANCE_HISTOGRAM, ())) for s in spans)
    assert hist_steps > 0
    assert otel.counter_total(M_VERIFY_STEPS) == hist_steps
    accepted = sum(s.attributes.get(SD_NUM_ACCEPTED_DRAFT_TOKENS, 0) for s in spans)
    drafted = sum(s.attributes.get(SD_NUM_DRAFT_TOKENS, 0) for s in spans)
    assert otel.counter_total(M_ACCEPTED_DRAFT_TOKENS) == accepted
    assert otel.counter_total(M_DRAFT_TOKENS) == drafted
    sum_means = sum(s.attributes[SD_MEAN_ACCEPTANCE_LENGTH] for s in with_mean)
    points = otel.points(M_ACCEPTANCE_LENGTH)
    assert abs(sum(p.sum for p in points) - sum_means) < 1e-6 * len(with_mean)

    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"\nload ({transport}): {len(spans)} requests ({ASYNC_REQUESTS} async streams, "
        f"{SYNC_THREADS}x{SYNC_CALLS} sync) in {elapsed:.1f}s; "
        f"max RSS {rss_after / 1024:.0f} MiB (+{(rss_after - rss_before) / 1024:.0f} MiB)"
    )
    otel.shutdown()
