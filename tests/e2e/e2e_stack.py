"""The processes of the end-to-end stack: OpenTelemetry Collector, Prometheus, Jaeger v2.

Everything here is plain helpers (no pytest), used by ``conftest.py``:

- locating the binaries (environment variables set by CI, else the install scripts,
  which reuse the build cache outside the repository);
- free loopback ports;
- starting each process in its own process group with its output in a log file, and
  stopping it by process group (SIGTERM, then SIGKILL), also from ``atexit``;
- small HTTP helpers for Prometheus and Jaeger (httpx).

The collector and Jaeger run with the SHIPPED configs (collector-config/otelcol.yaml,
collector-config/jaeger.yaml); only environment variables change their ports. Prometheus
cannot read environment variables, so it gets a temporary copy of the shipped
prometheus.yml with the scrape target and the intervals replaced, plus a job that
scrapes the inference servers' own ``/metrics`` (the simulators of conftest.py),
labelled ``server_address``/``server_port`` like the clients' series; it loads the
shipped rule files (collector-config/prometheus-rules.yml) from where they are.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from ports import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "collector-config"
SCRIPTS_DIR = REPO_ROOT / "scripts"

#: Environment variables that name prebuilt binaries (CI exports them from the scripts).
ENV_OTELCOL = "SPEC_DECODE_OTEL_OTELCOL"
ENV_JAEGER = "SPEC_DECODE_OTEL_JAEGER"
ENV_PROMETHEUS = "SPEC_DECODE_OTEL_PROMETHEUS"

#: Prometheus scrape interval in the tests: short, so a demo run of a few seconds is
#: scraped several times (rate() needs two samples of a series that changed).
SCRAPE_INTERVAL = "250ms"
#: Prometheus rule evaluation interval in the tests (collector-config/prometheus-rules.yml).
RULE_EVALUATION_INTERVAL = "1s"
#: The flags docker-compose.yaml gives Prometheus beside its config and data paths:
#: exemplar storage, and the OTLP receiver otelcol-prometheus-otlp.yaml pushes to.
COMPOSE_PROMETHEUS_FLAGS = ("--enable-feature=exemplar-storage", "--web.enable-otlp-receiver")
#: The scrape job of the inference servers' own /metrics (README: Client vs server).
SERVERS_JOB = "inference-servers"

_RUNNING: list[ManagedProcess] = []


class StackError(RuntimeError):
    """A binary is missing or a process did not become ready."""


# --------------------------------------------------------------------------- binaries


def _run_install_script(name: str) -> str:
    script = SCRIPTS_DIR / name
    env = dict(os.environ)
    # The scripts find Go on PATH or at /usr/local/go/bin/go.
    proc = subprocess.run(
        ["bash", str(script)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise StackError(
            f"{script.relative_to(REPO_ROOT)} failed (exit {proc.returncode}):\n"
            f"{proc.stderr[-4000:]}"
        )
    return lines[-1].strip()


def _executable(path: str, what: str) -> str:
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise StackError(f"{what}: {path!r} is not an executable file")
    return path


def find_otelcol() -> str:
    """The collector built from builder-manifest.yaml (env var, else install script)."""
    path = os.environ.get(ENV_OTELCOL)
    if path:
        return _executable(path, ENV_OTELCOL)
    return _executable(_run_install_script("install-collector.sh"), "install-collector.sh")


def find_jaeger() -> str:
    """Jaeger v2 (env var, else install script, which reuses its cache)."""
    path = os.environ.get(ENV_JAEGER)
    if path:
        return _executable(path, ENV_JAEGER)
    return _executable(_run_install_script("install-jaeger.sh"), "install-jaeger.sh")


def find_prometheus() -> str:
    """Prometheus of the compose stack's version, promtool beside it (env var, else the
    install script, which reuses its cache). Not one found on PATH: a distribution's
    package is another version than the one the stack ships."""
    path = os.environ.get(ENV_PROMETHEUS)
    if path:
        return _executable(path, ENV_PROMETHEUS)
    return _executable(_run_install_script("install-prometheus.sh"), "install-prometheus.sh")


def find_promtool() -> str:
    """promtool of the same build, beside :func:`find_prometheus`'s server."""
    return _executable(str(Path(find_prometheus()).with_name("promtool")), "promtool")


# --------------------------------------------------------------------------- ports


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --------------------------------------------------------------------------- processes


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the child gets SIGKILL when the test process dies, even by SIGKILL.

    The children run in their own process groups (so one killpg stops a process and
    its helpers); this keeps them from outliving a killed test run.
    """
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class ManagedProcess:
    """One child process in its own process group, with its output in ``log_path``."""

    name: str
    argv: list[str]
    env: Mapping[str, str]
    log_path: Path
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(  # the log file stays open in the child
                self.argv,
                env=dict(self.env),
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: killpg reaches all of it
                preexec_fn=_die_with_parent if os.name == "posix" else None,
            )
        _RUNNING.append(self)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "<no log>"

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds. Idempotent."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=5)
        # Anything the process left behind in its group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        if self in _RUNNING:
            _RUNNING.remove(self)


def stop_all() -> None:
    """Stop every process started here, newest first (also run at interpreter exit)."""
    for proc in reversed(list(_RUNNING)):
        with contextlib.suppress(Exception):
            proc.stop()


atexit.register(stop_all)


def _on_sigterm(signum: int, frame: Any) -> None:  # pragma: no cover - CI time-outs
    stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# A SIGTERM (a CI time-out) skips atexit: stop the stack first, then die as asked.
if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGTERM, _on_sigterm)


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    procs: list[ManagedProcess] = (),  # type: ignore[assignment]
    interval: float = 0.2,
) -> None:
    """Poll ``check`` until true; fail early if one of ``procs`` exits, with its log."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if check():
                return
        for proc in procs:
            if not proc.alive():
                raise StackError(f"{proc.name} exited while waiting for {what}:\n{proc.log_tail()}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name} ---\n{p.log_tail()}" for p in procs)
            raise StackError(f"timed out after {timeout}s waiting for {what}\n{logs}")
        time.sleep(interval)


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The test's environment without OTEL_* variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra)
    return env


# --------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    """Addresses of the running stack (all on 127.0.0.1)."""

    otlp_grpc_port: int
    otlp_http_port: int
    exporter_port: int
    prometheus_port: int
    jaeger_query_port: int
    processes: list[ManagedProcess]
    workdir: Path
    #: (host, port) of the inference servers Prometheus scrapes.
    servers: Sequence[tuple[str, int]] = ()

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def jaeger_url(self) -> str:
        return f"http://127.0.0.1:{self.jaeger_query_port}"

    def otlp_endpoint(self, protocol: str) -> str:
        port = self.otlp_grpc_port if protocol == "grpc" else self.otlp_http_port
        return f"http://127.0.0.1:{port}"

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log_path}) ---\n{p.log_tail()}" for p in self.processes)

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()


def shipped_servers_job() -> dict[str, Any]:
    """The inference servers' job that prometheus.yml ships commented out, uncommented:
    the stack scrapes the simulator with it, so the block users uncomment is the one
    tested. Its example target must carry the two labels the clients' series have."""
    text = (CONFIG_DIR / "prometheus.yml").read_text()
    start = text.index(f"  # - job_name: {SERVERS_JOB}")
    block = "\n".join(line.replace("# ", "", 1) for line in text[start:].splitlines())
    (job,) = yaml.safe_load(block)
    (example,) = job["static_configs"]
    if set(example["labels"]) != {"server_address", "server_port"}:
        raise StackError("prometheus.yml's inference-servers job has other labels")
    return dict(job)


def write_prometheus_config(
    dest: Path, exporter_port: int, servers: Sequence[tuple[str, int]] = ()
) -> Path:
    """The shipped prometheus.yml with the collector target and the intervals replaced,
    its rule files (relative to collector-config/) given as absolute paths, and a job
    scraping each of ``servers`` (host, port) with the labels that match the clients'
    ``server_address``/``server_port``."""
    config = yaml.safe_load((CONFIG_DIR / "prometheus.yml").read_text())
    config.setdefault("global", {})
    config["global"]["scrape_interval"] = SCRAPE_INTERVAL
    config["global"]["scrape_timeout"] = SCRAPE_INTERVAL
    # Rules are evaluated every second, so recorded series appear within seconds.
    config["global"]["evaluation_interval"] = RULE_EVALUATION_INTERVAL
    config["rule_files"] = [str(CONFIG_DIR / path) for path in config.get("rule_files") or []]
    jobs = [j for j in config["scrape_configs"] if j["job_name"] == "otel-collector"]
    if len(jobs) != 1:
        raise StackError("collector-config/prometheus.yml has no single 'otel-collector' job")
    job = jobs[0]
    job["scrape_interval"] = SCRAPE_INTERVAL
    job["scrape_timeout"] = SCRAPE_INTERVAL
    job["static_configs"] = [{"targets": [f"127.0.0.1:{exporter_port}"]}]
    config["scrape_configs"] = [job]
    if servers:
        servers_job = shipped_servers_job()
        servers_job["scrape_interval"] = SCRAPE_INTERVAL
        servers_job["scrape_timeout"] = SCRAPE_INTERVAL
        servers_job["static_configs"] = [
            {
                "targets": [f"{host}:{port}"],
                "labels": {"server_address": host, "server_port": str(port)},
            }
            for host, port in servers
        ]
        config["scrape_configs"].append(servers_job)
    dest.write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def start_stack(
    workdir: Path,
    otelcol: str,
    jaeger: str,
    prometheus: str,
    servers: Sequence[tuple[str, int]] = (),
) -> Stack:
    """Start Jaeger, the collector and Prometheus on free loopback ports; wait until ready
    (Prometheus scraping the collector and each of ``servers``).

    On any failure, whatever was started is stopped before the error propagates.
    """
    (
        col_grpc, col_http, col_exporter, col_telemetry,
        j_grpc, j_http, j_query, j_query_grpc, j_health, j_telemetry,
        prom_port,
    ) = free_ports(11)  # fmt: skip
    procs: list[ManagedProcess] = []
    try:
        jaeger_proc = ManagedProcess(
            "jaeger",
            [jaeger, "--config", str(CONFIG_DIR / "jaeger.yaml")],
            child_env(
                {
                    "JAEGER_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{j_grpc}",
                    "JAEGER_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{j_http}",
                    "JAEGER_QUERY_HTTP_ENDPOINT": f"127.0.0.1:{j_query}",
                    "JAEGER_QUERY_GRPC_ENDPOINT": f"127.0.0.1:{j_query_grpc}",
                    "JAEGER_HEALTH_ENDPOINT": f"127.0.0.1:{j_health}",
                    "JAEGER_TELEMETRY_HOST": "127.0.0.1",
                    "JAEGER_TELEMETRY_PORT": str(j_telemetry),
                }
            ),
            workdir / "jaeger.log",
            cwd=workdir,
        )
        collector = ManagedProcess(
            "otelcol",
            [otelcol, "--config", str(CONFIG_DIR / "otelcol.yaml")],
            child_env(
                {
                    "OTELCOL_GRPC_ENDPOINT": f"127.0.0.1:{col_grpc}",
                    "OTELCOL_HTTP_ENDPOINT": f"127.0.0.1:{col_http}",
                    "OTELCOL_PROMETHEUS_ENDPOINT": f"127.0.0.1:{col_exporter}",
                    "OTELCOL_TRACES_ENDPOINT": f"127.0.0.1:{j_grpc}",
                    "OTELCOL_TELEMETRY_HOST": "127.0.0.1",
                    "OTELCOL_TELEMETRY_PORT": str(col_telemetry),
                }
            ),
            workdir / "otelcol.log",
            cwd=workdir,
        )
        prom_config = write_prometheus_config(workdir / "prometheus.yml", col_exporter, servers)
        prom = ManagedProcess(
            "prometheus",
            [
                prometheus,
                f"--config.file={prom_config}",
                f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                *COMPOSE_PROMETHEUS_FLAGS,
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            child_env({}),
            workdir / "prometheus.log",
            cwd=workdir,
        )
        for proc in (jaeger_proc, collector, prom):
            proc.start()
            procs.append(proc)

        with httpx.Client(timeout=2.0) as http:

            def ok(url: str) -> Callable[[], bool]:
                return lambda: http.get(url).status_code == 200

            wait_until("Jaeger health", ok(f"http://127.0.0.1:{j_health}/status"), 30, procs)
            wait_until(
                "Jaeger query API", ok(f"http://127.0.0.1:{j_query}/api/services"), 30, procs
            )
            wait_until("Jaeger OTLP/gRPC", lambda: port_open(j_grpc), 30, procs)
            wait_until("collector OTLP/gRPC", lambda: port_open(col_grpc), 30, procs)
            wait_until("collector OTLP/HTTP", lambda: port_open(col_http), 30, procs)
            wait_until(
                "collector /metrics", ok(f"http://127.0.0.1:{col_exporter}/metrics"), 30, procs
            )
            wait_until("Prometheus ready", ok(f"http://127.0.0.1:{prom_port}/-/ready"), 60, procs)

            def target_up() -> bool:
                r = http.get(f"http://127.0.0.1:{prom_port}/api/v1/targets").json()
                active = r["data"]["activeTargets"]
                return bool(active) and all(t["health"] == "up" for t in active)

            wait_until("Prometheus scraping the collector and servers", target_up, 30, procs)
    except BaseException:
        for proc in reversed(procs):
            proc.stop()
        raise
    return Stack(
        otlp_grpc_port=col_grpc,
        otlp_http_port=col_http,
        exporter_port=col_exporter,
        prometheus_port=prom_port,
        jaeger_query_port=j_query,
        processes=procs,
        workdir=workdir,
        servers=tuple(servers),
    )


# --------------------------------------------------------------------------- HTTP APIs


def prom_query(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    """Instant query (``client`` has Prometheus as base_url): the result vector."""
    r = client.post("/api/v1/query", data={"query": expr})
    body = r.json()
    if r.status_code != 200 or body.get("status") != "success":
        raise AssertionError(f"PromQL failed ({r.status_code}): {expr}\n{body}")
    data = body["data"]
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": data["result"]}]
    return data["result"]


def prom_scalar(client: httpx.Client, expr: str) -> float | None:
    """The single value of ``expr``, or None when the result is empty."""
    result = prom_query(client, expr)
    if not result:
        return None
    assert len(result) == 1, f"{expr} returned {len(result)} series: {result}"
    return float(result[0]["value"][1])


def prom_by_label(client: httpx.Client, expr: str, label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in prom_query(client, expr)}


def prom_label_values(client: httpx.Client, label: str, match: str) -> list[str]:
    r = client.get(f"/api/v1/label/{label}/values", params={"match[]": match})
    body = r.json()
    if r.status_code != 200 or body.get("status") != "success":
        raise AssertionError(f"label values failed ({r.status_code}): {label} {match}\n{body}")
    return body["data"]


def prom_exemplars(
    client: httpx.Client, expr: str, start: float, end: float
) -> list[dict[str, Any]]:
    """Flat list of exemplars (labels, value, timestamp) for ``expr`` in [start, end]."""
    r = client.get("/api/v1/query_exemplars", params={"query": expr, "start": start, "end": end})
    body = r.json()
    if r.status_code != 200 or body.get("status") != "success":
        raise AssertionError(f"query_exemplars failed ({r.status_code}): {expr}\n{body}")
    out = []
    for series in body["data"] or []:
        for ex in series["exemplars"]:
            out.append({**ex, "series": series["seriesLabels"]})
    return out


def wait_for_exemplars(
    client: httpx.Client, expr: str, start: float, timeout: float = 15
) -> list[dict[str, Any]]:
    """:func:`prom_exemplars` of ``expr`` from ``start`` on, polled until some arrive or
    ``timeout`` seconds pass (then empty)."""
    deadline = time.monotonic() + timeout
    while True:
        exemplars = prom_exemplars(client, expr, start, time.time() + 60)
        if exemplars or time.monotonic() > deadline:
            return exemplars
        time.sleep(0.5)


def _otlp_value(value: dict[str, Any]) -> Any:
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [_otlp_value(v) for v in value["arrayValue"].get("values", [])]
    return None


def jaeger_trace_spans(client: httpx.Client, trace_id: str) -> list[dict[str, Any]] | None:
    """Spans of one trace from Jaeger's API v3 (OTLP JSON), as dicts with ``attributes``
    and ``resource`` flattened to plain Python values; None when the trace is unknown."""
    r = client.get(f"/api/v3/traces/{trace_id}")
    if r.status_code == 404:
        return None
    r.raise_for_status()
    spans: list[dict[str, Any]] = []
    for rs in r.json().get("result", {}).get("resourceSpans", []):
        resource = {
            a["key"]: _otlp_value(a["value"]) for a in rs.get("resource", {}).get("attributes", [])
        }
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                spans.append(
                    {
                        "name": span.get("name"),
                        "trace_id": span.get("traceId"),
                        "span_id": span.get("spanId"),
                        "scope": ss.get("scope", {}).get("name"),
                        "resource": resource,
                        "attributes": {
                            a["key"]: _otlp_value(a["value"]) for a in span.get("attributes", [])
                        },
                    }
                )
    return spans or None
