"""LiteLLM with OpenInference's LiteLLM instrumentation beside ours, nothing faked.

openinference-instrumentation-litellm 0.1.51 (with litellm 1.110.2, in a venv that
``scripts/install-coexistence-venvs.sh`` builds: it registers an ``opentelemetry_instrumentor``
entry point, which would load it in every zero-code test of the test environment) wraps
LiteLLM's module functions (``litellm.completion``, ``acompletion``, ...), so its span
(scope ``openinference.instrumentation.litellm``, kind INTERNAL, named after the function)
is current while LiteLLM runs. Its attributes are OpenInference's (``llm.*``, ``input.*``,
``output.*``), not the GenAI conventions', and it records no metrics.

Each run is a fresh process of ``litellm_openinference_app.py``: four calls (``hosted_vllm/``
chat, streamed and not, which only our LiteLLM callback sees; ``openai/`` chat through the
SDK, async and streamed), in each load order and with each instrumentation alone. Every
call must show exactly one span with ``spec_decode.*``, the figures of ours alone, as a
child of OpenInference's span for the call (in ``auto`` mode ours is not folded into it:
our span keeps the GenAI attributes and metrics OpenInference does not make), and
OpenInference's spans exactly as it makes them alone.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from installed import built_by
from otlp_values import clean_env
from spec_decode_otel.telemetry import SCOPE_NAME

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
APP = HERE / "litellm_openinference_app.py"
THEIR_SCOPE = "openinference.instrumentation.litellm"
ORDERS = ("theirs-first", "ours-first")
#: label -> the outcome ours alone gives it (a stream LiteLLM's own handler rebuilt
#: carries no stats; see README's LiteLLM section)
OUTCOMES = {
    "hosted-chat": "recorded",
    "hosted-chat-stream": "no_stats",
    "openai-chat": "recorded",
    "openai-chat-stream": "recorded",
}


class Run:
    """What one process exported, grouped by the app's per-call root span."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.metrics: dict[str, float] = report["metrics"]
        spans = report["spans"]
        roots = {s["trace_id"]: s["name"] for s in spans if s["scope"] == "coexistence-app"}
        self.calls: dict[str, list[dict[str, Any]]] = {}
        for span in spans:
            if span["scope"] != "coexistence-app":
                label = roots[span["trace_id"]].removeprefix("call ")
                self.calls.setdefault(label, []).append(span)

    def ours(self, label: str) -> list[dict[str, Any]]:
        return [s for s in self.calls.get(label, []) if s["scope"] == SCOPE_NAME]

    def theirs(self, label: str) -> list[tuple[str, dict[str, str]]]:
        spans = [s for s in self.calls.get(label, []) if s["scope"] == THEIR_SCOPE]
        return [(s["name"], s["attributes"]) for s in spans]


def spec_decode(span: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in span["attributes"].items() if k.startswith("spec_decode.")}


@pytest.fixture(scope="module")
def runs(simulator_url: str) -> Iterator[dict[str, Future[Run]]]:
    venvs = built_by("install-coexistence-venvs.sh", "SPEC_DECODE_OTEL_COEXISTENCE_VENVS")
    python = venvs / "openinference-litellm" / "bin" / "python"
    env = clean_env("PYTHON")

    def run(order: str) -> Run:
        done = subprocess.run(
            [str(python), str(APP)],
            env=env
            | {
                "PYTHONPATH": str(REPO / "src"),
                "SIMULATOR_URL": simulator_url,
                "COEX_ORDER": order,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            },
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return Run(json.loads(done.stdout.strip().splitlines()[-1]))

    with ThreadPoolExecutor(2) as pool:  # a run is mostly a process importing LiteLLM
        yield {o: pool.submit(run, o) for o in (*ORDERS, "theirs-only", "ours-only")}


@pytest.mark.parametrize("order", ORDERS)
def test_each_call_has_one_spec_decode_span_under_openinferences(
    runs: dict[str, Future[Run]], order: str
) -> None:
    case, theirs_alone, ours_alone = (runs[o].result() for o in (order, "theirs-only", "ours-only"))
    assert sorted(case.calls) == sorted(OUTCOMES)
    for label, outcome in OUTCOMES.items():
        (alone,) = ours_alone.ours(label)
        assert alone["attributes"]["spec_decode.outcome"] == outcome, label
        (ours,) = case.ours(label)
        assert spec_decode(ours) == spec_decode(alone), label
        (their_span,) = [s for s in case.calls[label] if s["scope"] == THEIR_SCOPE]
        assert ours["parent_id"] == their_span["span_id"], label
        assert case.theirs(label) == theirs_alone.theirs(label), label
    assert case.metrics == ours_alone.metrics
    assert case.metrics["spec_decode.requests"] == len(OUTCOMES)


def test_openinference_alone_makes_one_span_per_call_and_no_metrics(
    runs: dict[str, Future[Run]],
) -> None:
    """The baseline the coexistence test compares with is real: OpenInference's own
    span for every call, named after LiteLLM's function, and nothing of ours."""
    alone = runs["theirs-only"].result()
    names = {label: [name for name, _ in alone.theirs(label)] for label in OUTCOMES}
    assert names == {
        "hosted-chat": ["completion"],
        "hosted-chat-stream": ["completion"],
        "openai-chat": ["acompletion"],
        "openai-chat-stream": ["completion"],
    }
    assert all(alone.ours(label) == [] for label in OUTCOMES)
    assert alone.metrics == {}
