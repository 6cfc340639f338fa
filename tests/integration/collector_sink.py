"""A real OpenTelemetry Collector in front of a small OTLP/HTTP sink, for the tests of what
an application's ``OTEL_*`` variables make ``setup()`` export.

``running_collector()`` starts the collector built from collector-config/builder-manifest.yaml
(``SPEC_DECODE_OTEL_OTELCOL``, set by scripts/test.sh) with an OTLP receiver (gRPC and
HTTP, on loopback) whose traces and metrics go straight on, unbatched and unqueued, to
``Sink``: an HTTP server in the test process that decodes each OTLP request whole,
resource included (the collector's ``otlp_http`` exporter posts to ``/v1/traces`` and
``/v1/metrics``). With no queue the receiver answers once the sink has the data, so
what a process exported is in the sink when the process has exited.

``Sink`` also serves as an OTLP/HTTP endpoint on its own, where a test needs what only
the exporter's request shows (its path and headers), which the collector does not pass on.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ports import free_port, free_ports

ENV_OTELCOL = "SPEC_DECODE_OTEL_OTELCOL"


@dataclass
class Request:
    """One OTLP/HTTP request the sink got: its path, headers (lower-case names) and
    decoded body (None for a path that is not an OTLP one)."""

    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Sink:
    """A loopback OTLP/HTTP (protobuf) endpoint that keeps every request."""

    port: int
    requests: list[Request] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def _keep(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) of every span received."""
        with self._lock:
            got = [r for r in self.requests if isinstance(r.body, ExportTraceServiceRequest)]
        return [
            (attributes(rs.resource), span)
            for r in got
            for rs in r.body.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def metrics(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, metric) of every metric received."""
        with self._lock:
            got = [r for r in self.requests if isinstance(r.body, ExportMetricsServiceRequest)]
        return [
            (attributes(rm.resource), metric)
            for r in got
            for rm in r.body.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
        ]

    def metric_names(self) -> set[str]:
        return {metric.name for _, metric in self.metrics()}


def attributes(item: Any) -> dict[str, Any]:
    """An OTLP resource's, span's or data point's attributes as a plain dict."""
    out: dict[str, Any] = {}
    for kv in item.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


_BODIES: dict[str, tuple[type[Any], type[Any]]] = {
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
}


@contextlib.contextmanager
def running_sink() -> Iterator[Sink]:
    sink = Sink(free_port())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding", "").lower() == "gzip":
                raw = gzip.decompress(raw)
            kinds = _BODIES.get(self.path)
            body = kinds[0].FromString(raw) if kinds else None
            sink._keep(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if kinds is None:
                self.send_response(404)
                self.end_headers()
                return
            answer = kinds[1]().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", sink.port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp-sink", daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class Collector:
    """The running collector: its OTLP ports on 127.0.0.1 and the sink behind it."""

    grpc_port: int
    http_port: int
    sink: Sink
    log: Path

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"


CONFIG = """
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc}
      http:
        endpoint: 127.0.0.1:{http}
exporters:
  otlp_http:
    endpoint: {sink}
    compression: none
    retry_on_failure:
      enabled: false
    sending_queue:
      enabled: false
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [otlp_http]
    metrics:
      receivers: [otlp]
      exporters: [otlp_http]
"""


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def running_collector(grpc_port: int = 0, http_port: int = 0) -> Iterator[Collector]:
    """The real collector on the given ports (0: free ones), forwarding to a new sink."""
    binary = os.environ.get(ENV_OTELCOL)
    assert binary, f"{ENV_OTELCOL} names no collector (scripts/install-collector.sh builds it)"
    free = iter(free_ports(2))
    grpc_port = grpc_port or next(free)
    http_port = http_port or next(free)
    for port in (grpc_port, http_port):
        assert not _listening(port), f"127.0.0.1:{port} is taken: the test needs it"
    with running_sink() as sink, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "otelcol.yaml"
        config.write_text(CONFIG.format(grpc=grpc_port, http=http_port, sink=sink.endpoint))
        log = Path(tmp) / "otelcol.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [binary, "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 30
            while not (_listening(grpc_port) and _listening(http_port)):
                assert proc.poll() is None, f"the collector exited:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"the collector is not up:\n{log.read_text()}"
                time.sleep(0.1)
            yield Collector(grpc_port, http_port, sink, log)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
