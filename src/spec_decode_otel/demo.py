"""``spec-decode-otel demo``: the whole product in one command, no servers to start.

It starts the simulator in-process on a free loopback port, instruments the ``openai``
SDK through :func:`spec_decode_otel.setup` (so ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the
other ``OTEL_*`` variables export everything to a collector when set), runs a mixed
workload — sync, async, streaming — against two models whose drafters accept differently,
and prints a per-model acceptance summary computed from the OpenTelemetry metrics the
instrumentation emitted (read back through an in-memory metric reader), not from the
responses themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from spec_decode_otel import telemetry as names
from spec_decode_otel._attributes import attributes

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

#: The two demo models: an EAGLE-like drafter that accepts well (per-position
#: conditional acceptance falling with depth) and an n-gram drafter that accepts poorly.
DEMO_MODELS: dict[str, tuple[float, ...]] = {
    "llama-3.1-8b-eagle3": (0.9, 0.85, 0.75, 0.65),
    "qwen2.5-7b-ngram": (0.5, 0.4, 0.3, 0.2),
}
PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Explain speculative decoding in two sentences."}
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=48, help="requests to send (default 48)")
    parser.add_argument("--seed", type=int, default=7, help="simulator seed (default 7)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step (default 4)")
    parser.add_argument(
        "--concurrency", type=int, default=8, help="concurrent async streams (default 8)"
    )
    parser.add_argument(
        "--records-out",
        metavar="PATH",
        help="also write one JSON line per request with a record: model, engine, trace_id, "
        "record (read back from the exported span)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown only on a terminal)"
    )


def _recorded_spans() -> Any:
    """A span processor that keeps the spec-decode attributes and trace id of every span
    we end (made on use: the SDK is the ``otlp`` extra, not the core)."""
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

    class RecordedSpans(SpanProcessor):
        def __init__(self) -> None:
            self.rows: list[dict[str, Any]] = []
            self._lock = threading.Lock()

        def on_end(self, span: ReadableSpan) -> None:
            attrs = span.attributes or {}
            if names.SD_ENGINE not in attrs:
                return
            with self._lock:
                self.rows.append(
                    {
                        "model": attrs.get(names.GEN_AI_REQUEST_MODEL),
                        "engine": attrs.get(names.SD_ENGINE),
                        "trace_id": format(span.context.trace_id, "032x"),
                        "record": _record_from_span(attrs),
                    }
                )

    return RecordedSpans()


def _record_from_span(attrs: Any) -> dict[str, Any]:
    dense = list(attrs.get(names.SD_ACCEPTANCE_HISTOGRAM) or ())
    return {
        "engine": attrs.get(names.SD_ENGINE),
        "mean_acceptance_length": attrs.get(names.SD_MEAN_ACCEPTANCE_LENGTH),
        "draft_acceptance_rate": attrs.get(names.SD_DRAFT_ACCEPTANCE_RATE),
        "acceptance_histogram": {str(j): c for j, c in enumerate(dense) if c},
        "num_accepted_draft_tokens": attrs.get(names.SD_NUM_ACCEPTED_DRAFT_TOKENS),
        "num_draft_tokens": attrs.get(names.SD_NUM_DRAFT_TOKENS),
        "num_spec_steps": attrs.get(names.SD_NUM_SPEC_STEPS),
        "num_spec_tokens": attrs.get(names.SD_NUM_SPEC_TOKENS),
        "completion_tokens": attrs.get(names.GEN_AI_USAGE_OUTPUT_TOKENS),
    }


class _Progress:
    """A one-line progress bar on stderr (no dependency; silent when not wanted)."""

    def __init__(self, total: int, enabled: bool, stream: TextIO = sys.stderr) -> None:
        self.total, self.done, self.enabled, self.stream = total, 0, enabled, stream
        self._lock = threading.Lock()

    def advance(self) -> None:
        with self._lock:
            self.done += 1
            if self.enabled:
                width = 30
                filled = width * self.done // max(self.total, 1)
                self.stream.write(
                    f"\r  requests [{'#' * filled}{'.' * (width - filled)}] "
                    f"{self.done}/{self.total}"
                )
                if self.done >= self.total:
                    self.stream.write("\n")
                self.stream.flush()


def _run_workload(base_url: str, requests: int, concurrency: int, progress: _Progress) -> None:
    import openai

    models = list(DEMO_MODELS)
    sync_count = requests // 2
    client = openai.OpenAI(base_url=base_url, api_key="demo", max_retries=0)
    # Two workloads, so the dashboards' per-workload panels have something to slice.
    with client, attributes(workload="interactive-chat"):
        for i in range(sync_count):
            model = models[i % len(models)]
            if i % 2 == 0:
                client.chat.completions.create(model=model, messages=PROMPT)
            else:
                stream = client.chat.completions.create(model=model, messages=PROMPT, stream=True)
                with stream:
                    for _ in stream:
                        pass
            progress.advance()

    async def run_async() -> None:
        aclient = openai.AsyncOpenAI(base_url=base_url, api_key="demo", max_retries=0)
        gate = asyncio.Semaphore(max(concurrency, 1))

        async def one(i: int) -> None:
            async with gate:
                stream = await aclient.chat.completions.create(
                    model=models[i % len(models)], messages=PROMPT, stream=True
                )
                async for _ in stream:
                    pass
                progress.advance()

        try:
            with attributes(workload="batch-summarize"):
                await asyncio.gather(*(one(i) for i in range(requests - sync_count)))
        finally:
            await aclient.close()

    asyncio.run(run_async())


@dataclass
class ModelSummary:
    """Acceptance for one model, as read back from the emitted metrics."""

    model: str
    engine: str = "?"
    k: int | None = None
    requests: int = 0
    acceptance_length_sum: float = 0.0
    drafted: int = 0
    accepted: int = 0
    steps_by_accepted: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    accepted_at_position: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def steps(self) -> int:
        return sum(self.steps_by_accepted.values())

    @property
    def mean_acceptance_length(self) -> float:
        return self.acceptance_length_sum / self.requests if self.requests else float("nan")

    @property
    def token_weighted_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.steps if self.steps else float("nan")

    @property
    def draft_acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")


def summarize(metrics_data: Any) -> list[ModelSummary]:
    """Per-model summaries from an OTel ``MetricsData`` (our scope's points only)."""
    by_model: dict[str, ModelSummary] = {}

    def entry(attrs: Any) -> ModelSummary:
        model = str(attrs.get(names.GEN_AI_REQUEST_MODEL, "?"))
        summary = by_model.setdefault(model, ModelSummary(model))
        summary.engine = str(attrs.get(names.SD_ENGINE, summary.engine))
        k = attrs.get(names.SD_NUM_SPEC_TOKENS)
        if isinstance(k, int):
            summary.k = k
        return summary

    for resource_metrics in metrics_data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            if scope_metrics.scope.name != names.SCOPE_NAME:
                continue
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    attrs = point.attributes or {}
                    if names.SD_ENGINE not in attrs:
                        continue
                    summary = entry(attrs)
                    if metric.name == names.M_ACCEPTANCE_LENGTH:
                        summary.requests += point.count
                        summary.acceptance_length_sum += point.sum
                    elif metric.name == names.M_DRAFT_TOKENS:
                        summary.drafted += point.value
                    elif metric.name == names.M_ACCEPTED_DRAFT_TOKENS:
                        summary.accepted += point.value
                    elif metric.name == names.M_VERIFY_STEPS:
                        summary.steps_by_accepted[int(attrs[names.SD_ACCEPTED])] += point.value
                    elif metric.name == names.M_ACCEPTED_AT_POSITION:
                        summary.accepted_at_position[int(attrs[names.SD_POSITION])] += point.value
    return sorted(by_model.values(), key=lambda s: s.model)


def render(summaries: Sequence[ModelSummary]) -> str:
    """The terminal summary: one block per model, with a small text histogram."""
    lines = ["", "Speculative decoding — per-request acceptance (from the emitted metrics)", ""]
    for s in summaries:
        lines.append(f"model {s.model}   engine {s.engine}   k={s.k}")
        lines.append(f"  requests                          {s.requests}")
        lines.append(f"  mean acceptance length (per req)  {s.mean_acceptance_length:.3f}")
        weighted = s.token_weighted_acceptance_length
        lines.append(f"  token-weighted acceptance length  {weighted:.3f}")
        lines.append(f"  draft acceptance rate             {s.draft_acceptance_rate:.3f}")
        steps = s.steps
        positions = (
            "  ".join(
                f"p{p}={s.accepted_at_position.get(p, 0) / steps:.2f}"
                for p in range(max(s.accepted_at_position, default=-1) + 1)
            )
            if steps
            else "n/a"
        )
        lines.append(f"  per-position acceptance           {positions}")
        lines.append("  steps by drafts accepted:")
        top = max(s.steps_by_accepted.values(), default=0)
        for j in range(max(s.steps_by_accepted, default=-1) + 1):
            count = s.steps_by_accepted.get(j, 0)
            bar = "#" * (round(30 * count / top) if top else 0)
            lines.append(f"    {j:>2} | {bar:<30} {count}")
        lines.append("")
    return "\n".join(lines)


def _write_records(path: str, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def run(args: argparse.Namespace) -> int:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from spec_decode_otel.instrumentation import SpecDecodeInstrumentor
    from spec_decode_otel.sdk_setup import setup
    from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer

    config = SimulatorConfig(
        engine="vllm",
        level="detailed",
        k=args.k,
        seed=args.seed,
        model_alphas=DEMO_MODELS,
        min_length=48,
        max_length=160,
    )
    reader = InMemoryMetricReader()
    spans = _recorded_spans()
    providers = setup(
        "spec-decode-otel-demo",
        span_processors=[spans],
        metric_readers=[reader],
        inject_include_usage=True,
        metric_attributes=("workload",),
        # The demo stands in for an app with no GenAI instrumentation of its own, and the
        # dashboard's request-rate and latency panels read these opt-in metrics.
        genai_metrics=True,
    )
    try:
        with SimulatorServer(config) as simulator:
            print(f"simulator (vLLM shape, k={args.k}) at {simulator.base_url}", file=sys.stderr)
            show = not args.no_progress and sys.stderr.isatty()
            progress = _Progress(args.requests, enabled=show)
            _run_workload(simulator.base_url, args.requests, args.concurrency, progress)
        summaries = summarize(reader.get_metrics_data())
        print(render(summaries))
        if providers.exporting:
            print("exported over OTLP to the configured collector", file=sys.stderr)
        if args.records_out:
            _write_records(args.records_out, spans.rows)
    finally:
        SpecDecodeInstrumentor().uninstrument()
        providers.shutdown()
    return 0 if summaries else 1
