"""Session fixtures for the end-to-end tests: a real collector, Prometheus and Jaeger v2.

``e2e_stack`` finds the binaries (``SPEC_DECODE_OTEL_OTELCOL`` / ``_JAEGER`` /
``_PROMETHEUS``, else the install scripts, which reuse their cache), starts them on free
loopback ports with the shipped configs, and stops them by process group at the end of
the session, whatever happened (try/finally here, ``atexit`` in e2e_stack as a backstop).

The stack includes two simulator subprocesses, one with vLLM's server-side counters and
one with llama.cpp's, whose ``/metrics`` Prometheus scrapes (job ``inference-servers``,
labelled ``server_address``/``server_port``).

``workloads`` runs ``spec-decode-otel demo`` once per OTLP protocol (grpc and
http/protobuf) against that stack, each with its own service name, and returns the
records the demo wrote (the rows with a record).

``reconciliation`` sends an instrumented workload to the two simulators, first with every
request's stats reaching the client, then with some vLLM streams made without
``include_usage``, and keeps what Prometheus, the clients and the servers said after each
phase (see test_reconciliation.py). The demo command can be replaced with
``SPEC_DECODE_OTEL_E2E_DEMO`` (a shell-quoted command prefix that accepts the same
``demo`` arguments); the number of requests with ``SPEC_DECODE_OTEL_E2E_REQUESTS``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
    prom_by_label,
    prom_query,
    prom_scalar,
    start_stack,
    stop_all,
)

from simulator_process import SimulatorProcess
from spec_decode_otel.telemetry import MAX_DRAFT_POSITIONS, OVERFLOW_VALUE

PROTOCOLS = ("grpc", "http/protobuf")
DEMO_TIMEOUT_S = 180
INGEST_TIMEOUT_S = 30


@dataclass
class Workload:
    """One demo run: its protocol, service name (the Prometheus ``job``), and the records
    file's rows that have a record (every call of the demo should)."""

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


#: The simulators whose /metrics the stack scrapes: flavour -> simulator arguments.
SERVER_FLAVOURS = {
    "vllm": ("--engine", "vllm", "--level", "summary", "--k", "4", "--alpha", "0.7"),
    "llamacpp": ("--engine", "llamacpp", "--k", "3", "--alpha", "0.6"),
}


@pytest.fixture(scope="session")
def servers() -> Iterator[dict[str, str]]:
    """flavour -> base URL of a simulator subprocess only the reconciliation uses."""
    running: list[SimulatorProcess] = []
    try:
        for args in SERVER_FLAVOURS.values():
            running.append(SimulatorProcess(args))
            running[-1].start()
        yield {flavour: p.base_url for flavour, p in zip(SERVER_FLAVOURS, running, strict=True)}
    finally:
        for proc in running:
            proc.stop()


@pytest.fixture(scope="session")
def e2e_stack(tmp_path_factory: pytest.TempPathFactory, servers: dict[str, str]) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("e2e-stack")
    scraped = [host_port(url) for url in servers.values()]
    try:
        otelcol, jaeger, prometheus = find_otelcol(), find_jaeger(), find_prometheus()
        stack = start_stack(workdir, otelcol, jaeger, prometheus, scraped)
    except StackError as exc:
        pytest.fail(f"e2e stack could not start: {exc}", pytrace=False)
    try:
        yield stack
    finally:
        stack.stop()
        stop_all()


def host_port(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    assert parts.hostname and parts.port, base_url
    return parts.hostname, parts.port


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


def run_demo(
    endpoint: str,
    protocol: str,
    workdir: Path,
    requests: int,
    tag: str,
    extra_env: Mapping[str, str] | None = None,
) -> Workload:
    """``spec-decode-otel demo`` exporting to the collector at ``endpoint``, as service
    ``sdo-e2e-<tag>-<random>``, with ``extra_env`` over the OTel variables."""
    service = f"sdo-e2e-{tag}-{uuid.uuid4().hex[:8]}"
    records_path = workdir / f"records-{tag}.jsonl"
    log_path = workdir / f"demo-{tag}.log"
    env = child_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_SERVICE_NAME": service,
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=e2e",
            # Export often so that Prometheus (scraping every 250 ms) sees the counters
            # grow during the run: rate() needs two different samples of a series.
            "OTEL_METRIC_EXPORT_INTERVAL": "100",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            **(extra_env or {}),
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
    rows = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    records = [row for row in rows if row["record"] is not None]
    if not records:
        pytest.fail(f"demo over {protocol} wrote no records to {records_path}\n{log_text[-2000:]}")
    return Workload(protocol, service, records, started, finished, log_text)


def wait_ingested(prom: httpx.Client, workload: Workload) -> None:
    """Wait until Prometheus has the run's final totals (the demo flushed on exit), from
    classic histograms or native ones."""
    want_requests = len(workload.records)
    want_steps = sum(r["record"]["num_spec_steps"] for r in workload.records)
    sel = workload.job_matcher
    deadline = time.monotonic() + INGEST_TIMEOUT_S
    while time.monotonic() < deadline:
        count = prom_scalar(
            prom,
            f"sum(spec_decode_acceptance_length_count{{{sel}}})"
            f" or histogram_count(sum(spec_decode_acceptance_length{{{sel}}}))",
        )
        steps = prom_scalar(prom, f"sum(spec_decode_verify_steps_total{{{sel}}})")
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
        tag = "grpc" if protocol == "grpc" else "http"
        runs[protocol] = run_demo(
            e2e_stack.otlp_endpoint(protocol), protocol, workdir, requests, tag
        )
        wait_ingested(prom, runs[protocol])
    return runs


# --------------------------------------------------------------------------- expectations


def _position_label(p: int) -> str:
    return str(p) if p < MAX_DRAFT_POSITIONS else OVERFLOW_VALUE


class Expected:
    """What the records (the demo's rows with a record) say the metrics must add up to."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        recs = [r["record"] for r in records]
        self.mal = [
            r["mean_acceptance_length"] for r in recs if r.get("mean_acceptance_length") is not None
        ]
        self.dar = [
            r["draft_acceptance_rate"] for r in recs if r.get("draft_acceptance_rate") is not None
        ]
        self.accepted = sum(r.get("num_accepted_draft_tokens") or 0 for r in recs)
        self.drafted = sum(r.get("num_draft_tokens") or 0 for r in recs)
        self.steps_by_j: Counter[str] = Counter()
        self.at_position: Counter[str] = Counter()
        for r in recs:
            hist = {int(j): int(c) for j, c in (r.get("acceptance_histogram") or {}).items()}
            for j, c in hist.items():
                self.steps_by_j[_position_label(j)] += c
                # A step that accepted j drafts accepted draft positions 0..j-1.
                for p in range(j):
                    self.at_position[_position_label(p)] += c
        self.steps = sum(self.steps_by_j.values())
        self.engines = Counter(r["engine"] for r in records)
        self.models = {r["model"] for r in records}

    @property
    def token_weighted_al(self) -> float:
        return 1.0 + self.accepted / self.steps


# --------------------------------------------------------------------------- dashboard

#: The dashboard's "Client vs server" row.
ROW = "Client vs server"
DASHBOARD = REPO_ROOT / "collector-config" / "grafana" / "dashboards" / "spec-decode.json"


def dashboard() -> dict[str, Any]:
    """The shipped dashboard, as Grafana provisions it."""
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def dashboard_targets() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(title of the row it sits under, panel, target) of every query of the dashboard,
    in order; ``""`` for panels above the first row, and a collapsed row's own panels
    under it."""
    out, row = [], ""
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        for sub in [panel, *panel.get("panels", [])]:
            out += [(row, sub, target) for target in sub.get("targets", [])]
    return out


def row_targets() -> list[tuple[str, dict[str, Any]]]:
    """(panel title, target) of every panel in the dashboard's "Client vs server" row."""
    return [(p["title"], t) for row, p, t in dashboard_targets() if row.startswith(ROW)]


def variable_query(variable: dict[str, Any]) -> tuple[str, str]:
    """A ``label_values(MATCH, LABEL)`` variable's (MATCH, LABEL)."""
    query = variable["query"]
    query = query["query"] if isinstance(query, dict) else query
    m = re.fullmatch(r"label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)", query.strip())
    assert m, f"variable {variable['name']}: not a label_values() query: {query}"
    return m.group(1), m.group(2)


#: Grafana's own variables as the e2e tests send them: a 10-minute range, and the
#: $__rate_interval and $__interval of the provisioned datasource's 1m timeInterval (at
#: least 4 x, and at least 1 x).
GRAFANA_VARIABLES = {"__range": "10m", "__rate_interval": "5m", "__interval": "1m"}
#: A dashboard variable in a query: ``$name``, ``${name}`` / ``${name:format}``, or the
#: deprecated ``[[name]]`` (one group per form, the name in it). ``$1`` is not one: it is
#: a regex group in ``label_replace``'s replacement, which Grafana sends as is since no
#: variable has that name (``TemplateSrv.replace`` leaves an unknown name's match).
VARIABLE_REFERENCE = re.compile(
    r"\$\{(\w+)(?::[^}]*)?\}|\$([A-Za-z_]\w*)|\[\[(\w+)(?::[^\]]*)?\]\]"
)


def all_selected(**chosen: str) -> dict[str, str]:
    """The dashboard's variables as Grafana substitutes them with "All" chosen (each
    variable's ``allValue``), Grafana's own (GRAFANA_VARIABLES), and ``chosen`` over
    them (a variable without "All", such as ``dimension``, must be chosen)."""
    variables = dashboard()["templating"]["list"]
    values = {v["name"]: v["allValue"] for v in variables if v.get("includeAll")}
    return {**values, **GRAFANA_VARIABLES, **chosen}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with every variable reference replaced by its value in ``values``. A
    variable ``values`` does not give fails the test, naming it: sent as is, a
    selector such as ``server_port=~"$port"`` is a regex that matches no series, so a
    query would read an empty result instead of failing."""
    left: list[str] = []

    def value(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        if name in values:
            return values[name]
        left.append(m.group(0))
        return m.group(0)

    out = VARIABLE_REFERENCE.sub(value, expr)
    if left:
        pytest.fail(f"unsubstituted dashboard variable(s) {sorted(set(left))} in {expr}")
    return out


def as_totals(expr: str) -> str:
    """Every ``increase(SELECTOR[$__range])`` and ``rate(SELECTOR[$__rate_interval])`` ->
    ``SELECTOR``: the same formula over cumulative totals, which are exact (increase()
    extrapolates, and rate() and increase() miss the first sample of a series that starts
    inside the window, as a client's counters and histograms do)."""
    return re.sub(
        r"(?:increase|rate)\(([a-z_:]*\{[^}]*\})\[\$__(?:range|rate_interval)\]\)", r"\1", expr
    )


# --------------------------------------------------------------------------- reconciliation

MESSAGES = [{"role": "user", "content": "Reconcile the client with the server."}]


def server_totals(base_url: str) -> dict[str, float]:
    """A simulator's own accepted and drafted counters, from its /metrics."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    totals = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for key in ("accepted", "draft"):
            if name.endswith(f":spec_decode_num_{key}_tokens_total"):
                totals[key] = float(line.rsplit(" ", 1)[1])
    return totals


@dataclass
class Phase:
    """What one phase of the reconciliation workload left behind (values per server,
    keyed ``host:port``)."""

    #: The clients' own accepted/drafted totals (in-memory reader of the same provider).
    client: dict[str, dict[str, float]] = field(default_factory=dict)
    #: The servers' accepted/drafted totals, read from their /metrics directly.
    server: dict[str, dict[str, float]] = field(default_factory=dict)
    #: The coverage panel's formula over totals, from Prometheus.
    coverage: dict[str, float] = field(default_factory=dict)


@dataclass
class Reconciliation:
    service: str
    servers: dict[str, str]
    phases: dict[str, Phase]


def _client_totals(reader: Any) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    names = {"spec_decode.accepted_draft_tokens": "accepted", "spec_decode.draft_tokens": "draft"}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name not in names:
                    continue
                for point in metric.data.data_points:
                    server = (
                        f"{point.attributes['server.address']}:{point.attributes['server.port']}"
                    )
                    entry = totals.setdefault(server, {})
                    entry[names[metric.name]] = entry.get(names[metric.name], 0.0) + point.value
    return totals


def _coverage(prom: httpx.Client) -> dict[str, float]:
    """The coverage panel's formula over totals, every server and port chosen."""
    (expr,) = [as_totals(t["expr"]) for title, t in row_targets() if title.startswith("Coverage:")]
    expr = substitute(expr, all_selected())
    return {
        f"{r['metric']['server_address']}:{r['metric']['server_port']}": float(r["value"][1])
        for r in prom_query(prom, expr)
    }


def _wait_for_phase(prom: httpx.Client, service: str, phase: Phase) -> None:
    """Until Prometheus has the clients' and the servers' final totals of the phase."""
    job = f'job=~"(.+/)?{service}"'
    deadline = time.monotonic() + INGEST_TIMEOUT_S
    while time.monotonic() < deadline:
        client = prom_by_label(
            prom,
            f"sum by (server_port) (spec_decode_accepted_draft_tokens_total{{{job}}})",
            "server_port",
        )
        server = prom_by_label(
            prom,
            "sum by (server_port) "
            '({__name__=~"(vllm|llamacpp):spec_decode_num_accepted_tokens_total"})',
            "server_port",
        )
        want_client = {k.rsplit(":", 1)[1]: v["accepted"] for k, v in phase.client.items()}
        want_server = {k.rsplit(":", 1)[1]: v["accepted"] for k, v in phase.server.items()}
        if client == want_client and server == want_server:
            return
        time.sleep(0.25)
    # No failure here: the tests compare the numbers and say what differs.


@pytest.fixture(scope="session")
def reconciliation(
    e2e_stack: Stack, servers: dict[str, str], prom: httpx.Client
) -> Iterator[Reconciliation]:
    """Phase ``full``: to each server, non-streaming calls and streams whose stats reach
    the client (vLLM with include_usage; llama.cpp sends its timings on the last chunk
    anyway). Phase ``partial``: the same, plus vLLM streams made without include_usage,
    whose stats the server counts and the client never sees.

    The client is this process, instrumented with its own providers (OTLP/gRPC to the
    stack); the meter provider keeps exporting until the session ends, so the series stay
    current for the dashboard's rate() panels."""
    import openai
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        InMemoryMetricReader,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from spec_decode_otel import SpecDecodeInstrumentor

    service = f"sdo-e2e-reconcile-{uuid.uuid4().hex[:8]}"
    resource = Resource.create({"service.name": service})
    memory = InMemoryMetricReader()
    exporting = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=e2e_stack.otlp_endpoint("grpc"), insecure=True),
        export_interval_millis=100,
    )
    meter_provider = MeterProvider(metric_readers=[memory, exporting], resource=resource)
    tracer_provider = TracerProvider(resource=resource)

    def workload(stats_less_streams: int) -> None:
        for flavour, base_url in servers.items():
            with openai.OpenAI(api_key="sk-e2e", base_url=base_url, max_retries=0) as client:
                create: Callable[..., Any] = client.chat.completions.create
                # llama.cpp sends its timings on the last chunk without being asked.
                usage = {"stream_options": {"include_usage": True}} if flavour == "vllm" else {}
                for _ in range(4):
                    create(model="m", messages=MESSAGES)
                    assert list(create(model="m", messages=MESSAGES, stream=True, **usage))
                if flavour == "vllm":
                    for _ in range(stats_less_streams):
                        assert list(create(model="m", messages=MESSAGES, stream=True))

    def phase() -> Phase:
        assert meter_provider.force_flush(10_000)
        result = Phase(client=_client_totals(memory))
        for url in servers.values():
            host, port = host_port(url)
            result.server[f"{host}:{port}"] = server_totals(url)
        _wait_for_phase(prom, service, result)
        result.coverage = _coverage(prom)
        return result

    instrumentor = SpecDecodeInstrumentor()
    try:
        instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        try:
            workload(stats_less_streams=0)
            full = phase()
            workload(stats_less_streams=4)
            partial = phase()
        finally:
            instrumentor.uninstrument()
        yield Reconciliation(service, servers, {"full": full, "partial": partial})
    finally:
        meter_provider.shutdown()
        tracer_provider.shutdown()
