"""Faults through the real stack: the user sees exactly what the bare SDK shows.

Every request goes over HTTP to the simulator SUBPROCESS with a fault header
(``x-sim-fault``, see simulator/faults.py) and a fixed ``x-sim-seed``, so the bare and the
instrumented run of one request get the same bytes. Each scenario runs bare (nothing
wraps the SDK) and instrumented (process-wide ``instrument()``), and compares what user
code saw: the same chunks (ids and timestamps aside), the same exception type, status
code and message. Then the span: ended, ERROR with ``error.type`` on failures, and no
record where the data is bad (a record that survives a fault must equal the clean one:
the fault did not touch the data it was made from).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from opentelemetry.trace import StatusCode
from reliability_helpers import (
    API_KEY,
    Otel,
    canary_messages,
    instrumented,
    internal_errors,
    uninstrumented,
)

from spec_decode_otel.instrumentation.genai_metrics import (
    M_OPERATION_DURATION,
    M_TIME_TO_FIRST_CHUNK,
)
from spec_decode_otel.simulator.faults import DROP_AFTER_CHUNKS, PAYLOAD_FAULTS
from spec_decode_otel.telemetry import (
    ERROR_TYPE,
    M_ACCEPTANCE_LENGTH,
    M_VERIFY_STEPS,
    SD_ENGINE,
    SD_OUTCOME,
    SD_READ_TO_END,
)

ENGINES = ("vllm", "vllm-premerge", "sglang", "trtllm", "llamacpp")
#: Faults that leave every field an adapter reads untouched, so the record stands:
#: llama.cpp's huge-array fault only lengthens ``draft_rounds``, which this server does
#: not send unless started with --llamacpp-rounds.
UNTOUCHED = {("llamacpp", "huge-array")}


@dataclass
class Outcome:
    """What user code saw."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    body: dict[str, Any] | None = None
    error: type[BaseException] | None = None
    status: int | None = None
    message: str | None = None

    def same_as(self, other: Outcome) -> None:
        assert self.error is other.error, (self.error, other.error, self.message, other.message)
        assert self.status == other.status
        assert self.message == other.message
        assert self.body == other.body
        assert self.chunks == other.chunks


def _visible(obj: Any) -> dict[str, Any]:
    # The simulator mints a new id and timestamp per request; all else is seeded.
    return obj.model_dump(exclude={"id", "created"}, warnings=False)


def _request(engine: str, stream: bool, seed: int) -> tuple[dict[str, Any], dict[str, str]]:
    body: dict[str, Any] = {"model": "spec-sim", "messages": canary_messages(), "max_tokens": 40}
    if engine == "sglang":
        body["extra_body"] = {"return_spec_tokens_details": True}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    headers = {"x-spec-decode-engine": engine, "x-sim-seed": str(seed)}
    return body, headers


def run_sync(client: openai.OpenAI, body: dict, headers: dict, timeout: float | None = None):
    out = Outcome()
    if timeout is not None:
        client = client.with_options(timeout=timeout)
    try:
        result = client.chat.completions.create(**body, extra_headers=headers)
        if body.get("stream"):
            for chunk in result:
                out.chunks.append(_visible(chunk))
        else:
            out.body = _visible(result)
    except Exception as exc:
        out.error, out.message = type(exc), str(exc)
        out.status = getattr(exc, "status_code", None)
    return out


async def run_async(client: openai.AsyncOpenAI, body: dict, headers: dict, timeout=None):
    out = Outcome()
    if timeout is not None:
        client = client.with_options(timeout=timeout)
    try:
        result = await client.chat.completions.create(**body, extra_headers=headers)
        if body.get("stream"):
            async for chunk in result:
                out.chunks.append(_visible(chunk))
        else:
            out.body = _visible(result)
    except Exception as exc:
        out.error, out.message = type(exc), str(exc)
        out.status = getattr(exc, "status_code", None)
    return out


@pytest.fixture
def sync_client(simulator_url: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
    yield client
    client.close()


@pytest.fixture
async def async_client(simulator_url: str):  # type: ignore[no-untyped-def]
    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=simulator_url, max_retries=0)
    yield client
    await client.close()


def _only_span(otel: Otel):  # type: ignore[no-untyped-def]
    assert otel.counter.open == 0, "a span was left open"
    spans = otel.spans()
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def _spec_attrs(span: Any) -> dict[str, Any]:
    # the record's attributes; the call's outcome is checked on its own
    return {
        k: v
        for k, v in span.attributes.items()
        if k.startswith("spec_decode.") and k not in (SD_OUTCOME, SD_READ_TO_END)
    }


def assert_error_span(otel: Otel, outcome: Outcome) -> None:
    span = _only_span(otel)
    assert outcome.error is not None
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[ERROR_TYPE] == outcome.error.__qualname__
    assert SD_ENGINE not in span.attributes
    assert otel.histogram_count(M_ACCEPTANCE_LENGTH) == 0
    durations = otel.points(M_OPERATION_DURATION)
    assert [p.attributes.get(ERROR_TYPE) for p in durations] == [outcome.error.__qualname__]


def assert_first_chunk_time_without_error(otel: Otel, stream: bool) -> None:
    """A stream cut after its first chunks has its time to first chunk, without
    ``error.type``: the GenAI metrics convention gives that metric the duration's
    attributes but not ``error.type`` (semantic-conventions-genai ``gen-ai-metrics.md``),
    and util-genai 1.1b0 records it when the first chunk arrives, before any error."""
    points = otel.points(M_TIME_TO_FIRST_CHUNK)
    assert len(points) == (1 if stream else 0)
    assert all(ERROR_TYPE not in p.attributes for p in points)
    durations = otel.points(M_OPERATION_DURATION)
    assert all(
        {k: v for k, v in d.attributes.items() if k != ERROR_TYPE} == dict(p.attributes)
        for d in durations
        for p in points
    )


# --------------------------------------------------------------------------- payload faults


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fault", sorted(PAYLOAD_FAULTS))
def test_payload_fault(sync_client, engine: str, fault: str, stream: bool) -> None:
    body, headers = _request(engine, stream, seed=101)
    clean_otel = Otel()
    with instrumented(clean_otel, genai_metrics=True):
        clean = run_sync(sync_client, body, headers)
    clean_record = _spec_attrs(_only_span(clean_otel))
    assert clean.error is None and clean_record, "the unfaulted request must give a record"

    faulted = {**headers, "x-sim-fault": fault}
    with uninstrumented():
        bare = run_sync(sync_client, body, faulted)
    otel = Otel()
    with instrumented(otel, genai_metrics=True), internal_errors() as reported:
        seen = run_sync(sync_client, body, faulted)
    seen.same_as(bare)
    assert seen.error is None
    assert reported == []  # a server's bad payload is no bug of ours

    span = _only_span(otel)
    assert span.status.status_code is StatusCode.UNSET
    if (engine, fault) in UNTOUCHED:
        assert _spec_attrs(span) == clean_record
    else:
        assert _spec_attrs(span) == {}, f"{engine} kept a record under {fault}"
        assert otel.histogram_count(M_ACCEPTANCE_LENGTH) == 0
        assert otel.counter_total(M_VERIFY_STEPS) == 0
    clean_otel.shutdown()
    otel.shutdown()


@pytest.mark.parametrize("fault", sorted(PAYLOAD_FAULTS))
async def test_payload_fault_async_stream(async_client, fault: str) -> None:
    body, headers = _request("vllm", True, seed=202)
    headers["x-sim-fault"] = fault
    with uninstrumented():
        bare = await run_async(async_client, body, headers)
    otel = Otel()
    with instrumented(otel, genai_metrics=True), internal_errors() as reported:
        seen = await run_async(async_client, body, headers)
    seen.same_as(bare)
    assert seen.error is None and seen.chunks
    assert reported == []
    assert _spec_attrs(_only_span(otel)) == {}
    otel.shutdown()


# --------------------------------------------------------------------------- transport faults


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("fault", "error"),
    [("http-429", openai.RateLimitError), ("http-500", openai.InternalServerError)],
)
def test_http_error(sync_client, fault: str, error: type, stream: bool) -> None:
    body, headers = _request("vllm", stream, seed=303)
    headers["x-sim-fault"] = fault
    with uninstrumented():
        bare = run_sync(sync_client, body, headers)
    otel = Otel()
    with instrumented(otel, genai_metrics=True):
        seen = run_sync(sync_client, body, headers)
    seen.same_as(bare)
    assert seen.error is error
    assert_error_span(otel, seen)
    otel.shutdown()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("fault", "error"),
    [("http-429", openai.RateLimitError), ("http-500", openai.InternalServerError)],
)
async def test_http_error_async(async_client, fault: str, error: type, stream: bool) -> None:
    body, headers = _request("vllm", stream, seed=303)
    headers["x-sim-fault"] = fault
    with uninstrumented():
        bare = await run_async(async_client, body, headers)
    otel = Otel()
    with instrumented(otel, genai_metrics=True):
        seen = await run_async(async_client, body, headers)
    seen.same_as(bare)
    assert seen.error is error
    assert_error_span(otel, seen)
    otel.shutdown()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_connection_dropped(sync_client, stream: bool) -> None:
    body, headers = _request("vllm", stream, seed=404)
    headers["x-sim-fault"] = "drop-mid-stream"
    with uninstrumented():
        bare = run_sync(sync_client, body, headers)
    otel = Otel()
    with instrumented(otel, genai_metrics=True):
        seen = run_sync(sync_client, body, headers)
    seen.same_as(bare)
    assert seen.error is not None
    if stream:  # the chunks sent before the cut reached the user, unchanged
        assert len(seen.chunks) == DROP_AFTER_CHUNKS
    assert_error_span(otel, seen)
    assert_first_chunk_time_without_error(otel, stream)
    otel.shutdown()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_connection_dropped_async(async_client, stream: bool) -> None:
    body, headers = _request("vllm", stream, seed=404)
    headers["x-sim-fault"] = "drop-mid-stream"
    with uninstrumented():
        bare = await run_async(async_client, body, headers)
    otel = Otel()
    with instrumented(otel, genai_metrics=True):
        seen = await run_async(async_client, body, headers)
    seen.same_as(bare)
    assert seen.error is not None
    if stream:
        assert len(seen.chunks) == DROP_AFTER_CHUNKS
    assert_error_span(otel, seen)
    assert_first_chunk_time_without_error(otel, stream)
    otel.shutdown()


def test_slow_chunks(sync_client) -> None:
    body, headers = _request("vllm", True, seed=505)
    body["max_tokens"] = 12
    clean_otel = Otel()
    with instrumented(clean_otel, genai_metrics=True):
        run_sync(sync_client, body, headers)
    clean_record = _spec_attrs(_only_span(clean_otel))
    slow = {**headers, "x-sim-fault": "slow", "x-sim-delay-ms": "25"}
    with uninstrumented():
        bare = run_sync(sync_client, body, slow)
    otel = Otel()
    with instrumented(otel, genai_metrics=True):
        seen = run_sync(sync_client, body, slow)
    seen.same_as(bare)
    assert seen.error is None
    span = _only_span(otel)
    assert span.status.status_code is StatusCode.UNSET
    assert _spec_attrs(span) == clean_record  # slow is not bad data
    gaps = len(seen.chunks) - 1
    assert (span.end_time - span.start_time) / 1e9 >= 0.025 * gaps * 0.9
    clean_otel.shutdown()
    otel.shutdown()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_client_timeout(sync_client, stream: bool) -> None:
    """``timeout=`` shorter than the server's delay: the SDK's own timeout error, as is."""
    body, headers = _request("vllm", stream, seed=606)
    headers.update({"x-sim-fault": "slow", "x-sim-delay-ms": "1500"})
    with uninstrumented():
        bare = run_sync(sync_client, body, headers, timeout=0.3)
    otel = Otel()
    with instrumented(otel, genai_metrics=True):
        seen = run_sync(sync_client, body, headers, timeout=0.3)
    seen.same_as(bare)
    assert seen.error is not None
    if not stream:
        assert seen.error is openai.APITimeoutError
    assert_error_span(otel, seen)
    otel.shutdown()


async def test_client_timeout_async(async_client) -> None:
    body, headers = _request("vllm", False, seed=606)
    headers.update({"x-sim-fault": "slow", "x-sim-delay-ms": "1500"})
    with uninstrumented():
        bare = await run_async(async_client, body, headers, timeout=0.3)
    otel = Otel()
    with instrumented(otel, genai_metrics=True):
        seen = await run_async(async_client, body, headers, timeout=0.3)
    seen.same_as(bare)
    assert seen.error is openai.APITimeoutError
    assert_error_span(otel, seen)
    otel.shutdown()
