"""End to end: the other ways the compose stack's Prometheus (3.16) gets the metrics.

test_e2e_pipeline.py runs the default way: the SDK's explicit-bucket histograms, scraped
from the collector's prometheus exporter (otelcol.yaml). Here, against the same
Prometheus (loading the shipped prometheus.yml and rules, with the OTLP receiver on, as
docker-compose.yaml runs it), the demo runs three more ways:

  - ``push-classic``: explicit buckets, pushed by a second collector running
    otelcol-prometheus-otlp.yaml to Prometheus's OTLP endpoint;
  - ``push-exponential``: exponential histograms
    (``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram``),
    pushed the same way: Prometheus stores them as native histograms;
  - ``scrape-exponential``: exponential histograms through otelcol.yaml, scraped as
    native histograms (prometheus.yml's ``scrape_native_histograms``), in the same metric
    families as the classic histograms of the other runs.

For each: every panel of the shipped dashboard (but the "Client vs server" row, which
reads the inference servers' own metrics) has data for the run's service, the overview's
formulas over totals equal the records, exemplars name the run's requests, and where the
histograms are native the per-request median of the acceptance length matches the
records' within the resolution of the buckets. Found by running it: Prometheus 3.5.0
(the compose stack's version before) failed every scrape of a collector whose metric
family held both classic and native histograms ("histogram's observation count should
equal the number of observations found in the buckets", fixed in 3.15.0, #19452), so one
application exporting exponential histograms emptied the dashboard for every application
behind that collector; the scrape target must stay up here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2e_stack import (
    CONFIG_DIR,
    ManagedProcess,
    Stack,
    StackError,
    child_env,
    find_otelcol,
    port_open,
    prom_query,
    prom_scalar,
    wait_for_exemplars,
    wait_until,
)

from conftest import (
    ROW,
    Expected,
    Workload,
    all_selected,
    as_totals,
    dashboard_targets,
    run_demo,
    substitute,
    wait_ingested,
)
from ports import free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

EXPONENTIAL = {
    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "base2_exponential_bucket_histogram"
}
WAYS = ("push-classic", "push-exponential", "scrape-exponential")
REQUESTS = 60
#: Relative width of an exponential bucket at the coarsest scale the SDK could choose for
#: acceptance lengths in [1, 9] with its 160 buckets (scale 5: 2^(1/32) - 1 = 2.2 %);
#: a quantile read from native buckets lies within one bucket of the sample's.
NATIVE_RESOLUTION = 2 ** (1 / 32) - 1


@pytest.fixture(scope="module")
def push_collector(e2e_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second collector running otelcol-prometheus-otlp.yaml, pushing metrics to the
    stack's Prometheus and traces to the stack's collector: its OTLP/HTTP endpoint."""
    workdir = tmp_path_factory.mktemp("push-collector")
    grpc_port, http_port, telemetry_port = free_ports(3)
    proc = ManagedProcess(
        "otelcol-push",
        [find_otelcol(), "--config", str(CONFIG_DIR / "otelcol-prometheus-otlp.yaml")],
        child_env(
            {
                "OTELCOL_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
                "OTELCOL_HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
                "OTELCOL_PROMETHEUS_OTLP_ENDPOINT": f"{e2e_stack.prometheus_url}/api/v1/otlp",
                "OTELCOL_TRACES_ENDPOINT": f"127.0.0.1:{e2e_stack.otlp_grpc_port}",
                "OTELCOL_TELEMETRY_HOST": "127.0.0.1",
                "OTELCOL_TELEMETRY_PORT": str(telemetry_port),
            }
        ),
        workdir / "otelcol-push.log",
        cwd=workdir,
    )
    proc.start()
    try:
        wait_until("push collector OTLP/HTTP", lambda: port_open(http_port), 30, [proc])
    except StackError as exc:
        proc.stop()
        pytest.fail(f"push collector did not start: {exc}", pytrace=False)
    try:
        yield f"http://127.0.0.1:{http_port}"
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def runs(
    e2e_stack: Stack,
    push_collector: str,
    prom: httpx.Client,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Workload]:
    workdir = tmp_path_factory.mktemp("native-demo")
    scrape = e2e_stack.otlp_endpoint("http/protobuf")
    ways = {
        "push-classic": (push_collector, {}),
        "push-exponential": (push_collector, EXPONENTIAL),
        "scrape-exponential": (scrape, EXPONENTIAL),
    }
    done = {}
    for way, (endpoint, extra) in ways.items():
        done[way] = run_demo(endpoint, "http/protobuf", workdir, REQUESTS, way, extra)
        wait_ingested(prom, done[way])
    return done


def _panels_outside_the_servers_row() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(p, t) for row, p, t in dashboard_targets() if not row.startswith(ROW)]


def _has_data(result: list[dict[str, Any]]) -> bool:
    """A finite value, or a native histogram sample with observations (the heatmap's)."""
    for series in result:
        if "histogram" in series:
            if float(series["histogram"][1]["count"]) > 0:
                return True
        elif math.isfinite(float(series["value"][1])):
            return True
    return False


@pytest.mark.parametrize("way", WAYS)
def test_every_dashboard_panel_has_data(
    runs: dict[str, Workload], prom: httpx.Client, way: str
) -> None:
    values = all_selected(service=runs[way].service, dimension="gen_ai_request_model")
    targets = _panels_outside_the_servers_row()
    assert len(targets) >= 20
    empty = [
        f"{panel['title']!r} {target['refId']}: {expr}"
        for panel, target in targets
        if not _has_data(prom_query(prom, expr := substitute(target["expr"], values)))
    ]
    assert not empty, "\n".join(empty)


@pytest.mark.parametrize("way", WAYS)
def test_dashboard_overview_equals_records(
    runs: dict[str, Workload], prom: httpx.Client, way: str
) -> None:
    """The overview's stat panels, their formulas over totals (exact), against the
    records: the mean acceptance length reads the native histogram's sum and count."""
    values = all_selected(service=runs[way].service)
    stats = {
        panel["title"]: substitute(as_totals(target["expr"]), values)
        for panel, target in _panels_outside_the_servers_row()
        if "$__range" in target["expr"] and panel["type"] == "stat"
    }
    exp = Expected(runs[way].records)
    expected = {
        "Requests with acceptance data": len(runs[way].records),
        "Mean acceptance length per request": sum(exp.mal) / len(exp.mal),
        "Acceptance length (token-weighted)": exp.token_weighted_al,
        "Draft acceptance rate (token-weighted)": exp.accepted / exp.drafted,
    }
    for title, want in expected.items():
        got = prom_scalar(prom, stats[title])
        assert got is not None and math.isclose(got, want, rel_tol=1e-9), (title, got, want)


def test_overview_pools_applications_of_both_kinds(
    runs: dict[str, Workload], prom: httpx.Client
) -> None:
    """All three runs selected at once: one application's classic buckets beside two
    applications' native histograms. The mean acceptance length pools all their
    requests: its classic-or-native choice is made series by series, before the sum. It
    was made after the sum, and the classic side, once it had any series, hid every
    native one (the classic run's mean alone)."""
    values = all_selected(service="|".join(run.service for run in runs.values()))
    (expr,) = [
        substitute(as_totals(target["expr"]), values)
        for panel, target in _panels_outside_the_servers_row()
        if panel["title"] == "Mean acceptance length per request" and panel["type"] == "stat"
    ]
    means = Expected([r for run in runs.values() for r in run.records]).mal
    assert len(means) == sum(len(run.records) for run in runs.values())
    got = prom_scalar(prom, expr)
    assert got is not None and math.isclose(got, sum(means) / len(means), rel_tol=1e-9)


@pytest.mark.parametrize("way", ["push-exponential", "scrape-exponential"])
def test_native_median_matches_the_records(
    runs: dict[str, Workload], prom: httpx.Client, way: str
) -> None:
    """The p50 panel's formula per model, over the cumulative histograms (a rate()
    leaves out what a new series held at its first scrape), read from native buckets,
    lies within one bucket of the records' median (the two middle values of the sorted
    means)."""
    (expr,) = [
        target["expr"]
        for panel, target in _panels_outside_the_servers_row()
        if panel["title"] == "Mean acceptance length per request — p50 / p90"
        and target["refId"] == "A"
    ]
    totals = as_totals(expr)
    assert "rate(" not in totals, totals
    values = all_selected(service=runs[way].service)
    got = {
        r["metric"]["gen_ai_request_model"]: float(r["value"][1])
        for r in prom_query(prom, substitute(totals, values))
    }
    by_model: dict[str, list[float]] = {}
    for row in runs[way].records:
        by_model.setdefault(row["model"], []).append(row["record"]["mean_acceptance_length"])
    assert got.keys() == by_model.keys()
    for model, means in by_model.items():
        low, high = statistics.median_low(means), statistics.median_high(means)
        assert low * (1 - NATIVE_RESOLUTION) <= got[model] <= high * (1 + NATIVE_RESOLUTION), (
            model,
            got[model],
            low,
            high,
        )


def test_the_collector_scrape_stays_up_with_mixed_families(
    runs: dict[str, Workload], prom: httpx.Client
) -> None:
    """After the scrape-exponential run, the collector's metric families hold classic and
    native histograms side by side; Prometheus still scrapes every target."""
    targets = prom.get("/api/v1/targets").json()["data"]["activeTargets"]
    down = [(t["scrapeUrl"], t["lastError"]) for t in targets if t["health"] != "up"]
    assert targets and not down, down
    # And the native series came through that scrape (not only through the push).
    sel = runs["scrape-exponential"].job_matcher
    count = prom_scalar(prom, f"histogram_count(sum(spec_decode_acceptance_length{{{sel}}}))")
    assert count == len(runs["scrape-exponential"].records)


@pytest.mark.parametrize("way", WAYS)
def test_exemplars_name_the_run_s_requests(
    runs: dict[str, Workload], prom: httpx.Client, way: str
) -> None:
    """Exemplars reach Prometheus each way (OTLP push and native scrape as well as the
    classic scrape of test_e2e_pipeline.py): each names a trace of one of the run's
    requests and carries that request's mean acceptance length."""
    run = runs[way]
    series = "spec_decode_acceptance_length" + ("_bucket" if way == "push-classic" else "")
    values_by_trace: dict[str, list[float]] = {}
    for row in run.records:
        values_by_trace.setdefault(row["trace_id"], []).append(
            row["record"]["mean_acceptance_length"]
        )
    exemplars = wait_for_exemplars(prom, f"{series}{{{run.job_matcher}}}", run.started - 60)
    assert exemplars, f"no exemplar on {series} of {way}"
    for ex in exemplars:
        trace_id = ex["labels"].get("trace_id")
        assert trace_id in values_by_trace, ex
        assert any(math.isclose(float(ex["value"]), v) for v in values_by_trace[trace_id]), ex
