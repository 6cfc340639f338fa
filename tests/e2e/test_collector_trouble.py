"""Collector trouble: the application does not notice, and the counts come back.

Against the real stack of ``tests/e2e/conftest.py`` (the collector built from
collector-config/, Prometheus scraping it, Jaeger v2), an instrumented workload runs in a
subprocess set up exactly as users do (``spec_decode_otel.setup()`` reading ``OTEL_*``),
once per OTLP protocol, against the simulator subprocess:

1. collector up: requests, per-request wall time measured;
2. collector STOPPED: the same requests again: latency unchanged (generous tolerance);
   meanwhile workloads that exit while it is down must exit within the documented bound
   (``configure.SHUTDOWN_TIMEOUT_S``, twice, plus a margin), and so must workloads whose
   collector accepts connections but never answers (a hung collector);
3. collector restarted: Prometheus's cumulative counters and histogram counts account for
   EVERY request, those made while it was down included — the in-process totals are
   cumulative, so the first export after the restart carries them.

What is not retained (spans batched while the collector is unreachable and past the
exporter's retry window) is stated in SECURITY.md; the span figure is printed here.
"""

from __future__ import annotations

import contextlib
import json
import select
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_stack import ManagedProcess, Stack, child_env, port_open, prom_scalar, wait_until

from spec_decode_otel.sdk_setup import SHUTDOWN_TIMEOUT_S

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROTOCOLS = ("grpc", "http/protobuf")
WARMUP_REQUESTS = 20
PHASE_REQUESTS = 60
EXIT_PROBE_REQUESTS = 30
#: Exit with the collector down must take less than this (seconds).
EXIT_BOUND_S = SHUTDOWN_TIMEOUT_S * 2 + 3.0
RECOVERY_TIMEOUT_S = 90

WORKER = r"""
import json, os, sys, time

import openai

import spec_decode_otel

tel = spec_decode_otel.setup()
client = openai.OpenAI(api_key="sk-test", base_url=os.environ["SIM_URL"], max_retries=0)
print(json.dumps({"ready": True, "exporting": tel.exporting}), flush=True)
for line in sys.stdin:
    command, *args = line.split()
    if command == "exit":
        break
    latencies, steps, accepted = [], 0, 0
    for _ in range(int(args[0])):
        started = time.perf_counter()
        response = client.chat.completions.create(
            model="spec-sim",
            messages=[{"role": "user", "content": "CANARY-PROMPT-collector-trouble"}],
            max_tokens=16,
        )
        latencies.append(time.perf_counter() - started)
        stats = response.model_extra["metrics"]["speculative_decoding"]
        steps += stats["num_spec_steps"]
        accepted += stats["num_accepted_draft_tokens"]
    print(json.dumps({"latencies": latencies, "steps": steps, "accepted": accepted}), flush=True)
client.close()
# Falling off the end: atexit runs Providers.shutdown(), the bounded final flush.
"""


class Worker:
    """One instrumented application process, driven line by line over stdin/stdout."""

    def __init__(self, script: Path, env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )
        self.requests = 0
        self.steps = 0
        self.accepted = 0
        ready = self._read(60)
        assert ready.get("exporting") is True, ready

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise AssertionError(f"worker said nothing within {timeout}s:\n{self.log()}")
        return json.loads(line)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def run(self, requests: int) -> list[float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"run {requests}\n")
        self.proc.stdin.flush()
        result = self._read(120)
        self.requests += requests
        self.steps += result["steps"]
        self.accepted += result["accepted"]
        return result["latencies"]

    def exit(self) -> float:
        """Ask the process to end; seconds until it has (atexit flush included)."""
        assert self.proc.stdin is not None
        started = time.monotonic()
        self.proc.stdin.write("exit\n")
        self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"worker did not exit within 120s:\n{self.log()}") from None
        elapsed = time.monotonic() - started
        assert code == 0, f"worker exited {code}:\n{self.log()}"
        return elapsed

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()
        self._log.close()


def _collector(stack: Stack) -> ManagedProcess:
    (proc,) = [p for p in stack.processes if p.name == "otelcol"]
    return proc


def _wait_collector_ready(stack: Stack) -> None:
    proc = _collector(stack)
    with httpx.Client(timeout=2.0) as http:
        wait_until("collector OTLP/gRPC", lambda: port_open(stack.otlp_grpc_port), 60, [proc])
        wait_until("collector OTLP/HTTP", lambda: port_open(stack.otlp_http_port), 60, [proc])
        metrics_url = f"http://127.0.0.1:{stack.exporter_port}/metrics"
        wait_until("collector /metrics", lambda: http.get(metrics_url).status_code == 200, 60)


@contextlib.contextmanager
def collector_stopped(stack: Stack) -> Iterator[None]:
    """The collector down for the block, and back (same ports, same config) after it."""
    proc = _collector(stack)
    proc.stop()
    assert not port_open(stack.otlp_grpc_port) and not port_open(stack.otlp_http_port)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # keep the first run's log beside the new one
            shutil.copyfile(proc.log_path, proc.log_path.with_suffix(".before-restart.log"))
        proc.start()  # same argv and environment: same ports
        _wait_collector_ready(stack)


@contextlib.contextmanager
def hung_collector() -> Iterator[str]:
    """An endpoint that accepts TCP connections and then never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture
def worker_script(tmp_path: Path) -> Path:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return script


def _env(endpoint: str, protocol: str, service: str, simulator_url: str) -> dict[str, str]:
    return child_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_SERVICE_NAME": service,
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "SIM_URL": simulator_url,
            "PYTHONUNBUFFERED": "1",
        }
    )


def _job(service: str) -> str:
    return f'job=~"(.+/)?{service}"'


def _prom_totals(prom: httpx.Client, service: str) -> tuple[float | None, float | None]:
    count = prom_scalar(prom, f"sum(spec_decode_acceptance_length_count{{{_job(service)}}})")
    steps = prom_scalar(prom, f"sum(spec_decode_verify_steps_total{{{_job(service)}}})")
    return count, steps


def _wait_totals(prom: httpx.Client, worker: Worker, service: str, timeout: float) -> float:
    """Seconds until Prometheus shows the worker's totals; fails with what it saw."""
    started = time.monotonic()
    seen: tuple[float | None, float | None] = (None, None)
    while time.monotonic() - started < timeout:
        seen = _prom_totals(prom, service)
        if seen == (worker.requests, worker.steps):
            return time.monotonic() - started
        time.sleep(0.25)
    raise AssertionError(
        f"{service}: Prometheus has (requests, steps) = {seen}, the process made "
        f"({worker.requests}, {worker.steps})\n{worker.log()}"
    )


def _jaeger_span_count(jaeger: httpx.Client, service: str) -> int:
    r = jaeger.get("/api/traces", params={"service": service, "limit": 5000, "lookback": "1h"})
    if r.status_code != 200:
        return 0
    return sum(
        1
        for trace in r.json().get("data") or []
        for span in trace.get("spans", [])
        if span.get("operationName", "").startswith("chat")
    )


def _exit_probe(script: Path, endpoint: str, protocol: str, simulator_url: str, log: Path):
    """A workload that exits while its collector cannot take the final flush."""
    service = f"sdo-exit-{uuid.uuid4().hex[:8]}"
    worker = Worker(script, _env(endpoint, protocol, service, simulator_url), log)
    try:
        worker.run(EXIT_PROBE_REQUESTS)
        time.sleep(0.5)  # let the background exporters start failing
        return worker.exit()
    finally:
        worker.close()


def test_collector_down_then_back(
    e2e_stack: Stack,
    prom: httpx.Client,
    jaeger: httpx.Client,
    simulator_url: str,
    worker_script: Path,
    tmp_path: Path,
) -> None:
    _wait_collector_ready(e2e_stack)
    services = {p: f"sdo-trouble-{p.split('/')[0]}-{uuid.uuid4().hex[:8]}" for p in PROTOCOLS}
    workers = {
        p: Worker(
            worker_script,
            _env(e2e_stack.otlp_endpoint(p), p, services[p], simulator_url),
            tmp_path / f"worker-{p.split('/')[0]}.log",
        )
        for p in PROTOCOLS
    }
    figures: list[str] = []
    try:
        # 1. Collector up.
        up: dict[str, list[float]] = {}
        for p, worker in workers.items():
            worker.run(WARMUP_REQUESTS)
            up[p] = worker.run(PHASE_REQUESTS)
        for p, worker in workers.items():
            _wait_totals(prom, worker, services[p], 60)
        up_totals = {p: (w.requests, w.steps) for p, w in workers.items()}

        # 2. Collector down.
        down: dict[str, list[float]] = {}
        exits: dict[str, float] = {}
        with collector_stopped(e2e_stack):
            for p, worker in workers.items():
                down[p] = worker.run(PHASE_REQUESTS)
            for p in PROTOCOLS:
                exits[f"stopped/{p}"] = _exit_probe(
                    worker_script, e2e_stack.otlp_endpoint(p), p, simulator_url,
                    tmp_path / f"exit-stopped-{p.split('/')[0]}.log",
                )  # fmt: skip
            # Nothing new reached Prometheus while the collector was away.
            for p in PROTOCOLS:
                count, _ = _prom_totals(prom, services[p])
                assert count in (None, up_totals[p][0])

        # 3. Collector back: every request is accounted for, the downtime's included.
        for p, worker in workers.items():
            assert worker.requests == WARMUP_REQUESTS + 2 * PHASE_REQUESTS
            recovered = _wait_totals(prom, worker, services[p], RECOVERY_TIMEOUT_S)
            figures.append(f"{p}: Prometheus caught up {recovered:.1f}s after the restart")

        for p in PROTOCOLS:
            med_up, med_down = statistics.median(up[p]), statistics.median(down[p])
            p90_up = statistics.quantiles(up[p], n=10)[-1]
            p90_down = statistics.quantiles(down[p], n=10)[-1]
            figures.append(
                f"{p}: per-request median {med_up * 1e3:.2f} ms up, {med_down * 1e3:.2f} ms "
                f"down ({(med_down / med_up - 1) * 100:+.0f}%); p90 {p90_up * 1e3:.2f} / "
                f"{p90_down * 1e3:.2f} ms"
            )
            assert med_down <= med_up * 1.5 + 0.005, figures[-1]
            assert p90_down <= p90_up * 2.0 + 0.010, figures[-1]

        # Exit with a hung collector (accepts, never answers): the worst case.
        for p in PROTOCOLS:
            with hung_collector() as endpoint:
                exits[f"hung/{p}"] = _exit_probe(
                    worker_script, endpoint, p, simulator_url,
                    tmp_path / f"exit-hung-{p.split('/')[0]}.log",
                )  # fmt: skip
        # Exit with the collector up, for comparison.
        for p, worker in workers.items():
            exits[f"up/{p}"] = worker.exit()
        figures.append(
            "exit times: " + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(exits.items()))
        )
        for name, seconds in exits.items():
            assert seconds < EXIT_BOUND_S, f"exit {name} took {seconds:.1f}s: {figures[-1]}"

        # Spans: what made it (the up phase must have; the downtime's are best effort).
        for p in PROTOCOLS:
            deadline = time.monotonic() + 30
            spans = _jaeger_span_count(jaeger, services[p])
            while spans < WARMUP_REQUESTS + PHASE_REQUESTS and time.monotonic() < deadline:
                time.sleep(0.5)
                spans = _jaeger_span_count(jaeger, services[p])
            figures.append(
                f"{p}: Jaeger holds {spans} of {workers[p].requests} spans "
                f"({PHASE_REQUESTS} made while the collector was down)"
            )
            assert spans >= WARMUP_REQUESTS + PHASE_REQUESTS, figures[-1]
    finally:
        for worker in workers.values():
            worker.close()
        print("\ncollector trouble:\n  " + "\n  ".join(figures))
