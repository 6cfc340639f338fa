"""The README's promises, checked: its quick start runs, its reference is complete.

- The quick start's first fenced shell block (install + demo) runs for real in a fresh
  virtual environment that sees no other site-packages (so the ``demo`` extra must name
  everything the demo imports), changed only by activating that environment first.
- Its second block (the whole test suite) is not run from inside the test suite; instead
  CI's entry point ``.ci/run`` must call exactly that command.
- Every ``SPEC_DECODE_OTEL_*`` variable and keyword ``Settings.from_env`` reads is in the
  configuration table, and every metric, span attribute and bucket boundary in
  ``telemetry.py`` is in the README.
- The version lives in ``version.py`` only, and CHANGELOG's top entry matches it.
"""

from __future__ import annotations

import inspect
import os
import re
import shlex
import subprocess
import sys
import venv
from dataclasses import fields
from importlib.metadata import version as installed_version
from pathlib import Path

import spec_decode_otel
from spec_decode_otel import telemetry
from spec_decode_otel.instrumentation import genai_metrics
from spec_decode_otel.instrumentation import settings as config

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
DEMO_TITLE = "Speculative decoding — per-request acceptance (from the spans it emitted)"


def section(title: str) -> str:
    """The text of the ``## title`` section (up to the next level-2 heading)."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def shell_blocks(text: str) -> list[str]:
    return [m.strip() for m in re.findall(r"^```(?:sh|bash|shell)\n(.*?)^```", text, re.M | re.S)]


def quick_start_commands() -> tuple[str, str]:
    blocks = shell_blocks(section("Quick start"))
    assert len(blocks) >= 2, "Quick start must open with the demo and the test commands"
    return blocks[0], blocks[1]


def test_quick_start_commands_are_the_documented_ones() -> None:
    demo, tests = quick_start_commands()
    assert demo == "pip install -e '.[demo]' && spec-decode-otel demo"
    assert tests == "bash scripts/test.sh"


def test_quick_start_demo_runs_in_a_fresh_virtual_environment(tmp_path: Path) -> None:
    demo, _ = quick_start_commands()
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=False, with_pip=True).create(env_dir)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_", "VIRTUAL_ENV", "PYTHONPATH"))
    }
    script = f"source {shlex.quote(str(env_dir / 'bin' / 'activate'))} && {demo}"
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the install really happened in the new environment: its own console script exists
    assert (env_dir / "bin" / "spec-decode-otel").is_file()
    assert DEMO_TITLE in proc.stdout
    models = re.findall(r"^model (\S+)\s+engine (\S+)\s+k=(\d+)$", proc.stdout, re.M)
    assert models == [
        ("llama-3.1-8b-eagle3", "vllm", "4"),
        ("qwen2.5-7b-ngram", "vllm", "4"),
    ]
    requests = [int(n) for n in re.findall(r"^\s+requests\s+(\d+)$", proc.stdout, re.M)]
    assert sum(requests) == 48  # the demo's default, every request recorded
    lengths = re.findall(r"mean acceptance length \(per req\)\s+([\d.]+)", proc.stdout)
    eagle, ngram = (float(x) for x in lengths)
    assert 1.0 <= ngram < eagle <= 5.0


def test_ci_runs_exactly_the_readme_test_command() -> None:
    _, tests = quick_start_commands()
    lines = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    commands = [line.removeprefix("exec ") for line in lines]
    assert tests in commands, f".ci/run does not run {tests!r}: {lines}"
    assert (REPO / tests.split()[-1]).is_file()


# -- reference completeness ------------------------------------------------------------


def configuration_rows() -> list[str]:
    return [line for line in section("Configuration").splitlines() if line.startswith("|")]


def test_every_setting_is_in_the_configuration_table() -> None:
    source = inspect.getsource(config.Settings.from_env)
    names = set(re.findall(r'_env_(?:bool|int|list|choice)\("([A-Z_]+)"', source))
    names |= set(re.findall(r'ENV_PREFIX \+ "([A-Z_]+)"', source))
    assert {"MODE", "INJECT_INCLUDE_USAGE", "GENAI_METRICS"} <= names  # the scan works
    rows = configuration_rows()
    for name in names:
        variable = config.ENV_PREFIX + name
        matching = [row for row in rows if f"`{variable}`" in row]
        assert matching, f"{variable} is not in README's configuration table"
        keyword = name.lower()
        assert f"`{keyword}`" in matching[0], f"{variable}'s row does not name `{keyword}`"
    keywords = {f.name for f in fields(config.Settings)}
    assert keywords == {name.lower() for name in names}, "a keyword without a variable"


def shown_default(value: object) -> str:
    """How the configuration table writes a default."""
    if value is True or value is False:
        return f"`{str(value).lower()}`"
    if value is None:
        return "unset"
    if value == ():
        return "empty"
    return f"`{value}`"


def test_configuration_defaults_match_the_code() -> None:
    defaults = config.Settings()
    rows = {}
    for row in configuration_rows():
        match = re.match(r"\| `(\w+)` \|", row)
        if match:
            rows[match.group(1)] = [cell.strip() for cell in row.strip("|").split("|")]
    for field in fields(config.Settings):
        if field.name == "extra":
            continue
        value = getattr(defaults, field.name)
        default_cell = rows[field.name][2]
        assert default_cell.startswith(shown_default(value)), (
            f"{field.name}: README says {default_cell!r}, the code {value!r}"
        )


def test_every_metric_attribute_and_bucket_is_documented() -> None:
    constants = {
        name: value
        for module in (telemetry, genai_metrics)
        for name, value in vars(module).items()
        if name.startswith(("M_", "SD_")) and isinstance(value, str)
    }
    assert len([n for n in constants if n.startswith("M_")]) == 10  # the scan works
    reference = section("Telemetry reference")
    for name, value in constants.items():
        assert f"`{value}`" in reference, f"{name} = {value!r} is not in the telemetry reference"
    for buckets in (
        telemetry.ACCEPTANCE_LENGTH_BUCKETS,
        telemetry.ACCEPTANCE_RATE_BUCKETS,
        genai_metrics.DURATION_BUCKETS,
        genai_metrics.TOKEN_BUCKETS,
    ):
        shown = ", ".join(format(b, ".15g") for b in buckets)
        assert shown in " ".join(reference.split()), f"buckets {shown} not in the README"


def test_prometheus_names_follow_the_collector_translation() -> None:
    reference = section("Telemetry reference")
    for name in ("M_DRAFT_TOKENS", "M_ACCEPTED_DRAFT_TOKENS", "M_VERIFY_STEPS"):
        assert f"`{getattr(telemetry, name).replace('.', '_')}_total" in reference
    assert "`spec_decode_acceptance_length_bucket`" in reference
    assert 'spec_decode_verify_steps_total{spec_decode_accepted="j"}' in reference


def test_readme_links_resolve() -> None:
    for target in re.findall(r"\]\(((?!https?:|#)[^)#]+)(?:#[^)]*)?\)", README):
        assert (REPO / target).exists(), f"README links to missing {target}"
    for anchor in re.findall(r"\]\(#([^)]+)\)", README):
        titles = re.findall(r"^#{2,4} (.+)$", README, re.M)  # GitHub anchors every level
        slugs = {re.sub(r"[^\w\- ]", "", t).strip().lower().replace(" ", "-") for t in titles}
        assert anchor in slugs, f"README links to missing section #{anchor}"


# -- the version -----------------------------------------------------------------------


def test_version_lives_in_one_place() -> None:
    # (read with regular expressions: tomllib is not in Python 3.10)
    pyproject = (REPO / "pyproject.toml").read_text()
    project = re.search(r"^\[project\]\n(.*?)^\[", pyproject, re.M | re.S)
    assert project and re.search(r'^dynamic = \["version"\]$', project.group(1), re.M)
    assert not re.search(r"^version\s*=", project.group(1), re.M)
    hatch = re.search(r'^\[tool\.hatch\.version\]\npath = "([^"]+)"$', pyproject, re.M)
    assert hatch
    source = REPO / hatch.group(1)
    assert source == REPO / "src" / "spec_decode_otel" / "version.py"
    declared = re.search(r'^__version__ = "([^"]+)"$', source.read_text(), re.M)
    assert declared
    changelog = (REPO / "CHANGELOG.md").read_text()
    top = re.search(r"^## \[(\d+\.\d+\.\d+[^\]]*)\]", changelog, re.M)
    assert top
    assert spec_decode_otel.__version__ == declared.group(1) == top.group(1)
    # the installed distribution was built from that same source (reinstall after a bump)
    assert installed_version("spec-decode-otel") == spec_decode_otel.__version__
    assert sys.modules["spec_decode_otel.version"].__file__ == str(source)
