"""LiteLLM's own OpenTelemetry callback as an application's only OpenTelemetry set-up.

A LiteLLM user who turns on ``litellm.callbacks = ["otel"]`` and instruments with
``SpecDecodeInstrumentor().instrument()`` (or ``opentelemetry-instrument``, which without
the distro sets nothing up) gets whatever providers LiteLLM sets. In litellm 1.110.2
(``litellm/integrations/opentelemetry.py``): ``OpenTelemetryConfig.from_env`` reads
``OTEL_EXPORTER``/``OTEL_ENDPOINT`` (or the standard ``OTEL_EXPORTER_OTLP_PROTOCOL``/
``OTEL_EXPORTER_OTLP_ENDPOINT``); ``_init_tracing`` sets the global TracerProvider when
none is set; ``_init_metrics`` sets a MeterProvider only when
``LITELLM_OTEL_INTEGRATION_ENABLE_METRICS`` is ``true``. So by default our spans reach
LiteLLM's exporter and our metrics are lost, and the ``no-sdk`` hint must say exactly
that; with LiteLLM's metrics on, both signals arrive and the hint stays silent.

Each case is a fresh process (global providers), the real LiteLLM and ``openai`` SDK
against the simulator over HTTP, LiteLLM's exporter posting to a loopback OTLP/HTTP sink.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from collector_sink import attributes, running_sink

from otlp_values import clean_env

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

#: ``openai/`` goes through the ``openai`` SDK; one plain call and one stream.
APP = """
import json, logging, os
import litellm
from app_probes import Logged
from spec_decode_otel import SpecDecodeInstrumentor

logged = Logged()
logging.getLogger("spec_decode_otel").addHandler(logged)
SpecDecodeInstrumentor().instrument()
litellm.callbacks = ["otel"]
kwargs = dict(
    model="openai/spec-sim",
    api_base=os.environ["SIMULATOR_URL"],
    api_key="sk-test",
    messages=[{"role": "user", "content": "Name three prime numbers."}],
    max_tokens=32,
    extra_headers={"x-spec-decode-engine": "vllm", "x-sim-seed": "8301"},
)
text = litellm.completion(**kwargs).choices[0].message.content
chunks = sum(1 for _ in litellm.completion(
    **kwargs, stream=True, stream_options={"include_usage": True}))
print(json.dumps({"text": bool(text), "chunks": chunks, "logged": logged.records}))
"""


def run(simulator_url: str, endpoint: str, **env: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", APP],
        env=clean_env(
            "LITELLM_",
            SIMULATOR_URL=simulator_url,
            OTEL_EXPORTER="otlp_http",
            OTEL_ENDPOINT=endpoint,
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            PYTHONPATH=os.pathsep.join((str(REPO / "src"), str(HERE))),
            **env,
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["text"] is True and isinstance(report["chunks"], int) and report["chunks"] > 2
    return report


@pytest.mark.parametrize("litellm_metrics", [False, True], ids=["litellm-traces", "with-metrics"])
def test_with_litellms_otel_callback_as_the_only_sdk_the_hint_names_exactly_what_is_lost(
    simulator_url: str, litellm_metrics: bool
) -> None:
    env = {"LITELLM_OTEL_INTEGRATION_ENABLE_METRICS": "true"} if litellm_metrics else {}
    with running_sink() as sink:
        report = run(simulator_url, sink.endpoint, **env)
        spans = [attributes(span) for _, span in sink.spans()]
        metric_names = sink.metric_names()
    ours = [a for a in spans if "spec_decode.outcome" in a]
    assert [a["spec_decode.outcome"] for a in ours] == ["recorded", "recorded"]
    assert all(a["spec_decode.num_accepted_draft_tokens"] > 0 for a in ours)
    # LiteLLM's own span is there too, without our attributes (test_litellm.py pins why).
    assert len(spans) > len(ours)
    if litellm_metrics:
        assert report["logged"] == []
        assert "spec_decode.draft_acceptance_rate" in metric_names
    else:
        (hint,) = report["logged"]
        assert isinstance(hint, str)
        assert "configured for metrics (spans keep the record)" in hint
        assert not any(name.startswith("spec_decode") for name in metric_names)
