"""Every example in ``examples/`` runs, as a user would run it, and prints what it claims.

Each example is started as a subprocess with exactly the command its header's ``Run:``
line gives (``python`` meaning this interpreter), in an environment without
``OPENAI_*``/``OTEL_*``/``SPEC_DECODE_OTEL_*`` variables, so the example starts the
project's simulator itself. Scripts that export over OTLP are pointed at an OTLP/HTTP
receiver on loopback (oteltap) and the test checks that the data arrived. The custom
adapter package is pip-installed into a temporary virtual environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import site
import subprocess
import sys
import venv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from oteltap import OtelTapHttpProtobufReceiver, OtelTapHttpProtobufReceiverSettings

import spec_decode_otel
from otlp_values import otlp_attributes
from ports import free_port
from spec_decode_otel.adapters import ParsedResponse, SpecDecodeAdapter

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
CAPTURES = EXAMPLES / "captures"
TIMEOUT_S = 120
#: Scripts that are helpers of the examples rather than examples themselves.
HELPERS = {"_simulator.py", "plain_app.py"}
#: Every example and the test that runs it; a new example without a test fails below.
TESTED = {
    "wrap_client.py",
    "async_streaming.py",
    "zero_code.sh",
    "with_openai_v2.py",
    "workload_dimensions.py",
    "langchain_chat.py",
    "parse_logs.py",
    "to_collector.sh",
    "custom_adapter",
}


# -- running examples ------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """This environment minus anything that would point an example elsewhere."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENAI_", "OTEL_", "SPEC_DECODE_OTEL_"))
    }
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHON"] = sys.executable
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_command(name: str) -> list[str]:
    """The command from the example's header (``Run:  ...``), as an argv."""
    path = EXAMPLES / name
    match = re.search(r"^(?:#\s*)?Run:\s+(.+?)(?:\s{2,}\(.*)?$", path.read_text(), re.MULTILINE)
    assert match, f"{name} has no 'Run:' line in its header"
    argv = shlex.split(match.group(1))
    assert argv[1] == f"examples/{name}", f"{name}'s Run: line runs {argv[1]}"
    if argv[0] == "python":
        argv[0] = sys.executable
    return argv


def run_example(
    name: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*run_command(name), *args],
        cwd=REPO,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def fields(line: str) -> dict[str, str]:
    """``key=value`` pairs of one output line."""
    return dict(re.findall(r"(\w+)=(\S+)", line))


class Receiver:
    """An OTLP/HTTP receiver on loopback that keeps every span and metric it gets."""

    def __init__(self) -> None:
        self.port = free_port()
        self.tap = OtelTapHttpProtobufReceiver(
            OtelTapHttpProtobufReceiverSettings(http_port=self.port)
        )
        self.spans: list[Any] = []
        self.metrics: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Receiver:
        await self.tap.start()
        self._tasks = [
            asyncio.create_task(self._keep(self.tap.stream_traces(), self.spans)),
            asyncio.create_task(self._keep(self.tap.stream_metrics(), self.metrics)),
        ]
        await asyncio.sleep(0.05)  # both subscriptions registered before anything is sent
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.tap.stop()

    @staticmethod
    async def _keep(stream: Any, into: list[Any]) -> None:
        async for item in stream:
            into.append(item)

    async def wait_for(self, done: Callable[[], bool], timeout: float = 20.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done():
            assert loop.time() < deadline, (
                f"timed out: {len(self.spans)} spans, {len(self.metrics)} metrics"
            )
            await asyncio.sleep(0.05)


async def run_async(argv: Sequence[str], env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def check_acceptance(mal: float, rate: float, k: int = 4, per_request: bool = True) -> None:
    assert 1.0 <= mal <= k + 1
    assert 0.0 <= rate <= 1.0
    if per_request:
        # one request's identity for a fixed draft length k: mal - 1 == rate * k, since
        # accepted/steps == (accepted/drafted) * (drafted/steps) and drafted/steps == k
        assert mal - 1.0 == pytest.approx(rate * k, abs=3e-3)  # printed to 3 decimals


# -- the inventory ---------------------------------------------------------------------


def test_every_example_is_tested_and_says_how_to_run_it() -> None:
    present = {
        p.name
        for p in EXAMPLES.iterdir()
        if (p.suffix in (".py", ".sh") and p.name not in HELPERS) or p.name == "custom_adapter"
    }
    assert present == TESTED
    for name in present - {"custom_adapter"}:
        text = (EXAMPLES / name).read_text()
        assert run_command(name)
        # the header (docstring or comment block) comes first and says what it shows
        head = text.split("\n\n", 1)[0]
        assert head.startswith(('"""', "#!/usr/bin/env bash")), name
        assert len(head.splitlines()[0 if name.endswith(".py") else 1]) > 20, name


def test_examples_readme_lists_every_example() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    for name in TESTED:
        assert f"`{name}" in readme, name


# -- the examples ----------------------------------------------------------------------


def parse_attribute_blocks(out: str) -> dict[str, dict[str, str]]:
    blocks: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in out.splitlines():
        if line.endswith("'") and ": span '" in line:
            current = blocks.setdefault(line.split(":", 1)[0], {})
        elif line.startswith("  spec_decode.") and current is not None:
            key, value = line.strip().split(" = ", 1)
            current[key] = value
    return blocks


def test_wrap_client() -> None:
    out = run_example("wrap_client.py").stdout
    blocks = parse_attribute_blocks(out)
    assert set(blocks) == {"non-streaming", "streaming"}
    for attrs in blocks.values():
        assert attrs["spec_decode.engine"] == "vllm"
        assert attrs["spec_decode.num_spec_tokens"] == "4"
        histogram = json.loads(attrs["spec_decode.acceptance_histogram"])
        assert len(histogram) == 5
        assert sum(histogram) == int(attrs["spec_decode.num_spec_steps"])
        accepted = sum(j * count for j, count in enumerate(histogram))
        assert accepted == int(attrs["spec_decode.num_accepted_draft_tokens"])
        check_acceptance(
            float(attrs["spec_decode.mean_acceptance_length"]),
            float(attrs["spec_decode.draft_acceptance_rate"]),
        )
    assert re.search(r"\(streamed [1-9]\d* characters\)", out)


def test_wrap_client_uses_openai_base_url_when_set(simulator_url: str) -> None:
    # the session simulator (a subprocess) is k=4 vLLM; the example must not start its own
    env = clean_env(OPENAI_BASE_URL=simulator_url, OPENAI_MODEL="spec-sim")
    out = run_example("wrap_client.py", env=env).stdout
    assert "non-streaming: span 'chat spec-sim'" in out
    assert "streaming: span 'chat spec-sim'" in out


def test_async_streaming() -> None:
    out = run_example("async_streaming.py").stdout
    assert "6 concurrent streams, 6 spans with a record" in out
    rows = [fields(line) for line in out.splitlines() if line.startswith("prompt ")]
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("prompt ")] == [
        f"prompt {i}" for i in range(6)
    ]
    for row in rows:
        assert row["engine"] == "vllm"
        assert int(row["chunks"]) > 0 and int(row["steps"]) > 0
        assert int(row["output_tokens"]) <= 64
        check_acceptance(float(row["acceptance_length"]), float(row["draft_acceptance_rate"]))


def console_spans(stdout: str) -> list[dict[str, Any]]:
    """The JSON spans ConsoleSpanExporter printed among the app's own lines."""
    decoder = json.JSONDecoder()
    spans, index = [], stdout.find("{")
    while index != -1:
        span, end = decoder.raw_decode(stdout, index)
        spans.append(span)
        index = stdout.find("{", end)
    return spans


def test_zero_code_console() -> None:
    proc = run_example("zero_code.sh")
    assert re.search(r"^reply: [1-9]\d* characters$", proc.stdout, re.MULTILINE)
    assert re.search(r"^streamed reply: [1-9]\d* characters$", proc.stdout, re.MULTILINE)
    spans = console_spans(proc.stdout)
    # one span per call (openai-v2 is installed too and picked up by opentelemetry-instrument:
    # spec-decode-otel enriches its span rather than adding a second one)
    assert len(spans) == 2
    for span in spans:
        attrs = span["attributes"]
        assert attrs["spec_decode.engine"] == "vllm"
        assert attrs["gen_ai.request.model"] == "llama-3.1-8b-eagle3"
        assert span["resource"]["attributes"]["service.name"] == "plain-app"
        check_acceptance(
            attrs["spec_decode.mean_acceptance_length"], attrs["spec_decode.draft_acceptance_rate"]
        )


def test_zero_code_honours_spec_decode_variables() -> None:
    # The app never sets stream_options: its streaming call has a record only because the
    # script's SPEC_DECODE_OTEL_INJECT_INCLUDE_USAGE=true asks for the usage chunk.
    env = clean_env(SPEC_DECODE_OTEL_INJECT_INCLUDE_USAGE="false")
    spans = console_spans(run_example("zero_code.sh", env=env).stdout)
    assert len(spans) == 2
    engines = [s["attributes"].get("spec_decode.engine") for s in spans]
    assert engines == ["vllm", None]  # the non-streaming call, then the stream without usage


async def test_zero_code_over_otlp() -> None:
    async with Receiver() as receiver:
        env = clean_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_SERVICE_NAME="zero-code-test",
            # openai-v2 off (its entry point is "openai"): here spec-decode-otel makes its
            # own spans, where the console test above checks it enriching openai-v2's
            OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="openai",
        )
        code, out, err = await run_async(["bash", "examples/zero_code.sh"], env)
        assert code == 0, out + err
        assert "{" not in out  # nothing on the console: it all went over OTLP

        def ours() -> list[dict[str, Any]]:
            spans = map(otlp_attributes, receiver.spans)
            return [a for a in spans if a.get("spec_decode.engine") == "vllm"]

        def spans_without_record() -> int:
            return sum("spec_decode.engine" not in otlp_attributes(s) for s in receiver.spans)

        names = {"spec_decode.acceptance_length", "spec_decode.verify_steps"}
        await receiver.wait_for(
            lambda: len(ours()) == 2 and names <= {m.name for m in receiver.metrics}
        )
        assert spans_without_record() == 0  # one span per call, all ours
        for attrs in ours():
            assert attrs["gen_ai.provider.name"] == "openai"
            assert "gen_ai.response.id" not in attrs  # openai-v2 is really off
            check_acceptance(
                attrs["spec_decode.mean_acceptance_length"],
                attrs["spec_decode.draft_acceptance_rate"],
            )


def test_with_openai_v2() -> None:
    out = run_example("with_openai_v2.py").stdout
    assert "2 calls, 2 spans" in out
    scopes = re.findall(r"^span '.+' from scope (\S+)$", out, re.MULTILINE)
    assert len(scopes) == 2 and "spec_decode_otel" not in scopes

    def keys(label: str) -> list[set[str]]:
        rows = [line.split(":", 1)[1] for line in out.splitlines() if f"{label}:" in line]
        return [{key.strip() for key in row.split(",")} for row in rows]

    others, ours = keys("others"), keys("spec_decode.*")
    assert len(others) == len(ours) == 2
    for theirs, mine in zip(others, ours, strict=True):
        # openai-v2's attributes (gen_ai.response.id is set by it alone) and ours, one span
        assert {"gen_ai.operation.name", "gen_ai.response.id"} <= theirs
        assert {"spec_decode.engine", "spec_decode.mean_acceptance_length"} <= mine


def test_workload_dimensions() -> None:
    out = run_example("workload_dimensions.py").stdout
    rows = {
        row["workload"]: row
        for row in (fields(line) for line in out.splitlines() if line.startswith("workload="))
    }
    assert set(rows) == {"chat", "code"}
    assert rows["chat"]["requests"] == "4" and rows["code"]["requests"] == "8"
    for row in rows.values():
        # a mean over requests and a token-weighted rate: only the ranges hold
        mal, rate = float(row["mean_acceptance_length"]), float(row["draft_acceptance_rate"])
        check_acceptance(mal, rate, per_request=False)
    # the code model's drafter accepts far better (0.9/0.85/0.8/0.7 vs 0.5/0.4/0.3/0.2)
    assert float(rows["code"]["mean_acceptance_length"]) > float(
        rows["chat"]["mean_acceptance_length"]
    )
    assert "tenant is a metric attribute: False; spans with a tenant: 12" in out


def test_langchain_chat() -> None:
    out = run_example("langchain_chat.py").stdout
    headers = re.search(r"^invoke: [1-9]\d* characters, (\d+) response headers$", out, re.M)
    assert headers and int(headers.group(1)) > 0
    assert re.search(r"^stream: [1-9]\d* characters$", out, re.MULTILINE)
    for call in ("invoke", "stream"):
        line = next(x for x in out.splitlines() if x.startswith(f"{call}: span "))
        row = fields(line)
        assert row["engine"] == "vllm"
        check_acceptance(float(row["acceptance_length"]), float(row["draft_acceptance_rate"]))


def test_parse_logs() -> None:
    out = run_example("parse_logs.py").stdout
    lines = {
        line.split(":", 1)[0]: line.split(":", 1)[1].strip()
        for line in out.splitlines()
        if not line.startswith("record_from_json")
    }
    assert set(lines) == {p.name for p in CAPTURES.iterdir()}
    expected = {
        "vllm_response.json": ("vllm", "False"),
        "vllm_stream.sse": ("vllm", "False"),
        "sglang_response.json": ("sglang", "False"),
        "llamacpp_stream.sse": ("llamacpp", "True"),
        "trtllm_released_chunks.jsonl": ("tensorrt_llm", "True"),
    }
    for name, (engine, partial) in expected.items():
        row = fields(lines[name])
        assert (row["engine"], row["partial"]) == (engine, partial), name
    assert lines["plain_openai_response.json"] == "no spec-decode stats"
    # what the example prints agrees with the library and with the CLI
    for path in CAPTURES.iterdir():
        record = spec_decode_otel.record_from_text(path.read_text())
        cli = subprocess.run(
            [sys.executable, "-m", "spec_decode_otel", "parse", str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=TIMEOUT_S,
        )
        assert json.loads(cli.stdout) == (record.model_dump(mode="json") if record else None)
        if record is not None and record.mean_acceptance_length is not None:
            assert (
                f"mean_acceptance_length={round(record.mean_acceptance_length, 3)}"
                in (lines[path.name])
            )
    dumped = out.split("record_from_json(vllm body) as JSON: ", 1)[1]
    sent = json.loads((CAPTURES / "vllm_response.json").read_text())
    stats = sent["metrics"]["speculative_decoding"]
    assert json.loads(dumped)["per_step_accepted"] == stats["per_step_accepted"]


def test_parse_logs_reports_an_unreadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.txt"
    bad.write_text("this is not a capture\n")
    out = run_example("parse_logs.py", str(bad)).stdout
    assert out.startswith("garbage.txt: unreadable (")


def test_to_collector_dry_run_defaults_to_the_compose_stack() -> None:
    out = run_example("to_collector.sh", "--dry-run").stdout.strip()
    assert out == (
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 OTEL_EXPORTER_OTLP_PROTOCOL=grpc "
        "spec-decode-otel demo --requests 200"
    )
    header = (EXAMPLES / "to_collector.sh").read_text()
    assert "docker compose -f collector-config/docker-compose.yaml up -d" in header
    assert (REPO / "collector-config" / "docker-compose.yaml").is_file()


async def test_to_collector_exports_to_the_configured_endpoint() -> None:
    requests = 6
    async with Receiver() as receiver:
        env = clean_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        )
        argv = [*run_command("to_collector.sh"), "--requests", str(requests), "--no-progress"]
        code, out, err = await run_async(argv, env)
        assert code == 0, out + err
        to = f"exported over OTLP/HTTP to {receiver.endpoint}"
        assert f"spans {to}; metrics {to}" in err.splitlines(), err
        assert "model llama-3.1-8b-eagle3" in out

        def records() -> list[dict[str, Any]]:
            spans = map(otlp_attributes, receiver.spans)
            return [a for a in spans if "spec_decode.engine" in a]

        names = {
            "spec_decode.acceptance_length",
            "spec_decode.draft_acceptance_rate",
            "spec_decode.draft_tokens",
            "spec_decode.accepted_draft_tokens",
            "spec_decode.verify_steps",
            "spec_decode.accepted_at_position",
        }
        await receiver.wait_for(
            lambda: len(records()) == requests and names <= {m.name for m in receiver.metrics}
        )
        histogram = next(m for m in receiver.metrics if m.name == "spec_decode.acceptance_length")
        assert histogram.unit == "{token}"
        assert sum(p.count for p in histogram.histogram.data_points) == requests


# -- the third-party adapter package ---------------------------------------------------

XSPEC_BODY = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 33, "total_tokens": 36},
    "x_spec": {"steps": 12, "accepted": 21, "drafted": 36},
}


def venv_from_checkout(env_dir: Path, *projects: Path, env: dict[str, str]) -> Path:
    """A new virtual environment holding this checkout and ``projects``, installed from
    their directories (never from a package index); returns its interpreter.

    Everything else comes from this interpreter's environment, whose site directories a
    ``.pth`` file appends after the new environment's own. ``--system-site-packages``
    would not do: inside a virtualenv (as most users run the tests) it lends the *base*
    interpreter's packages, without this project or its dependencies.
    """
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = [
        *site.getsitepackages(),
        *([site.getusersitepackages()] if site.ENABLE_USER_SITE else []),
    ]
    (Path(purelib) / "_test_environment.pth").write_text("".join(f"{d}\n" for d in ours))
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(REPO), *map(str, projects)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return python


def test_custom_adapter_installs_and_is_found(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    env = clean_env()
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    # The venv must use what it installed, not a working tree a developer put on the path.
    env.pop("PYTHONPATH", None)
    python = venv_from_checkout(env_dir, EXAMPLES / "custom_adapter", env=env)
    # the project in that environment is the one just built from this checkout
    where = subprocess.run(
        [str(python), "-c", "import spec_decode_otel; print(spec_decode_otel.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,
    )
    assert where.stdout.startswith(str(env_dir)), where.stdout + where.stderr
    check = subprocess.run(
        [str(python), str(EXAMPLES / "custom_adapter" / "check_plugin.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,  # not the repository: the adapter must come from the installed package
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "adapters: vllm, sglang, tensorrt_llm, llamacpp, usage_details, xspec" in check.stdout
    record = json.loads(check.stdout.split("record: ", 1)[1])
    assert record["engine"] == "xspec"
    assert record["mean_acceptance_length"] == pytest.approx(1 + 21 / 12)
    assert record["draft_acceptance_rate"] == pytest.approx(21 / 36)
    assert record["completion_tokens"] == 33
    # the CLI in that environment recognises the new engine too
    body = tmp_path / "xspec.json"
    body.write_text(json.dumps(XSPEC_BODY))
    parsed = subprocess.run(
        [str(python), "-m", "spec_decode_otel", "parse", str(body)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert parsed.returncode == 0, parsed.stderr
    assert json.loads(parsed.stdout)["num_spec_steps"] == 12
    # and this interpreter, without the plug-in, does not
    assert spec_decode_otel.record_from_json(XSPEC_BODY) is None


def _xspec_adapter() -> Any:
    sys.path.insert(0, str(EXAMPLES / "custom_adapter" / "src"))
    try:
        from xspec_adapter import XSpecAdapter
    finally:
        sys.path.pop(0)
    return XSpecAdapter


@pytest.mark.parametrize(
    ("stats", "usable"),
    [
        ({"steps": 12, "accepted": 21, "drafted": 36}, True),
        ({"steps": 0, "accepted": 0, "drafted": 0}, True),
        ({"steps": 12, "accepted": 40, "drafted": 36}, False),  # accepted > drafted
        ({"steps": 12, "accepted": True, "drafted": 36}, False),  # a bool is not a count
        ({"steps": 12, "accepted": -1, "drafted": 36}, False),
        ({"steps": 12, "drafted": 36}, False),
        ({"steps": "12", "accepted": 21, "drafted": 36}, False),
    ],
)
def test_custom_adapter_rules(stats: dict[str, Any], usable: bool) -> None:
    adapter = _xspec_adapter()
    assert isinstance(adapter, type) and isinstance(adapter(), SpecDecodeAdapter)
    responses = [ParsedResponse.from_dict({**XSPEC_BODY, "x_spec": stats})]
    assert adapter.can_adapt(responses)
    record = adapter.adapt(responses)
    assert (record is not None) == usable
    if record is not None:
        assert record.engine == "xspec" and record.is_partial
        assert record.num_spec_steps == stats["steps"]


def test_custom_adapter_leaves_other_payloads_alone() -> None:
    adapter = _xspec_adapter()
    plain = [ParsedResponse.from_dict({"choices": [], "usage": None})]
    assert not adapter.can_adapt(plain)
    two = {**XSPEC_BODY, "choices": [{"index": 0}, {"index": 1}]}
    assert adapter.adapt([ParsedResponse.from_dict(two)]) is None
