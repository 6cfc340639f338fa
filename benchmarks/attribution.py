"""Where a configuration's per-call CPU goes, measured in situ by a sampling profiler.

Usage (from the repository root)::

    python benchmarks/attribution.py [--quick] [--configs B,E] [--kind KIND] [--json FILE]

KIND: nonstream, stream, stream_short, or the same three through ``AsyncOpenAI``
(async_nonstream, ...).

Why this exists: ``overhead.py`` says how much CPU an instrumentation adds, not whose
code spends it. Timing parts of our code in a tight loop understates them 2-4x (on the
real call path, between two ~650 µs runs of the SDK's own pydantic and httpx work, the
caches are cold), and stubbing parts out moves the rest. Here nothing is changed: each
configuration runs its calls back to back in an ``overhead.py`` worker while ``py-spy``
samples the process from outside, and every sample is charged to the innermost frame
that belongs to a known owner (standard-library frames are charged to their caller):

  ours   spec_decode_otel
  otel   opentelemetry (API and SDK)
  sdk    openai, httpx/httpx2, pydantic, and what they call
  bench  the benchmark's own driver (the floor's few lines live here)

Shares of the samples taken in the call loop, times the worker's thread CPU per call,
give µs per call by owner. With the floor (E) in the same run, B - E by owner splits our
cost above the floor into our own code, extra OpenTelemetry work, and the SDK itself
running slower next to ours.

py-spy pauses the process for each sample (``--nonblocking`` stacks are torn often
enough to misattribute a few per cent), which costs some µs per call; figures are
shares, so that scales out. It needs ptrace rights over the worker (root, or
``kernel.yama.ptrace_scope`` = 0).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _replay import ASYNC_KINDS, KINDS  # noqa: E402
from overhead import WorkerProcess  # noqa: E402

OWNERS = ("ours", "otel", "sdk", "bench", "other")
#: Path fragments (full filenames, as py-spy's ``--full-filenames`` gives them) → owner,
#: first match wins. Anything else under a site-packages is "other"; what is left is the
#: standard library, charged to the calling frame.
_OWNER_PATTERNS: tuple[tuple[str, str], ...] = (
    ("/spec_decode_otel/", "ours"),
    ("/opentelemetry/", "otel"),
    ("/openai/", "sdk"),
    ("/httpx2/", "sdk"),
    ("/httpx/", "sdk"),
    ("/httpcore/", "sdk"),
    ("/pydantic/", "sdk"),
    ("/pydantic_core/", "sdk"),
    ("/anyio/", "sdk"),
    ("/typing_extensions", "sdk"),
    ("/benchmarks/", "bench"),
)
_FRAME = re.compile(r"^(?P<function>.*) \((?P<path>.*?)(?::(?P<line>\d+))?\)$")
#: The worker's loop marks the samples taken while calls run (its imports, set-up and
#: the export thread's waits are not).
LOOP_MARKER = "Worker.loop ("


@dataclass(frozen=True)
class Frame:
    function: str
    path: str

    @property
    def owner(self) -> str | None:
        for fragment, owner in _OWNER_PATTERNS:
            if fragment in self.path:
                return owner
        if "site-packages/" in self.path or "dist-packages/" in self.path:
            return "other"
        return None  # standard library (or frozen): charged to the caller

    @property
    def label(self) -> str:
        tail = "/".join(self.path.split("/")[-2:])
        return f"{self.function} ({tail})"


def parse_frame(text: str) -> Frame:
    match = _FRAME.match(text)
    if match is None:
        return Frame(text, "")
    return Frame(match["function"], match["path"])


@dataclass
class Attribution:
    """Loop samples charged to owners, and to the functions of each owner."""

    samples: int = 0
    by_owner: Counter[str] = field(default_factory=Counter)
    by_function: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, frames: list[Frame], count: int) -> None:
        self.samples += count
        for frame in reversed(frames):
            owner = frame.owner
            if owner is not None:
                break
        else:
            owner, frame = "other", frames[-1]
        self.by_owner[owner] += count
        self.by_function.setdefault(owner, Counter())[frame.label] += count

    def us_per_call(self, us: float) -> dict[str, float]:
        """µs per call by owner, given the loop's CPU µs per call."""
        total = self.samples or 1
        return {owner: us * self.by_owner[owner] / total for owner in OWNERS}

    def top(self, owner: str, us: float, n: int) -> list[tuple[str, float]]:
        total = self.samples or 1
        found = self.by_function.get(owner, Counter())
        return [(name, us * count / total) for name, count in found.most_common(n)]


def attribute(raw_lines: Iterable[str]) -> Attribution:
    """Charge py-spy ``--format raw`` lines (``frame;frame;... count``) to owners,
    keeping only the samples taken inside the worker's call loop."""
    result = Attribution()
    for line in raw_lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        texts = stack.split(";")
        inside = [i for i, text in enumerate(texts) if text.startswith(LOOP_MARKER)]
        if not inside:
            continue
        frames = [parse_frame(text) for text in texts[inside[0] + 1 :]]
        if frames:
            result.add(frames, int(count))
    return result


def profile(name: str, kind: str, warmup: float, seconds: float, rate: int) -> dict[str, Any]:
    """Run ``name``'s calls in a worker while py-spy samples it; µs per call by owner."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    worker = WorkerProcess(name)
    try:
        worker.wait_ready()
        worker.send({"op": "loop", "kind": kind, "warmup": warmup, "seconds": seconds})
        if not worker.receive().get("measuring"):
            raise SystemExit(f"worker {name} did not start its loop")
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / f"{name}.raw"
            spy = subprocess.run(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(worker.proc.pid),
                    "--rate",
                    str(rate),
                    "--duration",
                    str(max(1, int(seconds - 1))),
                    "--format",
                    "raw",
                    "--full-filenames",
                    "--output",
                    str(raw),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            loop = worker.receive()
            if spy.returncode != 0 or not raw.exists():
                raise SystemExit(
                    f"py-spy could not sample worker {name} (ptrace rights?):\n{spy.stderr}"
                )
            attribution = attribute(raw.read_text().splitlines())
    finally:
        worker.close()
    us = loop["thread_cpu_ns"] / 1000
    return {
        "config": name,
        "kind": kind,
        "calls": loop["calls"],
        "us_per_call": us,
        "samples": attribution.samples,
        "by_owner_us": attribution.us_per_call(us),
        "top_ours_us": attribution.top("ours", us, 15),
        "top_otel_us": attribution.top("otel", us, 8),
    }


def report(results: list[dict[str, Any]], out: Any = sys.stdout) -> dict[str, float]:
    """Print the table (and B - E by owner when both ran); return the headline figures."""
    header = f"{'config':8} {'µs/call':>8} {'samples':>8} " + " ".join(
        f"{owner:>8}" for owner in OWNERS
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in results:
        cells = " ".join(f"{r['by_owner_us'][owner]:8.1f}" for owner in OWNERS)
        print(f"{r['config']:8} {r['us_per_call']:8.1f} {r['samples']:8d} {cells}", file=out)
    figures: dict[str, float] = {}
    by_name = {r["config"]: r for r in results}
    if "B" in by_name and "E" in by_name:
        b, e = by_name["B"]["by_owner_us"], by_name["E"]["by_owner_us"]
        figures = {
            "ours_self_us": b["ours"],
            "otel_above_floor_us": b["otel"] - e["otel"],
            "sdk_slower_next_to_ours_us": b["sdk"] - e["sdk"],
            "b_minus_e_us": by_name["B"]["us_per_call"] - by_name["E"]["us_per_call"],
        }
        print("\nB - E by owner (µs per call):", file=out)
        for name, value in figures.items():
            print(f"{name}: {value:.1f}", file=out)
    for r in results:
        if r["top_ours_us"]:
            print(f"\n{r['config']}: our functions, self µs per call", file=out)
            for label, value in r["top_ours_us"]:
                print(f"  {value:6.2f}  {label}", file=out)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke-test size (~30 s)")
    parser.add_argument(
        "--kind",
        default="nonstream",
        choices=(*KINDS, *ASYNC_KINDS),
        help="what each call is; async kinds run in the worker's event loop",
    )
    parser.add_argument("--configs", default="B,E", help="comma-separated, e.g. B,E,D")
    parser.add_argument("--seconds", type=float, help="sampling time per configuration")
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    seconds = args.seconds or (6.0 if args.quick else 45.0)
    warmup = 2.0 if args.quick else 8.0
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    results = []
    # One configuration at a time: two would share the machine's two cores with py-spy.
    for name in names:
        print(f"  sampling {name} ({args.kind}) for {seconds:.0f} s", file=sys.stderr)
        results.append(profile(name, args.kind, warmup, seconds, args.rate))
    figures = report(results)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "figures": figures}, indent=2))
    if any(r["samples"] == 0 for r in results):
        print("no samples were taken inside the call loop", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
