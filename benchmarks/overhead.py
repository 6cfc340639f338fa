"""Client CPU that spec_decode_otel adds to openai SDK calls, against openai-v2 and a floor.

    python benchmarks/overhead.py [--quick] [--json [FILE]]

The real ``openai`` SDK replays recorded bodies (``benchmarks/data/``) through an
in-process ``httpx2.MockTransport``. The configurations (A bare SDK, B ours, D openai-v2,
E the floor) are switched on and off in one process with their instrumentors' public API
and timed in interleaved rounds. benchmarks/README.md says what runs and what each figure
means.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time
import timeit
import tracemalloc
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx2
import openai
from opentelemetry import trace
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from spec_decode_otel import SpecDecodeInstrumentor, record_from_json

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hostile  # noqa: E402

GUARD_RAILS = {
    "overhead_vs_openai_v2": 1.5,
    "stream_us_per_chunk": 2.0,
    "parse_us_10k_steps": 1000.0,
    "rss_growth_mb_100k_calls": 5.0,
    "worst_case_us_per_mib": 5000.0,
}
CONFIGS = {"A": "bare SDK", "B": "spec-decode-otel", "D": "openai-v2", "E": "floor"}
KINDS = ("nonstream", "stream", "stream_short")
MESSAGES = [{"role": "user", "content": "Summarise speculative decoding in two paragraphs."}]
#: rounds; calls per batch of each kind; memory-run calls; parse repeats; per hostile
#: body: the least number of off/on call pairs, seconds of calls to aim for (up to 20
#: pairs), and CPU seconds allowed before it is stopped
FULL = {"rounds": 150, "nonstream": 100, "stream": 1, "stream_short": 50, "memory": 100_000}
FULL |= {"parse_repeat": 31, "hostile_repeat": 5, "hostile_seconds": 4, "hostile_timeout": 120}
QUICK = {"rounds": 16, "nonstream": 20, "stream": 1, "stream_short": 10, "memory": 2_000}
QUICK |= {"parse_repeat": 7, "hostile_repeat": 5, "hostile_seconds": 0.3, "hostile_timeout": 20}
#: The long stream: the recorded one's 100 content chunks this many times (1,003 chunks).
STREAM_REPEATS = 10
HOSTILE_MEMORY_LIMIT = 3 << 30  # bytes of address space for the hostile corpus's process


def replay_client(body: bytes, content_type: str) -> openai.OpenAI:
    """An ``openai.OpenAI`` whose every request is answered with ``body``, in process."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": content_type}, content=body)

    http_client = httpx2.Client(transport=httpx2.MockTransport(handler))
    return openai.OpenAI(
        base_url="http://127.0.0.1:8000/v1", api_key="-", max_retries=0, http_client=http_client
    )


def lengthened(sse: bytes, content_chunks: int, repeats: int) -> bytes:
    """The recorded stream, content chunks sent ``repeats`` times (slope above noise)."""
    events = sse.split(b"\n\n")
    content = events[1 : 1 + content_chunks]
    return b"\n\n".join(events[:1] + content * repeats + events[1 + content_chunks :])


def call(client: openai.OpenAI, stream: bool) -> Any:
    """One chat completion; a stream is read to its end."""
    if not stream:
        return client.chat.completions.create(model="spec-sim", messages=MESSAGES, max_tokens=256)
    options = {"include_usage": True}
    chunks = client.chat.completions.create(
        model="spec-sim", messages=MESSAGES, max_tokens=512, stream=True, stream_options=options
    )
    return sum(1 for _ in chunks)


class Drop(SpanExporter, LogRecordExporter):
    """Drops spans or log records, keeping only the last batch."""

    last: Any = ()

    def export(self, batch: Any) -> None:
        self.last = batch

    def shutdown(self) -> None: ...

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class Providers:
    """Real SDK providers: spans (batched, or one by one) and logs (openai-v2 emits some)
    exported to nowhere, and metrics kept by a reader that is never collected."""

    def __init__(self, processor: type = BatchSpanProcessor) -> None:
        self.spans = Drop()
        self.tracer = TracerProvider()
        self.tracer.add_span_processor(processor(self.spans))
        self.meter = MeterProvider(metric_readers=[InMemoryMetricReader()])
        self.logger = LoggerProvider()
        self.logger.add_log_record_processor(BatchLogRecordProcessor(Drop()))

    def flush(self) -> None:
        self.tracer.force_flush()
        self.logger.force_flush()


class Floor:
    """Config E: one span around the bare call with B's 19 attributes, and B's two histogram
    records (B's attribute sets, with the span's context); none of B's counter sums."""

    START = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "spec-sim",
        "server.address": "127.0.0.1",
        "server.port": 8000,
    }
    END = {
        "gen_ai.request.max_tokens": 256,
        "gen_ai.response.model": "spec-sim",
        "spec_decode.outcome": "recorded",
        "gen_ai.usage.input_tokens": 11,
        "gen_ai.usage.output_tokens": 256,
        "gen_ai.response.finish_reasons": ("length",),
        "spec_decode.engine": "vllm",
        "spec_decode.mean_acceptance_length": 2.84,
        "spec_decode.draft_acceptance_rate": 0.46,
        "spec_decode.num_spec_steps": 90,
        "spec_decode.num_accepted_draft_tokens": 166,
        "spec_decode.num_draft_tokens": 360,
        "spec_decode.num_spec_tokens": 4,
        "spec_decode.acceptance_histogram": (25, 17, 13, 12, 23),
    }
    METRIC = START | {
        "gen_ai.response.model": "spec-sim",
        "spec_decode.engine": "vllm",
        "spec_decode.num_spec_tokens": 4,
    }

    def __init__(self, providers: Providers) -> None:
        self.tracer = providers.tracer.get_tracer("bench.floor")
        meter = providers.meter.get_meter("bench.floor")
        self.length = meter.create_histogram("spec_decode.acceptance_length", unit="{token}")
        self.rate = meter.create_histogram("spec_decode.draft_acceptance_rate", unit="1")

    def call(self, client: openai.OpenAI, stream: bool) -> Any:
        kind = trace.SpanKind.CLIENT
        span = self.tracer.start_span("chat spec-sim", kind=kind, attributes=self.START)
        result = call(client, stream)
        span.set_attributes(self.END)
        context = trace.set_span_in_context(span)
        self.length.record(2.84, self.METRIC, context=context)
        self.rate.record(0.46, self.METRIC, context=context)
        span.end()
        return result


class SdkClock:
    """Thread CPU ns in the SDK's own work, which every configuration only calls: its
    ``request`` (transport and, unless streaming, parse) and building each stream chunk.
    Left out of the timings: its drift on a shared machine hides what configurations add."""

    def __init__(self) -> None:
        self.ns, self._depth = 0, 0
        for name in ("request", "_process_response_data"):
            setattr(openai.OpenAI, name, self._timed(getattr(openai.OpenAI, name)))

    def _timed(self, method: Any) -> Any:
        def timed(client: Any, *args: Any, **kwargs: Any) -> Any:
            self._depth, t0 = self._depth + 1, time.thread_time_ns()
            try:
                return method(client, *args, **kwargs)
            finally:
                self._depth -= 1
                if not self._depth:  # a chunk built inside ``request`` counts once
                    self.ns += time.thread_time_ns() - t0

        return timed


class Bench:
    """The replayed clients, and the configurations switched on and off in this process."""

    def __init__(self, providers: Providers) -> None:
        self.providers, self.floor = providers, Floor(providers)
        self.sdk = SdkClock()
        manifest = json.loads((HERE / "data" / "manifest.json").read_text())
        self.clients, self.chunks = {}, {}
        for kind in KINDS:
            body = (HERE / "data" / manifest[kind]["file"]).read_bytes()
            self.chunks[kind] = manifest[kind].get("chunks", 1)
            if kind == "stream":
                content = manifest[kind]["content_chunks"]
                body = lengthened(body, content, STREAM_REPEATS)
                self.chunks[kind] += content * (STREAM_REPEATS - 1)
            self.clients[kind] = replay_client(body, manifest[kind]["content_type"])

    def switch(self, config: str, on: bool) -> None:
        p = self.providers
        if config == "B" and on:
            SpecDecodeInstrumentor().instrument(tracer_provider=p.tracer, meter_provider=p.meter)
        elif config == "B":
            SpecDecodeInstrumentor().uninstrument()
        elif config == "D" and on:
            OpenAIInstrumentor().instrument(
                tracer_provider=p.tracer, meter_provider=p.meter, logger_provider=p.logger
            )
        elif config == "D":
            OpenAIInstrumentor().uninstrument()

    def cpu_us(self, config: str, kind: str, n: int) -> float:
        """CPU µs per call over ``n`` calls (after one untimed call), exports included,
        the SDK's own work (:class:`SdkClock`) left out."""
        client, stream = self.clients[kind], kind != "nonstream"
        run = self.floor.call if config == "E" else call
        run(client, stream)
        self.providers.flush()
        t0, sdk = time.process_time_ns(), self.sdk.ns
        for _ in range(n):
            run(client, stream)
        self.providers.flush()
        return (time.process_time_ns() - t0 - (self.sdk.ns - sdk)) / n / 1000


def time_configs(bench: Bench, plan: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """CPU µs per call, ``times[config][kind]``, one entry per round."""
    names = list(CONFIGS)
    times: dict[str, dict[str, list[float]]] = {c: {k: [] for k in KINDS} for c in names}
    for r in range(plan["rounds"]):
        for config in names[r % 4 :] + names[: r % 4]:
            bench.switch(config, True)
            for kind in KINDS:
                times[config][kind].append(bench.cpu_us(config, kind, plan[kind]))
            bench.switch(config, False)
        print(f"  round {r + 1}/{plan['rounds']}", file=sys.stderr, end="\r", flush=True)
    print(file=sys.stderr)
    return times


def overheads(times: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per configuration and kind: the median over rounds of (config - A) in that round."""
    a = times["A"]
    return {
        c: {k: statistics.median(x - y for x, y in zip(t[k], a[k], strict=True)) for k in KINDS}
        for c, t in times.items()
    }


def memory_growth_mb(client: openai.OpenAI, calls: int, quick: bool) -> tuple[float, str]:
    """B's memory growth over ``calls`` non-streaming calls, scaled to 100,000 calls; spans
    go synchronously to nowhere (a batch queue's fill level would move the RSS)."""
    p = Providers(SimpleSpanProcessor)
    SpecDecodeInstrumentor().instrument(tracer_provider=p.tracer, meter_provider=p.meter)
    for _ in range(min(calls, 5_000)):
        call(client, False)
    gc.collect()
    if quick:  # too few calls for the RSS to tell: Python's own allocations instead
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if quick else rss_bytes()
    for _ in range(calls):
        call(client, False)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] if quick else rss_bytes()
    tracemalloc.stop()
    SpecDecodeInstrumentor().uninstrument()
    how = f"tracemalloc over {calls} calls, x {100_000 // calls}" if quick else "RSS"
    return (after - before) / 2**20 * 100_000 / calls, how


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def detailed_vllm_payload(steps: int = 10_000, k: int = 4) -> dict[str, Any]:
    """A consistent vLLM merged-shape body, level ``detailed``: per-step arrays of
    ``steps`` entries."""
    accepted = [i * 7 % (k + 1) for i in range(steps)]
    total = sum(accepted)
    spec = {
        "mean_acceptance_length": 1 + total / steps,
        "draft_acceptance_rate": total / (k * steps),
        "acceptance_histogram": [accepted.count(j) for j in range(k + 1)],
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": total,
        "num_draft_tokens": k * steps,
        "num_spec_tokens": k,
        "per_step_accepted": accepted,
        "per_step_drafted": [k] * steps,
    }
    usage = {"prompt_tokens": 21, "completion_tokens": steps + total, "total_tokens": 0}
    choice = {"index": 0, "message": {"role": "assistant", "content": "x"}}
    return {
        "model": "m",
        "choices": [choice],
        "usage": usage,
        "metrics": {"speculative_decoding": spec},
    }


def parse_us_10k_steps(repeat: int) -> float:
    """µs of one ``record_from_json`` of the 10,000-step payload: the fastest of
    ``repeat`` timeit batches, as timeit's documentation advises."""
    payload = detailed_vllm_payload()
    if record_from_json(payload) is None:
        raise SystemExit("the 10,000-step payload gave no record: nothing to time")
    timer = timeit.Timer(lambda: record_from_json(payload))
    number, _ = timer.autorange()
    return min(timer.repeat(repeat, number)) / number * 1e6


def hostile_body(bench: Bench, name: str, plan: dict[str, Any]) -> dict[str, Any]:
    """The CPU B adds to a call replaying one hostile body: the fastest of alternating
    instrumented calls minus the fastest bare one, both without the SDK's own work (other
    work only ever adds time, and the SDK takes up to a second on these bodies); and the
    extra peak RSS."""
    body = hostile.build(name)
    stream = body.startswith(b"data:")
    client = replay_client(body, "text/event-stream" if stream else "application/json")
    errors = []

    def cpu_us() -> float:
        # This thread's CPU: spans are exported in it here, and while a CPU timer is armed
        # (the time limit) the process CPU clock only advances at scheduler ticks.
        gc.collect()
        t0, sdk = time.thread_time_ns(), bench.sdk.ns
        try:
            call(client, stream)
        except Exception as exc:  # the SDK's own failure, instrumented or not
            errors.append(type(exc).__name__)
        return (time.thread_time_ns() - t0 - (bench.sdk.ns - sdk)) / 1000

    t0 = time.thread_time_ns()
    cpu_us()  # the SDK's first parse of this body, not counted; the whole call sizes pairs
    first = (time.thread_time_ns() - t0) / 1000
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    off, on = [], []
    pairs = min(20, int(plan["hostile_seconds"] * 1e6 / 2 / first))
    for _ in range(max(plan["hostile_repeat"], pairs)):
        off.append(cpu_us())
        bench.switch("B", True)
        call(bench.clients["nonstream"], False)  # the instrumentation's first call
        on.append(cpu_us())
        bench.switch("B", False)
    mib = len(body) / 2**20
    extra = min(on) - min(off)
    return {
        "name": name,
        "status": "ok",
        "mib": mib,
        "pairs": len(off),
        "off_us": min(off),
        "extra_us": extra,
        "us_per_mib": extra / mib,
        "extra_peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024,
        "sdk_errors": sorted(set(errors)),
    }


def hostile_child(quick: bool, names: list[str]) -> None:
    """Measures ``names`` in turn, one JSON line each. SIGPROF, whose default action ends
    the process, stops a body that takes more CPU seconds than ``hostile_timeout``."""
    resource.setrlimit(resource.RLIMIT_AS, (HOSTILE_MEMORY_LIMIT, HOSTILE_MEMORY_LIMIT))
    plan = QUICK if quick else FULL
    bench = Bench(Providers(SimpleSpanProcessor))
    call(bench.clients["nonstream"], False)  # the SDK's first call in this process
    for name in names:
        signal.setitimer(signal.ITIMER_PROF, plan["hostile_timeout"])
        print(json.dumps(hostile_body(bench, name, plan)), flush=True)
        signal.setitimer(signal.ITIMER_PROF, 0)


def run_hostile(quick: bool) -> list[dict[str, Any]]:
    """Every hostile body, in a child process that is started again after a body that
    ended it (by its CPU time limit, or a failure such as its memory limit)."""
    names, rows = list(hostile.BUILDERS), []
    timeout = (QUICK if quick else FULL)["hostile_timeout"]
    while len(rows) < len(names):
        argv = [sys.executable, __file__, "--hostile", *names[len(rows) :]]
        argv += ["--quick"] if quick else []
        done = subprocess.run(argv, capture_output=True, text=True)
        rows += [json.loads(line) for line in done.stdout.splitlines()]
        if len(rows) < len(names):
            status = f"failed: {(done.stderr.strip().splitlines() or ['no output'])[-1][:100]}"
            if done.returncode == -signal.SIGPROF:
                status = f"timeout ({timeout} CPU s)"
            rows.append({"name": names[len(rows)], "status": status})
    return rows


def report(result: dict[str, Any], out: Any) -> None:
    med, over, chunks = result["median_us"], result["overhead_us"], result["chunks"]
    print("Client CPU per call, µs: medians over rounds; + = minus A in the same round", file=out)
    head = "".join(f"{h:>9}" for h in ("call", "+", "stream", "+", "short", "+", "+/chunk"))
    print(f"{'config':20}{head}", file=out)
    for c, label in CONFIGS.items():
        o = over[c]
        slope = (o["stream"] - o["stream_short"]) / (chunks["stream"] - chunks["stream_short"])
        cells = "".join(f"{med[c][k]:9.0f}{o[k]:+9.1f}" for k in KINDS)
        print(f"{c + ' ' + label:20}{cells}{slope:+9.2f}", file=out)
    attributes, load = result["span_attributes"], result["environment"]["load_average"]
    print(
        f"streams of {chunks['stream']} and {chunks['stream_short']} chunks; span attributes:"
        f" B {attributes['B']}, E {attributes['E']}; load average at the end {load[:2]}",
        file=out,
    )
    print(f"memory: {result['memory_method']}", file=out)
    print("\nHostile bodies, instrumented - bare (fastest call of each):", file=out)
    for row in result["hostile"]:
        if row["status"] != "ok":
            print(f"  {row['name']:32} {row['status']}", file=out)
            continue
        errors = f"  (SDK raised {', '.join(row['sdk_errors'])})" if row["sdk_errors"] else ""
        print(
            f"  {row['name']:32} {row['mib']:6.2f} MiB {row['extra_us']:+10.0f} µs"
            f" {row['us_per_mib']:+9.0f} µs/MiB, peak RSS +{row['extra_peak_mb']:.0f} MB{errors}",
            file=out,
        )
    print(file=out)
    for name, value in result["figures"].items():
        line = f"{name}: {'n/a' if value is None else f'{value:.3f}'}"
        if name in GUARD_RAILS:
            met = value is not None and value <= GUARD_RAILS[name]
            line += f"  (guard-rail <= {GUARD_RAILS[name]:g}: {'met' if met else 'MISSED'})"
        print(line, file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run, < 60 s; noisy")
    json_help = "results as JSON to FILE, or to stdout (the report then goes to stderr)"
    parser.add_argument("--json", nargs="?", const="-", metavar="FILE", help=json_help)
    parser.add_argument("--hostile", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hostile:  # the child process measuring hostile bodies
        hostile_child(args.quick, args.hostile)
        return 0
    plan = QUICK if args.quick else FULL
    started = time.monotonic()
    bench = Bench(Providers())
    print(f"timing A, B, D, E: {plan['rounds']} interleaved rounds", file=sys.stderr)
    times = time_configs(bench, plan)
    span_attributes = {}
    for config in ("B", "E"):
        bench.switch(config, True)
        bench.cpu_us(config, "nonstream", 1)
        span_attributes[config] = len(bench.providers.spans.last[-1].attributes)
        bench.switch(config, False)
    print(f"memory: {plan['memory']} calls", file=sys.stderr)
    growth, memory_method = memory_growth_mb(bench.clients["nonstream"], plan["memory"], args.quick)
    print("parse", file=sys.stderr)
    parse_us = parse_us_10k_steps(plan["parse_repeat"])
    print(f"hostile corpus: {len(hostile.BUILDERS)} bodies", file=sys.stderr)
    hostile_rows = run_hostile(args.quick)
    per_mib = [row["us_per_mib"] for row in hostile_rows if row["status"] == "ok"]

    over = overheads(times)
    b, d, e = over["B"], over["D"], over["E"]
    chunks = bench.chunks["stream"] - bench.chunks["stream_short"]
    figures = {
        "overhead_vs_openai_v2": b["nonstream"] / d["nonstream"],
        "overhead_vs_floor": b["nonstream"] / e["nonstream"],
        "stream_us_per_chunk": (b["stream"] - b["stream_short"]) / chunks,
        "parse_us_10k_steps": parse_us,
        "rss_growth_mb_100k_calls": growth,
        # None when a body timed out or failed: no worst case is known then
        "worst_case_us_per_mib": max(per_mib) if len(per_mib) == len(hostile_rows) else None,
    }
    packages = ("openai", "opentelemetry-sdk", "opentelemetry-instrumentation-openai-v2")
    result = {
        "figures": figures,
        "guard_rails": GUARD_RAILS,
        "quick": args.quick,
        "plan": plan,
        "median_us": {c: {k: statistics.median(v) for k, v in t.items()} for c, t in times.items()},
        "overhead_us": over,
        "chunks": bench.chunks,
        "span_attributes": span_attributes,
        "memory_method": memory_method,
        "hostile": hostile_rows,
        "seconds": round(time.monotonic() - started),
        "environment": {"python": platform.python_version(), "load_average": os.getloadavg()}
        | {"cpus": os.cpu_count()}
        | {p: version(p) for p in packages},
    }
    report(result, sys.stderr if args.json == "-" else sys.stdout)
    if args.json == "-":
        print(json.dumps(result, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
