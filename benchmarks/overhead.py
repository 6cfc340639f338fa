"""Client CPU overhead of spec_decode_otel against the bare SDK, openai-v2 and a floor.

Usage (from the repository root)::

    python benchmarks/overhead.py [--quick] [--json FILE] [--png FILE]

The real ``openai`` SDK is fed by an in-process transport replaying bodies recorded from
the project's simulator (``benchmarks/data/``, made by ``record_payloads.py``: vLLM
merged shape, level detailed, k=4; a non-streaming chat completion, a 103-chunk stream —
role chunk, 100 content chunks, finish chunk, usage chunk with the stats — and the same
stream cut to 8 chunks), so neither network nor server time is in the figures: only
client CPU.

Configurations, each in its own long-lived worker process (``_worker.py``; instrumentors
wrap classes process-wide), all with real OTel SDK providers — spans through a
``BatchSpanProcessor`` to an exporter that drops them, metrics aggregated by a
``MeterProvider`` whose reader is never collected during timing:

  A  bare SDK;
  B  ours, full, default settings: own span, attributes, every spec-decode metric (the
     opt-in GenAI client metrics off, as by default);
  C  ours in ``auto`` mode under opentelemetry-instrumentation-openai-v2 (enriching its span);
  D  opentelemetry-instrumentation-openai-v2 alone (also given a real LoggerProvider);
  E  the floor: the same SDK call plus one bare span carrying our attribute count and
     the same number of synchronous histogram records B makes; no wrapping logic;
  G  a yardstick: E plus a minimal wrapper that makes the span current and copies the
     stats into B's telemetry without checking anything (``_minimal.py``);
  F  (full runs) opentelemetry-instrumentation-genai-openai alone, in its own venv.

The parent drives one worker at a time, rotating the order every round, so batches of
all configurations interleave in time; each worker reports the process CPU time
(``time.process_time_ns``) of its batch divided by the calls in it. Overheads are
medians over rounds of the paired difference between the configuration and the same
worker with its instrumentation switched off (the instrumentors' class attributes put
back), batches taken back to back, so neither time drift nor a process's own memory
layout enters the difference; A is timed in its own never-instrumented worker too.

Figures:

  overhead_vs_openai_v2      (B - A) / (D - A), non-streaming
  overhead_vs_floor          (B - A) / (E - A), non-streaming
  stream_us_per_chunk        ((B - A) on the 103-chunk stream - (B - A) on the 8-chunk
                             stream) / (103 - 8): the extra CPU per chunk, with the
                             per-call part (span, detection, metrics, the stream's
                             own fixed work) taken out, counting every chunk the SDK
                             yields. Also printed: the cruder
                             stream_us_per_chunk_vs_nonstream = ((B - A) stream -
                             (B - A) non-streaming) / 103, which charges the stream's
                             extra fixed work (its proxy, time-to-first-chunk record,
                             colder caches after 103 chunks) to the chunks
  parse_us_10k_steps         from benchmarks/parse_bench.py
  rss_growth_mb_100k_calls   RSS growth of a fresh config-B worker over 100,000
                             non-streaming calls after 5,000 warm-up calls, collected
                             before each reading; spans go synchronously to the dropping
                             exporter there (a batch processor's bounded queue would move
                             the RSS high-water mark with the export thread's scheduling);
                             --quick: tracemalloc growth over 1,500 calls, scaled to 100k

No targets, from config G (``_minimal.py``, the least a wrapping instrumentation adds):
minimal_vs_openai_v2, minimal_vs_floor, minimal_us_per_chunk, ours_above_minimal_us.
Each ratio and slope also gets a 95 % bootstrap interval (``interval <name>: lo .. hi``):
a target whose interval straddles it is not decided by the run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _genai_venv  # noqa: E402
from _replay import ASYNC_KINDS, CONFIGS, KINDS, load_payloads  # noqa: E402

DEFAULT_PNG = HERE / "out" / "overhead.png"
ORDER = ("A", "B", "C", "D", "E", "G")
NAMES: tuple[str, ...] = ORDER
#: The interpreter of each configuration's worker (the default: this one).
PYTHONS: dict[str, str] = {}
TARGETS = {
    "overhead_vs_openai_v2": 0.5,
    "overhead_vs_floor": 1.5,
    "stream_us_per_chunk": 1.0,
    "parse_us_10k_steps": 1000.0,
    "rss_growth_mb_100k_calls": 5.0,
}
MEMORY_CALLS = 100_000


@dataclass(frozen=True)
class Plan:
    rounds: int
    nonstream_batch: int
    stream_batch: int
    stream_short_batch: int
    stream_pairs: int  # on/off pairs of long-stream batches per round and worker
    warmup_batches: int
    memory_method: str
    memory_calls: int
    memory_warmup: int


FULL = Plan(40, 300, 8, 120, 6, 2, "rss", MEMORY_CALLS, 5000)
QUICK = Plan(10, 80, 3, 25, 3, 1, "tracemalloc", 1500, 300)


class WorkerProcess:
    def __init__(self, name: str, *flags: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [PYTHONS.get(name, sys.executable), str(HERE / "_worker.py"), name, *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def wait_ready(self) -> None:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SystemExit(f"worker {self.name} failed to start")
        json.loads(line)

    def send(self, request: dict[str, Any]) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def receive(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SystemExit(f"worker {self.name} died")
        return json.loads(line)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self.send(request)
        return self.receive()

    def close(self) -> None:
        try:
            self.send({"op": "quit"})
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()


def start_workers(names: tuple[str, ...], *flags: str) -> dict[str, WorkerProcess]:
    workers = {name: WorkerProcess(name, *flags) for name in names}
    for worker in workers.values():
        worker.wait_ready()
    return workers


Samples = dict[str, dict[str, dict[str, list[float]]]]
#: configuration → kind → (on - off) per batch pair, µs
Differences = dict[str, dict[str, list[float]]]


def run_timing(
    plan: Plan, log: Any, passes: tuple[tuple[str, str, str], ...] = (KINDS,)
) -> tuple[list[Samples], dict[str, Any]]:
    """CPU µs per call, per configuration and kind, one entry per round; one Samples per
    pass, timed one after the other by the same workers.

    A pass is its non-streaming, long-stream and short-stream kinds (KINDS, or
    ASYNC_KINDS).
    """
    workers = start_workers(NAMES)
    try:
        described = {name: w.ask({"op": "describe"}) for name, w in workers.items()}
        results = []
        for number, kinds in enumerate(passes):
            if number:
                print(f"  pass {number + 1}: {', '.join(kinds)}", file=log, flush=True)
            results.append(_time_pass(plan, log, workers, kinds))
    finally:
        for w in workers.values():
            w.close()
    return results, described


def _time_pass(
    plan: Plan, log: Any, workers: dict[str, WorkerProcess], kinds: tuple[str, str, str]
) -> Samples:
    nonstream, stream, stream_short = kinds
    sizes = {
        nonstream: plan.nonstream_batch,
        stream: plan.stream_batch,
        stream_short: plan.stream_short_batch,
    }
    for _ in range(plan.warmup_batches):
        for w in workers.values():
            for kind, n in sizes.items():
                for enabled in (False, True):
                    w.ask({"op": "batch", "kind": kind, "n": n, "enabled": enabled})
    # samples[name][kind][state]: "on" is the configuration, "off" the same worker
    # with its instrumentation switched off (the bare SDK in the same process).
    samples: Samples = {name: {kind: {"on": [], "off": []} for kind in sizes} for name in NAMES}
    for r in range(plan.rounds):
        order = NAMES[r % len(NAMES) :] + NAMES[: r % len(NAMES)]
        if r % 2:
            order = order[::-1]
        for kind, n in sizes.items():
            pairs = plan.stream_pairs if kind == stream else 1
            for name in order:
                for pair in range(pairs):
                    # on/off order alternates by round and by pair
                    states = ("on", "off") if (r + pair) % 2 else ("off", "on")
                    for state in states if name != "A" else ("on",):
                        reply = workers[name].ask(
                            {"op": "batch", "kind": kind, "n": n, "enabled": state == "on"}
                        )
                        samples[name][kind][state].append(reply["cpu_ns"] / 1000.0)
        if log and (r + 1) % max(1, plan.rounds // 4) == 0:
            print(f"  timing: round {r + 1}/{plan.rounds}", file=log, flush=True)
    return samples


def run_memory(plan: Plan) -> dict[str, dict[str, Any]]:
    """Growth over ``plan.memory_calls`` non-streaming calls for A and B (in parallel)."""
    workers = start_workers(("A", "B"), "--sync-spans")
    try:
        for w in workers.values():
            w.send(
                {
                    "op": "memory",
                    "n": plan.memory_calls,
                    "warmup": plan.memory_warmup,
                    "method": plan.memory_method,
                }
            )
        return {name: w.receive() for name, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()


def parse_figure() -> float | None:
    try:
        from parse_bench import measure_parse_us_10k_steps  # type: ignore[import-not-found]
    except ImportError:
        return None
    return float(measure_parse_us_10k_steps())


def _pkg(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def summarise(
    samples: Samples,
    chunks: int,
    short_chunks: int,
    kinds: tuple[str, str, str] = KINDS,
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]], Differences]:
    """Medians per config/kind; overheads: the median over rounds of (on - off) in the
    same worker process, so a process's own memory layout cancels out; and those paired
    differences themselves (for ``intervals``). All are keyed by the sync kinds' names,
    whichever ``kinds`` were timed."""
    names = dict(zip(kinds, KINDS, strict=True))
    med = {
        n: {names[k]: statistics.median(v["on"]) for k, v in by_kind.items()}
        for n, by_kind in samples.items()
    }
    diffs = paired_differences(samples, kinds)
    over = overheads(diffs, chunks, short_chunks)
    for name, o in over.items():
        for timed, kind in names.items():
            o[f"{kind}_off"] = statistics.median(samples[name][timed]["off"])
    return med, over, diffs


def paired_differences(samples: Samples, kinds: tuple[str, str, str] = KINDS) -> Differences:
    """(on - off) per batch pair, per instrumented configuration, keyed by sync kind."""
    names = dict(zip(kinds, KINDS, strict=True))
    return {
        name: {
            kind: [
                x - a
                for x, a in zip(
                    samples[name][timed]["on"], samples[name][timed]["off"], strict=True
                )
            ]
            for timed, kind in names.items()
        }
        for name in NAMES[1:]
    }


def overheads(diffs: Differences, chunks: int, short_chunks: int) -> dict[str, dict[str, float]]:
    """Each configuration's overhead per kind (the median of its paired differences) and
    per chunk."""
    over: dict[str, dict[str, float]] = {}
    for name, by_kind in diffs.items():
        o = over[name] = {kind: statistics.median(d) for kind, d in by_kind.items()}
        # Marginal cost of a chunk: the long and the short stream differ only in chunks.
        o["per_chunk"] = (o["stream"] - o["stream_short"]) / (chunks - short_chunks)
        # The simpler estimate: the non-streaming call's overhead as the per-call part.
        o["per_chunk_vs_nonstream"] = (o["stream"] - o["nonstream"]) / chunks
    return over


def intervals(
    diffs: Differences,
    chunks: int,
    short_chunks: int,
    figures: Any,
    iterations: int = 2000,
    seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """95 % bootstrap intervals of ``figures(over)``: every configuration's paired
    differences resampled with replacement, the figures recomputed each time.

    A figure's interval says how far another run of the same code could put it on this
    machine, which one run's median alone does not.
    """
    rng = random.Random(seed)
    drawn: dict[str, list[float]] = {}
    for _ in range(iterations):
        resampled = {
            name: {kind: rng.choices(d, k=len(d)) for kind, d in by_kind.items()}
            for name, by_kind in diffs.items()
        }
        for key, value in figures(overheads(resampled, chunks, short_chunks)).items():
            if value is not None:
                drawn.setdefault(key, []).append(value)
    out = {}
    for key, values in drawn.items():
        values.sort()
        out[key] = (values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1])
    return out


def ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def shared_figures(over: dict[str, dict[str, float]]) -> dict[str, float | None]:
    """The three figures both passes report: (B-A)/(D-A), (B-A)/(E-A), B's per-chunk slope."""
    b = over["B"]
    return {
        "overhead_vs_openai_v2": ratio(b["nonstream"], over["D"]["nonstream"]),
        "overhead_vs_floor": ratio(b["nonstream"], over["E"]["nonstream"]),
        "stream_us_per_chunk": b["per_chunk"],
    }


def minimal_figures(over: dict[str, dict[str, float]]) -> dict[str, float | None]:
    """Config G against the targets' denominators: the least the two ratios and the
    per-chunk figure can be for code that wraps the SDK call and emits B's telemetry."""
    g, b = over["G"], over["B"]
    return {
        "minimal_vs_openai_v2": ratio(g["nonstream"], over["D"]["nonstream"]),
        "minimal_vs_floor": ratio(g["nonstream"], over["E"]["nonstream"]),
        "minimal_us_per_chunk": g["per_chunk"],
        "ours_above_minimal_us": b["nonstream"] - g["nonstream"],
    }


def both_figures(over: dict[str, dict[str, float]]) -> dict[str, float | None]:
    return {**shared_figures(over), **minimal_figures(over)}


def render_figures(found: dict[str, float | None]) -> str:
    """One ``name: value`` line per figure, as the issue asks them printed."""
    return "\n".join(
        f"{key}: {'n/a' if value is None else f'{value:.3f}'}" for key, value in found.items()
    )


def render_intervals(found: dict[str, tuple[float, float]]) -> str:
    return "\n".join(f"interval {key}: {lo:.3f} .. {hi:.3f}" for key, (lo, hi) in found.items())


def async_figures(
    med: dict[str, dict[str, float]], over: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """The async pass's medians, overheads and its figures, ours and the yardstick's (no
    targets: the issue's targets are for the sync client)."""
    return {
        "median_us_per_call": med,
        "overhead_us": over,
        "figures": {f"async_{key}": value for key, value in both_figures(over).items()},
    }


def render_async(result: dict[str, Any]) -> str:
    med, over = result["median_us_per_call"], result["overhead_us"]
    lines = [
        f"{'config':28} {'µs/call':>9} {'+µs':>8} {'stream µs':>10} {'+µs':>8} {'+µs/chunk':>10}",
        "-" * 78,
    ]
    for name in NAMES:
        o = over.get(name, {"nonstream": 0.0, "stream": 0.0, "per_chunk": 0.0})
        lines.append(
            f"{name + ' ' + CONFIGS[name][0]:28} {med[name]['nonstream']:9.1f} "
            f"{o['nonstream']:+8.1f} {med[name]['stream']:10.1f} {o['stream']:+8.1f} "
            f"{o['per_chunk']:+10.2f}"
        )
    return "\n".join(lines)


def render_table(
    med: dict[str, dict[str, float]],
    over: dict[str, dict[str, float]],
    described: dict[str, Any],
    chunks: int,
) -> str:
    head = (
        f"{'config':<28}{'µs/call':>9}{'+µs':>8}{'stream µs/call':>15}{'+µs':>8}"
        f"{'short µs/call':>14}{'+µs':>8}{'µs/chunk':>9}{'+µs/chunk':>10}"
        f"{'spans':>6}{'attrs':>6}{'records':>8}"
    )
    lines = [head, "-" * len(head)]
    for name in NAMES:
        label = f"{name} {CONFIGS[name][0]}"
        o = over.get(name)
        d = described.get(name, {}).get("nonstream", {})
        ds = described.get(name, {}).get("stream", {})
        records = f"{d.get('histogram_records', 0)}/{ds.get('histogram_records', 0)}"
        lines.append(
            f"{label:<28}{med[name]['nonstream']:>9.1f}"
            f"{(o['nonstream'] if o else 0.0):>+8.1f}"
            f"{med[name]['stream']:>15.1f}{(o['stream'] if o else 0.0):>+8.1f}"
            f"{med[name]['stream_short']:>14.1f}{(o['stream_short'] if o else 0.0):>+8.1f}"
            f"{med[name]['stream'] / chunks:>9.2f}{(o['per_chunk'] if o else 0.0):>+10.2f}"
            f"{d.get('spans', 0):>6}{d.get('span_attributes', 0):>6}{records:>8}"
        )
    return "\n".join(lines)


def write_png(path: Path, over: dict[str, dict[str, float]], med: dict[str, Any], quick: bool):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(NAMES[1:])
    labels = [f"{n}\n" + "\n".join(textwrap.wrap(CONFIGS[n][0], 12)) for n in names]
    colors = ["#d62728" if n in ("B", "C") else "#7f7f7f" for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    vals = [over[n]["nonstream"] for n in names]
    ax1.bar(labels, vals, color=colors)
    ax1.set_ylabel("extra client CPU per call (µs)")
    ax1.set_title(f"Non-streaming call (bare SDK: {med['A']['nonstream']:.0f} µs)")
    for i, v in enumerate(vals):
        ax1.annotate(f"{v:.0f}", (i, v), ha="center", va="bottom", fontsize=9)
    vals2 = [over[n]["per_chunk"] for n in names]
    # One far taller bar (genai-openai records a histogram per chunk) would flatten the
    # rest: clip the axis and print that bar's value at the top.
    others = [v for n, v in zip(names, vals2, strict=True) if n != "F"]
    top = max([*others, 1.0]) * 1.6
    clipped = any(v > top for v in vals2)
    ax2.bar(labels, [min(v, top) for v in vals2], color=colors)
    ax2.axhline(0, color="black", linewidth=0.6)
    if clipped:
        ax2.set_ylim(top=top * 1.08)
    ax2.set_ylabel("extra client CPU per chunk (µs)")
    ax2.set_title("Streaming, per chunk (103- vs 8-chunk stream)")
    for i, v in enumerate(vals2):
        shown = f"{v:.2f}" + (" (clipped)" if v > top else "")
        ax2.annotate(shown, (i, min(v, top)), ha="center", va="bottom", fontsize=9)
    fig.suptitle(
        "spec_decode_otel client overhead vs. bare openai SDK"
        + (" (--quick)" if quick else "")
        + "; in-process replay, CPU time, medians"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke-test size (< 60 s)")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--png", type=Path, default=DEFAULT_PNG, help="bar chart path")
    parser.add_argument("--rounds", type=int, help="override the number of timing rounds")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory run")
    parser.add_argument(
        "--async",
        dest="async_",
        action="store_true",
        help="also time every configuration through AsyncOpenAI (a second pass, after the "
        "sync one, with the same plan)",
    )
    parser.add_argument(
        "--genai-openai-python",
        metavar="PYTHON",
        help="time opentelemetry-instrumentation-genai-openai (config F) in this "
        "interpreter: a venv with it and its opentelemetry-util-genai installed (they "
        "cannot share an environment with openai-v2 2.4b0). Default for a full run: a "
        "cached venv built on first use (_genai_venv.py)",
    )
    parser.add_argument(
        "--no-genai-openai",
        action="store_true",
        help="skip config F (a --quick run skips it unless --genai-openai-python is given)",
    )
    args = parser.parse_args(argv)
    global NAMES
    NAMES = ORDER
    genai_python = args.genai_openai_python
    if genai_python is None and not (args.quick or args.no_genai_openai):
        genai_python, how = _genai_venv.ensure()
        print(f"config F venv: {genai_python or 'unavailable'} ({how})", file=sys.stderr)
    if genai_python:
        PYTHONS["F"] = genai_python
        NAMES = (*ORDER, "F")
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = Plan(**{**plan.__dict__, "rounds": args.rounds})
    payloads = load_payloads()
    chunks = payloads.stream_chunks
    short_chunks = payloads.stream_short_chunks
    t0 = time.monotonic()
    log = sys.stderr
    print(
        f"timing {len(NAMES)} configurations, {plan.rounds} interleaved rounds "
        f"({plan.nonstream_batch} non-streaming calls, {plan.stream_pairs} x "
        f"{plan.stream_batch} long or {plan.stream_short_batch} short streams per batch, "
        "each on and off)",
        file=log,
        flush=True,
    )
    passes, described = run_timing(plan, log, (KINDS, ASYNC_KINDS) if args.async_ else (KINDS,))
    samples = passes[0]
    med, over, diffs = summarise(samples, chunks, short_chunks)
    spread = intervals(diffs, chunks, short_chunks, both_figures)
    async_result: dict[str, Any] = {}
    if args.async_:
        a_med, a_over, a_diffs = summarise(passes[1], chunks, short_chunks, ASYNC_KINDS)
        async_result = async_figures(a_med, a_over)
        async_result["intervals"] = {
            f"async_{key}": value
            for key, value in intervals(a_diffs, chunks, short_chunks, both_figures).items()
        }
        async_result["samples_us"] = passes[1]

    memory: dict[str, Any] = {}
    rss_growth = None
    if not args.no_memory:
        print(
            f"memory: {plan.memory_calls} non-streaming calls ({plan.memory_method})",
            file=log,
            flush=True,
        )
        memory = run_memory(plan)
        scale = MEMORY_CALLS / plan.memory_calls
        for result in memory.values():
            result["growth_mb_100k_calls"] = result["growth_bytes"] * scale / 2**20
        rss_growth = memory["B"]["growth_mb_100k_calls"]
    print("parse: benchmarks/parse_bench.py", file=log, flush=True)
    parse_us = parse_figure()

    b, d, e = over["B"], over["D"], over["E"]
    figures = {
        **shared_figures(over),
        "parse_us_10k_steps": parse_us,
        "rss_growth_mb_100k_calls": rss_growth,
    }

    print()
    print(
        "Client CPU per call, median of interleaved batches (µs); '+' columns: median of "
        "(on - off) in the same worker, off = instrumentation switched off"
    )
    print(render_table(med, over, described, chunks))
    for kind in ("nonstream", "stream"):
        shape = ("spans", "span_attributes", "histogram_records")
        ours = [described["B"].get(kind, {}).get(k) for k in shape]
        for ref in ("E", "G"):
            theirs = [described[ref].get(kind, {}).get(k) for k in shape]
            if ours != theirs:
                print(f"WARNING: {ref} does not do B's OTel work ({kind}): {theirs} != {ours}")
    print(
        f"stream = {chunks} chunks ({payloads.stream_content_chunks} content), short = "
        f"{short_chunks} chunks; +µs/chunk = (stream +µs - short +µs) / {chunks - short_chunks}"
        "; records = synchronous histogram records per non-streaming/streaming call"
    )
    print(
        "per chunk, (stream +µs - non-stream +µs) / "
        f"{chunks}: "
        + ", ".join(f"{n} {over[n]['per_chunk_vs_nonstream']:+.2f}" for n in NAMES[1:])
    )
    if memory:
        how = (
            "RSS"
            if plan.memory_method == "rss"
            else f"tracemalloc over {plan.memory_calls} calls, scaled to {MEMORY_CALLS}"
        )
        for name, result in memory.items():
            print(
                f"memory {name} {CONFIGS[name][0]}: {result['growth_mb_100k_calls']:+.2f} MB "
                f"per {MEMORY_CALLS} non-streaming calls ({how})"
            )
    print()
    print(render_figures(figures))
    print()
    print(f"stream_us_per_chunk_vs_nonstream: {b['per_chunk_vs_nonstream']:.3f}")
    # The floor against openai-v2: the least overhead_vs_openai_v2 that any code emitting
    # B's span and histogram records through this OTel SDK can reach.
    floor_vs_openai_v2 = ratio(e["nonstream"], d["nonstream"])
    if floor_vs_openai_v2 is not None:
        print(f"floor_vs_openai_v2: {floor_vs_openai_v2:.3f}")
    print(f"ours_above_floor_us: {b['nonstream'] - e['nonstream']:.1f}")
    yardstick = minimal_figures(over)
    print(render_figures(yardstick))
    if "F" in over and over["F"]["nonstream"]:
        print(f"overhead_vs_genai_openai: {b['nonstream'] / over['F']['nonstream']:.3f}")
    if async_result:
        print()
        print("Through AsyncOpenAI (same payloads and plan; + = median of on - off, µs):")
        print(render_async(async_result))
        print(render_figures(async_result["figures"]))
    print()
    print("95 % bootstrap intervals (batch pairs resampled; how far another run could land):")
    print(render_intervals(spread))
    if async_result:
        print(render_intervals(async_result["intervals"]))
    print()
    for key, value in figures.items():
        verdict = "not measured" if value is None else "met" if value <= TARGETS[key] else "MISSED"
        if key in spread:
            verdict += " (95 % interval {:.3f} .. {:.3f})".format(*spread[key])
        print(f"  target {key} <= {TARGETS[key]:g}: {verdict}")
    print(f"(took {time.monotonic() - t0:.0f} s)")

    result = {
        "figures": figures,
        "intervals": spread,
        "targets": TARGETS,
        "definitions": {
            "overhead_vs_openai_v2": "(B-A)/(D-A), non-streaming, paired medians",
            "overhead_vs_floor": "(B-A)/(E-A), non-streaming, paired medians",
            "stream_us_per_chunk": (
                "((B-A) on the long stream - (B-A) on the short stream) / (chunk difference)"
            ),
            "stream_us_per_chunk_vs_nonstream": "((B-A)_stream - (B-A)_nonstream) / chunks",
            "parse_us_10k_steps": "benchmarks/parse_bench.py",
            "rss_growth_mb_100k_calls": (
                "config B (spans exported synchronously to a dropping exporter), RSS growth "
                "over 100k non-streaming calls after 5k warm-up calls"
                if plan.memory_method == "rss"
                else f"config B, tracemalloc growth over {plan.memory_calls} calls x "
                f"{MEMORY_CALLS // plan.memory_calls} (extrapolated)"
            ),
        },
        "configs": {n: {"label": CONFIGS[n][0], "description": CONFIGS[n][1]} for n in NAMES},
        "median_us_per_call": med,
        "overhead_us": over,
        "described": described,
        "memory": memory,
        "samples_us": samples,
        "plan": plan.__dict__,
        "quick": args.quick,
        "stream_chunks": chunks,
        "stream_short_chunks": short_chunks,
        "stream_us_per_chunk_vs_nonstream": b["per_chunk_vs_nonstream"],
        "async": async_result,
        "floor_vs_openai_v2": floor_vs_openai_v2,
        "ours_above_floor_us": b["nonstream"] - e["nonstream"],
        "minimal": yardstick,
        "environment": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "openai": _pkg("openai"),
            "opentelemetry-sdk": _pkg("opentelemetry-sdk"),
            "opentelemetry-instrumentation-openai-v2": _pkg(
                "opentelemetry-instrumentation-openai-v2"
            ),
            "spec-decode-otel": _pkg("spec-decode-otel"),
        },
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.png:
        write_png(args.png, over, med, args.quick)
        print(f"chart: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
