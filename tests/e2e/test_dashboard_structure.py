"""Static checks of collector-config/: no processes, no network (not marked e2e).

- the Grafana dashboard JSON is a sane, current-schema dashboard whose panels use a
  provisioned datasource and whose variables are all defined;
- Grafana provisioning, the compose file and the Prometheus config parse and refer to
  files that exist;
- each collector config uses only components the ocb manifest builds, every pipeline
  component is defined, every ${env:...} has a default, and the manifest is pinned to
  one release that the install script's builder version matches.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import conftest
from conftest import (
    ROW,
    VARIABLE_REFERENCE,
    all_selected,
    dashboard_targets,
    substitute,
    variable_query,
)

REPO = Path(__file__).resolve().parents[2]
CFG = REPO / "collector-config"
DATASOURCES = CFG / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
DASHBOARD_PROVIDERS = CFG / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml"
COMPOSE = CFG / "docker-compose.yaml"
MANIFEST = CFG / "builder-manifest.yaml"
COLLECTOR_CONFIGS = sorted(CFG.glob("otelcol*.yaml"))

PANEL_TYPES = {"timeseries", "stat", "barchart", "heatmap", "row", "table", "text", "bargauge"}
#: Component type names of the ocb modules we use (module path's last element -> type).
COMPONENT_TYPES = {
    "otlpreceiver": "otlp",
    "memorylimiterprocessor": "memory_limiter",
    "batchprocessor": "batch",
    "deltatocumulativeprocessor": "deltatocumulative",
    "debugexporter": "debug",
    "otlpexporter": "otlp_grpc",
    "otlphttpexporter": "otlp_http",
    "prometheusexporter": "prometheus",
    "fileexporter": "file",
}
#: Deprecated exporter aliases the collector still accepts (the receiver stays `otlp`).
EXPORTER_ALIASES = {"otlp": "otlp_grpc", "otlphttp": "otlp_http"}


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return conftest.dashboard()


@pytest.fixture(scope="module")
def datasources() -> dict[str, dict[str, Any]]:
    return {ds["uid"]: ds for ds in _load_yaml(DATASOURCES)["datasources"]}


def _all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


# --------------------------------------------------------------------------- dashboard


def test_dashboard_identity(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"] == "Speculative decoding — per request"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert 36 <= dashboard["schemaVersion"] <= 42
    assert "id" not in dashboard or dashboard["id"] is None  # provisioned: no fixed id


def test_dashboard_panels_layout(dashboard: dict[str, Any]) -> None:
    panels = _all_panels(dashboard)
    assert len([p for p in panels if p["type"] != "row"]) >= 10
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        assert p["type"] in PANEL_TYPES, p["type"]
        assert p.get("title"), p
        grid = p["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), grid
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, (p["title"], grid)
    types = {p["type"] for p in panels}
    assert {"timeseries", "stat", "barchart", "heatmap"} <= types


def _variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def test_dashboard_variables(
    dashboard: dict[str, Any], datasources: dict[str, dict[str, Any]]
) -> None:
    variables = _variables(dashboard)
    assert {"datasource", "service", "model", "engine", "server", "dimension"} <= variables.keys()
    ds_var = variables["datasource"]
    assert ds_var["type"] == "datasource" and ds_var["query"] == "prometheus"
    # Its default is the provisioned Prometheus datasource.
    assert datasources[ds_var["current"]["value"]]["type"] == "prometheus"
    for name in ("service", "model", "engine", "server"):
        var = variables[name]
        variable_query(var)  # a label_values() query
        assert var["includeAll"] and var["allValue"] == ".*"
    assert variables["dimension"]["current"]["value"] == "workload"


def _uses_variables(text: str) -> set[str]:
    """The variables ``text`` refers to: ``$name``, ``${name}`` / ``${name:format}`` and
    the deprecated ``[[name]]``."""
    return {next(g for g in m.groups() if g) for m in VARIABLE_REFERENCE.finditer(text)}


BUILTIN_VARIABLES = {"__rate_interval", "__range", "__interval", "__interval_ms", "__range_s"}


def test_dashboard_targets(
    dashboard: dict[str, Any], datasources: dict[str, dict[str, Any]]
) -> None:
    variables = _variables(dashboard)
    prometheus_uids = {uid for uid, ds in datasources.items() if ds["type"] == "prometheus"}
    for p in _all_panels(dashboard):
        if p["type"] == "row":
            continue
        ds = p["datasource"]
        assert ds["type"] == "prometheus", p["title"]
        assert ds["uid"] in prometheus_uids | {"${datasource}"}, (p["title"], ds)
        targets = p["targets"]
        assert targets, p["title"]
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in targets:
            assert t["expr"].strip(), (p["title"], t)
            assert t.get("datasource", ds) == ds, p["title"]
            unknown = _uses_variables(t["expr"]) - variables.keys() - BUILTIN_VARIABLES
            assert not unknown, (p["title"], unknown)
            # Balanced parentheses and braces: a cheap guard against editing slips.
            for open_, close in ("()", "{}", "[]"):
                assert t["expr"].count(open_) == t["expr"].count(close), (p["title"], t["expr"])
        # Panels over the acceptance histograms show exemplars (links to traces).
        for t in targets:
            if re.search(
                r"spec_decode_(acceptance_length|draft_acceptance_rate)_bucket", t["expr"]
            ):
                assert t.get("exemplar") is True, (p["title"], t["refId"])


def _strings(node: Any, path: str = "") -> list[tuple[str, str]]:
    """(path, text) of every string in ``node``, leaving out the variables' ``current``
    and ``options`` (the values chosen, such as ``$__all``, not references)."""
    if isinstance(node, str):
        return [(path, node)]
    if isinstance(node, list):
        return [s for i, v in enumerate(node) for s in _strings(v, f"{path}[{i}]")]
    if isinstance(node, dict):
        return [
            s
            for k, v in node.items()
            if k not in ("current", "options")
            for s in _strings(v, f"{path}.{k}")
        ]
    return []


def test_every_variable_the_dashboard_uses_is_defined(dashboard: dict[str, Any]) -> None:
    """A variable that is not defined is left in the query as Grafana sends it: in a
    selector, ``server_port=~"$port"`` is a regex that matches no series, and the panel
    reads "no data" instead of failing. Every reference anywhere in the dashboard (query
    expressions, legends, titles, variable queries, datasource uids) names a defined
    variable or one of Grafana's own, and a variable's query names only variables listed
    before it (the chain service, model, engine, server, port)."""
    names = [v["name"] for v in dashboard["templating"]["list"]]
    defined = set(names) | BUILTIN_VARIABLES
    checked, unknown = 0, []
    for path, text in _strings(dashboard):
        for name in _uses_variables(text):
            checked += 1
            if name not in defined:
                unknown.append((path, name))
    assert not unknown, unknown
    assert checked > 100, checked
    for i, var in enumerate(dashboard["templating"]["list"]):
        for _, text in _strings(var.get("query", "")):
            later = _uses_variables(text) - set(names[:i]) - BUILTIN_VARIABLES
            assert not later, (var["name"], later)


def test_e2e_substitution_leaves_no_variable(dashboard: dict[str, Any]) -> None:
    """The e2e tests run the dashboard's expressions on the real Prometheus through
    conftest.substitute. The coverage of the "Client vs server" row (conftest._coverage)
    replaced ``$server`` only, so a ``$port`` there would have been sent as is and read
    an empty result. With "All" chosen everywhere (and a dimension), every target
    substitutes to an expression with no variable left; a variable the values do not
    give fails the test, naming it."""
    values = all_selected(dimension="workload")
    assert {"service", "model", "engine", "server", "port"} <= values.keys(), values
    targets = [t for p in _all_panels(dashboard) for t in p.get("targets", [])]
    assert targets
    for t in targets:
        expr = substitute(t["expr"], values)
        assert not VARIABLE_REFERENCE.search(expr), expr
    for left in ('x{server_port=~"$port"}', "x[${__range}]", "sum by ([[dimension]]) (x)"):
        with pytest.raises(pytest.fail.Exception, match="unsubstituted"):
            substitute(left, {"server": ".*"})


def test_dashboard_covers_the_metrics(dashboard: dict[str, Any]) -> None:
    exprs = " ".join(t["expr"] for p in _all_panels(dashboard) for t in p.get("targets", []))
    for metric in (
        "spec_decode_acceptance_length_bucket",
        "spec_decode_acceptance_length_sum",
        "spec_decode_draft_acceptance_rate_bucket",
        "spec_decode_draft_tokens_total",
        "spec_decode_accepted_draft_tokens_total",
        "spec_decode_verify_steps_total",
        "spec_decode_accepted_at_position_total",
    ):
        assert metric in exprs, metric
    assert "histogram_quantile(0.5" in exprs and "histogram_quantile(0.9" in exprs
    assert "ignoring(spec_decode_position) group_left" in exprs
    assert "by ($dimension)" in exprs


# --------------------------------------------------------------------------- provisioning


def test_datasources_link_exemplars_to_the_trace_store(
    datasources: dict[str, dict[str, Any]],
) -> None:
    prometheus = [ds for ds in datasources.values() if ds["type"] == "prometheus"]
    assert len(prometheus) == 1
    destinations = prometheus[0]["jsonData"]["exemplarTraceIdDestinations"]
    # The collector's prometheus exporter names the exemplar label trace_id.
    assert [d["name"] for d in destinations] == ["trace_id"]
    for d in destinations:
        assert datasources[d["datasourceUid"]]["type"] in {"jaeger", "tempo"}
    assert datasources["jaeger"]["url"].endswith(":16686")


def _compose() -> dict[str, Any]:
    return _load_yaml(COMPOSE)


def test_dashboard_provider_path_is_mounted() -> None:
    providers = _load_yaml(DASHBOARD_PROVIDERS)["providers"]
    assert len(providers) == 1
    path = providers[0]["options"]["path"]
    mounts = {}
    for volume in _compose()["services"]["grafana"]["volumes"]:
        src, dst = volume.split(":")[:2]
        mounts[dst] = src
    assert path in mounts
    assert (CFG / mounts[path]).resolve() == conftest.DASHBOARD.parent.resolve()


def test_compose_structure() -> None:
    compose = _compose()
    services = compose["services"]
    assert {"otel-collector", "prometheus", "jaeger", "grafana"} <= services.keys()
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), (name, image)
        for volume in service.get("volumes", []):
            src = volume.split(":")[0]
            if src.startswith("."):
                assert (CFG / src).exists(), (name, src)
    collector = services["otel-collector"]
    assert any(v.startswith("./otelcol.yaml:") for v in collector["volumes"])
    assert collector["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert {"4317:4317", "4318:4318"} <= set(collector["ports"])
    prometheus = services["prometheus"]
    assert "--enable-feature=exemplar-storage" in prometheus["command"]
    assert any(v.startswith("./prometheus.yml:") for v in prometheus["volumes"])
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")
    assert any(v.startswith("./jaeger.yaml:") for v in services["jaeger"]["volumes"])
    env = services["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Admin"
    # Service names the configs' defaults point at.
    otelcol = (CFG / "otelcol.yaml").read_text()
    assert "jaeger:4317" in otelcol
    scrape = _load_yaml(CFG / "prometheus.yml")["scrape_configs"][0]
    host = scrape["static_configs"][0]["targets"][0].split(":")[0]
    assert host in services


def test_prometheus_config() -> None:
    config = _load_yaml(CFG / "prometheus.yml")
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    job = jobs["otel-collector"]
    # Keep the application's job/instance labels that the exporter sets.
    assert job["honor_labels"] is True
    assert job["static_configs"][0]["targets"] == ["otel-collector:8889"]


# --------------------------------------------------------------------------- collector


def _manifest_modules() -> dict[str, list[str]]:
    manifest = _load_yaml(MANIFEST)
    return {
        kind: [entry["gomod"] for entry in manifest.get(kind, [])]
        for kind in (
            "receivers",
            "processors",
            "exporters",
            "extensions",
            "connectors",
            "providers",
        )
    }


def _built_types() -> dict[str, set[str]]:
    built: dict[str, set[str]] = {}
    for kind, modules in _manifest_modules().items():
        if kind == "providers":
            continue
        built[kind] = {COMPONENT_TYPES[m.split()[0].rsplit("/", 1)[1]] for m in modules}
    return built


def _type(kind: str, component_id: str) -> str:
    base = component_id.split("/", 1)[0]
    return EXPORTER_ALIASES.get(base, base) if kind == "exporters" else base


@pytest.mark.parametrize("path", COLLECTOR_CONFIGS, ids=lambda p: p.name)
def test_collector_config_uses_built_components(path: Path) -> None:
    config = _load_yaml(path)
    built = _built_types()
    for kind in ("receivers", "processors", "exporters", "extensions", "connectors"):
        for component_id in config.get(kind) or {}:
            assert _type(kind, component_id) in built.get(kind, set()), (
                path.name,
                kind,
                component_id,
            )
    pipelines = config["service"]["pipelines"]
    assert {"metrics", "traces"} <= pipelines.keys()
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            for component_id in pipeline.get(kind, []):
                assert component_id in config[kind], (path.name, name, component_id)
        assert pipeline["processors"][0] == "memory_limiter", (path.name, name)
        assert "batch" in pipeline["processors"], (path.name, name)
        assert "debug" in pipeline["exporters"], (path.name, name)
    assert config["exporters"]["debug"]["verbosity"].endswith(":-basic}")


def test_manifest_lists_exactly_the_components_used() -> None:
    used: dict[str, set[str]] = {}
    for path in COLLECTOR_CONFIGS:
        config = _load_yaml(path)
        for kind in ("receivers", "processors", "exporters", "extensions", "connectors"):
            used.setdefault(kind, set()).update(_type(kind, c) for c in config.get(kind) or {})
    built = _built_types()
    for kind, types in built.items():
        assert types == used.get(kind, set()), (kind, types, used.get(kind))


def test_manifest_is_pinned_to_one_release() -> None:
    core, stable, contrib = set(), set(), set()
    for modules in _manifest_modules().values():
        for module in modules:
            path, version = module.split()
            if path.startswith("github.com/open-telemetry/opentelemetry-collector-contrib/"):
                contrib.add(version)
            elif "/confmap/provider/" in path:
                stable.add(version)
            else:
                core.add(version)
    assert len(core) == 1 and len(stable) == 1 and len(contrib) == 1, (core, stable, contrib)
    (core_v,) = core
    (contrib_v,) = contrib
    # contrib vX.Y.* goes with core vX.Y.0
    assert contrib_v.rsplit(".", 1)[0] == core_v.rsplit(".", 1)[0], (core_v, contrib_v)
    script = (REPO / "scripts" / "install-collector.sh").read_text()
    assert f'OCB_VERSION="{core_v}"' in script


@pytest.mark.parametrize(
    "path",
    [*COLLECTOR_CONFIGS, CFG / "jaeger.yaml"],
    ids=lambda p: p.name,
)
def test_env_references_have_defaults(path: Path) -> None:
    text = path.read_text()
    refs = re.findall(r"\$\{env:([^}]*)\}", text)
    assert refs, path.name
    for ref in refs:
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*:-[^}]+", ref), (path.name, ref)


def _seconds(duration: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", duration)
    assert m, duration
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def test_rate_windows_span_two_sdk_exports(
    datasources: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector serves a series' value as of the application's last export, so it
    changes once per OTEL_METRIC_EXPORT_INTERVAL (the SDK's default: 60 s), however often
    Prometheus scrapes. Grafana's $__rate_interval is at least 4 x the datasource's
    timeInterval; at 4 x 5 s, a rate() window held no export two times out of three,
    and on the real Prometheus (2.42) the rate panels fell to 0 and the ratio panels to
    NaN between exports. The provisioned datasource's timeInterval must make every
    $__rate_interval window span two default exports."""
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    monkeypatch.delenv("OTEL_METRIC_EXPORT_INTERVAL", raising=False)
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter())
    try:
        export_s = reader._export_interval_millis / 1000
    finally:
        reader.shutdown()
    (prometheus,) = [ds for ds in datasources.values() if ds["type"] == "prometheus"]
    assert 4 * _seconds(prometheus["jsonData"]["timeInterval"]) >= 2 * export_s


def test_position_panels_number_draft_positions_from_zero(dashboard: dict[str, Any]) -> None:
    """spec_decode_position is 0-based: a step that accepted one draft counts at position 0
    (SpecDecodeAcceptanceRecord.accepted_at_position). A panel that says which p is the
    first drafted token must say p = 0 (one said p = 1)."""
    from spec_decode_otel.record import SpecDecodeAcceptanceRecord

    record = SpecDecodeAcceptanceRecord(
        engine="vllm",
        mean_acceptance_length=2.0,
        draft_acceptance_rate=1.0,
        acceptance_histogram={1: 5},
        num_accepted_draft_tokens=5,
        num_draft_tokens=5,
        num_spec_steps=5,
        num_spec_tokens=1,
    )
    first = record.accepted_at_position().index(5)
    said = []
    for p in _all_panels(dashboard):
        text = p.get("description", "")
        for m in re.finditer(r"p\s*=\s*(\d+) is the first drafted token", text):
            said.append((p["title"], int(m.group(1))))
    assert said, "no panel says which position is the first drafted token"
    assert all(p == first for _, p in said), (first, said)


def test_dashboard_tells_servers_apart_by_port(dashboard: dict[str, Any]) -> None:
    """A server is its address and port (server.address / server.port of the client's
    base_url): two engines on one host (ports 8000 and 8001) are two servers. The
    dashboard filtered by server_address only, so picking a host showed both engines
    merged. A ``port`` variable lists the ports of the chosen servers, every selector
    that filters the server filters its port too, and every breakdown by server keeps
    the port. That includes the "Client vs server" row, on both sides (the clients'
    series and the servers' own): it showed each server as address:port but selected by
    address only, so with one port chosen it still showed the host's other engine."""
    variables = _variables(dashboard)
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert "port" in variables, names
    assert names.index("port") == names.index("server") + 1, names
    port = variables["port"]
    match, label = variable_query(port)
    assert label == "server_port" and 'server_address=~"$server"' in match, (match, label)
    # The servers' own query, narrowed to the chosen servers.
    server_match, _ = variable_query(variables["server"])
    assert match.startswith(server_match.split("}", 1)[0]), (match, server_match)
    assert port["includeAll"] and port["allValue"] == ".*" and port["multi"]
    client_vs_server = {p["id"] for row, p, _ in dashboard_targets() if row.startswith(ROW)}
    assert client_vs_server
    exprs = [t["expr"] for p in _all_panels(dashboard) for t in p.get("targets", [])]
    server_side = 0
    for p in _all_panels(dashboard):
        for t in p.get("targets", []):
            for selector in re.findall(r"\{[^}]*\}", t["expr"]):
                if "$server" in selector:
                    assert 'server_port=~"$port"' in selector, (p["title"], selector)
                    if p["id"] in client_vs_server and "__name__" in selector:
                        server_side += 1
    assert server_side >= 4, server_side  # the servers' counters in the row, filtered too
    for expr in exprs:
        for by in re.findall(r"by \(([^)]*)\)", expr):
            labels = {label.strip() for label in by.split(",")}
            assert "server_address" not in labels or "server_port" in labels, expr
    assert any('server_port=~"$port"' in e for e in exprs)
