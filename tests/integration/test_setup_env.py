"""``setup()`` driven by the standard ``OTEL_*`` variables, as a deployment sets them, and
checked where the data lands: a real OpenTelemetry Collector (``collector_sink.py``) whose
OTLP receiver forwards to a sink in this process, so each test sees the resource, the
spans and the metrics the collector received. Each application runs in a process of its
own (``setup()`` installs process-wide state) and exits normally, so what it exported is
what its exit flush sent.

What the SDK does with the same variables is the reference: opentelemetry-sdk 1.45.2,
``opentelemetry/sdk/_configuration/__init__.py`` (the auto-configuration
``opentelemetry-instrument`` runs through opentelemetry-distro 0.66b2), and the OTLP
exporters 1.45.2, which read their own endpoint, header and protocol variables.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from collector_sink import Collector, Sink, attributes, running_collector, running_sink
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from installed import REPO, built_by
from otlp_values import clean_env, run_under_opentelemetry_instrument

#: One instrumented chat call to the simulator, then a normal exit.
ONE_CALL = """
import os, openai, spec_decode_otel
spec_decode_otel.setup("from-argument")
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
client.chat.completions.create(model="spec-sim", messages=[{"role": "user", "content": "hi"}])
client.close()
"""

#: Bounds the exit flush where a test points a signal at nothing.
QUICK = {"OTEL_EXPORTER_OTLP_TIMEOUT": "2"}


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    with running_collector() as running:
        yield running


@pytest.fixture
def sink(collector: Collector) -> Sink:
    collector.sink.clear()
    return collector.sink


def run_app(
    script: str, simulator_url: str, python: Path = Path(sys.executable), **env: str
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(python), "-c", script],
        env=clean_env(SIMULATOR_URL=simulator_url, **env),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


def span_names(sink: Sink) -> list[str]:
    return [span.name for _, span in sink.spans()]


# ------------------------------------------------------------------ endpoints and paths


@pytest.mark.parametrize(
    ("case", "spans", "metrics"),
    [("generic", True, True), ("traces-with-path", True, False), ("traces-no-path", False, True)],
)
def test_otlp_http_endpoints_follow_the_path_rules_of_the_specification(
    simulator_url: str, collector: Collector, sink: Sink, case: str, spans: bool, metrics: bool
) -> None:
    """OTLP exporter specification, as opentelemetry-exporter-otlp-proto-http 1.45.2
    applies it (``trace_exporter/__init__.py``: ``_append_trace_path`` on the generic
    variable only): ``OTEL_EXPORTER_OTLP_ENDPOINT`` gets ``/v1/traces`` and
    ``/v1/metrics`` appended; ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` wins over it and is
    used as it is, so one without the path posts to ``/``, which the collector refuses.
    ``setup()`` exports a signal when either names an endpoint, and leaves the URL to the
    exporter."""
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", **QUICK}
    if case == "generic":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.http_endpoint
    elif case == "traces-with-path":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = collector.http_endpoint + "/v1/traces"
    else:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.http_endpoint
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = collector.http_endpoint
    run_app(ONE_CALL, simulator_url, **env)
    assert span_names(sink) == (["chat spec-sim"] if spans else [])
    assert ("spec_decode.acceptance_length" in sink.metric_names()) is metrics


def test_headers_from_the_environment_are_url_decoded_and_the_signals_own_win(
    simulator_url: str,
) -> None:
    """``OTEL_EXPORTER_OTLP_HEADERS`` values are URL-encoded (OTLP exporter
    specification; ``parse_env_headers(..., liberal=True)`` in opentelemetry-exporter-
    otlp-proto-http 1.45.2), and ``OTEL_EXPORTER_OTLP_METRICS_HEADERS``, when set,
    replaces them for metrics. ``setup()`` builds the exporters without arguments, so they
    read these themselves: the receiver gets the decoded values. (Straight to a sink: a
    collector does not pass request headers on.)"""
    with running_sink() as sink:
        run_app(
            ONE_CALL,
            simulator_url,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_ENDPOINT=sink.endpoint,
            OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer%20t0k%3D%3D,x-team=ml%2Finfra",
            OTEL_EXPORTER_OTLP_METRICS_HEADERS="x-team=metrics",
        )
        by_path = {r.path: r.headers for r in sink.requests}
    assert by_path["/v1/traces"]["authorization"] == "Bearer t0k=="
    assert by_path["/v1/traces"]["x-team"] == "ml/infra"
    assert by_path["/v1/metrics"]["x-team"] == "metrics"
    assert "authorization" not in by_path["/v1/metrics"]


def test_a_grpc_endpoint_without_a_scheme_is_plaintext_under_otlp_insecure(
    simulator_url: str, collector: Collector, sink: Sink
) -> None:
    """A gRPC endpoint given as ``host:port`` is TLS unless ``OTEL_EXPORTER_OTLP_INSECURE``
    is ``true`` (opentelemetry-exporter-otlp-proto-grpc 1.45.2, ``exporter.py``: the
    scheme decides, else that variable). The collector's receiver is plaintext, so both
    signals arrive only because the exporter read the variable."""
    run_app(
        ONE_CALL,
        simulator_url,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"127.0.0.1:{collector.grpc_port}",
        OTEL_EXPORTER_OTLP_INSECURE="true",
    )
    assert span_names(sink) == ["chat spec-sim"]
    assert "spec_decode.acceptance_length" in sink.metric_names()


# ------------------------------------------------------------------ resource

DEPLOYMENT_ATTRIBUTES = "service.name=from-attributes,deployment.environment=prod"


@pytest.mark.parametrize(
    ("env", "service"),
    [
        ({}, "from-argument"),
        ({"OTEL_SERVICE_NAME": "from-service-name"}, "from-service-name"),
        (
            {"OTEL_RESOURCE_ATTRIBUTES": DEPLOYMENT_ATTRIBUTES},
            "from-attributes",
        ),
        (
            {
                "OTEL_SERVICE_NAME": "from-service-name",
                "OTEL_RESOURCE_ATTRIBUTES": DEPLOYMENT_ATTRIBUTES,
            },
            "from-service-name",
        ),
    ],
    ids=["argument", "service-name", "resource-attributes", "both-variables"],
)
def test_the_environments_service_name_wins_over_setups_argument(
    simulator_url: str, collector: Collector, sink: Sink, env: dict[str, str], service: str
) -> None:
    """``setup("from-argument")`` is the service name when the environment names none. A
    deployment names it with ``OTEL_SERVICE_NAME`` or with ``service.name`` in
    ``OTEL_RESOURCE_ATTRIBUTES`` (the SDK's ``OTELResourceDetector``, opentelemetry-sdk
    1.45.2 ``resources/__init__.py``: the former wins over the latter). The argument won
    over ``OTEL_RESOURCE_ATTRIBUTES``: spans and metrics went out as ``from-argument``
    from a pod whose deployment named it otherwise, so its dashboards showed nothing under
    the name they were given."""
    run_app(ONE_CALL, simulator_url, OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint, **env)
    resources = [resource for resource, _ in sink.spans() + sink.metrics()]
    assert resources, "nothing arrived"
    assert {r["service.name"] for r in resources} == {service}
    if "OTEL_RESOURCE_ATTRIBUTES" in env:
        assert {r["deployment.environment"] for r in resources} == {"prod"}


# ------------------------------------------------------------------ metrics and sampling


def test_metrics_honour_the_delta_temporality_preference(
    simulator_url: str, collector: Collector, sink: Sink
) -> None:
    """``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta`` (read by the OTLP metric
    exporter, opentelemetry-exporter-otlp-proto-common 1.45.2 ``_common_configuration``):
    counters and histograms arrive as deltas (the shipped collector config converts them
    with ``deltatocumulative``)."""
    run_app(
        ONE_CALL,
        simulator_url,
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint,
        OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="delta",
    )
    by_name = {metric.name: metric for _, metric in sink.metrics()}
    assert (
        by_name["spec_decode.draft_tokens"].sum.aggregation_temporality
        == AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    )
    assert (
        by_name["spec_decode.acceptance_length"].histogram.aggregation_temporality
        == AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    )


LONG_RUNNING = ONE_CALL + "print('called', flush=True)\nimport sys\nsys.stdin.read()\n"


def test_metrics_are_exported_at_the_interval_the_environment_sets(
    simulator_url: str, collector: Collector, sink: Sink
) -> None:
    """``OTEL_METRIC_EXPORT_INTERVAL`` (ms; opentelemetry-sdk 1.45.2
    ``PeriodicExportingMetricReader``, default 60000): a long-running service's metrics
    arrive while it runs, not only at its exit."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LONG_RUNNING],
        env=clean_env(
            SIMULATOR_URL=simulator_url,
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint,
            OTEL_METRIC_EXPORT_INTERVAL="300",
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "called"
        deadline = time.monotonic() + 10
        while "spec_decode.acceptance_length" not in sink.metric_names():
            assert time.monotonic() < deadline, "no metrics while the service ran"
            time.sleep(0.1)
        assert proc.poll() is None  # it is still running
    finally:
        proc.communicate(timeout=30)


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_TRACES_SAMPLER": "always_off"},
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"},
    ],
    ids=["always-off", "ratio-0"],
)
def test_calls_sampled_out_of_traces_are_still_counted_in_metrics(
    simulator_url: str, collector: Collector, sink: Sink, env: dict[str, str]
) -> None:
    """``OTEL_TRACES_SAMPLER`` / ``_ARG`` (read by the SDK's TracerProvider, opentelemetry-
    sdk 1.45.2 ``trace/sampling.py`` ``_get_from_env_or_default``): a fleet that keeps a
    fraction of its traces still counts every call's acceptance in the metrics."""
    run_app(ONE_CALL, simulator_url, OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint, **env)
    assert span_names(sink) == []
    # the last export (cumulative: the exit flush and the shutdown each send one)
    requests = [m for _, m in sink.metrics() if m.name == "spec_decode.requests"][-1]
    assert sum(point.as_int for point in requests.sum.data_points) == 1
    assert all(attributes(p) for p in requests.sum.data_points)


# ------------------------------------------------------------------ exporter names


@pytest.mark.parametrize(
    ("traces", "metrics", "to_collector", "printed"),
    [
        ("console", "console", set(), {"spans", "metrics"}),
        ("otlp,console", "otlp", {"spans", "metrics"}, {"spans"}),
        ("console", None, {"metrics"}, {"spans"}),
        ("none", "otlp , console", {"metrics"}, {"metrics"}),
    ],
    ids=["console", "otlp-and-console", "console-traces-only", "list-with-spaces"],
)
def test_the_exporter_variables_choose_where_each_signal_goes(
    simulator_url: str,
    collector: Collector,
    sink: Sink,
    traces: str,
    metrics: str | None,
    to_collector: set[str],
    printed: set[str],
) -> None:
    """``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` are comma-separated exporter
    names (OTel specification, SDK environment variables; opentelemetry-sdk 1.45.2
    ``_configuration/__init__.py`` ``_get_exporter_names`` splits and strips them and loads
    each from the ``opentelemetry_traces_exporter`` / ``_metrics_exporter`` entry points,
    ``console`` among them). ``setup()`` knew only ``none``: with an endpoint set, any
    other value exported over OTLP, so ``console``, the usual way to look at what an
    application emits, printed nothing and sent everything to the collector. Each signal
    now goes to the exporters its variable names; an unset variable still means OTLP
    when an endpoint is set."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.grpc_endpoint, "OTEL_TRACES_EXPORTER": traces}
    if metrics is not None:
        env["OTEL_METRICS_EXPORTER"] = metrics
    done = run_app(ONE_CALL, simulator_url, **env)
    arrived = set()
    if span_names(sink):
        arrived.add("spans")
    if "spec_decode.acceptance_length" in sink.metric_names():
        arrived.add("metrics")
    assert arrived == to_collector
    shown = set()
    if '"name": "chat spec-sim"' in done.stdout:
        shown.add("spans")
    if '"name": "spec_decode.acceptance_length"' in done.stdout:
        shown.add("metrics")
    assert shown == printed, done.stdout[-2000:]


def test_nothing_is_exported_under_otel_sdk_disabled_whatever_exporters_are_named(
    simulator_url: str, collector: Collector, sink: Sink
) -> None:
    """``OTEL_SDK_DISABLED=true``: "a no-op SDK implementation will be used for all
    telemetry signals" (OTel specification; opentelemetry-sdk 1.45.2's providers then hand
    out no-op tracers and meters). With exporters named explicitly too, nothing reaches
    the collector or the console, and the application's calls go on."""
    done = run_app(
        ONE_CALL,
        simulator_url,
        OTEL_SDK_DISABLED="true",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint,
        OTEL_TRACES_EXPORTER="otlp,console",
        OTEL_METRICS_EXPORTER="otlp,console",
    )
    assert sink.requests == []
    assert done.stdout == ""


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_an_otlp_exporter_named_without_an_endpoint_sends_to_the_default_one(
    simulator_url: str, protocol: str
) -> None:
    """``OTEL_TRACES_EXPORTER=otlp`` with no endpoint variable: the OTLP exporters' default,
    ``http://localhost:4317`` (gRPC) or ``http://localhost:4318/v1/traces`` (HTTP) (OTLP
    exporter specification; opentelemetry-exporter-otlp-proto-grpc/-http 1.45.2), where a
    node's collector agent listens; opentelemetry-instrument sends there. ``setup()``
    exported nothing without an endpoint variable, whatever the exporter variables said,
    and warned of nothing. It sends to the default endpoint when the variable names
    ``otlp``; with neither variable set it still exports nothing. (This test needs
    127.0.0.1:4317 and :4318 free.)"""
    with running_collector(grpc_port=4317, http_port=4318) as collector:
        run_app(
            ONE_CALL,
            simulator_url,
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_METRICS_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        )
        assert span_names(collector.sink) == ["chat spec-sim"]
        assert "spec_decode.acceptance_length" in collector.sink.metric_names()


def test_an_exporter_name_nothing_provides_warns_naming_it_and_exports_no_otlp(
    simulator_url: str, collector: Collector, sink: Sink
) -> None:
    """``OTEL_METRICS_EXPORTER=prometheus`` without opentelemetry-exporter-prometheus
    installed: the SDK's auto-configuration finds no such entry point and raises
    ("Requested component 'prometheus' not found in entry point
    'opentelemetry_metrics_exporter'", opentelemetry-sdk 1.45.2 ``_configuration``).
    ``setup()`` took the name for OTLP and pushed the metrics to the endpoint, silently.
    It warns, naming the variable and the name, and that signal goes nowhere; the other
    signal is exported as its own variables say."""
    done = run_app(
        ONE_CALL,
        simulator_url,
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint,
        OTEL_METRICS_EXPORTER="prometheus",
    )
    assert span_names(sink) == ["chat spec-sim"]
    assert sink.metric_names() == set()
    assert "RuntimeWarning: spec_decode_otel.setup(): metrics" in done.stderr, done.stderr
    assert "OTEL_METRICS_EXPORTER names 'prometheus'" in done.stderr, done.stderr
    assert "<string>:3: RuntimeWarning" in done.stderr, done.stderr  # the setup() line


# ------------------------------------------------------------------ values the SDK refuses


@pytest.mark.parametrize(
    ("env", "warned", "exported"),
    [
        (
            {"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
            [
                "spans are not exported",
                "metrics are not exported",
                "OTEL_EXPORTER_OTLP_COMPRESSION",
            ],
            set(),
        ),
        (
            {"OTEL_METRICS_EXEMPLAR_FILTER": "sometimes"},
            ["exemplar filter", "'sometimes'"],
            {"spans", "metrics"},
        ),
        (
            {"OTEL_ATTRIBUTE_COUNT_LIMIT": "lots"},
            ["span limits", "OTEL_ATTRIBUTE_COUNT_LIMIT"],
            {"spans", "metrics"},
        ),
        (
            # Read as the SDK is imported (a module-level SpanLimits._from_env_if_absent,
            # opentelemetry-sdk 1.45.2 trace/__init__.py): the import itself failed.
            {"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "abc"},
            ["span limits", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"],
            {"spans", "metrics"},
        ),
        (
            {"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "-3"},
            ["span limits", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"],
            {"spans", "metrics"},
        ),
        (
            # The exporter's own message names no variable ("could not convert string to
            # float: 'abc'"): the warning says it is an OTEL_* value.
            {"OTEL_EXPORTER_OTLP_TIMEOUT": "abc"},
            ["spans are not exported", "'abc' (an OTEL_* value the OpenTelemetry SDK refuses)"],
            set(),
        ),
    ],
    ids=[
        "grpc-compression",
        "exemplar-filter",
        "attribute-count",
        "span-attribute-count-at-import",
        "negative-length",
        "timeout",
    ],
)
def test_an_otel_value_the_sdk_refuses_never_stops_the_application(
    simulator_url: str,
    collector: Collector,
    sink: Sink,
    env: dict[str, str],
    warned: list[str],
    exported: set[str],
) -> None:
    """The SDK raises on these while building what ``setup()`` builds (opentelemetry-sdk
    1.45.2: ``SpanLimits`` in ``trace/__init__.py`` "must be a non-negative integer",
    ``_get_exemplar_filter`` in ``metrics/_internal/__init__.py`` "Unknown exemplar
    filter"; opentelemetry-exporter-otlp-proto-grpc 1.45.2 ``exporter.py``
    ``InvalidCompressionValueException``, gRPC knowing only gzip and deflate). Under
    ``opentelemetry-instrument`` that costs the telemetry ("Failed to auto initialize
    OpenTelemetry") and the application runs; ``setup()`` let each one out, so the
    application died at start-up over a telemetry variable (only a ``ValueError`` from an
    exporter was caught). Each warns, naming the value: an exporter that cannot be built
    is left out, a provider refusing its limits or exemplar filter gets the SDK's
    defaults for them, and the calls go on."""
    done = run_app(
        ONE_CALL, simulator_url, OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint, **env
    )
    assert "Traceback" not in done.stderr, done.stderr
    for said in warned:
        assert said in done.stderr, done.stderr
    assert "<string>:3: RuntimeWarning: spec_decode_otel.setup()" in done.stderr, done.stderr
    arrived = set()
    if span_names(sink) == ["chat spec-sim"]:
        arrived.add("spans")
    if "spec_decode.acceptance_length" in sink.metric_names():
        arrived.add("metrics")
    assert arrived == exported


# ------------------------------------------------------------------ the demo says where


@pytest.mark.parametrize("where", ["console", "otlp"])
def test_the_demo_says_what_it_exported_where(collector: Collector, sink: Sink, where: str) -> None:
    """``spec-decode-otel demo`` printed "exported over OTLP to the configured collector"
    whenever ``setup()`` built an exporter, also for ``OTEL_TRACES_EXPORTER=console`` and
    no endpoint, where the spans went to stdout and nothing went over OTLP. It names each
    signal's destination: the console, or OTLP with its protocol and endpoint; a signal
    with no exporter is said not to be exported."""
    demo = shutil.which("spec-decode-otel")
    assert demo, "the package's spec-decode-otel command is not installed"
    if where == "console":
        env = {"OTEL_TRACES_EXPORTER": "console"}
    else:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.grpc_endpoint}
    done = subprocess.run(
        [demo, "demo", "--requests", "4", "--no-progress"],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if where == "console":
        said = "spans exported to the console (stdout); metrics not exported"
        assert "OTLP" not in done.stderr, done.stderr
        assert done.stdout.count('"spec_decode.engine": "vllm"') == 4, done.stdout
        assert span_names(sink) == []
    else:
        to = f"exported over OTLP/gRPC to {collector.grpc_endpoint}"
        said = f"spans {to}; metrics {to}"
        calls = [name for name in span_names(sink) if name.startswith("chat ")]
        assert len(calls) == 4, span_names(sink)
    assert said in done.stderr.splitlines(), done.stderr


# ------------------------------------------------------------------ providers already set

APP_PROVIDERS = """
import json, os, warnings, openai
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import spec_decode_otel

spans = InMemorySpanExporter()
tracer_provider = TracerProvider(resource=Resource.create({"service.name": "the-app"}))
tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(tracer_provider)
reader = InMemoryMetricReader()
if os.environ["INSTALLED"] == "both":
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    built = spec_decode_otel.setup("from-setup")
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
with trace.get_tracer("app").start_as_current_span("handler"):
    client.chat.completions.create(model="spec-sim", messages=[{"role": "user", "content": "hi"}])
client.close()
got = {s.name: s for s in spans.get_finished_spans()}
data = reader.get_metrics_data()
print(json.dumps({
    "spans": sorted(got),
    "child": got["chat spec-sim"].parent.span_id == got["handler"].context.span_id
    if "chat spec-sim" in got and "handler" in got else None,
    "app_metrics": sorted(
        m.name for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
        for m in sm.metrics
    ),
    "returned_global": built.tracer_provider is trace.get_tracer_provider(),
    "warnings": [(w.filename, str(w.message)) for w in caught],
}))
"""


@pytest.mark.parametrize("installed", ["both", "tracer-only"])
def test_setup_records_into_the_providers_the_application_installed(
    simulator_url: str, collector: Collector, sink: Sink, installed: str
) -> None:
    """An application that set up the SDK itself, then calls ``setup()`` (a library's
    or a template's): the OpenTelemetry API keeps the first global provider ("Overriding
    of current TracerProvider is not allowed", opentelemetry-api 1.45.2
    ``trace/__init__.py``), and ``setup()`` instrumented with the providers it had just
    built anyway. The call's span went to a provider of its own, out of the application's
    pipeline (its trace cut in two, under another service name; with no endpoint set,
    lost), beside a set of exporters that exported nothing else. ``setup()`` now records
    into an SDK provider already installed, says so with a RuntimeWarning at the caller's
    line, and builds only what is missing: here the MeterProvider, exported as the
    ``OTEL_*`` variables say, with the application's resource."""
    done = run_app(
        APP_PROVIDERS,
        simulator_url,
        INSTALLED=installed,
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint,
    )
    report = json.loads(done.stdout)
    assert report["spans"] == ["chat spec-sim", "handler"]
    assert report["child"] is True
    assert report["returned_global"] is True
    assert span_names(sink) == []  # the application's pipeline has the spans
    (warning,) = report["warnings"]
    assert warning[0] == "<string>"
    assert "already installed" in warning[1]
    if installed == "both":
        assert "spec_decode.acceptance_length" in report["app_metrics"]
        assert sink.metric_names() == set()
    else:
        assert report["app_metrics"] == []
        resources = [resource for resource, _ in sink.metrics()]
        assert resources, "setup()'s own MeterProvider exported nothing"
        assert {r["service.name"] for r in resources} == {"the-app"}


LOGFIRE_PROVIDERS = """
import json, os, warnings, logfire, openai
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import spec_decode_otel

spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
logfire.configure(
    send_to_logfire=False,
    inspect_arguments=False,  # the app is a -c script: no source for logfire to read
    console=False,
    service_name="the-app",
    additional_span_processors=[SimpleSpanProcessor(spans)],
    metrics=logfire.MetricsOptions(additional_readers=[reader]),
)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    built = spec_decode_otel.setup("from-setup")
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
with logfire.span("handler"):
    client.chat.completions.create(model="spec-sim", messages=[{"role": "user", "content": "hi"}])
client.close()
got = {s.name: s for s in spans.get_finished_spans()}
data = reader.get_metrics_data()
print(json.dumps({
    "spans": sorted(got),
    "child": got["chat spec-sim"].parent.span_id == got["handler"].context.span_id
    if "chat spec-sim" in got and "handler" in got else None,
    "service": got["chat spec-sim"].resource.attributes.get("service.name")
    if "chat spec-sim" in got else None,
    "app_metrics": sorted(
        m.name for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
        for m in sm.metrics
    ),
    "returned_global": built.tracer_provider is trace.get_tracer_provider(),
    "warnings": [str(w.message) for w in caught],
}))
"""


def test_setup_records_into_logfires_providers(
    simulator_url: str, collector: Collector, sink: Sink
) -> None:
    """logfire (5.4, as pydantic-ai users run it) installs providers that are not the
    SDK's: proxies (``logfire._internal.tracer.ProxyTracerProvider``, an API
    ``TracerProvider``) that hand on to its own SDK providers. ``setup()`` took only SDK
    providers for installed ones, built its own, could not install them ("Overriding of
    current TracerProvider is not allowed") and instrumented with them anyway: with no
    endpoint set, the call's spans and metrics were lost with no word said. It now
    records into logfire's, as into any provider installed before it. (logfire runs in a
    venv of its own: scripts/install-coexistence-venvs.sh says why.)"""
    venvs = built_by("install-coexistence-venvs.sh", "SPEC_DECODE_OTEL_COEXISTENCE_VENVS")
    done = run_app(
        LOGFIRE_PROVIDERS,
        simulator_url,
        python=venvs / "logfire" / "bin" / "python",
        PYTHONPATH=str(REPO / "src"),
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint,
    )
    report = json.loads(done.stdout)
    assert report["spans"] == ["chat spec-sim", "handler"]
    assert report["child"] is True
    assert report["service"] == "the-app"
    assert "spec_decode.acceptance_length" in report["app_metrics"]
    assert report["returned_global"] is True
    (warning,) = report["warnings"]
    assert "already installed" in warning
    assert span_names(sink) == [] and sink.metric_names() == set()  # all went to logfire


WARNED_AT_THE_CALL = """
import json, os, warnings
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
import spec_decode_otel
from spec_decode_otel import sdk_setup

trace.set_tracer_provider(TracerProvider())
spec_decode_otel.SpecDecodeInstrumentor().instrument(mode="span")
call = spec_decode_otel.setup if os.environ["ROUTE"] == "package" else sdk_setup.setup
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    call(mode="enrich")
    call()
print(json.dumps([(w.filename, w.lineno, str(w.message)[:100]) for w in caught]))
"""


@pytest.mark.parametrize("route", ["package", "module"])
def test_setups_warnings_point_at_the_applications_call(route: str) -> None:
    """Each warning ``setup()`` gives (a value the SDK refuses, a provider already
    installed, options given in code while already instrumented with others, a second
    ``setup()``) names the application's line in ``filename``/``lineno``, whether it
    calls ``spec_decode_otel.setup`` or ``spec_decode_otel.sdk_setup.setup`` (the demo's
    route). The "already instrumented" one came from ``instrument()`` with
    ``stacklevel=2`` and named ``sdk_setup.py``; the others counted a fixed number of
    frames that assumed the package's wrapper, and named no file of the application
    through the module's own function."""
    done = run_app(
        WARNED_AT_THE_CALL,
        "http://127.0.0.1:9/v1",
        ROUTE=route,
        OTEL_METRICS_EXPORTER="console",
        OTEL_METRIC_EXPORT_INTERVAL="0",
    )
    lines = WARNED_AT_THE_CALL.splitlines()
    first = lines.index('    call(mode="enrich")') + 1
    warned = [tuple(w) for w in json.loads(done.stdout)]
    assert [(filename, line) for filename, line, _ in warned] == [("<string>", first)] * 3 + [
        ("<string>", first + 1)
    ], warned
    said = [message for _, _, message in warned]
    assert "metrics (exporter 'console') are n" in said[0]
    assert "already installed" in said[1]
    assert "already instrumented" in said[2]
    assert "already called" in said[3]


ZERO_CODE_SETUP = """
import json, os, openai, spec_decode_otel
from opentelemetry import trace
built = spec_decode_otel.setup("from-setup")
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
client.chat.completions.create(model="spec-sim", messages=[{"role": "user", "content": "hi"}])
client.close()
print(json.dumps({
    "returned_global": built.tracer_provider is trace.get_tracer_provider(),
    "exporting": built.exporting,
    "exports": built.exports,
}))
"""


def test_setup_under_opentelemetry_instrument_uses_the_providers_it_configured(
    simulator_url: str, collector: Collector, sink: Sink, tmp_path: Path
) -> None:
    """An application with ``setup()`` in its code, run under ``opentelemetry-instrument``
    (opentelemetry-distro 0.66b2 sets the SDK up first, from the same ``OTEL_*``
    variables, and instruments through our entry point). ``setup()`` built a second set
    of providers and exporters that nothing used (the global ones were the distro's, and
    so were the instrumentation's), logged "Overriding of current TracerProvider is not
    allowed", warned "already instrumented; the first settings stay" though it was given
    no settings, and returned providers that were not the ones recording. It uses the
    distro's providers: the call is exported once, as the distro exports it."""
    app = tmp_path / "app.py"
    app.write_text(ZERO_CODE_SETUP)
    done = run_under_opentelemetry_instrument(
        app,
        SIMULATOR_URL=simulator_url,
        OTEL_SERVICE_NAME="zero-code-service",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_LOGS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint,
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="openai",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    installed = "by the exporters of the {} installed before setup()"
    assert report == {
        "returned_global": True,
        "exporting": False,
        "exports": {
            "spans": [installed.format("TracerProvider")],
            "metrics": [installed.format("MeterProvider")],
        },
    }
    assert "Overriding of current" not in done.stderr, done.stderr
    assert "already instrumented" not in done.stderr, done.stderr
    assert "already installed" in done.stderr, done.stderr
    assert [(r["service.name"], s.name) for r, s in sink.spans()] == [
        ("zero-code-service", "chat spec-sim")
    ]
    assert "spec_decode.acceptance_length" in sink.metric_names()


INSTRUMENTED = """
import json
from spec_decode_otel import SpecDecodeInstrumentor
print(json.dumps(SpecDecodeInstrumentor().is_instrumented_by_opentelemetry))
"""


@pytest.mark.parametrize(
    ("disabled", "instrumented"),
    [("", True), ("spec_decode", False), ("openai , spec_decode", False), ("spec-decode", True)],
)
def test_opentelemetry_instrument_leaves_us_out_when_our_entry_point_is_disabled(
    tmp_path: Path, disabled: str, instrumented: bool
) -> None:
    """``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` names entry points, comma-separated, each
    stripped and compared exactly (opentelemetry-instrumentation 0.66b2,
    ``auto_instrumentation/_load.py`` ``_load_instrumentors``): ours is ``spec_decode``
    (pyproject.toml), so ``spec_decode`` turns it off, alone or in a list, and a near
    miss does not."""
    app = tmp_path / "app.py"
    app.write_text(INSTRUMENTED)
    done = run_under_opentelemetry_instrument(
        app,
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) is instrumented
