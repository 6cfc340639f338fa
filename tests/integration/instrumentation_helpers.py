"""Shared pieces of the instrumentation tests: real OTel SDK providers read in memory,
SDK calls in every flavour, and the un-instrumented view of the same request.

The simulator's ``x-sim-seed`` header makes a request's sample depend on the seed alone,
so the same request sent again (here with plain ``httpx``, which nothing instruments)
returns the same speculative-decoding payload; what ``spec_decode_otel.record_from_json``
reads from it is what the instrumented call's span and metrics must carry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Sampler

import spec_decode_otel
from spec_decode_otel.payloads import parse_payloads
from spec_decode_otel.record import SpecDecodeAcceptanceRecord
from spec_decode_otel.telemetry import SCOPE_NAME

MODEL = "spec-sim"
MESSAGES = [{"role": "user", "content": "Describe a zebra-unicorn in exactly three words."}]
PROMPT = "Describe a zebra-unicorn in exactly three words."
ENGINES = ["vllm", "vllm-premerge", "sglang", "trtllm", "trtllm-released", "llamacpp", "none"]
#: Engines whose streams are asked for the usage chunk (vLLM puts its stats there and
#: llama.cpp moves its timings there); the others stream without it, so both placements
#: of usage-less and usage-carrying streams are exercised.
INCLUDE_USAGE_ENGINES = frozenset({"vllm", "vllm-premerge", "llamacpp"})
OPERATION = {"chat": "chat", "completions": "text_completion"}
SPEC_DECODE_METRICS = (
    "spec_decode.acceptance_length",
    "spec_decode.draft_acceptance_rate",
    "spec_decode.draft_tokens",
    "spec_decode.accepted_draft_tokens",
    "spec_decode.verify_steps",
    "spec_decode.accepted_at_position",
)
VOLATILE = ("id", "created")  # differ between two answers to the same seeded request


class Otel:
    """A TracerProvider and a MeterProvider of the real SDK, exported to memory; the
    tracer provider samples with ``sampler`` (None: the SDK's default)."""

    def __init__(self, sampler: Sampler | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(sampler=sampler)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("tests.user")

    # -- instrumentation --------------------------------------------------------------

    def instrument(self, **options: Any) -> None:
        """(Re-)instrument every openai client with these providers and ``options``."""
        spec_decode_otel.SpecDecodeInstrumentor().uninstrument()
        spec_decode_otel.SpecDecodeInstrumentor().instrument(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options
        )

    def uninstrument(self) -> None:
        spec_decode_otel.SpecDecodeInstrumentor().uninstrument()

    def close(self) -> None:
        spec_decode_otel.SpecDecodeInstrumentor().uninstrument()
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()

    # -- spans --------------------------------------------------------------------------

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def our_spans(self) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.instrumentation_scope.name == SCOPE_NAME]

    def only_span(self) -> ReadableSpan:
        spans = self.spans()
        assert len(spans) == 1, [s.name for s in spans]
        return spans[0]

    def clear(self) -> None:
        self.exporter.clear()

    # -- metrics ------------------------------------------------------------------------

    def metrics(self) -> list[tuple[str, Metric]]:
        """Every metric collected now, as (scope name, metric)."""
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [
            (sm.scope.name, m)
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        ]

    @staticmethod
    def find(
        metrics: list[tuple[str, Metric]], name: str, scope: str | None = SCOPE_NAME
    ) -> list[Metric]:
        return [m for s, m in metrics if m.name == name and (scope is None or s == scope)]

    @classmethod
    def points(
        cls, metrics: list[tuple[str, Metric]], name: str, scope: str | None = SCOPE_NAME
    ) -> list[Any]:
        """Data points of ``name`` from ``scope`` (None: from any scope)."""
        return [p for m in cls.find(metrics, name, scope) for p in m.data.data_points]

    def requests_by_outcome(self) -> dict[str, int]:
        """The ``spec_decode.requests`` counter's totals, by outcome."""
        points = self.points(self.metrics(), "spec_decode.requests")
        return {p.attributes["spec_decode.outcome"]: p.value for p in points}


# -- requests --------------------------------------------------------------------------


def request_kwargs(engine: str, api: str, stream: bool, seed: int, **extra: Any) -> dict[str, Any]:
    """SDK keyword arguments for one request to ``engine`` (header-selected shape)."""
    kwargs: dict[str, Any] = {"model": MODEL, "stream": stream}
    if api == "chat":
        kwargs["messages"] = MESSAGES
    else:
        kwargs["prompt"] = PROMPT
    headers = {"x-sim-seed": str(seed)}
    if engine is not None:
        headers["x-spec-decode-engine"] = engine
    kwargs["extra_headers"] = headers
    if engine == "sglang":
        kwargs["extra_body"] = {"return_spec_tokens_details": True}
    if stream and engine in INCLUDE_USAGE_ENGINES:
        kwargs["stream_options"] = {"include_usage": True}
    kwargs.update(extra)
    return kwargs


def create_method(client: Any, api: str) -> Any:
    return client.chat.completions.create if api == "chat" else client.completions.create


def call_sync(client: Any, api: str, kwargs: dict[str, Any]) -> list[Any]:
    """One call; the response object, or every chunk of a fully consumed stream."""
    result = create_method(client, api)(**kwargs)
    return list(result) if kwargs.get("stream") else [result]


async def call_async(client: Any, api: str, kwargs: dict[str, Any]) -> list[Any]:
    result = await create_method(client, api)(**kwargs)
    if kwargs.get("stream"):
        return [chunk async for chunk in result]
    return [result]


def raw_payload(base_url: str, api: str, kwargs: Mapping[str, Any]) -> Any:
    """The same request through plain ``httpx``: the decoded body or list of chunks."""
    body = {
        k: v
        for k, v in kwargs.items()
        if k not in ("extra_headers", "extra_body") and v is not None
    }
    body.update(kwargs.get("extra_body") or {})
    path = "/chat/completions" if api == "chat" else "/completions"
    response = httpx.post(
        base_url + path, json=body, headers=dict(kwargs.get("extra_headers") or {}), timeout=30
    )
    response.raise_for_status()
    return parse_payloads(response.text) if body.get("stream") else response.json()


def payload_usage(payload: Any) -> Mapping[str, Any] | None:
    chunks = payload if isinstance(payload, list) else [payload]
    for chunk in reversed(chunks):
        if chunk.get("usage"):
            return chunk["usage"]
    return None


def payload_finish_reasons(payload: Any) -> list[str]:
    chunks = payload if isinstance(payload, list) else [payload]
    return [
        c["finish_reason"]
        for chunk in chunks
        for c in chunk.get("choices") or ()
        if c.get("finish_reason") is not None
    ]


def server_of(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def dumps_without_volatile(objs: list[Any]) -> list[dict[str, Any]]:
    """SDK objects as JSON-like dicts, minus the fields that differ per answer."""
    out = []
    for obj in objs:
        data = obj.model_dump(exclude_unset=True) if hasattr(obj, "model_dump") else dict(obj)
        for key in VOLATILE:
            data.pop(key, None)
        out.append(json.loads(json.dumps(data)))
    return out


def fingerprint_left_on_the_usage_chunk(bare: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chunks a user who did not ask for usage sees once ``include_usage`` is injected,
    from ``bare`` (what they see without it): vLLM 0.34.0 stamps ``system_fingerprint``
    on a stream's terminal chunk only (``chat_completion/serving.py``, "Stamp the
    fingerprint on terminal chunks only"), which with ``include_usage`` is the usage chunk
    we hide, so the finish chunk shows none (README, ``inject_include_usage``)."""
    assert any("system_fingerprint" in chunk for chunk in bare)
    return [{k: v for k, v in chunk.items() if k != "system_fingerprint"} for chunk in bare]


# -- expectations ------------------------------------------------------------------------


def expected_span_attributes(record: SpecDecodeAcceptanceRecord) -> dict[str, Any]:
    """The ``spec_decode.*`` span attributes DESIGN.md promises for ``record``,
    written out from the record's fields (not through the code under test)."""
    expected: dict[str, Any] = {"spec_decode.engine": record.engine}
    fields = {
        "spec_decode.draft_method": record.draft_method,
        "spec_decode.mean_acceptance_length": record.mean_acceptance_length,
        "spec_decode.draft_acceptance_rate": record.draft_acceptance_rate,
        "spec_decode.num_spec_steps": record.num_spec_steps,
        "spec_decode.num_accepted_draft_tokens": record.num_accepted_draft_tokens,
        "spec_decode.num_draft_tokens": record.num_draft_tokens,
        "spec_decode.num_spec_tokens": record.num_spec_tokens,
    }
    expected.update({k: v for k, v in fields.items() if v is not None})
    if record.acceptance_histogram is not None:
        size = max(
            (record.num_spec_tokens or 0) + 1, max(record.acceptance_histogram, default=-1) + 1
        )
        expected["spec_decode.acceptance_histogram"] = tuple(
            record.acceptance_histogram.get(j, 0) for j in range(size)
        )
    if record.is_partial:
        expected["spec_decode.partial"] = True
    return expected


#: Attributes about the call rather than the record (tests check them on their own).
CALL_ATTRIBUTES = ("spec_decode.outcome", "spec_decode.read_to_end")


def spec_decode_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The record's ``spec_decode.*`` attributes (without the call's outcome)."""
    return {
        k: v
        for k, v in attributes.items()
        if k.startswith("spec_decode.") and k not in CALL_ATTRIBUTES
    }


def only_attributes(otel: Otel) -> dict[str, Any]:
    """The attributes of the one span of ours ``otel`` holds."""
    (span,) = otel.our_spans()
    return dict(span.attributes or {})


def expected_outcome(record: SpecDecodeAcceptanceRecord | None) -> str:
    """The outcome a call whose payload gives ``record`` (None: no stats) must report."""
    if record is None:
        return "no_stats"
    return "partial" if record.is_partial else "recorded"
