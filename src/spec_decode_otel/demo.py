"""``spec-decode-otel demo``: the whole product in one command, no servers to start.

It starts the simulator in-process on a free loopback port, instruments the ``openai``
SDK through :func:`spec_decode_otel.setup` (so ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the
other ``OTEL_*`` variables export everything to a collector when set; every call is
sampled, as the summary needs), runs a mixed workload — sync, async, streaming — against
two models whose drafters accept differently, and prints a per-model summary computed
from the spans the instrumentation emitted, not from the responses themselves: a
:class:`~spec_decode_otel.records.RecordsFileProcessor` turns each span into a line of
the records file (``--records-out`` keeps it), and the summary is
``spec-decode-otel summarize``'s, from the same code.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
from typing import TYPE_CHECKING

from spec_decode_otel import SpecDecodeInstrumentor, attributes, summary
from spec_decode_otel._terminal import write_out

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
        help="also write the records file: one JSON line per call (model, server, outcome, "
        "engine, trace_id, span_id, record), the input of spec-decode-otel summarize",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown only on a terminal)"
    )


class _Progress:
    """A one-line progress bar on stderr, drawn only when ``enabled``. Every request ends
    on the main thread (the sync loop, then one event loop), so no lock is needed."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled

    def advance(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        filled = 30 * self.done // max(self.total, 1)
        end = "\n" if self.done >= self.total else ""
        sys.stderr.write(
            f"\r  requests [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}{end}"
        )
        sys.stderr.flush()


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


def _where(exports: dict[str, tuple[str, ...]]) -> str:
    """What went where: "spans exported to the console (stdout); metrics not exported"."""
    return "; ".join(
        f"{signal} exported {' and '.join(exports[signal])}"
        if exports.get(signal)
        else f"{signal} not exported"
        for signal in ("spans", "metrics")
    )


def run(args: argparse.Namespace) -> int:
    """Exit status 1 when no call got a record: then the demo showed nothing."""
    from spec_decode_otel.records import RecordsFileProcessor
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
    records = io.StringIO()
    # The summary is computed from the spans, so every call's must be sampled, whatever
    # sampler the shell names for its applications (setup()'s TracerProvider reads it),
    # and the SDK must not be a no-op.
    os.environ["OTEL_TRACES_SAMPLER"] = "always_on"
    os.environ.pop("OTEL_SDK_DISABLED", None)
    providers = setup(
        "spec-decode-otel-demo",
        span_processors=[RecordsFileProcessor(records)],
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
        # Every call's span has ended: its line is in the records file.
        records.seek(0)
        summaries = summary.summarize(summary.read_rows(records, summary.Skipped()))
        write_out(summary.render(summaries, "the spans it emitted"))
        if providers.exports:
            print(_where(providers.exports), file=sys.stderr)
        if args.records_out:
            with open(args.records_out, "w", encoding="utf-8") as handle:
                handle.write(records.getvalue())
    finally:
        SpecDecodeInstrumentor().uninstrument()
        providers.shutdown()
    return 0 if any(m.engines for m in summaries) else 1
