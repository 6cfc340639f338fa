"""Coexistence matrix: every other OpenAI instrumentation, in both load orders, through
``instrument()`` and through ``opentelemetry-instrument``, with nothing faked.

The others, real and pinned: opentelemetry-instrumentation-openai-v2 2.4b0 (the test
environment), its successor opentelemetry-instrumentation-genai-openai 1.3b0,
OpenInference (openinference-instrumentation-openai 0.1.66) and OpenLLMetry
(opentelemetry-instrumentation-openai 0.62.4). The last three live in venvs that
``scripts/install-coexistence-venvs.sh`` builds (they cannot share the test environment:
see that script). Each case is a fresh process running ``coexistence_app.py`` (OpenLLMetry's
uninstrument leaves its wrapper, so no process instruments twice), exporting OTLP/HTTP to
a receiver in this process; its spans are grouped by the app's per-call root span.

For every call (sync and async chat, streamed and not, legacy completions) a case must
show: exactly one span carrying ``spec_decode.*``, with the figures the server sent (those
of the same seeded call with spec-decode-otel alone); the other instrumentation's spans,
attributes and metrics exactly as with it alone. In the instrument way also:
``uninstrument()`` puts back what each class attribute held before (keeping what the other
put there after us), after which no call is recorded; ``instrument_client()`` records
each call once and touches no class.

Load order under ``opentelemetry-instrument`` is entry-point order, i.e. the order the
distributions are found on ``sys.path``: each case puts a copy of the two distributions'
metadata on ``PYTHONPATH`` in the order wanted (the first found of a name wins) and the
app reports the order it saw.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from installed import built_by
from otlp_values import clean_env, otlp_attributes
from spec_decode_otel.instrumentation.coexistence import FOREIGN_SCOPES
from spec_decode_otel.telemetry import SCOPE_NAME

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
APP = HERE / "coexistence_app.py"
APP_SCOPE = "coexistence-app"

#: name in the matrix -> (venv name or None for the test environment, distribution)
OTHERS = {
    "openai-v2": (None, "opentelemetry-instrumentation-openai-v2"),
    "genai-openai": ("genai-openai", "opentelemetry-instrumentation-genai-openai"),
    "openinference": ("openinference", "openinference-instrumentation-openai"),
    "openllmetry": ("openllmetry", "opentelemetry-instrumentation-openai"),
}
WAYS = ("instrument", "zero-code")
ORDERS = ("theirs-first", "ours-first")
CALLS = ("chat", "chat-stream", "completions", "async-chat", "async-chat-stream")
AFTER_UNINSTRUMENT = "after-uninstrument"
CLIENT_CALLS = ("client-chat", "client-chat-stream")
#: Their attributes that differ from run to run whoever is installed: response ids,
#: timings, and OpenInference's copy of the whole response body (which holds both).
#: coexistence_app.py's calls whose body is read after ``create`` returned, or whose stream
#: is dropped unread, by the instrumentations that end their span before we see its end:
#: OpenLLMetry (0.62.4) ends its span as ``create`` returns a ``with_streaming_response``
#: and as its stream wrapper is reclaimed; OpenInference (0.1.66) and genai-openai (1.3b0)
#: as their stream wrappers are reclaimed, before ours. Their ``with_streaming_response``
#: and ``with_raw_response`` streams are read to the end although each drives the
#: response itself: genai-openai (1.3b0) closes our stream from its hook on the HTTP
#: response's ``close``, which the SDK's stream calls from inside our ``__next__`` as it
#: reaches the end; OpenInference (0.1.66) loaded after us calls ``parse()`` in its
#: wrapper and puts its own stream in the response's parse cache, which the user's
#: ``parse()`` then returns.
READ_AFTER_CREATE = ("raw-stream", "async-raw-stream", "raw-response-stream")
LATE_ENDERS = {
    "openllmetry": (*READ_AFTER_CREATE, "dropped-stream"),
    "openinference": (*READ_AFTER_CREATE, "dropped-stream"),
    "genai-openai": (*READ_AFTER_CREATE, "dropped-stream"),
}
#: coexistence_app.py's extra calls, in the order it makes them.
EXTRA_CALLS = ("raw-stream", "async-raw-stream", "dropped-stream", "raw-response-stream")
#: The scope each other instrumentation records its metrics under.
OTHER_SCOPES = {
    "openllmetry": "opentelemetry.instrumentation.openai.v1",
    "openinference": "openinference.instrumentation.openai",
    "genai-openai": "opentelemetry.instrumentation.genai.openai",
}
VARYING = frozenset({"gen_ai.response.id", "gen_ai.response.time_to_first_chunk", "output.value"})
#: Samplers of the GenAI-metrics cases: one that keeps every trace and one that drops
#: every trace (metrics do not depend on sampling, so neither may the count).
SAMPLERS = ("always_on", "always_off")


# --------------------------------------------------------------------------- OTLP in


@dataclass
class Sink:
    """What one process exported: OTLP/HTTP protobuf requests, decoded."""

    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)


class OtlpReceiver:
    """An OTLP/HTTP receiver on loopback (instrumentation scope included, unlike a
    flattened view); one per case."""

    def __init__(self) -> None:
        self.sink = Sink()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path.endswith("/v1/traces"):
                    receiver.sink.traces.append(ExportTraceServiceRequest.FromString(body))
                elif self.path.endswith("/v1/metrics"):
                    receiver.sink.metrics.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- one case


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    scope: str
    name: str
    kind: int
    attributes: dict[str, Any]

    @classmethod
    def from_otlp(cls, scope: str, span: Any) -> Span:
        """One OTLP ``Span`` message of instrumentation scope ``scope``."""
        return cls(
            span.trace_id.hex(),
            span.span_id.hex(),
            span.parent_span_id.hex(),
            scope,
            span.name,
            span.kind,
            otlp_attributes(span),
        )

    @property
    def spec_decode(self) -> dict[str, Any]:
        return {k: v for k, v in self.attributes.items() if k.startswith("spec_decode.")}

    def theirs_view(self) -> tuple[Any, ...]:
        """What the other instrumentation made: everything but our attributes and the
        values that change from run to run."""
        attrs = {k: v for k, v in self.attributes.items() if not k.startswith("spec_decode.")}
        shown = {k: ("<varies>" if k in VARYING else v) for k, v in attrs.items()}
        return (self.scope, self.name, self.kind, json.dumps(shown, sort_keys=True))


@dataclass
class Case:
    report: dict[str, Any]
    calls: dict[str, list[Span]]  # label -> the call's spans, its root excluded
    metrics: dict[tuple[str, str], float]  # (scope, metric) -> total

    def ours(self, label: str) -> list[Span]:
        return [s for s in self.calls[label] if s.spec_decode]

    def theirs(self, label: str) -> list[tuple[Any, ...]]:
        return sorted(s.theirs_view() for s in self.calls[label] if s.scope != SCOPE_NAME)

    def their_metrics(self) -> dict[tuple[str, str], float]:
        return {k: v for k, v in self.metrics.items() if k[0] != SCOPE_NAME}


def zero_code_env(service: str, endpoint: str, order: str) -> dict[str, str]:
    """The variables of a run under ``opentelemetry-instrument`` exporting OTLP/HTTP to
    ``endpoint``; in the one-sided orders, the other side's instrumentor disabled."""
    env = {
        "OTEL_SERVICE_NAME": service,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_METRIC_EXPORT_INTERVAL": "600000",
    }
    disabled = {"theirs-only": "spec_decode", "ours-only": "openai"}.get(order)
    if disabled:
        env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = disabled
    return env


def decode(sink: Sink) -> tuple[dict[str, list[Span]], dict[tuple[str, str], float]]:
    spans = [
        Span.from_otlp(scope_spans.scope.name, span)
        for request in sink.traces
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]
    roots = {s.trace_id: s.name.removeprefix("call ") for s in spans if s.scope == APP_SCOPE}
    assert len(roots) == len([s for s in spans if s.scope == APP_SCOPE]), "one root per call"
    calls: dict[str, list[Span]] = {label: [] for label in roots.values()}
    for span in spans:
        assert span.trace_id in roots, f"a span outside every call: {span}"
        if span.scope != APP_SCOPE:
            calls[roots[span.trace_id]].append(span)
    metrics: dict[tuple[str, str], float] = {}
    for request in sink.metrics:  # cumulative: the last export holds the totals
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    points = getattr(metric, kind).data_points
                    total = sum(
                        p.count if kind in ("histogram", "exponential_histogram")
                        else p.as_int or p.as_double
                        for p in points
                    )  # fmt: skip
                    metrics[(scope_metrics.scope.name, metric.name)] = total
    return calls, metrics


def distribution_files(python: str, name: str) -> dict[str, Any]:
    """A distribution's metadata as ``python``'s environment has it."""
    script = (
        "import importlib.metadata as m, json, sys; d = m.distribution(sys.argv[1]); "
        "print(json.dumps({'name': d.metadata['Name'], 'version': d.version, "
        "'files': {f: d.read_text(f) for f in ('METADATA', 'entry_points.txt')}}))"
    )
    done = subprocess.run(
        [python, "-c", script, name], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(done.stdout)


def metadata_dir(root: Path, dist: dict[str, Any]) -> Path:
    """A directory holding only a copy of ``dist``'s metadata (so its entry points)."""
    where = root / dist["name"]
    normalized = dist["name"].replace("-", "_").replace(".", "_").lower()
    info = where / f"{normalized}-{dist['version']}.dist-info"
    info.mkdir(parents=True)
    for name, text in dist["files"].items():
        (info / name).write_text(text or "", encoding="utf-8")
    return where


@dataclass
class Matrix:
    """Runs each case once, two at a time (a case is mostly a process starting up)."""

    simulator_url: str
    venvs: Path
    workdir: Path
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(2))
    cases: dict[tuple[str, str, str, bool, str | None], Future[Case]] = field(default_factory=dict)

    def python(self, other: str) -> str:
        venv = OTHERS[other][0]
        return sys.executable if venv is None else str(self.venvs / venv / "bin" / "python")

    def start(
        self, other: str, way: str, order: str, extra: bool = False, sampler: str | None = None
    ) -> None:
        key = (other, way, order, extra, sampler)
        if key not in self.cases:
            self.cases[key] = self.pool.submit(self._run, other, way, order, extra, sampler)

    def run(
        self, other: str, way: str, order: str, extra: bool = False, sampler: str | None = None
    ) -> Case:
        self.start(other, way, order, extra, sampler)
        return self.cases[(other, way, order, extra, sampler)].result()

    def _run(
        self, other: str, way: str, order: str, extra: bool = False, sampler: str | None = None
    ) -> Case:
        python = self.python(other)
        way_dir = f"{way}-extra" if extra else way
        if sampler is not None:
            way_dir = f"{way_dir}-{sampler}"
        ours = metadata_dir(
            self.workdir / f"{other}-{way_dir}-{order}-ours",
            distribution_files(sys.executable, "spec-decode-otel"),
        )
        theirs = metadata_dir(
            self.workdir / f"{other}-{way_dir}-{order}-theirs",
            distribution_files(python, OTHERS[other][1]),
        )
        first, second = (theirs, ours) if order.startswith("theirs") else (ours, theirs)
        receiver = OtlpReceiver()
        env = clean_env(
            "PYTHON",
            PYTHONPATH=os.pathsep.join(map(str, (first, second, REPO / "src"))),
            SIMULATOR_URL=self.simulator_url,
            COEX_WAY=way,
            COEX_OTHER=other,
            COEX_ORDER=order,
            OTLP_ENDPOINT=receiver.endpoint,
        )
        if extra:  # and the GenAI client metrics opted in
            env |= {"COEX_EXTRA": "1", "SPEC_DECODE_OTEL_GENAI_METRICS": "true"}
        if sampler is not None:  # likewise, and each call's GenAI metric points reported
            env |= {"COEX_SAMPLER": sampler, "SPEC_DECODE_OTEL_GENAI_METRICS": "true"}
        argv = [python, str(APP)]
        if way == "zero-code":
            argv = [str(Path(python).parent / "opentelemetry-instrument"), *argv]
            env |= zero_code_env("coexistence-app", receiver.endpoint, order)
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
        finally:
            receiver.close()
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        calls, metrics = decode(receiver.sink)
        return Case(report, calls, metrics)


@pytest.fixture(scope="module")
def coexistence_venvs() -> Path:
    """The venvs of the instrumentations the test environment cannot hold; scripts/test.sh
    builds them (cached) and exports their directory; a bare pytest run builds them here."""
    return built_by("install-coexistence-venvs.sh", "SPEC_DECODE_OTEL_COEXISTENCE_VENVS")


@pytest.fixture(scope="module")
def matrix(simulator_url: str, coexistence_venvs: Path) -> Iterator[Matrix]:
    with tempfile.TemporaryDirectory() as workdir:
        matrix = Matrix(simulator_url, coexistence_venvs, Path(workdir))
        for other in OTHERS:  # every case starts now; each test waits for its own
            for way in WAYS:
                for order in ("theirs-only", *ORDERS):
                    matrix.start(other, way, order)
        for way in WAYS:
            matrix.start("openai-v2", way, "ours-only")
        for other in LATE_ENDERS:
            for order in ("theirs-only", *ORDERS):
                matrix.start(other, "instrument", order, extra=True)
        matrix.start("openai-v2", "instrument", "ours-only", extra=True)
        for sampler in SAMPLERS:
            matrix.start("openai-v2", "instrument", "ours-only", sampler=sampler)
            for other in OTHERS:
                for order in ORDERS:
                    matrix.start(other, "instrument", order, sampler=sampler)
        try:
            yield matrix
        finally:
            matrix.pool.shutdown(cancel_futures=True)


# --------------------------------------------------------------------------- the matrix


def carrier_of(other: str, order: str, label: str) -> str:
    """Whose span a call's ``spec_decode.*`` lands on. openai-v2, genai-openai and
    OpenLLMetry wrap ``create`` (openai-v2 and genai-openai only chat's), which calls
    ``request``: their span is current whatever the order. OpenInference wraps
    ``OpenAI.request``: loaded after us it wraps ours, loaded before us ours wraps its
    wrapper. ``instrument_client`` wraps the instance's ``request``, outside any class's."""
    if other in ("openai-v2", "genai-openai"):
        return "ours" if label.endswith("completions") else "theirs"
    if other == "openllmetry":
        return "theirs"
    return "theirs" if order == "ours-first" and not label.startswith("client") else "ours"


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("other", list(OTHERS))
def test_every_call_has_one_spec_decode_span_and_theirs_intact(
    matrix: Matrix, other: str, way: str, order: str
) -> None:
    case = matrix.run(other, way, order)
    alone = matrix.run(other, way, "theirs-only")
    ours_alone = matrix.run("openai-v2", way, "ours-only")

    if way == "zero-code":
        expected = (
            ["openai", "spec_decode"] if order == "theirs-first" else ["spec_decode", "openai"]
        )
        assert case.report["entry_points"] == expected

    labels = [*CALLS, AFTER_UNINSTRUMENT, *CLIENT_CALLS] if way == "instrument" else list(CALLS)
    assert sorted(case.calls) == sorted(labels)
    for label in labels:
        ours = case.ours(label)
        if label == AFTER_UNINSTRUMENT:
            assert ours == [], "recorded after uninstrument()"
        else:
            assert len(ours) == 1, (label, [(s.scope, s.name) for s in case.calls[label]])
            (alone_span,) = ours_alone.ours(label)
            assert ours[0].spec_decode == alone_span.spec_decode, label
            assert ours[0].spec_decode["spec_decode.engine"] == "vllm"
            # Whose span carries it: theirs when theirs is current as our wrapper runs
            # (auto mode enriches it), else our own, with theirs (if any) as its child.
            carrier = "ours" if ours[0].scope == SCOPE_NAME else "theirs"
            assert carrier == carrier_of(other, order, label), label
            if carrier == "ours":
                children = [s for s in case.calls[label] if s.scope != SCOPE_NAME]
                assert all(s.parent_id == ours[0].span_id for s in children), label
        # Theirs: the same spans with the same attributes as with it alone.
        assert case.theirs(label) == alone.theirs(label), label
    assert case.their_metrics() == alone.their_metrics()
    # Our metrics: each recorded call once.
    recorded = len(labels) - (1 if way == "instrument" else 0)
    assert case.metrics[(SCOPE_NAME, "spec_decode.acceptance_length")] == recorded

    if way == "instrument":
        assert case.report["restored"] == dict.fromkeys(case.report["restored"], True)
        assert case.report["instrument_client_kept_classes"] is True


def test_each_other_instrumentation_makes_spans_of_its_own_scope(matrix: Matrix) -> None:
    """The scopes coexistence.py recognises are the ones these releases use, and each
    of them made a span for every call it wraps (the matrix compares real telemetry)."""
    scopes = {}
    for other in OTHERS:
        alone = matrix.run(other, "instrument", "theirs-only")
        scopes[other] = Counter(s.scope for label in CALLS for s in alone.calls[label])
    assert scopes == {
        # chat only (sync, async, streamed or not); util-genai's handler makes the spans
        "openai-v2": {"opentelemetry.util.genai.handler": 4},
        "genai-openai": {"opentelemetry.instrumentation.genai.openai": 4},
        "openinference": {"openinference.instrumentation.openai": 5},
        "openllmetry": {"opentelemetry.instrumentation.openai.v1": 5},
    }
    for other in ("genai-openai", "openinference", "openllmetry"):
        assert set(scopes[other]) <= FOREIGN_SCOPES, other


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("other", list(LATE_ENDERS))
def test_a_record_arriving_after_their_span_ended_is_kept_on_a_span_of_ours(
    matrix: Matrix, other: str, order: str
) -> None:
    """Their span ends before the body is read (or the stream reclaimed), so attributes
    set on it later are dropped. The record must still land: on their span while it is
    open, else on a span of ours, a child of theirs, with the figures of ours alone."""
    case = matrix.run(other, "instrument", order, extra=True)
    alone = matrix.run(other, "instrument", "theirs-only", extra=True)
    ours_alone = matrix.run("openai-v2", "instrument", "ours-only", extra=True)
    for label in LATE_ENDERS[other]:
        ours = case.ours(label)
        assert len(ours) == 1, (label, [(s.scope, s.name) for s in case.calls[label]])
        (alone_span,) = ours_alone.ours(label)
        assert ours[0].spec_decode == alone_span.spec_decode, label
        if ours[0].scope == SCOPE_NAME:  # ours: within this call's trace, under its root
            assert ours[0].parent_id, label
        assert case.theirs(label) == alone.theirs(label), label
    assert case.their_metrics() == alone.their_metrics()


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("other", list(LATE_ENDERS))
def test_opted_in_genai_metrics_count_each_call_once_in_either_load_order(
    matrix: Matrix, other: str, order: str
) -> None:
    """With ``genai_metrics`` on, each call's GenAI client metrics are recorded once: by
    the other instrumentation when it records them (OpenLLMetry 0.62.4 and genai-openai
    1.3b0 do), else by us. OpenInference (openinference-instrumentation-openai 0.1.66)
    records no metrics, so ours must not be left to it when its span is the one enriched
    (loaded after us), as they are not when ours is its own span (loaded before us)."""
    case = matrix.run(other, "instrument", order, extra=True)
    alone = matrix.run(other, "instrument", "theirs-only", extra=True)
    duration = "gen_ai.client.operation.duration"
    theirs = alone.their_metrics().get((OTHER_SCOPES[other], duration), 0)
    ours = case.metrics.get((SCOPE_NAME, duration), 0)
    if other == "openinference":
        assert (ours, theirs) == (len(EXTRA_CALLS), 0)
    else:
        assert ours == 0 and theirs > 0
    assert case.their_metrics() == alone.their_metrics()


def assert_read_streams_recorded(matrix: Matrix, other: str, order: str) -> None:
    """Each stream of ``READ_AFTER_CREATE`` the app reads to its end ends as read to the
    end, with the figures of ours alone (``recorded``), on exactly one span."""
    case = matrix.run(other, "instrument", order, extra=True)
    ours_alone = matrix.run("openai-v2", "instrument", "ours-only", extra=True)
    for label in READ_AFTER_CREATE:
        ours = case.ours(label)
        assert len(ours) == 1, (label, [(s.scope, s.name) for s in case.calls[label]])
        (alone_span,) = ours_alone.ours(label)
        assert alone_span.spec_decode["spec_decode.outcome"] == "recorded", label
        assert "spec_decode.read_to_end" not in ours[0].spec_decode, label
        assert ours[0].spec_decode == alone_span.spec_decode, label


@pytest.mark.parametrize("order", ORDERS)
def test_genai_openai_closing_our_stream_from_inside_its_last_read_still_ends_it_read(
    matrix: Matrix, order: str
) -> None:
    """genai-openai (opentelemetry-instrumentation-genai-openai 1.3b0, _raw_response.py)
    hooks the HTTP response's ``close`` of a ``with_raw_response`` /
    ``with_streaming_response`` stream and closes its stream wrapper, so ours, from it.
    The SDK's stream (openai 3.63.0, _streaming.py) closes the response in its iterator's
    ``finally``: inside our ``__next__``, before the end of the stream reaches us. That
    close must not end a stream the user reads to its end as stopped early."""
    assert_read_streams_recorded(matrix, "genai-openai", order)


@pytest.mark.parametrize("order", ORDERS)
def test_openinference_parsing_in_its_wrapper_leaves_the_users_stream_recorded(
    matrix: Matrix, order: str
) -> None:
    """OpenInference (openinference-instrumentation-openai 0.1.66, _request.py
    ``_finalize_response``), loaded after us, wraps ours: it calls ``parse()`` on the
    response we return, then puts its own stream (wrapping the SDK's) in the response's
    parse cache, which the user's ``parse()`` then returns. The stream our first
    ``parse()`` made is never read; the user's chunks must still end the call, read to
    the end, with its record."""
    assert_read_streams_recorded(matrix, "openinference", order)


def genai_recorder(other: str | None, label: str) -> str:
    """Who records a call's GenAI client metrics (duration, token usage) when another
    instrumentation is loaded beside us with ``genai_metrics`` on: theirs for the calls
    they record themselves, else ours. openai-v2 (2.4b0, ``__init__.py``) and
    genai-openai (1.3b0, ``__init__.py``) wrap chat but not legacy completions;
    OpenLLMetry (opentelemetry-instrumentation-openai 0.62.4, ``v1/__init__.py``) wraps
    both, but passes its histograms to ``chat_wrapper`` only (``completion_wrapper``
    gets the tracer alone); OpenInference (0.1.66) records no metrics at all."""
    if other in ("openai-v2", "genai-openai", "openllmetry"):
        return "ours" if label.endswith("completions") else "theirs"
    return "ours"


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize(
    ("other", "order"),
    [("openai-v2", "ours-only"), *((other, order) for other in OTHERS for order in ORDERS)],
)
def test_opted_in_genai_metrics_count_each_call_once_whether_its_trace_is_sampled_or_not(
    matrix: Matrix, other: str, order: str, sampler: str
) -> None:
    """Each call's GenAI client metrics are recorded once, by exactly one
    instrumentation, whatever the sampler decides: the others record theirs whether
    their span is sampled or not (openai-v2 2.4b0 with opentelemetry-util-genai 1.1b0,
    ``_inference_invocation.py`` ``_apply_finish``; genai-openai 1.3b0 with
    opentelemetry-util-genai 1.3b0, ``_invocation.py`` ``_record_client_metrics``;
    OpenLLMetry 0.62.4, ``shared/chat_wrappers.py`` ``chat_wrapper``), and a span the
    sampler drops is a ``NonRecordingSpan`` that names no instrumentation, so whether
    ours stays out cannot rest on seeing their span. Alone (ours-only, in the test
    environment) every call is ours; after ``uninstrument()`` none is."""
    case = matrix.run(other, "instrument", order, sampler=sampler)
    per_call: dict[str, dict[str, int]] = case.report["genai"]
    assert sorted(per_call) == sorted([*CALLS, AFTER_UNINSTRUMENT, *CLIENT_CALLS])
    duration = f"{SCOPE_NAME} gen_ai.client.operation.duration"
    tokens = f"{SCOPE_NAME} gen_ai.client.token.usage"
    for label, counts in per_call.items():
        ours = {k: n for k, n in counts.items() if k in (duration, tokens)}
        if label == AFTER_UNINSTRUMENT:
            assert ours == {}, (label, counts)
            continue
        durations = [
            n for k, n in counts.items() if k.endswith(" gen_ai.client.operation.duration")
        ]
        assert durations == [1], (label, counts)  # once, by one instrumentation
        recorder = genai_recorder(None if order == "ours-only" else other, label)
        assert ours == ({duration: 1, tokens: 2} if recorder == "ours" else {}), (label, counts)
    if sampler == "always_off":
        assert case.calls == {}  # the sampler dropped every span
