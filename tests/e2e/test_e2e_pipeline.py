"""End to end: ``spec-decode-otel demo`` -> OTLP (grpc, http/protobuf) -> the collector
built from collector-config/ -> Prometheus (scraping, exemplars) and Jaeger v2.

Checks, for each protocol:
  - Prometheus's totals equal the records the demo wrote (exactly, up to float rounding);
  - every record's trace is in Jaeger, with its ``spec_decode.*`` span attributes;
  - exemplars on the acceptance-length histogram carry trace ids of those requests, and
    those traces exist in Jaeger;
and, once for both runs, every PromQL expression of the shipped Grafana dashboard.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import yaml
from e2e_stack import (
    CONFIG_DIR,
    Stack,
    jaeger_trace_spans,
    prom_by_label,
    prom_label_values,
    prom_query,
    prom_scalar,
    wait_for_exemplars,
)

from conftest import (
    PROTOCOLS,
    Expected,
    Reconciliation,
    Workload,
    all_selected,
    as_totals,
    dashboard,
    dashboard_targets,
    host_port,
    substitute,
    variable_query,
)
from simulator_process import SimulatorProcess
from spec_decode_otel.telemetry import MAX_DRAFT_POSITIONS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

REL = 1e-9  # float sums: the SDK and the records add the same doubles, maybe in another order
TRACE_TIMEOUT_S = 30


def _close(actual: float | None, expected: float, what: str, rel: float = REL) -> None:
    assert actual is not None, f"{what}: Prometheus returned no data (expected {expected})"
    assert math.isclose(actual, expected, rel_tol=rel, abs_tol=1e-9), (
        f"{what}: Prometheus {actual!r} != records {expected!r}"
    )


# --------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_metric_totals_match_records(
    workloads: dict[str, Workload], prom: httpx.Client, protocol: str
) -> None:
    w = workloads[protocol]
    sel = w.job_matcher
    exp = Expected(w.records)
    assert exp.mal, "no record has a mean acceptance length"

    def total(series: str, by: str | None = None) -> Any:
        """sum (by label) of the run's ``series``: cumulative totals, exact."""
        name, _, extra = series.partition("{")
        matchers = f"{sel}, {extra.rstrip('}')}" if extra else sel
        if by is None:
            return prom_scalar(prom, f"sum({name}{{{matchers}}})")
        return prom_by_label(prom, f"sum by ({by}) ({name}{{{matchers}}})", by)

    # Acceptance-length histogram: one observation per record; the mean of the records'
    # mean_acceptance_length is _sum / _count; the +Inf bucket holds every observation.
    count, total_al = (
        total("spec_decode_acceptance_length_count"),
        total("spec_decode_acceptance_length_sum"),
    )
    _close(count, len(exp.mal), "acceptance_length count")
    _close(total_al, sum(exp.mal), "acceptance_length sum")
    _close(total_al / count, sum(exp.mal) / len(exp.mal), "mean acceptance length per request")
    _close(total('spec_decode_acceptance_length_bucket{le="+Inf"}'), len(exp.mal), "+Inf bucket")
    if exp.dar:
        _close(total("spec_decode_draft_acceptance_rate_count"), len(exp.dar), "rate count")
        _close(total("spec_decode_draft_acceptance_rate_sum"), sum(exp.dar), "rate sum")

    # Counters.
    accepted = total("spec_decode_accepted_draft_tokens_total")
    _close(accepted, exp.accepted, "accepted_draft_tokens")
    _close(total("spec_decode_draft_tokens_total"), exp.drafted, "draft_tokens")
    steps_by_j = total("spec_decode_verify_steps_total", by="spec_decode_accepted")
    assert steps_by_j == {j: float(c) for j, c in exp.steps_by_j.items()}, (
        "verify_steps by accepted count != sum of the records' acceptance histograms"
    )
    at_position = total("spec_decode_accepted_at_position_total", by="spec_decode_position")
    assert at_position == {p: float(c) for p, c in exp.at_position.items() if c}, (
        "accepted_at_position != reverse cumulative sums of the records' histograms"
    )
    # Token-weighted acceptance length: 1 + accepted draft tokens / verify steps.
    _close(1 + accepted / sum(steps_by_j.values()), exp.token_weighted_al, "token-weighted AL")

    # Dimensions: engines exactly, models among the request/response model labels.
    by_engine = total("spec_decode_acceptance_length_count", by="spec_decode_engine")
    assert by_engine == {e: float(c) for e, c in exp.engines.items()}
    match = f"spec_decode_acceptance_length_count{{{sel}}}"
    models = set(prom_label_values(prom, "gen_ai_request_model", match))
    models |= set(prom_label_values(prom, "gen_ai_response_model", match))
    assert exp.models <= models, f"record models {exp.models} not among metric labels {models}"
    # resource_constant_labels in otelcol.yaml copies deployment.environment.name.
    assert prom_label_values(prom, "deployment_environment_name", match) == ["e2e"]


# --------------------------------------------------------------------------- traces


def _spec_spans(spans: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [s for s in spans or [] if "spec_decode.mean_acceptance_length" in s["attributes"]]


def _mismatches(span: dict[str, Any], line: dict[str, Any], service: str) -> list[str]:
    """How ``span`` differs from the record ``line`` (empty: it is that request's span)."""
    rec, attrs = line["record"], span["attributes"]
    out = []
    if span["resource"].get("service.name") != service:
        out.append(f"service.name {span['resource'].get('service.name')!r} != {service!r}")
    if attrs.get("spec_decode.engine") != line["engine"]:
        out.append(f"engine {attrs.get('spec_decode.engine')!r} != {line['engine']!r}")
    for key in ("mean_acceptance_length", "draft_acceptance_rate"):
        got = attrs.get(f"spec_decode.{key}")
        if rec.get(key) is not None and not (
            isinstance(got, float) and math.isclose(got, rec[key])
        ):
            out.append(f"{key} {got!r} != {rec[key]!r}")
    for key in (
        "num_spec_steps",
        "num_accepted_draft_tokens",
        "num_draft_tokens",
        "num_spec_tokens",
    ):
        if rec.get(key) is not None and attrs.get(f"spec_decode.{key}") != rec[key]:
            out.append(f"{key} {attrs.get(f'spec_decode.{key}')!r} != {rec[key]!r}")
    hist = {int(j): int(c) for j, c in (rec.get("acceptance_histogram") or {}).items()}
    if hist:
        dense = [hist.get(j, 0) for j in range(max(hist) + 1)]
        got = list(attrs.get("spec_decode.acceptance_histogram") or [])
        # Dense from index 0; trailing zero buckets (up to k) are allowed.
        if got[: len(dense)] != dense or any(got[len(dense) :]):
            out.append(f"acceptance_histogram {got} != {dense}")
    return out


def _find_span(
    jaeger: httpx.Client, line: dict[str, Any], service: str, deadline: float
) -> tuple[dict[str, Any] | None, list[str]]:
    """The span of the record's request in its trace (polling until ``deadline``), or
    None and what the closest span got wrong."""
    while True:
        candidates = _spec_spans(jaeger_trace_spans(jaeger, line["trace_id"]))
        best: list[str] = ["trace not found, or no span with spec_decode.* attributes"]
        for span in candidates:
            problems = _mismatches(span, line, service)
            if not problems:
                return span, []
            if len(problems) < len(best) or best[0].startswith("trace not found"):
                best = problems
        if time.monotonic() > deadline:
            return None, best
        time.sleep(0.25)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_traces_carry_spec_decode_attributes(
    workloads: dict[str, Workload], jaeger: httpx.Client, protocol: str
) -> None:
    w = workloads[protocol]
    deadline = time.monotonic() + TRACE_TIMEOUT_S
    failures = []
    for line in w.records:
        assert re.fullmatch(r"[0-9a-f]{32}", line["trace_id"]), line["trace_id"]
        span, problems = _find_span(jaeger, line, w.service, deadline)
        if span is None:
            failures.append(f"{line['trace_id']}: {'; '.join(problems)}")
    assert not failures, (
        f"{len(failures)}/{len(w.records)} records without a matching span in Jaeger:\n"
        + "\n".join(failures[:10])
    )

    # The classic JSON API (what Grafana's Jaeger datasource reads) serves them too.
    first = w.records[0]["trace_id"]
    body = jaeger.get(f"/api/traces/{first}").json()
    tags = {t["key"] for s in body["data"][0]["spans"] for t in s["tags"]}
    assert "spec_decode.mean_acceptance_length" in tags
    services = jaeger.get("/api/services").json()["data"]
    assert w.service in services


# --------------------------------------------------------------------------- exemplars


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_exemplars_link_metrics_to_traces(
    workloads: dict[str, Workload], prom: httpx.Client, jaeger: httpx.Client, protocol: str
) -> None:
    w = workloads[protocol]
    values_by_trace: dict[str, list[float]] = {}
    for line in w.records:
        values_by_trace.setdefault(line["trace_id"], []).append(
            line["record"]["mean_acceptance_length"]
        )

    exemplars = wait_for_exemplars(
        prom, f"spec_decode_acceptance_length_bucket{{{w.job_matcher}}}", w.started - 60
    )
    assert exemplars, "no exemplar on spec_decode_acceptance_length_bucket"

    for ex in exemplars:
        trace_id = ex["labels"].get("trace_id")
        assert trace_id, f"exemplar without trace_id: {ex}"
        assert ex["labels"].get("span_id"), f"exemplar without span_id: {ex}"
        # Each exemplar is one request's measurement, recorded in that request's span.
        assert trace_id in values_by_trace, (
            f"exemplar trace {trace_id} is not one of the demo's requests"
        )
        assert any(math.isclose(float(ex["value"]), v) for v in values_by_trace[trace_id])
        # And it sits in the right bucket.
        le = ex["series"]["le"]
        assert float(ex["value"]) <= (math.inf if le == "+Inf" else float(le))

    deadline = time.monotonic() + TRACE_TIMEOUT_S
    for trace_id in {ex["labels"]["trace_id"] for ex in exemplars}:
        while True:
            span_ids = {s["span_id"] for s in _spec_spans(jaeger_trace_spans(jaeger, trace_id))}
            wanted = {
                ex["labels"]["span_id"] for ex in exemplars if ex["labels"]["trace_id"] == trace_id
            }
            if wanted <= span_ids or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        # The exemplar's span is a span of that trace, and the one with the attributes.
        assert wanted <= span_ids, f"exemplar spans {wanted} of trace {trace_id} not in Jaeger"


# --------------------------------------------------------------------------- dashboard


def _variables(workloads: dict[str, Workload]) -> dict[str, str]:
    """The dashboard's variables with the demo's services chosen, every other "All"."""
    return all_selected(
        service="|".join(w.service for w in workloads.values()), dimension="workload"
    )


def test_every_dashboard_query_returns_data(
    workloads: dict[str, Workload], reconciliation: Reconciliation, prom: httpx.Client
) -> None:
    """Every panel, with the demo's services selected; the "Client vs server" row reads
    the reconciliation workload's servers (it ignores the service filter)."""
    variables = _variables(workloads)
    targets = dashboard_targets()
    assert len(targets) >= 10
    problems = []
    for _, panel, target in targets:
        expr = substitute(target["expr"], variables)
        result = prom_query(prom, expr)
        values = [float(r["value"][1]) for r in result]
        finite = [v for v in values if math.isfinite(v)]
        where = f"{panel['title']!r} {target['refId']}"
        if not finite:
            problems.append(f"{where}: no finite value ({len(result)} series): {expr}")
            continue
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit == "percentunit" and not all(-1e-9 <= v <= 1 + 1e-9 for v in finite):
            problems.append(f"{where}: ratio outside [0, 1]: {finite}")
        if (
            "acceptance length" in panel["title"].lower()
            and panel["type"] != "heatmap"
            and min(finite) < 1 - 1e-9
        ):
            problems.append(f"{where}: acceptance length below 1: {finite}")
    assert not problems, "\n".join(problems)


def test_dashboard_overview_equals_records(
    workloads: dict[str, Workload], prom: httpx.Client
) -> None:
    """The dashboard's own formulas, applied to totals, give the values the records give."""
    records = [r for w in workloads.values() for r in w.records]
    exp = Expected(records)
    variables = _variables(workloads)
    by_title = {}
    for _, panel, target in dashboard_targets():
        if "$__range" in target["expr"]:
            by_title[panel["title"]] = substitute(as_totals(target["expr"]), variables)

    def scalar(title: str) -> float | None:
        return prom_scalar(prom, by_title[title])

    # Every record counts, with or without a mean acceptance length (spec_decode.requests).
    _close(scalar("Requests with acceptance data"), len(records), "requests")
    _close(scalar("Acceptance length (token-weighted)"), exp.token_weighted_al, "token-weighted AL")
    _close(scalar("Mean acceptance length per request"), sum(exp.mal) / len(exp.mal), "mean AL")
    _close(
        scalar("Draft acceptance rate (token-weighted)"),
        exp.accepted / exp.drafted,
        "acceptance rate",
    )

    per_position = prom_by_label(
        prom,
        by_title["Acceptance rate by draft position (selected range)"],
        "spec_decode_position",
    )
    want = {p: c / exp.steps for p, c in exp.at_position.items() if c}
    assert per_position.keys() == want.keys()
    for p, v in want.items():
        _close(per_position[p], v, f"acceptance rate at position {p}")

    steps = prom_by_label(
        prom,
        by_title["Verify steps by number of accepted drafts (selected range)"],
        "spec_decode_accepted",
    )
    assert steps == {j: float(c) for j, c in exp.steps_by_j.items()}


def test_dashboard_variables_resolve(workloads: dict[str, Workload], prom: httpx.Client) -> None:
    """Each label_values() variable query lists the values the demo produced."""
    records = [r for w in workloads.values() for r in w.records]
    variables = _variables(workloads)
    found: dict[str, list[str]] = {}
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        match, label = variable_query(var)
        found[var["name"]] = prom_label_values(prom, label, substitute(match, variables))
        assert found[var["name"]], f"variable {var['name']}: no values for {match}"
    assert {w.service for w in workloads.values()} <= set(found["service"])
    assert {r["engine"] for r in records} <= set(found["engine"])
    assert {r["model"] for r in records} <= set(found["model"]) | _response_models(prom, workloads)


def _response_models(prom: httpx.Client, workloads: dict[str, Workload]) -> set[str]:
    services = "|".join(w.service for w in workloads.values())
    return set(
        prom_label_values(
            prom,
            "gen_ai_response_model",
            f'spec_decode_acceptance_length_count{{job=~"{services}"}}',
        )
    )


def test_token_weighted_acceptance_length_counts_only_requests_with_verify_steps(
    reconciliation: Reconciliation, prom: httpx.Client
) -> None:
    """One service calls a vLLM server (a histogram per request, so verify steps) and a
    llama.cpp one (accepted and drafted counts, no steps: wire-formats.md, llama.cpp
    b11312 ``timings``). Every token-weighted acceptance length on the dashboard is
    1 + accepted drafts / verify steps of the requests that have steps: the llama.cpp
    accepted tokens, with no steps to divide by, must not be added in (they were: the Overview stat
    and the by-model and by-dimension panels read too high)."""
    job = f'job=~"(.+/)?{reconciliation.service}"'
    steps = prom_by_label(
        prom,
        f"sum by (spec_decode_accepted) (spec_decode_verify_steps_total{{{job}}})",
        "spec_decode_accepted",
    )
    assert steps, "no verify steps from the vLLM server"
    llamacpp = prom_scalar(
        prom,
        f'sum(spec_decode_accepted_draft_tokens_total{{{job}, spec_decode_engine="llamacpp"}})',
    )
    assert llamacpp, "no accepted drafts from the llama.cpp server"
    want = 1 + sum(int(j) * n for j, n in steps.items()) / sum(steps.values())

    checked = _dashboard_reads(
        prom,
        reconciliation.service,
        lambda expr: expr.lstrip().startswith("1 +") and "spec_decode_verify_steps_total" in expr,
        want,
    )
    assert len(checked) >= 3, checked


# --------------------------------------------------------------------------- llama.cpp only

#: Calls the llama.cpp-only client makes (half of them streamed).
LLAMACPP_CALLS = 6


@contextlib.contextmanager
def _instrumented(stack: Stack, service: str, *, delta: bool = False) -> Iterator[Any]:
    """The ``openai`` SDK instrumented with providers of its own (service ``service``),
    exporting over OTLP/gRPC to the stack every 100 ms; yields the meter provider.
    ``delta``: the exporter prefers delta temporality, as
    OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta makes it."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, ObservableCounter
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from spec_decode_otel import SpecDecodeInstrumentor

    resource = Resource.create({"service.name": service})
    # What the SDK's exporter picks for OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta.
    temporality = (
        dict.fromkeys((Counter, Histogram, ObservableCounter), AggregationTemporality.DELTA)
        if delta
        else None
    )
    exporter = OTLPMetricExporter(
        endpoint=stack.otlp_endpoint("grpc"), insecure=True, preferred_temporality=temporality
    )
    meter_provider = MeterProvider(
        metric_readers=[PeriodicExportingMetricReader(exporter, export_interval_millis=100)],
        resource=resource,
    )
    tracer_provider = TracerProvider(resource=resource)
    instrumentor = SpecDecodeInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield meter_provider
    finally:
        instrumentor.uninstrument()
        meter_provider.shutdown()
        tracer_provider.shutdown()


def _instrumented_calls(
    stack: Stack,
    prom: httpx.Client,
    base_url: str,
    service: str,
    model: str,
    calls: int,
    *,
    delta: bool = False,
    pause: float = 0.0,
    first_scraped: bool = False,
) -> None:
    """``calls`` chat completions (every other one streamed) to ``base_url`` from a client
    instrumented with its own providers (service ``service``, see ``_instrumented``);
    returns once Prometheus has counted them all. ``pause``: seconds between calls;
    ``first_scraped``: the other calls wait until Prometheus has counted the first, so
    ``rate()`` over the series sees them (a series whose first sample already holds every
    call has a rate of 0, and ``histogram_quantile`` of zero rates is NaN)."""
    import openai

    messages = [{"role": "user", "content": "Count these calls."}]
    usage = {"stream_options": {"include_usage": True}}
    with (
        _instrumented(stack, service, delta=delta) as meter_provider,
        openai.OpenAI(api_key="sk-e2e", base_url=base_url, max_retries=0) as client,
    ):
        create: Callable[..., Any] = client.chat.completions.create
        for i in range(calls):
            if i % 2:
                assert list(create(model=model, messages=messages, stream=True, **usage))
            else:
                create(model=model, messages=messages)
            time.sleep(pause)
            if first_scraped and i == 0:
                _wait_for_count(meter_provider, prom, service, 1)
        _wait_for_count(meter_provider, prom, service, calls)


def _dashboard_reads(
    prom: httpx.Client, service: str, chosen: Callable[[str], bool], want: float
) -> list[str]:
    """Every dashboard target whose expression ``chosen`` picks, over the totals of
    ``service`` (every model, engine and server), reads ``want`` on the real
    Prometheus; the targets checked."""
    variables = _all_of(service)
    checked = []
    for _, panel, target in dashboard_targets():
        expr = target["expr"]
        if not chosen(expr):
            continue
        where = f"{panel['title']!r} {target['refId']}"
        values = [
            float(r["value"][1]) for r in prom_query(prom, substitute(as_totals(expr), variables))
        ]
        assert values, f"{where}: no data"
        for value in values:
            _close(value, want, where)
        checked.append(where)
    return checked


def _all_of(service: str, **chosen: str) -> dict[str, str]:
    """The dashboard's variables for every model, engine and server of ``service`` (but
    what ``chosen`` picks)."""
    return all_selected(service=service, dimension="job", **chosen)


def _requests_stat() -> str:
    """The query of the overview's "Requests with acceptance data" stat."""
    title = "Requests with acceptance data"
    (expr,) = [t["expr"] for _, p, t in dashboard_targets() if p["title"] == title]
    return expr


def _wait_for_count(meter_provider: Any, prom: httpx.Client, service: str, calls: int) -> None:
    """Flush, then wait (up to 30 s) until Prometheus counts ``calls`` requests of ``service``."""
    assert meter_provider.force_flush(10_000)
    deadline = time.monotonic() + 30
    query = f'sum(spec_decode_requests_total{{job="{service}"}})'
    while time.monotonic() < deadline and prom_scalar(prom, query) != calls:
        time.sleep(0.25)


def _export_records(
    stack: Stack,
    prom: httpx.Client,
    service: str,
    records: list[tuple[Any, dict[str, Any]]],
    settled: tuple[str, float],
) -> None:
    """Each (record, call attributes) through the instrumentation's own instruments and
    the real SDK, exported over OTLP/gRPC to the stack as service ``service``; returns
    once Prometheus reads ``settled`` (query, value), or after 30 s."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    from spec_decode_otel.telemetry import SpecDecodeInstruments

    provider = MeterProvider(
        metric_readers=[
            PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=stack.otlp_endpoint("grpc"), insecure=True),
                export_interval_millis=100,
            )
        ],
        resource=Resource.create({"service.name": service}),
    )
    instruments = SpecDecodeInstruments(provider)
    try:
        for record, attrs in records:
            instruments.record(record, instruments.series(attrs, record))
        assert provider.force_flush(10_000)
        query, value = settled
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and prom_scalar(prom, query) != value:
            time.sleep(0.25)
    finally:
        provider.shutdown()


@pytest.fixture(scope="module")
def llamacpp_only(e2e_stack: Stack, servers: dict[str, str], prom: httpx.Client) -> dict[str, str]:
    """A service that only calls a llama.cpp server (the simulator's llama.cpp shape:
    ``timings.draft_n`` / ``draft_n_accepted``, no verify steps, so no acceptance-length
    histogram); its service, model, engine and server."""
    service = f"sdo-e2e-llamacpp-{uuid.uuid4().hex[:8]}"
    model = f"tiny-{uuid.uuid4().hex[:6]}"
    _instrumented_calls(e2e_stack, prom, servers["llamacpp"], service, model, LLAMACPP_CALLS)
    host = servers["llamacpp"].split("//", 1)[1].split(":", 1)[0]
    return {"service": service, "model": model, "engine": "llamacpp", "server": host}


def test_dashboard_shows_a_llamacpp_only_service(
    llamacpp_only: dict[str, str], prom: httpx.Client
) -> None:
    """llama.cpp (b11312 ``timings``) reports drafted and accepted counts and no verify
    steps, so its records have no spec_decode.acceptance_length. The dashboard's
    variables must still list such a service, its model, engine and server (they were
    read from spec_decode_acceptance_length_count, so a llama.cpp-only deployment had
    empty drop-downs), and "Requests with acceptance data" must count its calls."""
    variables = _all_of(llamacpp_only["service"])
    for var in dashboard()["templating"]["list"]:
        if var["name"] not in ("service", "model", "engine", "server"):
            continue
        match, label = variable_query(var)
        values = prom_label_values(prom, label, substitute(match, variables))
        assert llamacpp_only[var["name"]] in values, (var["name"], match, values)

    _close(
        prom_scalar(prom, substitute(as_totals(_requests_stat()), variables)),
        LLAMACPP_CALLS,
        "Requests with acceptance data (llama.cpp only)",
    )


@pytest.fixture(scope="module")
def nothing_accepted(e2e_stack: Stack, prom: httpx.Client) -> str:
    """The service of a client whose vLLM server (the simulator, ``--alpha 0``) rejects
    every draft: every request's mean acceptance length is exactly 1.0."""
    server = SimulatorProcess(["--engine", "vllm", "--k", "3", "--alpha", "0"])
    server.start()
    service = f"sdo-e2e-rejected-{uuid.uuid4().hex[:8]}"
    try:
        _instrumented_calls(
            e2e_stack, prom, server.base_url, service, "rejected", 10, first_scraped=True
        )
    finally:
        server.stop()
    return service


def test_acceptance_length_quantiles_never_go_below_one(
    nothing_accepted: str, prom: httpx.Client
) -> None:
    """A request's mean acceptance length is at least 1 (the bonus token), and 1.0 lands in
    the lowest bucket, le="1.0" (telemetry.ACCEPTANCE_LENGTH_BUCKETS). histogram_quantile
    interpolates that bucket from 0, so when every draft was rejected the dashboard's
    p50/p90 read 0.5 and 0.9 on the real Prometheus; each quantile of the acceptance
    length, on the dashboard and in the p50 recording rules, must read 1."""
    service = nothing_accepted
    job = f'job="{service}"'
    _close(
        prom_scalar(prom, f"sum(spec_decode_acceptance_length_sum{{{job}}})"),
        10.0,
        "ten requests at acceptance length 1",
    )
    variables = _all_of(service, __rate_interval="1h", __range="1h")
    exprs = [
        (f"{p['title']!r} {t['refId']}", substitute(t["expr"], variables))
        for _, p, t in dashboard_targets()
        if "histogram_quantile" in t["expr"] and "spec_decode_acceptance_length_bucket" in t["expr"]
    ]
    rules = yaml.safe_load((CONFIG_DIR / "prometheus-rules.yml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "histogram_quantile" in rule.get("expr", "") and "acceptance_length" in rule["expr"]:
                expr = (
                    rule["expr"]
                    .replace("[5m]", "[1h]")
                    .replace(
                        "spec_decode_acceptance_length_bucket[",
                        f"spec_decode_acceptance_length_bucket{{{job}}}[",
                    )
                )
                exprs.append((rule["record"], expr))
    assert len(exprs) >= 5, exprs
    for where, expr in exprs:
        values = [float(r["value"][1]) for r in prom_query(prom, expr)]
        assert values, f"{where}: no data: {expr}"
        for value in values:
            _close(value, 1.0, where)


#: Calls of the delta-temporality client, each followed by a pause of several export intervals.
DELTA_CALLS = 8


def test_delta_temporality_reaches_prometheus_as_totals(
    e2e_stack: Stack, servers: dict[str, str], prom: httpx.Client
) -> None:
    """OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta (a common setting for
    other backends): the SDK (1.45) sends a synchronous histogram point only for an
    interval with a measurement, starting where the previous collection ended, so a
    series idle for an interval arrives with a gap. The collector's prometheus exporter
    (contrib 0.165.1) then logs "Misaligned starting timestamps" and keeps the last delta
    instead of the sum, so Prometheus's histogram counts fell back to the last interval's.
    Through the shipped collector config, every count must arrive."""
    service = f"sdo-e2e-delta-{uuid.uuid4().hex[:8]}"
    _instrumented_calls(
        e2e_stack, prom, servers["vllm"], service, "m", DELTA_CALLS, delta=True, pause=0.35
    )
    job = f'job="{service}"'
    _close(
        prom_scalar(
            prom, f'sum(spec_decode_requests_total{{{job}, spec_decode_outcome="recorded"}})'
        ),
        DELTA_CALLS,
        "requests (observable counter, delta)",
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        count = prom_scalar(prom, f"sum(spec_decode_acceptance_length_count{{{job}}})")
        if count == DELTA_CALLS:
            break
        time.sleep(0.25)
    for metric in (
        "spec_decode_acceptance_length_count",
        'spec_decode_acceptance_length_bucket{le="+Inf"}',
        "spec_decode_draft_acceptance_rate_count",
    ):
        name, _, extra = metric.partition("{")
        matchers = f"{job}, {extra.rstrip('}')}" if extra else job
        _close(prom_scalar(prom, f"sum({name}{{{matchers}}})"), DELTA_CALLS, f"{metric} (delta)")


def test_draft_acceptance_rate_counts_only_accepted_drafts_with_a_drafted_count(
    e2e_stack: Stack, prom: httpx.Client
) -> None:
    """SGLang under --speculative-adaptive (0.5.23; tests/unit/test_adapters_wire_fidelity
    ADAPTIVE_EVIDENCE): a request drafted past the startup length keeps its accepted drafts
    and histogram but no drafted count or k. Its accepted drafts have nothing to be divided
    by, so every token-weighted draft acceptance rate on the dashboard is accepted / drafted
    of the requests that report both (it added them in and read over 1). The records go
    through the real SDK (the instrumentation's own instruments), collector and
    Prometheus."""
    from spec_decode_otel.record import SpecDecodeAcceptanceRecord

    measured = SpecDecodeAcceptanceRecord(
        engine="sglang",
        mean_acceptance_length=2.2,
        draft_acceptance_rate=0.6,
        acceptance_histogram={0: 2, 1: 4, 2: 4},
        num_accepted_draft_tokens=12,
        num_draft_tokens=20,
        num_spec_steps=10,
        num_spec_tokens=2,
    )
    adaptive = SpecDecodeAcceptanceRecord(
        engine="sglang",
        mean_acceptance_length=4.1,
        acceptance_histogram={0: 1, 1: 1, 2: 2, 3: 1, 4: 2, 5: 3},
        num_accepted_draft_tokens=31,
        num_spec_steps=10,
    )
    service = f"sdo-e2e-adaptive-{uuid.uuid4().hex[:8]}"
    attrs = {"gen_ai.request.model": "adaptive", "server.address": "sglang-0"}
    _export_records(
        e2e_stack,
        prom,
        service,
        [(r, attrs) for r in (measured, adaptive, measured, adaptive)],
        settled=(f'sum(spec_decode_accepted_draft_tokens_total{{job="{service}"}})', 86),
    )

    checked = _dashboard_reads(
        prom,
        service,
        lambda expr: (
            re.search(
                r"spec_decode_accepted_draft_tokens_total.*\)\s*\)?\s*/\s*sum.*spec_decode_draft_tokens_total",
                expr,
            )
            is not None
            and "vllm:" not in expr
        ),
        24 / 40,
    )
    assert len(checked) >= 3, checked


def test_acceptance_length_quantiles_resolve_drafts_up_to_64_tokens(
    e2e_stack: Stack, prom: httpx.Client
) -> None:
    """A record allows k up to MAX_SPEC_TOKENS, and n-gram / suffix drafters run with k of
    32 or 64 (SGLang's and vLLM's n-gram and suffix methods), so a request's mean acceptance
    length reaches k + 1 = 65 (the per-position series stop at MAX_DRAFT_POSITIONS = 64).
    With the top bucket at 16, every such request landed in +Inf and histogram_quantile
    read 16 for all of them. Requests at 30 (k = 32) and 60 (k = 64), through the real SDK,
    collector and Prometheus: every quantile of the acceptance length on the dashboard and
    in the p50 recording rules reads a value inside the finite bucket that holds the
    requests' acceptance length."""
    from spec_decode_otel.record import SpecDecodeAcceptanceRecord
    from spec_decode_otel.telemetry import ACCEPTANCE_LENGTH_BUCKETS

    service = f"sdo-e2e-long-drafts-{uuid.uuid4().hex[:8]}"
    truth: dict[str, float] = {}
    records = []
    for k, accepted in ((32, 29), (64, 59)):
        model = f"k{k}"
        truth[model] = 1.0 + accepted
        record = SpecDecodeAcceptanceRecord(
            engine="sglang",
            mean_acceptance_length=truth[model],
            draft_acceptance_rate=accepted / k,
            acceptance_histogram={accepted: 10},
            num_accepted_draft_tokens=10 * accepted,
            num_draft_tokens=10 * k,
            num_spec_steps=10,
            num_spec_tokens=k,
        )
        attrs = {"gen_ai.request.model": model, "server.address": "sglang-0"}
        records += [(record, attrs)] * 5
    _export_records(
        e2e_stack,
        prom,
        service,
        records,
        settled=(f'sum(spec_decode_acceptance_length_count{{job="{service}"}})', 10),
    )

    job = f'job="{service}"'
    variables = _all_of(service)
    exprs = [
        (f"{p['title']!r} {t['refId']}", substitute(as_totals(t["expr"]), variables))
        for _, p, t in dashboard_targets()
        if "histogram_quantile" in t["expr"] and "spec_decode_acceptance_length_bucket" in t["expr"]
    ]
    rules = yaml.safe_load((CONFIG_DIR / "prometheus-rules.yml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "histogram_quantile" in rule.get("expr", "") and "acceptance_length" in rule["expr"]:
                expr = re.sub(
                    r"rate\(spec_decode_acceptance_length_bucket\[\w+\]\)",
                    f"spec_decode_acceptance_length_bucket{{{job}}}",
                    rule["expr"],
                )
                exprs.append((rule["record"], expr))
    assert len(exprs) >= 5, exprs
    bounds = (-math.inf, *ACCEPTANCE_LENGTH_BUCKETS, math.inf)
    problems = []
    for where, expr in exprs:
        result = prom_query(prom, expr)
        got = {r["metric"].get("gen_ai_request_model"): float(r["value"][1]) for r in result}
        if None in got:  # grouped by $dimension (job): one series over both models
            continue
        assert set(got) == set(truth), f"{where}: {got}"
        for model, value in got.items():
            upper = next(b for b in bounds if b >= truth[model])
            lower = bounds[bounds.index(upper) - 1]
            if not (math.isfinite(upper) and lower < value <= upper):
                problems.append(
                    f"{where}: {model} (acceptance length {truth[model]}) reads {value}, "
                    f"outside its bucket ({lower}, {upper}]"
                )
    assert not problems, "\n".join(problems)
    # And so for every k whose positions have their own series.
    assert ACCEPTANCE_LENGTH_BUCKETS[-1] >= MAX_DRAFT_POSITIONS + 1


@pytest.mark.parametrize(
    ("title", "label"),
    [
        ("Acceptance rate by draft position (selected range)", "spec_decode_position"),
        ("Verify steps by number of accepted drafts (selected range)", "spec_decode_accepted"),
    ],
)
def test_position_panels_order_draft_positions_as_numbers(
    e2e_stack: Stack, prom: httpx.Client, title: str, label: str
) -> None:
    """The two bar charts over draft positions sorted their rows by the position label,
    a string: Grafana's sortBy compares strings with ``localeCompare``
    (``fieldComparers.ts``), so with k = 12 the bars read 0, 1, 10, 11, 2, ... and the drop
    the panel is meant to show was scrambled (found by a helper). Each query now adds a
    hidden ``order`` label, two digits (``_OTHER``: ``z``), which sorts as the number
    does. Through the real SDK, collector and Prometheus, with k = 12 and a k = 70 request
    whose positions past 63 fold into ``_OTHER``."""
    from spec_decode_otel.record import SpecDecodeAcceptanceRecord

    service = f"sdo-e2e-positions-{uuid.uuid4().hex[:8]}"
    histogram = dict.fromkeys(range(13), 1)
    k12 = SpecDecodeAcceptanceRecord(
        engine="vllm",
        mean_acceptance_length=7.0,
        draft_acceptance_rate=0.5,
        acceptance_histogram=histogram,
        num_accepted_draft_tokens=78,
        num_draft_tokens=156,
        num_spec_steps=13,
        num_spec_tokens=12,
    )
    k70 = SpecDecodeAcceptanceRecord(
        engine="vllm",
        mean_acceptance_length=67.0,
        draft_acceptance_rate=66 / 70,
        acceptance_histogram={66: 1},
        num_accepted_draft_tokens=66,
        num_draft_tokens=70,
        num_spec_steps=1,
        num_spec_tokens=70,
    )
    attrs = {"gen_ai.request.model": "m", "server.address": "vllm-0"}
    _export_records(
        e2e_stack,
        prom,
        service,
        [(k12, attrs), (k70, attrs)],
        settled=(f'sum(spec_decode_verify_steps_total{{job="{service}"}})', 14),
    )
    ((_, panel, target),) = [(r, p, t) for r, p, t in dashboard_targets() if p["title"] == title]
    sort, hide = panel["transformations"]
    assert sort == {"id": "sortBy", "options": {"sort": [{"field": "order"}]}}
    assert hide["id"] == "organize" and hide["options"]["excludeByName"]["order"] is True
    rows = prom_query(prom, substitute(as_totals(target["expr"]), _all_of(service)))
    keys = [(row["metric"]["order"], row["metric"][label]) for row in rows]
    shown = [value for _, value in sorted(keys)]  # digits and "z": any collation agrees
    numbers = sorted(int(v) for v in shown if v != "_OTHER")
    assert shown == [str(n) for n in numbers] + ["_OTHER"]
    assert numbers[-1] >= 12 and len(numbers) >= 13


#: Calls from one service to each of two vLLM servers on one host: (calls answered with
#: statistics, streams made without include_usage, which vLLM answers without them).
TWO_PORTS_CALLS = {"a": (4, 0), "b": (2, 3)}


@pytest.fixture(scope="module")
def two_ports(e2e_stack: Stack, prom: httpx.Client) -> dict[str, Any]:
    """One service calls two vLLM servers (simulators) on 127.0.0.1, each on its own
    port, with the calls of TWO_PORTS_CALLS: half of each server's calls, then, once
    Prometheus has counted them (so rate() sees the rest), the other half. The service,
    the host and each server's port."""
    import openai

    service = f"sdo-e2e-two-ports-{uuid.uuid4().hex[:8]}"
    servers = {name: SimulatorProcess(["--engine", "vllm", "--k", "3"]) for name in TWO_PORTS_CALLS}
    messages = [{"role": "user", "content": "Which port am I on?"}]
    try:
        for server in servers.values():
            server.start()
        with _instrumented(e2e_stack, service) as meter_provider:
            done = 0
            for half in (0, 1):
                for name, (with_stats, without) in TWO_PORTS_CALLS.items():
                    url = servers[name].base_url
                    with openai.OpenAI(api_key="sk-e2e", base_url=url, max_retries=0) as client:
                        create: Callable[..., Any] = client.chat.completions.create
                        for _ in range(with_stats // 2 + (with_stats % 2) * half):
                            create(model="m", messages=messages)
                            done += 1
                        for _ in range(without // 2 + (without % 2) * half):
                            assert list(create(model="m", messages=messages, stream=True))
                            done += 1
                _wait_for_count(meter_provider, prom, service, done)
        ports = {name: str(host_port(s.base_url)[1]) for name, s in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    assert done == sum(a + b for a, b in TWO_PORTS_CALLS.values())
    return {"service": service, "host": "127.0.0.1", "ports": ports}


def test_two_servers_on_one_host_stay_apart(two_ports: dict[str, Any], prom: httpx.Client) -> None:
    """Two engines on one host (vLLM on two ports of 127.0.0.1): server.address is the
    same, server.port is not, and a user running both wants them apart. On the real
    Prometheus (the compose stack's version, the shipped rules evaluated every second):
      - the share of calls with statistics (job_model_server rules) is one series per
        port: 1 for the server that answers every call with statistics, under 1 for the
        one whose streams have none (merged, the host read one figure for both);
      - the dashboard's ``port`` variable lists both ports of the host, and with a port
        chosen, "Requests with acceptance data" counts that server's calls only."""
    service, host, ports = two_ports["service"], two_ports["host"], two_ports["ports"]
    job = f'job="{service}"'
    rule = "job_model_server:spec_decode_requests_with_stats:ratio_rate5m"
    deadline = time.monotonic() + 60
    while True:
        # Until the rule has evaluated over the last samples: an evaluation between two
        # scrapes of the first half's counts (no increase yet) reads 0/0 = NaN, and the
        # rule runs up to a second after the fixture saw the final counts.
        got = prom_by_label(prom, f"last_over_time({rule}{{{job}}}[5m])", "server_port")
        complete = set(got) == set(ports.values()) and not any(map(math.isnan, got.values()))
        if complete or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(got) == set(ports.values()), f"{rule}: {got}, want one series per port {ports}"
    assert got[ports["a"]] == 1.0, got
    assert 0.0 < got[ports["b"]] < 1.0, got

    (port_var,) = [v for v in dashboard()["templating"]["list"] if v["name"] == "port"]
    match, label = variable_query(port_var)
    assert label == "server_port", label
    listed = prom_label_values(prom, label, substitute(match, _all_of(service, server=host)))
    assert sorted(listed) == sorted(ports.values()), (listed, ports)

    requests_stat = as_totals(_requests_stat())
    for name, port in ports.items():
        variables = _all_of(service, server=host, port=port)
        _close(
            prom_scalar(prom, substitute(requests_stat, variables)),
            TWO_PORTS_CALLS[name][0],
            f"Requests with acceptance data, port {port}",
        )
