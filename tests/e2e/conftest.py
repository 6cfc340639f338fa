"""Session fixtures for the end-to-end tests: a real collector, Prometheus and Jaeger v2.

``e2e_stack`` finds the binaries (``SPEC_DECODE_OTEL_OTELCOL`` / ``_JAEGER`` /
``_PROMETHEUS``, else the install scripts, which reuse their cache), starts them on free
loopback ports with the shipped configs, and stops them by process group at the end of
the session, whatever happened (try/finally here, ``atexit`` in e2e_stack as a backstop).

``workloads`` runs ``spec-decode-otel demo`` once per OTLP protocol (grpc and
http/protobuf) against that stack, each with its own service name, and returns the
records the demo wrote. The demo command can be replaced with
``SPEC_DECODE_OTEL_E2E_DEMO`` (a shell-quoted command prefix that accepts the same
``demo`` arguments); the number of requests with ``SPEC_DECODE_OTEL_E2E_REQUESTS``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from e2e_stack import (
    REPO_ROOT,
    Stack,
    StackError,
    child_env,
    find_jaeger,
    find_otelcol,
    find_prometheus,
    prom_scalar,
    start_stack,
    stop_all,
)

PROTOCOLS = ("grpc", "http/protobuf")
DEMO_TIMEOUT_S = 180
INGEST_TIMEOUT_S = 30


@dataclass
class Workload:
    """One demo run: its protocol, service name (the Prometheus ``job``), and records."""

    protocol: str
    service: str
    records: list[dict[str, Any]]
    started: float
    finished: float
    log: str

    @property
    def job_matcher(self) -> str:
        # The collector's prometheus exporter sets job = [service.namespace/]service.name.
        return f'job=~"(.+/)?{self.service}"'


@pytest.fixture(scope="session")
def e2e_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("e2e-stack")
    try:
        otelcol, jaeger, prometheus = find_otelcol(), find_jaeger(), find_prometheus()
        stack = start_stack(workdir, otelcol, jaeger, prometheus)
    except StackError as exc:
        pytest.fail(f"e2e stack could not start: {exc}", pytrace=False)
    try:
        yield stack
    finally:
        stack.stop()
        stop_all()


@pytest.fixture(scope="session")
def prom(e2e_stack: Stack) -> Iterator[httpx.Client]:
    """HTTP client for Prometheus (base_url set)."""
    with httpx.Client(base_url=e2e_stack.prometheus_url, timeout=10.0) as client:
        yield client


@pytest.fixture(scope="session")
def jaeger(e2e_stack: Stack) -> Iterator[httpx.Client]:
    """HTTP client for Jaeger's query service (base_url set)."""
    with httpx.Client(base_url=e2e_stack.jaeger_url, timeout=10.0) as client:
        yield client


def _demo_command() -> list[str]:
    override = os.environ.get("SPEC_DECODE_OTEL_E2E_DEMO")
    if override:
        return shlex.split(override)
    return [sys.executable, "-m", "spec_decode_otel"]


def _run_demo(stack: Stack, protocol: str, workdir: Path, requests: int) -> Workload:
    tag = "grpc" if protocol == "grpc" else "http"
    service = f"sdo-e2e-{tag}-{uuid.uuid4().hex[:8]}"
    records_path = workdir / f"records-{tag}.jsonl"
    log_path = workdir / f"demo-{tag}.log"
    env = child_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": stack.otlp_endpoint(protocol),
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_SERVICE_NAME": service,
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=e2e",
            # Export often so that Prometheus (scraping every 250 ms) sees the counters
            # grow during the run: rate() needs two different samples of a series.
            "OTEL_METRIC_EXPORT_INTERVAL": "100",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
    )
    argv = [
        *_demo_command(),
        "demo",
        "--requests",
        str(requests),
        "--records-out",
        str(records_path),
        "--no-progress",
    ]
    started = time.time()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.run(
                argv,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=DEMO_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"demo over {protocol} ran over {DEMO_TIMEOUT_S}s: {log_path}")
    finished = time.time()
    log_text = log_path.read_text(errors="replace")
    if proc.returncode != 0:
        pytest.fail(
            f"demo over {protocol} exited {proc.returncode}: {shlex.join(argv)}\n{log_text[-4000:]}"
        )
    records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    if not records:
        pytest.fail(f"demo over {protocol} wrote no records to {records_path}\n{log_text[-2000:]}")
    return Workload(protocol, service, records, started, finished, log_text)


def _wait_ingested(prom: httpx.Client, workload: Workload) -> None:
    """Wait until Prometheus has the run's final totals (the demo flushed on exit)."""
    want_requests = len(workload.records)
    want_steps = sum(r["record"]["num_spec_steps"] for r in workload.records)
    deadline = time.monotonic() + INGEST_TIMEOUT_S
    while time.monotonic() < deadline:
        count = prom_scalar(
            prom, f"sum(spec_decode_acceptance_length_count{{{workload.job_matcher}}})"
        )
        steps = prom_scalar(prom, f"sum(spec_decode_verify_steps_total{{{workload.job_matcher}}})")
        if count == want_requests and steps == want_steps:
            return
        time.sleep(0.25)
    # No failure here: the tests compare the numbers and say what differs.


@pytest.fixture(scope="session")
def workloads(
    e2e_stack: Stack, prom: httpx.Client, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Workload]:
    """The demo run once over OTLP/gRPC and once over OTLP/HTTP (protobuf)."""
    workdir = tmp_path_factory.mktemp("e2e-demo")
    requests = int(os.environ.get("SPEC_DECODE_OTEL_E2E_REQUESTS", "120"))
    runs: dict[str, Workload] = {}
    for protocol in PROTOCOLS:
        runs[protocol] = _run_demo(e2e_stack, protocol, workdir, requests)
        _wait_ingested(prom, runs[protocol])
    return runs
