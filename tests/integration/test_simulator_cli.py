"""The simulator as a program (URL line, signals, exit codes, flags) and as a Python API
(``SimulatorServer`` in a background thread, ``create_app``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from simulator_process import SimulatorProcess, wait_until
from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer, create_app
from spec_decode_otel.simulator.cli import main

PROMPT = [{"role": "user", "content": "hello"}]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_url_line_and_clean_exit_on_signal(sig: int) -> None:
    proc = SimulatorProcess(["--engine", "sglang", "--seed", "1"])
    try:
        url = proc.start()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        port = int(url.removesuffix("/v1").rsplit(":", 1)[1])
        assert port > 0
        with openai.OpenAI(api_key="sk-test", base_url=url, max_retries=0) as client:
            resp = client.chat.completions.create(
                model="spec-sim",
                messages=PROMPT,
                max_tokens=20,
                extra_body={"return_spec_tokens_details": True},
            )
        assert resp.model_extra["sglext"]["spec_tokens_details"]["spec_verify_ct"] > 0
        assert proc.stop(sig) == 0, proc.stderr()
        assert not port_open(port)
        assert "Traceback" not in proc.stderr()
    finally:
        proc.stop(signal.SIGKILL)


def test_sigterm_during_an_open_stream_still_exits_zero() -> None:
    proc = SimulatorProcess(["--step-delay-ms", "20"])
    try:
        url = proc.start()
        client = openai.OpenAI(api_key="sk-test", base_url=url, max_retries=0)
        stream = client.chat.completions.create(
            model="spec-sim", messages=PROMPT, max_tokens=200, stream=True
        )
        next(iter(stream))
        assert proc.stop(signal.SIGTERM) == 0, proc.stderr()
        client.close()
    finally:
        proc.stop(signal.SIGKILL)


def test_top_level_cli_simulate_subcommand() -> None:
    cmd = [sys.executable, "-m", "spec_decode_otel", "simulate", "--port", "0", "--k", "3"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        try:
            line = p.stdout.readline().strip()  # type: ignore[union-attr]
            assert line.startswith("serving http://127.0.0.1:"), p.stderr.read()  # type: ignore[union-attr]
            url = line.removeprefix("serving ")
            body = httpx.post(
                url + "/chat/completions",
                json={"model": "m", "messages": PROMPT, "max_tokens": 9},
                timeout=10,
            ).json()
            assert body["metrics"]["speculative_decoding"]["num_spec_tokens"] == 3
            p.send_signal(signal.SIGTERM)
            assert p.wait(10) == 0
        finally:
            if p.poll() is None:
                p.kill()


@pytest.mark.parametrize(
    "argv",
    [["--engine", "bogus"], ["--alpha-vector", "x,y"], ["--model", "no-equals-sign"]],
)
def test_bad_flags_exit_2(argv: list[str], capsys: Any) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--port", "0", *argv])
    assert info.value.code == 2


def test_invalid_configuration_exits_2(capsys: Any) -> None:
    assert main(["--port", "0", "--alpha", "1.5"]) == 2
    assert "invalid configuration" in capsys.readouterr().err


def test_port_in_use_exits_1(capsys: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["--port", str(port)]) == 1


# --- the Python API -----------------------------------------------------------------------


def test_simulator_server_context_manager() -> None:
    with SimulatorServer(SimulatorConfig(engine="trtllm", seed=1)) as sim:
        assert sim.base_url == f"http://127.0.0.1:{sim.port}/v1"
        with openai.OpenAI(api_key="x", base_url=sim.base_url, max_retries=0) as client:
            resp = client.chat.completions.create(model="m", messages=PROMPT, max_tokens=30)
        assert "speculative_decoding" in resp.choices[0].model_extra
        port = sim.port
    assert not port_open(port)
    assert not [t for t in threading.enumerate() if t.name == f"spec-decode-simulator:{port}"]


async def test_simulator_server_async_context_manager() -> None:
    async with SimulatorServer(SimulatorConfig(engine="llamacpp")) as sim:
        async with openai.AsyncOpenAI(api_key="x", base_url=sim.base_url, max_retries=0) as c:
            resp = await c.completions.create(model="m", prompt="hi", max_tokens=30)
        assert resp.model_extra["timings"]["predicted_n"] == 30
    assert not port_open(sim.port)


async def test_create_app_in_process() -> None:
    """The ASGI app alone, over an in-memory transport (how a test can skip the socket)."""
    app = create_app(SimulatorConfig(engine="vllm-premerge", level="summary"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        health = await client.get("/health")
        body = (
            await client.post(
                "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 12}
            )
        ).json()
    assert health.status_code == 200
    stats = body["choices"][0]["speculative_decoding_stats"]
    assert "per_step_accepted" not in stats
    assert all(type(k) is str for k in stats["acceptance_histogram"])


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        SimulatorConfig(alpha_vector=(0.5, 2.0))
    with pytest.raises(ValueError):
        SimulatorConfig(draft_schedule=(2, 0))
    with pytest.raises(ValueError):
        SimulatorConfig(min_length=10, max_length=5)


def test_a_killed_test_run_leaves_no_simulator_behind() -> None:
    """A test process killed by SIGKILL runs no teardown: its simulators lived on under
    init (found twice after interrupted runs, up for an hour). Through tests/lifeline.py
    each one ends within seconds of its parent."""
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; sys.path.insert(0, sys.argv[1]);"
            "from simulator_process import SimulatorProcess;"
            "p = SimulatorProcess(['--seed', '1']); p.start();"
            "print(p.proc.pid, flush=True); time.sleep(600)",
            str(Path(__file__).resolve().parents[1]),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    with starter:
        assert starter.stdout is not None
        simulator = int(starter.stdout.readline())
        assert _running(simulator)
        starter.kill()
    try:
        assert wait_until(lambda: not _running(simulator), timeout=10), "outlived its parent"
    finally:
        if _running(simulator):
            os.kill(simulator, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie lasts until init reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
