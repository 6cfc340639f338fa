"""Out-of-process set-ups: zero-code ``opentelemetry-instrument`` and ``setup()``.

Zero-code: ``opentelemetry-instrument python zero_code_app.py`` with OTLP/HTTP exporters
pointed at an in-process OTLP receiver (``oteltap``) over real HTTP. The app contains no
telemetry code; the spans and metrics it exports must carry the spec-decode data.

``setup()`` with no endpoint configured: runs, instruments, exports nothing, and the
process exits cleanly and quietly.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from check_command import COMMAND, PROBES, run_check
from otlp_values import (
    clean_env,
    otlp_attributes,
    receiving_otlp,
    run_under_opentelemetry_instrument,
)

HERE = Path(__file__).resolve().parent
APP = HERE / "zero_code_app.py"


async def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


async def test_zero_code_exports_spec_decode_spans_and_metrics(simulator_url: str) -> None:
    instrument = shutil.which("opentelemetry-instrument")
    assert instrument, "opentelemetry-distro's opentelemetry-instrument is not installed"
    async with receiving_otlp() as received:
        spans, metrics = received.spans, received.metrics
        env = clean_env(
            SIMULATOR_URL=simulator_url,
            OTEL_SERVICE_NAME="zero-code-app",
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_METRICS_EXPORTER="otlp",
            OTEL_LOGS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_ENDPOINT=received.endpoint,
            OTEL_METRIC_EXPORT_INTERVAL="500",
            OTEL_BSP_SCHEDULE_DELAY="100",
            # only our instrumentor: the span must be ours, not an enriched openai-v2 one
            OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="openai",
        )
        proc = await asyncio.create_subprocess_exec(
            instrument,
            sys.executable,
            str(APP),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        told = json.loads(out.decode().strip().splitlines()[-1])

        wanted = {"spec_decode.acceptance_length", "spec_decode.verify_steps"}
        assert await wait_for(
            lambda: (
                len([s for s in spans if s.name == "chat spec-sim"]) >= 2
                and wanted <= {m.name for m in metrics}
            ),
            15,
        ), ([s.name for s in spans], sorted({m.name for m in metrics}))

    calls = [s for s in spans if s.name == "chat spec-sim"]
    assert len(calls) == 2  # one per call: the JSON one, then the stream
    stats = told["stats"]
    for span in calls:
        attrs = otlp_attributes(span)
        assert span.kind == span.SPAN_KIND_CLIENT
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["spec_decode.engine"] == "vllm"
        # both calls were seeded alike: the server's own numbers, unchanged
        assert attrs["spec_decode.num_spec_steps"] == stats["num_spec_steps"]
        assert attrs["spec_decode.num_draft_tokens"] == stats["num_draft_tokens"]
        assert attrs["spec_decode.acceptance_histogram"] == stats["acceptance_histogram"]
        assert attrs["spec_decode.mean_acceptance_length"] == stats["mean_acceptance_length"]

    def last(name: str) -> Any:
        return [m for m in metrics if m.name == name][-1]

    length = last("spec_decode.acceptance_length")
    assert length.unit == "{token}"
    (point,) = length.histogram.data_points
    assert point.count == 2
    assert point.sum == 2 * stats["mean_acceptance_length"]
    assert otlp_attributes(point)["spec_decode.engine"] == "vllm"
    verify = last("spec_decode.verify_steps")
    assert verify.sum.is_monotonic
    by_accepted = {
        otlp_attributes(p)["spec_decode.accepted"]: p.as_int for p in verify.sum.data_points
    }
    expected = {j: 2 * c for j, c in enumerate(stats["acceptance_histogram"]) if c}
    assert by_accepted == expected


def test_setup_without_an_endpoint_runs_and_exports_nothing(simulator_url: str) -> None:
    script = """
import json, os
import openai
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
import spec_decode_otel

reader = InMemoryMetricReader()
built = spec_decode_otel.setup("setup-test", metric_readers=[reader])
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
client.chat.completions.create(model="spec-sim", messages=[{"role": "user", "content": "hi"}])
client.close()
names = sorted(
    m.name
    for rm in reader.get_metrics_data().resource_metrics
    for sm in rm.scope_metrics
    for m in sm.metrics
)
print(json.dumps({
    "exporting": built.exporting,
    "span_processors": len(built.tracer_provider._active_span_processor._span_processors),
    "readers": len(built.meter_provider._all_metric_readers),
    "service": built.tracer_provider.resource.attributes.get("service.name"),
    "metrics": names,
}))
"""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=clean_env(SIMULATOR_URL=simulator_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no exporter errors, no warnings
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["exporting"] is False
    assert report["span_processors"] == 0  # no exporter was attached
    assert report["readers"] == 1  # only the caller's own reader
    assert report["service"] == "setup-test"
    # the instrumentation still ran: its data is there for an in-process reader
    assert "spec_decode.acceptance_length" in report["metrics"]
    assert time.monotonic() - started < 30  # exit did not wait on a collector


def test_a_bad_variable_warns_and_leaves_zero_code_instrumentation_working(
    simulator_url: str,
) -> None:
    """``opentelemetry-instrument`` stops instrumenting the whole process when one
    instrumentor raises ("Failed to auto initialize OpenTelemetry",
    opentelemetry-instrumentation's ``_load_instrumentors`` re-raises): a typo in one of
    our variables must not cost the user every other instrumentation. Each bad value
    warns, naming the variable, and falls back; the calls are still recorded."""
    instrument = shutil.which("opentelemetry-instrument")
    assert instrument, "opentelemetry-distro's opentelemetry-instrument is not installed"
    env = clean_env(
        SIMULATOR_URL=simulator_url,
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="openai",
        SPEC_DECODE_OTEL_REQUEST_ENGINE_STATS="sglang,sglnag",
        SPEC_DECODE_OTEL_MODE="spam",
        SPEC_DECODE_OTEL_PER_STEP_MAX_LENGTH="lots",
    )
    done = subprocess.run(
        [instrument, sys.executable, str(APP)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Failed to auto initialize" not in done.stderr, done.stderr
    for told in (
        "SPEC_DECODE_OTEL_REQUEST_ENGINE_STATS='sglang,sglnag': unknown engine(s) sglnag left out",
        "SPEC_DECODE_OTEL_MODE='spam': not one of auto, span, enrich; auto is used",
        "SPEC_DECODE_OTEL_PER_STEP_MAX_LENGTH='lots': not an integer; 1024 is used",
    ):
        assert told in done.stderr, done.stderr
    # the console exporter's spans: both calls, ours, with the server's stats
    assert done.stdout.count('"spec_decode.engine": "vllm"') == 2, done.stdout


#: Under ``opentelemetry-instrument``: the app's own options in code, then the same
#: options given a second time, differently. One streamed call without ``stream_options``
#: (vLLM sends its statistics only on the usage chunk, which only ``inject_include_usage``
#: asks for).
OPTIONS_IN_CODE = """
import json, logging, os, warnings, openai
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import spec_decode_otel
from spec_decode_otel import SpecDecodeInstrumentor

told = []
class Keep(logging.Handler):
    def emit(self, record):
        told.append((record.levelname, record.getMessage()))
logging.getLogger("spec_decode_otel").addHandler(Keep())
logging.getLogger("spec_decode_otel").setLevel(logging.DEBUG)
spans = InMemorySpanExporter()
trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(spans))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if os.environ["HOW"] == "setup":
        spec_decode_otel.setup(inject_include_usage=True)
    else:
        SpecDecodeInstrumentor().instrument(inject_include_usage=True)
    SpecDecodeInstrumentor().instrument(inject_include_usage=False)
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
stream = client.chat.completions.create(
    model="spec-sim", messages=[{"role": "user", "content": "hi"}], stream=True
)
chunks = list(stream)
client.close()
(span,) = [s for s in spans.get_finished_spans() if s.name == "chat spec-sim"]
print(json.dumps({
    "engine": span.attributes.get("spec_decode.engine"),
    "steps": span.attributes.get("spec_decode.num_spec_steps"),
    "usage_chunks": sum(1 for c in chunks if not c.choices),
    "already": [
        (os.path.basename(w.filename), w.lineno)
        for w in caught if "already instrumented" in str(w.message)
    ],
    "told": told,
}))
"""
SECOND = "    SpecDecodeInstrumentor().instrument(inject_include_usage=False)"


@pytest.mark.parametrize("how", ["setup", "instrument"])
def test_options_in_code_replace_what_opentelemetry_instrument_set_from_the_environment(
    simulator_url: str, tmp_path: Path, how: str
) -> None:
    """``opentelemetry-instrument python app.py`` (opentelemetry-distro 0.66b2's
    configurator, then ``_load_instrumentors`` in opentelemetry-instrumentation 0.66b2
    calls ``instrument(skip_dep_check=True)`` through our entry point) instruments with
    the ``SPEC_DECODE_OTEL_*`` variables' settings before the app runs. An app that then
    says ``setup(inject_include_usage=True)`` or ``instrument(inject_include_usage=True)``
    lost its option: the first settings stayed, with an "already instrumented" warning,
    and its streamed calls to vLLM had no statistics. Options given in code replace
    settings that came from the environment only (logged at INFO on ``spec_decode_otel``);
    given a second time in code, the first stay, with the warning at the app's line."""
    app = tmp_path / "app.py"
    app.write_text(OPTIONS_IN_CODE)
    done = run_under_opentelemetry_instrument(
        app,
        SIMULATOR_URL=simulator_url,
        HOW=how,
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="openai",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # the injected include_usage: the stream's statistics, and no usage chunk for the app
    assert report["engine"] == "vllm", report
    assert report["steps"] > 0, report
    assert report["usage_chunks"] == 0, report
    # the second options in code: warned once, at the app's own line
    second = OPTIONS_IN_CODE.splitlines().index(SECOND) + 1
    assert [tuple(w) for w in report["already"]] == [("app.py", second)], report
    replaced = [m for level, m in report["told"] if "replace" in m]
    assert len(replaced) == 1, report["told"]
    assert ("INFO", replaced[0]) in [tuple(t) for t in report["told"]]


VLLM_HEADER = ("--header", "x-spec-decode-engine: vllm")


def test_check_under_opentelemetry_instrument_answers_as_without_it(simulator_url: str) -> None:
    """``opentelemetry-instrument spec-decode-otel check`` (or a pod the OTel Operator
    injects auto-instrumentation into): our process-wide instrumentor took the requests
    from check's own client, and openai-v2 (opentelemetry-instrumentation-openai-v2,
    installed here) made the span ours enriched, so every line said ``none``, the verdict
    said no stats arrived, and the check's spans went to the console exporter. Now check
    undoes the auto-instrumentation in its own process: the same answer as without it,
    and nothing exported."""
    instrument = shutil.which("opentelemetry-instrument")
    assert instrument, "opentelemetry-distro's opentelemetry-instrument is not installed"
    bare = run_check(simulator_url, "--model", "spec-sim", *VLLM_HEADER)
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    }
    done = subprocess.run(
        [instrument, *COMMAND, simulator_url, "--model", "spec-sim", *VLLM_HEADER],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert "Traceback" not in done.stderr, done.stderr
    outcomes = [re.search(rf"^  {re.escape(p)}\s+(\S+)", done.stdout, re.M) for p in PROBES]
    assert [found and found.group(1) for found in outcomes] == ["recorded", "no_stats", "recorded"]
    assert [bare[1][p].split()[0] for p in PROBES] == ["recorded", "no_stats", "recorded"]
    assert "spec_decode.outcome" not in done.stdout
    assert done.returncode == bare[0] == 0
