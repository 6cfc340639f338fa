"""One benchmark configuration in its own long-lived process, driven over stdin/stdout.

Instrumentors wrap ``openai`` classes process-wide, so each configuration lives in its
own process; the parent (``overhead.py``) tells one worker at a time to run a batch, so
batches of different configurations interleave in time while never running together.
Each worker measures its own process CPU time (``time.process_time_ns``: every thread of
the process, so the span processor's export thread counts too).

Protocol: one JSON object per line each way. Requests: ``{"op": "batch", "kind":
"nonstream"|"stream"|"stream_short", "n": N, "enabled": bool}``, ``{"op": "describe"}``,
``{"op": "memory", "n": N, "warmup": W, "method": "rss"|"tracemalloc"}``, ``{"op": "loop",
"kind": ..., "warmup": W, "seconds": S}`` (calls for W seconds, then one line
``{"measuring": true}``, then calls for S seconds while a sampling profiler watches; see
``attribution.py``), ``{"op": "quit"}``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _replay import ASYNC_KINDS, load_payloads, setup_config


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Worker:
    def __init__(self, name: str, sync_spans: bool = False) -> None:
        self.name = name
        self.payloads = load_payloads()
        self.config = setup_config(name, self.payloads, sync_spans)
        self.providers = self.config.providers
        #: One event loop for every async batch, made once.
        self._loop = asyncio.new_event_loop()

    def batch(self, kind: str, n: int, enabled: bool = True) -> dict[str, Any]:
        config = self.config
        config.set_enabled(enabled)
        if kind in ASYNC_KINDS:
            return self._loop.run_until_complete(self._abatch(config.acalls[kind], n))
        call = config.calls[kind]
        process_time_ns = time.process_time_ns
        perf_counter_ns = time.perf_counter_ns
        w0 = perf_counter_ns()
        c0 = process_time_ns()
        for _ in range(n):
            call()
        c1 = process_time_ns()
        w1 = perf_counter_ns()
        return {"cpu_ns": (c1 - c0) / n, "wall_ns": (w1 - w0) / n}

    @staticmethod
    async def _abatch(call: Any, n: int) -> dict[str, Any]:
        """``batch`` for an async kind: the timing runs inside the worker's one event
        loop, so starting and stopping the loop is not in it."""
        process_time_ns = time.process_time_ns
        perf_counter_ns = time.perf_counter_ns
        w0 = perf_counter_ns()
        c0 = process_time_ns()
        for _ in range(n):
            await call()
        c1 = process_time_ns()
        w1 = perf_counter_ns()
        return {"cpu_ns": (c1 - c0) / n, "wall_ns": (w1 - w0) / n}

    def describe(self) -> dict[str, Any]:
        """Spans, span attributes, synchronous histogram records and the sum of every
        counter's increase per call, by kind."""
        out: dict[str, Any] = {"config": self.name}
        config = self.config
        config.set_enabled(True)
        out["stream_chunks_seen"] = config.calls["stream"]()
        out["stream_short_chunks_seen"] = config.calls["stream_short"]()
        p = self.providers
        if p is None:
            return out
        for kind, call in config.calls.items():
            p.flush()
            spans0 = p.span_exporter.exported
            records0, counted0 = p.metric_totals()
            call()
            p.flush()
            records, counted = p.metric_totals()
            out[kind] = {
                "spans": p.span_exporter.exported - spans0,
                "span_attributes": p.span_exporter.last_attribute_count,
                "span_scope": p.span_exporter.last_scope,
                "histogram_records": records - records0,
                "counted": counted - counted0,
            }
        return out

    def memory(self, n: int, warmup: int, method: str) -> dict[str, Any]:
        """Growth over ``n`` non-streaming calls after ``warmup`` calls, collected and
        flushed before each reading."""
        self.config.set_enabled(True)
        call = self.config.calls["nonstream"]
        for _ in range(warmup):
            call()
        self._settle()
        if method == "tracemalloc":
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(n):
                call()
            self._settle()
            after = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
        else:
            before = _rss_bytes()
            for _ in range(n):
                call()
            self._settle()
            after = _rss_bytes()
        return {"method": method, "calls": n, "growth_bytes": after - before}

    def loop(self, kind: str, warmup: float, seconds: float, out: Any) -> dict[str, Any]:
        """Calls back to back: ``warmup`` seconds, then a ``measuring`` line, then
        ``seconds`` more, timed with this thread's CPU clock (what a profiler sampling
        the main thread sees)."""
        if kind in ASYNC_KINDS:
            return self._loop.run_until_complete(self._aloop(kind, warmup, seconds, out))
        self.config.set_enabled(True)
        call = self.config.calls[kind]
        monotonic = time.monotonic
        deadline = monotonic() + warmup
        while monotonic() < deadline:
            call()
        out.write(json.dumps({"measuring": True}) + "\n")
        out.flush()
        calls = 0
        t0 = time.thread_time_ns()
        deadline = monotonic() + seconds
        while monotonic() < deadline:
            call()
            calls += 1
        return {"calls": calls, "thread_cpu_ns": (time.thread_time_ns() - t0) / max(calls, 1)}

    async def _aloop(self, kind: str, warmup: float, seconds: float, out: Any) -> dict[str, Any]:
        """``loop`` for an async kind, in the worker's event loop."""
        self.config.set_enabled(True)
        call = self.config.acalls[kind]
        monotonic = time.monotonic
        deadline = monotonic() + warmup
        while monotonic() < deadline:
            await call()
        out.write(json.dumps({"measuring": True}) + "\n")
        out.flush()
        calls = 0
        t0 = time.thread_time_ns()
        deadline = monotonic() + seconds
        while monotonic() < deadline:
            await call()
            calls += 1
        return {"calls": calls, "thread_cpu_ns": (time.thread_time_ns() - t0) / max(calls, 1)}

    def close(self) -> None:
        """Finish the async generators the SDK's streams left to the loop, then close it
        (otherwise their pending finalizers are reported at exit)."""
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    def _settle(self) -> None:
        if self.providers is not None:
            self.providers.flush()
        gc.collect()


def main() -> int:
    name = sys.argv[1]
    worker = Worker(name, sync_spans="--sync-spans" in sys.argv[2:])
    out = sys.stdout
    out.write(json.dumps({"ready": name, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "quit":
            break
        if op == "batch":
            reply = worker.batch(request["kind"], request["n"], request.get("enabled", True))
        elif op == "describe":
            reply = worker.describe()
        elif op == "loop":
            reply = worker.loop(request["kind"], request["warmup"], request["seconds"], out)
        elif op == "memory":
            reply = worker.memory(request["n"], request["warmup"], request["method"])
        else:
            reply = {"error": f"unknown op {op!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    worker.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
