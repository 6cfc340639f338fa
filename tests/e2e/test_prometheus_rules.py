"""collector-config/prometheus-rules.yml: checked, unit-tested, and run on the real pipeline.

Not marked e2e (they need only ``promtool``): the promtool beside the e2e tests'
Prometheus, the compose stack's version (docker-compose.yaml's
``prom/prometheus:v3.16.0``), built from the Go module github.com/prometheus/prometheus
v0.316.0 (its VERSION file: 3.16.0) by ``scripts/install-prometheus.sh``
(``SPEC_DECODE_OTEL_PROMETHEUS``, else that script); missing is a failure, not a skip.
With it:
  - ``promtool check rules`` accepts the rules file and counts every rule in it;
  - ``promtool test rules`` passes prometheus-rules.test.yml, and that file gives every
    recording rule an expected value and every alert a firing and a quiet case; and
    prometheus-rules-native.test.yml, the quantile rules over native histograms;
  - ``promtool check config`` accepts prometheus.yml and loads the rules file through it;
    docker-compose.yaml mounts the rules file where prometheus.yml looks for it;
  - the server and promtool say the version of compose's Prometheus image, the version
    scripts/install-prometheus.sh pins;
  - every alert has ``for``, a severity and a summary and description; every rule is
    documented in collector-config/README.md.

Marked e2e (the stack and the demo runs of conftest.py): Prometheus, loading the shipped
rules (e2e_stack.write_prometheus_config), evaluates every rule without error, and the
recording rules produce series, with sane values, for every model and engine of the
demo's records.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_stack import (
    COMPOSE_PROMETHEUS_FLAGS,
    CONFIG_DIR,
    REPO_ROOT,
    StackError,
    find_promtool,
    prom_query,
)

from conftest import Workload

RULES = CONFIG_DIR / "prometheus-rules.yml"
RULES_TEST = CONFIG_DIR / "prometheus-rules.test.yml"
RULES_NATIVE_TEST = CONFIG_DIR / "prometheus-rules-native.test.yml"
PROMETHEUS_CONFIG = CONFIG_DIR / "prometheus.yml"
COMPOSE = CONFIG_DIR / "docker-compose.yaml"
README = CONFIG_DIR / "README.md"
INSTALL_PROMETHEUS = REPO_ROOT / "scripts" / "install-prometheus.sh"
RULES_TIMEOUT_S = 60


def _rules() -> list[dict[str, Any]]:
    """Every rule of the rules file, with its group's name under ``group``."""
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [{**rule, "group": g["name"]} for g in groups for rule in g["rules"]]


def _recorded() -> list[str]:
    return [r["record"] for r in _rules() if "record" in r]


def _alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


def _compose_prometheus_version() -> str:
    """The version of the compose stack's Prometheus image (``prom/prometheus:vX.Y.Z``)."""
    image = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["prometheus"]["image"]
    name, tag = image.rsplit(":", 1)
    assert name == "prom/prometheus" and re.fullmatch(r"v\d+\.\d+\.\d+", tag), image
    return tag.removeprefix("v")


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool of the compose stack's Prometheus: see the module's docstring."""
    try:
        return find_promtool()
    except StackError as exc:
        pytest.fail(str(exc), pytrace=False)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=CONFIG_DIR, capture_output=True, text=True, timeout=300, check=False
    )


# --------------------------------------------------------------------------- promtool


def test_promtool_checks_the_rules(promtool: str) -> None:
    proc = _run([promtool, "check", "rules", str(RULES)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in proc.stdout, proc.stdout


@pytest.mark.parametrize("tests", [RULES_TEST, RULES_NATIVE_TEST], ids=lambda p: p.name)
def test_promtool_unit_tests_pass(promtool: str, tests: Path) -> None:
    proc = _run([promtool, "test", "rules", str(tests)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout and "FAILED" not in proc.stdout, proc.stdout


def test_prometheus_config_loads_the_rules(promtool: str) -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    assert config["rule_files"] == [RULES.name]
    proc = _run([promtool, "check", "config", str(PROMETHEUS_CONFIG)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rule files found" in proc.stdout, proc.stdout
    # ... and promtool checked that very file through it.
    checked = proc.stdout.split(f"Checking {RULES}", 1)
    assert len(checked) == 2, proc.stdout
    assert f"SUCCESS: {len(_rules())} rules found" in checked[1], proc.stdout


def test_compose_mounts_the_rules_where_the_config_looks() -> None:
    prometheus = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["prometheus"]
    mounts = {}
    for volume in prometheus["volumes"]:
        src, dst = volume.split(":")[:2]
        mounts[dst] = (CONFIG_DIR / src).resolve()
    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    config_path = config_flag.split("=", 1)[1]
    assert mounts[config_path] == PROMETHEUS_CONFIG.resolve()
    # rule_files are relative to the config file's directory.
    config_dir = config_path.rsplit("/", 1)[0]
    for rule_file in yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))["rule_files"]:
        assert mounts.get(f"{config_dir}/{rule_file}") == (CONFIG_DIR / rule_file).resolve(), (
            f"{rule_file} is not mounted at {config_dir}/{rule_file}: {prometheus['volumes']}"
        )


def test_e2e_prometheus_runs_with_the_compose_flags() -> None:
    """The e2e stack starts Prometheus with the flags compose gives it (beyond the config
    file and data directory, which differ by design), so the tests run what users run."""
    command = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["prometheus"][
        "command"
    ]
    flags = {f for f in command if not f.startswith(("--config.file=", "--storage.tsdb.path="))}
    assert flags == set(COMPOSE_PROMETHEUS_FLAGS), command


def test_prometheus_is_the_version_compose_runs(promtool: str) -> None:
    """The e2e Prometheus and its promtool are of the compose stack's image, and the
    install script pins that version."""
    version = _compose_prometheus_version()
    assert int(version.split(".")[0]) >= 3, version
    for binary in (promtool, str(Path(promtool).with_name("prometheus"))):
        proc = _run([binary, "--version"])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        first_line = (proc.stdout + proc.stderr).splitlines()[0]
        assert first_line.startswith(f"{Path(binary).name}, version {version} "), first_line
    script = INSTALL_PROMETHEUS.read_text(encoding="utf-8")
    assert f'PROMETHEUS_VERSION="v{version}"' in script


# --------------------------------------------------------------------------- coverage


def _unit_tests() -> list[dict[str, Any]]:
    return yaml.safe_load(RULES_TEST.read_text(encoding="utf-8"))["tests"]


def test_unit_tests_cover_every_rule() -> None:
    """Each recording rule has an expected value; each alert fires and stays quiet."""
    valued: set[str] = set()
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in _unit_tests():
        for case in test.get("promql_expr_test", []):
            if case.get("exp_samples"):
                valued.update(re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", case["expr"]))
        for case in test.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert set(_recorded()) <= valued, f"no expected value for {set(_recorded()) - valued}"
    names = {a["alert"] for a in _alerts()}
    assert names <= firing, f"never tested firing: {names - firing}"
    assert names <= quiet, f"never tested quiet: {names - quiet}"


def test_rule_names_follow_the_convention() -> None:
    """level:metric:operations; the thresholds are spec_decode:<what>:min_/max_<unit>."""
    for name in _recorded():
        level, metric, operations = name.split(":")
        if level == "spec_decode":
            assert re.fullmatch(r"(min|max)_[a-z]+", operations), name
        else:
            assert set(level.split("_")) <= {"job", "model", "engine", "server"}, name
            assert metric.startswith("spec_decode_"), name
            assert re.fullmatch(r"([a-z0-9_]+_)?rate(5m|1h|1d)", operations), name


def test_alerts_say_what_to_check() -> None:
    alerts = _alerts()
    assert len(alerts) >= 4
    for alert in alerts:
        name = alert["alert"]
        assert re.fullmatch(r"\d+m", alert.get("for", "")), (name, alert.get("for"))
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        annotations = alert["annotations"]
        assert "{{ $labels.gen_ai_request_model }}" in annotations["summary"], name
        assert len(annotations["description"]) > 200, name
        assert "check" in annotations["description"].lower(), name


def test_every_rule_is_documented() -> None:
    """Each rule is named in collector-config/README.md (a recording rule's windows may
    be written once: ``...:ratio_rate5m`` / ``_rate1h`` documents both)."""
    readme = README.read_text(encoding="utf-8")
    names = [re.sub(r"(5m|1h|1d)$", "", n) for n in _recorded()]
    names += [a["alert"] for a in _alerts()]
    missing = [n for n in names if n not in readme]
    assert not missing, f"collector-config/README.md does not mention {missing}"


# --------------------------------------------------------------------------- end to end


def _pairs(records: list[dict[str, Any]], want: str) -> set[tuple[str, str]]:
    """(model, engine) of the records whose ``want`` count is positive."""
    return {(r["model"], r["engine"]) for r in records if (r["record"].get(want) or 0) > 0}


def _series(prom: httpx.Client, expr: str) -> dict[tuple[str, ...], float]:
    out = {}
    for s in prom_query(prom, expr):
        m = s["metric"]
        key = (m.get("gen_ai_request_model", ""), m.get("spec_decode_engine", ""))
        if "spec_decode_position" in m:
            key = (*key, m["spec_decode_position"])
        out[key] = float(s["value"][1])
    return out


@pytest.fixture(scope="module")
def rules_evaluated(prom: httpx.Client) -> list[dict[str, Any]]:
    """Prometheus's loaded rules (``/api/v1/rules``), once each has been evaluated."""
    deadline = time.monotonic() + RULES_TIMEOUT_S
    while True:
        groups = prom.get("/api/v1/rules").json()["data"]["groups"]
        rules = [{**r, "group": g["name"]} for g in groups for r in g["rules"]]
        if rules and all(r["health"] != "unknown" for r in rules):
            return rules
        assert time.monotonic() < deadline, f"rules not evaluated within {RULES_TIMEOUT_S}s"
        time.sleep(0.5)


@pytest.mark.e2e
def test_prometheus_evaluates_every_rule(
    rules_evaluated: list[dict[str, Any]], prom: httpx.Client
) -> None:
    loaded = {(r["group"], r["name"]) for r in rules_evaluated}
    shipped = {(r["group"], r.get("record") or r.get("alert")) for r in _rules()}
    assert loaded == shipped
    broken = [(r["name"], r.get("lastError")) for r in rules_evaluated if r["health"] != "ok"]
    assert not broken, broken
    # The thresholds are there with the values of the file.
    for rule in _rules():
        m = re.fullmatch(r"vector\(([0-9.]+)\)", str(rule.get("expr", "")).strip())
        if m:
            assert _series(prom, rule["record"]) == {("", ""): float(m.group(1))}, rule["record"]


#: Recording rule (minus the window) -> the record count it needs, and value bounds.
E2E_RULES: dict[str, tuple[str, float, float]] = {
    "model_engine:spec_decode_accepted_draft_tokens:rate": ("num_accepted_draft_tokens", 0, 1e9),
    "model_engine:spec_decode_draft_tokens:rate": ("num_draft_tokens", 0, 1e9),
    "model_engine:spec_decode_verify_steps:rate": ("num_spec_steps", 0, 1e9),
    "model_engine:spec_decode_accepted_at_position:rate": ("num_accepted_draft_tokens", 0, 1e9),
    # Floored at 1: histogram_quantile alone interpolates the lowest bucket (le="1") from 0.
    "model_engine:spec_decode_acceptance_length:p50_rate": ("num_spec_steps", 1, 65),
    "model_engine:spec_decode_acceptance_length:token_weighted_rate": ("num_spec_steps", 1, 65),
    "model_engine:spec_decode_draft_acceptance_rate:ratio_rate": ("num_draft_tokens", 0, 1),
    "model_engine:spec_decode_accepted_at_position:ratio_rate": ("num_accepted_draft_tokens", 0, 1),
}
#: Extrapolation in rate() differs a little per series, so a ratio may pass 1 by a hair.
SLACK = 0.02


@pytest.mark.e2e
def test_recording_rules_follow_the_demo(
    workloads: dict[str, Workload], rules_evaluated: list[dict[str, Any]], prom: httpx.Client
) -> None:
    records = [r for w in workloads.values() for r in w.records]
    names = [n for n in _recorded() if n.startswith("model_engine:")]
    checked = set()
    problems = []
    for name in names:
        base = re.sub(r"(5m|1h|1d)$", "", name)
        need, low, high = E2E_RULES[base]
        want = _pairs(records, need)
        assert want, f"the demo has no record with {need} > 0"
        # Every series the rule recorded in the last hour (a 5m window may be over now);
        # a rule evaluated once since the demo's last scrape has them all.
        deadline = time.monotonic() + RULES_TIMEOUT_S
        while True:
            got = _series(prom, f"last_over_time({name}[1h])")
            have = {key[:2] for key in got}
            if want <= have or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if not want <= have:
            problems.append(f"{name}: no series for {sorted(want - have)}")
            continue
        for agg in ("min_over_time", "max_over_time"):
            for key, value in _series(prom, f"{agg}({name}[1h])").items():
                if key[:2] in want and not (low - SLACK <= value <= high + SLACK):
                    problems.append(f"{name}{key}: {agg} {value} outside [{low}, {high}]")
        if "accepted_at_position" in name:
            positions = {
                (r["model"], r["engine"], str(p))
                for r in records
                for j in (r["record"].get("acceptance_histogram") or {})
                for p in range(int(j))
            }
            if not positions <= set(got):
                problems.append(f"{name}: no series for {sorted(positions - set(got))[:5]}")
        checked.add(base)
    assert checked == set(E2E_RULES), checked
    assert not problems, "\n".join(problems)
    # The 1-day baselines of the alerts, now: finite and sane for every model.
    for name, (low, high) in {
        "model_engine:spec_decode_acceptance_length:token_weighted_rate1d": (1, 65),
        "model_engine:spec_decode_draft_acceptance_rate:ratio_rate1d": (0, 1),
    }.items():
        got = _series(prom, name)
        for pair in _pairs(records, "num_draft_tokens"):
            assert pair in got, f"{name}: no series for {pair}"
            assert math.isfinite(got[pair]) and low - SLACK <= got[pair] <= high + SLACK, (
                name,
                pair,
                got[pair],
            )
