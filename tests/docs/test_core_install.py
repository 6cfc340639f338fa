"""With only the core installed (``pip install .``, no extras) the package keeps the
promises of issue 14 and the README:

- ``import spec_decode_otel`` loads the OpenTelemetry API and nothing heavier (no SDK, no
  exporter, no grpc, no fastapi), in an environment where none of those is installed;
- ``spec-decode-otel --help`` and ``spec-decode-otel parse FILE`` work, ``parse`` giving
  the same record as in the full test environment;
- ``simulate``, ``demo`` and ``check`` print the extra to install and exit non-zero, and
  ``setup()`` raises an ImportError naming the ``otlp`` extra.

The environment is a real venv holding the core dependencies from the package index
(cached under ``$SPEC_DECODE_OTEL_CACHE/venvs``, default ``~/.cache/spec-decode-otel``,
keyed by interpreter and the core requirements) and spec-decode-otel built
from this checkout, reinstalled on every run.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SSE_PAYLOAD = REPO / "tests" / "data" / "payloads" / "vllm_merged_stream.sse"
HEAVY = ("opentelemetry.sdk", "opentelemetry.exporter", "grpc", "fastapi")
CACHE = Path(os.environ.get("SPEC_DECODE_OTEL_CACHE", Path.home() / ".cache" / "spec-decode-otel"))


def clean_env() -> dict[str, str]:
    """This environment minus anything that would lend the venv other packages or
    point the CLI elsewhere."""
    return {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        and not key.startswith(("OTEL_", "SPEC_DECODE_OTEL_", "OPENAI_"))
    }


def pip(python: Path, *args: str) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "install", "--quiet", *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def core_bin() -> Iterator[Path]:
    """``bin/`` of a venv with spec-decode-otel from this checkout and only its core."""
    pyproject = REPO.joinpath("pyproject.toml").read_text(encoding="utf-8")
    core = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.M | re.S)
    assert core, "pyproject.toml has no dependencies list"
    key = hashlib.sha256(f"{sys.version}\n{core.group(1)}".encode()).hexdigest()[:16]
    venvs = CACHE / "venvs"
    venvs.mkdir(parents=True, exist_ok=True)
    prefix = f"core-only-py{sys.version_info[0]}.{sys.version_info[1]}-"
    env_dir = venvs / f"{prefix}{key}"
    python = env_dir / "bin" / "python"
    with (venvs / ".core-only.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while the tests use the venv
        if not (env_dir / ".complete").is_file():
            shutil.rmtree(env_dir, ignore_errors=True)
            venv.EnvBuilder(with_pip=True).create(env_dir)
            pip(python, str(REPO))  # the core's dependencies, from the index
            (env_dir / ".complete").touch()
            for stale in venvs.glob(f"{prefix}*"):  # built for other requirements
                if stale != env_dir:
                    shutil.rmtree(stale, ignore_errors=True)
        pip(python, "--no-deps", "--force-reinstall", str(REPO))  # this checkout, as built now
        yield env_dir / "bin"


def run(core_bin: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(core_bin / argv[0]), *argv[1:]],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,  # not the checkout: the package must come from the venv
    )


def test_the_venv_holds_the_core_only(core_bin: Path, tmp_path: Path) -> None:
    found = run(
        core_bin,
        "python",
        "-c",
        "import importlib.util, spec_decode_otel\n"
        "print(spec_decode_otel.__file__)\n"
        f"for name in {[*HEAVY, 'uvicorn', 'openai']!r}:\n"
        "    print(name, importlib.util.find_spec(name) is not None)",
        cwd=tmp_path,
    )
    assert found.returncode == 0, found.stderr
    where, *rows = found.stdout.splitlines()
    assert where.startswith(str(core_bin.parent)), where  # installed, not this checkout's src
    assert rows == [f"{name} False" for name in [*HEAVY, "uvicorn", "openai"]]


def test_import_loads_only_the_opentelemetry_api(core_bin: Path, tmp_path: Path) -> None:
    # The check, verbatim.
    check = (
        "import spec_decode_otel, sys; assert not any(m.startswith(('opentelemetry.sdk',"
        "'opentelemetry.exporter','grpc','fastapi')) for m in sys.modules)"
    )
    done = run(core_bin, "python", "-c", check, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # and the API really is what it loaded (the check above cannot fail by importing nothing)
    api = run(
        core_bin,
        "python",
        "-c",
        "import spec_decode_otel, sys; print('opentelemetry.trace' in sys.modules)",
        cwd=tmp_path,
    )
    assert api.stdout.strip() == "True", api.stderr


def test_help_and_parse_work(core_bin: Path, tmp_path: Path) -> None:
    helped = run(core_bin, "spec-decode-otel", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    for command in ("parse", "simulate", "demo", "check"):
        assert re.search(rf"^\s+{command}\s", helped.stdout, re.M), helped.stdout
    parsed = run(core_bin, "spec-decode-otel", "parse", str(SSE_PAYLOAD), cwd=tmp_path)
    assert parsed.returncode == 0, parsed.stderr
    here = subprocess.run(
        [sys.executable, "-m", "spec_decode_otel", "parse", str(SSE_PAYLOAD)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    record = json.loads(parsed.stdout)
    assert record == json.loads(here.stdout)
    assert record["engine"] == "vllm" and record["num_spec_steps"] == 14


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        (["simulate"], "simulator"),
        (["demo"], "demo"),
        (["check", "http://127.0.0.1:9/v1", "--model", "m"], "instruments,otlp"),
    ],
    ids=["simulate", "demo", "check"],
)
def test_commands_needing_an_extra_say_which(
    core_bin: Path, tmp_path: Path, command: list[str], extra: str
) -> None:
    done = run(core_bin, "spec-decode-otel", *command, cwd=tmp_path)
    assert done.returncode != 0
    assert f"pip install 'spec-decode-otel[{extra}]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_setup_names_the_otlp_extra(core_bin: Path, tmp_path: Path) -> None:
    done = run(
        core_bin,
        "python",
        "-c",
        "import spec_decode_otel\n"
        "try:\n"
        "    spec_decode_otel.setup('core-only')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('no error')",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'spec-decode-otel[otlp]'" in done.stdout
