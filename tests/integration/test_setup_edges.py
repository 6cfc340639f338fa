"""``setup()`` and ``spec-decode-otel check`` under the standard ``OTEL_*`` variables a
user's shell or deployment already sets, each in a process of its own (``setup()``
installs process-wide state), against the simulator and a real OTLP receiver (oteltap,
over HTTP).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from check_command import run_check
from otlp_values import clean_env, otlp_attributes, receiving_otlp


async def run_exporting(script: str, **env: str) -> tuple[list[Any], list[Any], str]:
    """Run ``script`` (code, or a file's path) with OTLP/HTTP pointed at a real receiver;
    the spans and metrics it got once the process has exited (exit flushes both
    providers), and stderr."""
    async with receiving_otlp() as received:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *(["-c", script] if "\n" in script else [script]),
            env=clean_env(
                **{
                    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                    "OTEL_EXPORTER_OTLP_ENDPOINT": received.endpoint,
                    **env,
                }
            ),
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        await asyncio.sleep(0.3)  # what the exit flush sent is through the receiver
    return received.spans, received.metrics, err.decode()


ONE_CALL = """
import os, openai, spec_decode_otel
spec_decode_otel.setup("setup-edges")
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
client.chat.completions.create(model="spec-sim", messages=[{"role": "user", "content": "hi"}])
client.close()
"""


@pytest.mark.parametrize(
    ("variable", "sent"),
    [("OTEL_METRICS_EXPORTER", "spans"), ("OTEL_TRACES_EXPORTER", "metrics")],
)
async def test_setup_exports_nothing_of_a_signal_whose_exporter_is_none(
    simulator_url: str, variable: str, sent: str
) -> None:
    """``OTEL_METRICS_EXPORTER=none`` is how a deployment says "this endpoint takes no
    metrics" (OTel specification, SDK environment variables: ``none``, "no automatically
    configured exporter"), as in Jaeger's own quick start, whose OTLP endpoint serves
    traces only. ``setup()`` ignored it and exported both signals to the one endpoint:
    with the real Jaeger 2.12 behind ``OTEL_EXPORTER_OTLP_ENDPOINT``, the application
    logged "Failed to export metrics ... StatusCode.UNIMPLEMENTED" (gRPC; "code: 404" over
    HTTP) at every export interval. A signal whose exporter is ``none`` is not exported;
    the other still is."""
    spans, metrics, _ = await run_exporting(
        ONE_CALL, SIMULATOR_URL=simulator_url, **{variable: "none"}
    )
    got = {"spans": [s.name for s in spans], "metrics": [m.name for m in metrics]}
    if sent == "spans":
        assert got == {"spans": ["chat spec-sim"], "metrics": []}
    else:
        assert got["spans"] == []
        assert "spec_decode.acceptance_length" in got["metrics"]


def _report_of(script: str, simulator_url: str, *argv: str) -> Any:
    """What ``script`` printed as JSON, run with ``argv`` in a process of its own against
    the simulator (``setup()`` installs process-wide state)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        env=clean_env(SIMULATOR_URL=simulator_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


AFTER_SHUTDOWN = """
import json, os, openai, spec_decode_otel
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

first = InMemorySpanExporter()
spec_decode_otel.setup(
    "one", set_global=False, span_processors=[SimpleSpanProcessor(first)]
).shutdown()
second, reader = InMemorySpanExporter(), InMemoryMetricReader()
spec_decode_otel.setup(
    "two", set_global=False, span_processors=[SimpleSpanProcessor(second)], metric_readers=[reader]
)
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
client.chat.completions.create(model="spec-sim", messages=[{"role": "user", "content": "hi"}])
client.close()
data = reader.get_metrics_data()
print(json.dumps({
    "first": len(first.get_finished_spans()),
    "second": [s.resource.attributes["service.name"] for s in second.get_finished_spans()],
    "metrics": sorted(
        m.name for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
        for m in sm.metrics
    ),
}))
"""


def test_setup_after_shutdown_records_into_the_new_providers(simulator_url: str) -> None:
    """``Providers.shutdown()`` then ``setup()`` again (a test fixture per test, an app
    that re-initialises its telemetry) builds new providers, but the calls still went to
    the stopped ones: the instrumentor, instrumented by the first ``setup()``, kept its
    providers ("already instrumented; the first settings stay"), so the new providers
    got no span and no metric, and the stopped ones dropped everything ("Processor is
    already shutdown"). The second ``setup()``'s providers get the calls."""
    report = _report_of(AFTER_SHUTDOWN, simulator_url)
    assert report["first"] == 0
    assert report["second"] == ["two"]
    assert "spec_decode.acceptance_length" in report["metrics"]


CYCLES = """
import atexit, gc, json, os, sys, weakref, openai, spec_decode_otel
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from spec_decode_otel import sdk_setup

client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
providers, made, hooks = [], [], []
for cycle in range(6):
    built = spec_decode_otel.setup(
        f"cycle-{cycle}",
        set_global=sys.argv[1] == "global",
        span_processors=[SimpleSpanProcessor(InMemorySpanExporter())],
    )
    client.chat.completions.create(model="spec-sim", messages=[{"role": "user", "content": "hi"}])
    providers.append((weakref.ref(built.tracer_provider), weakref.ref(built.meter_provider)))
    built.shutdown()
    del built
    gc.collect()
    made.append(len(sdk_setup._made))
    hooks.append(atexit._ncallbacks())
client.close()
print(json.dumps({
    "alive": [i for i, refs in enumerate(providers) if any(ref() is not None for ref in refs)],
    "made": made,
    "hooks": hooks,
}))
"""


@pytest.mark.parametrize("where", ["global", "not-global"])
def test_setup_and_shutdown_cycles_keep_no_stopped_providers(
    simulator_url: str, where: str
) -> None:
    """``setup()`` then ``shutdown()``, again and again (a test suite's fixtures, a
    notebook cell run again, an app re-initialising its telemetry): each ``setup()``
    registered its ``Providers.shutdown`` with ``atexit`` and added its providers to a
    module-level list, neither ever removed, so every stopped provider, with its span
    processors, exporters and their buffers, stayed alive until exit. Only the providers
    still in use stay: the last ``setup()``'s (what ``setup()`` returns to and
    instruments with until the next one) and, installed globally, the first one's, which
    the OpenTelemetry API keeps (it sets a global provider once). The exit hooks and the
    providers held stay at their size after the first cycles."""
    report = _report_of(CYCLES, simulator_url, where)
    assert report["alive"] == ([0, 5] if where == "global" else [5])
    assert len(set(report["hooks"])) == 1, report["hooks"]
    held = 4 if where == "global" else 2  # the global pair and the last one's
    assert report["made"][2:] == [held] * 4, report["made"]


AFTER_UNINSTRUMENT = """
import json, os, warnings, openai, spec_decode_otel
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

spans = InMemorySpanExporter()
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
def call():
    client.chat.completions.create(model="spec-sim", messages=[{"role": "user", "content": "hi"}])
processors = [SimpleSpanProcessor(spans)]
first = spec_decode_otel.setup("one", set_global=False, span_processors=processors)
call()
spec_decode_otel.SpecDecodeInstrumentor().uninstrument()
call()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    again = spec_decode_otel.setup("two", set_global=False)
call()
client.close()
print(json.dumps({
    "same": again is first,
    "spans": len(spans.get_finished_spans()),
    "warnings": [str(w.message) for w in caught],
}))
"""


def test_setup_after_uninstrument_instruments_again_with_its_providers(
    simulator_url: str,
) -> None:
    """``setup()``, ``uninstrument()``, ``setup()`` (a test suite's fixtures, an app
    re-initialising): the second ``setup()`` returned the first one's providers with "its
    settings stay", and nothing was instrumented, so every later call went unrecorded with
    no word said. It now instruments again with the providers it built, and says so."""
    report = _report_of(AFTER_UNINSTRUMENT, simulator_url)
    assert report["same"] is True
    assert report["spans"] == 2  # the first and the third call; not the uninstrumented one
    (warning,) = report["warnings"]
    assert "instrumenting again" in warning


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_TRACES_SAMPLER": "always_off"},
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"},
        {"OTEL_SDK_DISABLED": "true"},
    ],
    ids=["always-off", "ratio-0", "sdk-disabled"],
)
def test_check_reads_every_call_whatever_the_shells_otel_variables_say(
    simulator_url: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check`` reads each call's outcome from the span the instrumentation ends, on an
    in-memory TracerProvider it builds, and the SDK's TracerProvider reads
    ``OTEL_TRACES_SAMPLER`` and ``OTEL_SDK_DISABLED`` from the environment (SDK 1.45:
    ``sampling._get_from_env_or_default``, ``TracerProvider.__init__``). Run from a shell
    that configures its application's tracing that way (production sampling, telemetry
    off), every line read ``none`` and the command said "No response carried spec-decode
    stats", exit 1, about a server that sends them. It exports nothing, so those
    variables do not apply to it: a vLLM server's non-streamed call is ``recorded``."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    status, lines, out = run_check(simulator_url, "--model", "spec-sim")
    assert lines["chat"].startswith("recorded"), out
    assert lines["stream + include_usage"].startswith("recorded"), out
    assert status == 0


@pytest.mark.parametrize("value", ["enabled", "ture", "y"])
def test_a_boolean_variable_with_a_bad_value_warns_naming_it(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README (Configuration): "A variable's bad value is not an error but a
    ``RuntimeWarning`` naming the variable, and a fallback". A boolean variable took any
    value it did not know as false, silently: ``SPEC_DECODE_OTEL_INJECT_INCLUDE_USAGE=
    enabled`` (or a typo) left vLLM streams without their stats and said nothing. It warns,
    naming the variable and the value, and the default (false) is used."""
    import openai

    import spec_decode_otel

    monkeypatch.setenv("SPEC_DECODE_OTEL_INJECT_INCLUDE_USAGE", value)
    with pytest.warns(RuntimeWarning, match=f"SPEC_DECODE_OTEL_INJECT_INCLUDE_USAGE='{value}'"):
        client = spec_decode_otel.instrument_client(openai.OpenAI(api_key="sk-test"))
    client.close()


@pytest.mark.parametrize(
    ("base_url", "says"),
    [
        ("http://127.0.0.1:9/v1", "Connection refused"),
        ("127.0.0.1:9/v1", "missing an 'http://' or 'https://' protocol"),
    ],
    ids=["refused", "no-scheme"],
)
def test_check_says_why_it_could_not_connect(base_url: str, says: str) -> None:
    """Every failure to connect read "APIConnectionError: Connection error." (openai's
    own message; httpx's reason is only the exception's ``__cause__``), so a refused
    port, an unknown host, a TLS mismatch and a URL without its scheme looked alike. Each
    line says the transport's reason."""
    status, lines, out = run_check(base_url, "--model", "m", "--timeout", "5")
    assert all(says in line for line in lines.values()), out
    assert status == 1


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_TRACES_SAMPLER": "always_off"},
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
        {"OTEL_SDK_DISABLED": "true"},
    ],
    ids=["always-off", "ratio", "sdk-disabled"],
)
def test_the_demo_summarizes_every_call_whatever_sampler_the_shell_names(
    env: dict[str, str],
) -> None:
    """The demo's summary is computed from the spans it emits, and ``setup()``'s
    TracerProvider takes its sampler from ``OTEL_TRACES_SAMPLER`` (SDK 1.45): run where
    an application's sampling is configured, it printed "no calls" and exited 1
    (``always_off``), or a summary of the sampled quarter as if it were every call
    ("calls to llama-3.1-8b-eagle3: 3   recorded 3 (100%)" for 16 requests). So did
    ``OTEL_SDK_DISABLED=true``, under which the SDK's providers are no-ops (found by a
    helper: "no calls", exit 1, all 8 calls answered). The summary counts every request
    sent."""
    done = subprocess.run(
        [sys.executable, "-m", "spec_decode_otel", "demo", "--requests", "8", "--no-progress"],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    calls = [int(n) for n in re.findall(r"^calls to \S+: (\d+)", done.stdout, re.M)]
    assert sum(calls) == 8, done.stdout


async def test_an_exporter_the_sdk_refuses_to_build_warns_and_the_app_runs(
    simulator_url: str,
) -> None:
    """``OTEL_METRIC_EXPORT_INTERVAL=0`` (taken for "off"), ``OTEL_BSP_MAX_QUEUE_SIZE=0``
    or ``OTEL_EXPORTER_OTLP_TIMEOUT=abc``: the SDK's exporters and processors raise
    ``ValueError`` when built from such values (SDK 1.45: "interval value 0.0 is invalid
    and needs to be larger than zero"), and ``setup()`` let it out, so the application
    died at start-up over its telemetry, where ``opentelemetry-instrument`` logs and runs
    on. The signal whose exporter could not be built is not exported, with a
    ``RuntimeWarning`` that says so and why; the other one still is."""
    spans, metrics, err = await run_exporting(
        ONE_CALL, SIMULATOR_URL=simulator_url, OTEL_METRIC_EXPORT_INTERVAL="0"
    )
    assert [s.name for s in spans] == ["chat spec-sim"]
    assert metrics == []
    assert "RuntimeWarning" in err and "metrics are not exported" in err, err
    assert "interval value 0.0 is invalid" in err, err


async def test_an_exporter_refused_without_a_message_is_named_by_its_exception(
    simulator_url: str,
) -> None:
    """``OTEL_PYTHON_METER_PROVIDER=bogus``: the SDK's OTLP span exporter (1.45.2) looks
    the provider up for metrics of its own and raises a bare ``StopIteration``, and the
    warning said "spans are not exported: " and nothing. The app runs on; the warning
    names the exception."""
    spans, _, err = await run_exporting(
        ONE_CALL, SIMULATOR_URL=simulator_url, OTEL_PYTHON_METER_PROVIDER="bogus"
    )
    assert spans == []
    assert "spans are not exported: StopIteration (an OTEL_* value" in err, err


@pytest.mark.parametrize(
    ("env", "named", "sent"),
    [
        (
            {"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"},
            "METRICS_PROTOCOL='http/json'",
            "spans",
        ),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grcp"}, "TRACES_PROTOCOL='grcp'", "metrics"),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grcp",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            "OTEL_EXPORTER_OTLP_PROTOCOL='grcp'",
            "spans",
        ),
    ],
)
async def test_an_otlp_protocol_the_exporters_do_not_speak_warns_naming_it_and_exports_nothing(
    simulator_url: str, env: dict[str, str], named: str, sent: str
) -> None:
    """``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the per-signal ``_TRACES_``/``_METRICS_``
    variable, which wins) set to a typo (``grcp``) or to ``http/json``, which the
    specification names but the Python exporters do not implement: the SDK's
    auto-configuration (opentelemetry-sdk 1.45.2, ``_configuration/__init__.py``,
    ``_EXPORTER_BY_OTLP_PROTOCOL`` has ``grpc`` and ``http/protobuf`` only) raises
    "Unsupported OTLP protocol ... is configured", so under ``opentelemetry-instrument``
    nothing is exported. ``setup()`` took any value but ``grpc`` for ``http/protobuf``,
    silently. Now that signal is not exported, with a ``RuntimeWarning`` naming the
    variable and its value (as for the other values the SDK refuses); a signal whose own
    variable is valid still is."""
    spans, metrics, err = await run_exporting(ONE_CALL, SIMULATOR_URL=simulator_url, **env)
    got = {"spans": [s.name for s in spans], "metrics": [m.name for m in metrics]}
    if sent == "spans":
        assert got == {"spans": ["chat spec-sim"], "metrics": []}
        assert "RuntimeWarning: spec_decode_otel.setup(): metrics are not exported" in err, err
    else:
        assert got["spans"] == []
        assert "spec_decode.acceptance_length" in got["metrics"]
        assert "RuntimeWarning: spec_decode_otel.setup(): spans are not exported" in err, err
    assert named in err, err
    assert "grpc, http/protobuf" in err, err


def test_setup_under_otel_sdk_disabled_builds_no_exporter() -> None:
    """``OTEL_SDK_DISABLED=true``: "a no-op SDK implementation will be used for all
    telemetry signals" (OTel specification, SDK environment variables; SDK 1.45's
    providers then hand out no-op tracers and meters). ``setup()`` still built both OTLP
    exporters and started their threads, and said ``exporting=True`` (so ``demo`` printed
    "exported over OTLP to the configured collector"), for providers that export
    nothing. It builds none."""
    script = (
        "import json, threading, spec_decode_otel\n"
        "built = spec_decode_otel.setup('disabled', set_global=False)\n"
        "print(json.dumps({'exporting': built.exporting,"
        " 'threads': sorted(t.name for t in threading.enumerate())}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=clean_env(OTEL_SDK_DISABLED="true", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"exporting": False, "threads": ["MainThread"]}


def test_check_interrupted_while_a_server_hangs_exits_130_without_a_traceback() -> None:
    """A server that accepts and never answers holds each of ``check``'s requests for
    ``--timeout`` (60 s by default), so a user presses Ctrl-C: the command printed
    forty lines of httpx's traceback ending in ``KeyboardInterrupt``. It exits with the
    shell's status for SIGINT, 130, and no traceback."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        url = f"http://127.0.0.1:{hung.getsockname()[1]}/v1"
        proc = subprocess.Popen(
            [sys.executable, "-m", "spec_decode_otel", "check", url, "--model", "m"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(url)  # the requests have begun
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err
    assert proc.returncode == 130


MULTIPROCESSING_APP = """
import multiprocessing, os, openai, spec_decode_otel

def work():
    client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
    client.chat.completions.create(model="spec-sim", messages=[{"role": "user", "content": "hi"}])
    client.close()

if __name__ == "__main__":
    spec_decode_otel.setup("multiprocessing-app")
    child = multiprocessing.get_context("fork").Process(target=work)
    child.start()
    child.join()
    assert child.exitcode == 0
"""


async def test_a_multiprocessing_childs_calls_are_exported(
    simulator_url: str, tmp_path: Path
) -> None:
    """``setup()`` flushes its providers at exit through ``atexit``, but a
    ``multiprocessing`` child (fork start method; Pool workers and billiard's, Celery's,
    alike) ends with ``os._exit`` after multiprocessing's own exit handlers, where
    ``atexit`` never runs: a call made in the child was recorded, then lost with the
    batch processor's queue and the metric reader's sums (no span, no metric reached
    the receiver). The child's span and metrics are exported when it ends."""
    app = tmp_path / "app.py"
    app.write_text(MULTIPROCESSING_APP)
    spans, metrics, _ = await run_exporting(str(app), SIMULATOR_URL=simulator_url)
    assert [s.name for s in spans] == ["chat spec-sim"]
    assert "spec_decode.acceptance_length" in {m.name for m in metrics}


HELD_STREAM_APP = """
import os, openai, spec_decode_otel
spec_decode_otel.setup("held-stream-app")
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
messages = [{"role": "user", "content": "hi"}]
client.chat.completions.create(model="spec-sim", messages=messages)
stream = client.chat.completions.create(model="spec-sim", messages=messages, stream=True)
for chunk in stream:
    break  # read no further; `stream` stays referenced until the interpreter exits
"""


async def test_a_stream_still_held_at_exit_is_exported_as_not_read_to_end(
    simulator_url: str,
) -> None:
    """A script that stops reading a stream kept in a module-level variable: the
    collector reclaims it only at module teardown, after the providers' exit handlers
    have stopped exporting, so its call had no span and was not counted. It is ended at
    exit, before they flush."""
    spans, metrics, _ = await run_exporting(HELD_STREAM_APP, SIMULATOR_URL=simulator_url)
    outcomes = sorted(
        (a["spec_decode.outcome"], a.get("spec_decode.read_to_end"))
        for a in map(otlp_attributes, spans)
    )
    assert outcomes == [("not_read_to_end", False), ("recorded", None)]
    # cumulative: the last export (exit flushes, then shuts down) holds every count
    requests = [m for m in metrics if m.name == "spec_decode.requests"][-1]
    counts = {otlp_attributes(p)["spec_decode.outcome"]: p.as_int for p in requests.sum.data_points}
    assert counts == {"recorded": 1, "not_read_to_end": 1}


HELD_RESPONSE_APP = """
import os, openai, spec_decode_otel
providers = spec_decode_otel.setup("held-response-app")
client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
kwargs = {"model": "spec-sim", "messages": [{"role": "user", "content": "hi"}], "stream": True}
for chunk in client.chat.completions.create(**kwargs):
    pass  # the first stream, read to its end
held = os.environ["HELD"]
if held == "streaming-response":
    response = client.chat.completions.with_streaming_response.create(**kwargs).__enter__()
elif held == "raw-response":
    response = client.chat.completions.with_raw_response.create(**kwargs)
else:  # new providers, made after the first stream, and a stream held
    providers.shutdown()
    spec_decode_otel.setup("held-response-app")
    response = client.chat.completions.create(**kwargs)
    next(response)
"""


@pytest.mark.parametrize("held", ["streaming-response", "raw-response", "providers-made-since"])
async def test_a_response_still_held_at_exit_is_exported_as_not_read_to_end(
    held: str, simulator_url: str
) -> None:
    """Two ways out that the held stream's test did not take, found by probing exits:
    a response of ``with_streaming_response`` or ``with_raw_response`` whose body was
    never read or parsed had no exit hook at all; and the hook, registered once at the
    first stream, ran after the exit handlers of providers made since (atexit runs the
    last one first), whose processors had stopped. Either call had no span and no count."""
    spans, metrics, _ = await run_exporting(
        HELD_RESPONSE_APP, SIMULATOR_URL=simulator_url, HELD=held
    )
    outcomes = sorted(
        (a["spec_decode.outcome"], a.get("spec_decode.read_to_end"))
        for a in map(otlp_attributes, spans)
    )
    # The first stream asked for no usage chunk, where the simulator's vLLM sends its stats.
    assert outcomes == [("no_stats", None), ("not_read_to_end", False)]
    if held != "providers-made-since":  # new providers count anew
        requests = [m for m in metrics if m.name == "spec_decode.requests"][-1]
        points = requests.sum.data_points
        counts = {otlp_attributes(p)["spec_decode.outcome"]: p.as_int for p in points}
        assert counts == {"no_stats": 1, "not_read_to_end": 1}


@pytest.mark.parametrize(
    ("keyword", "value"),
    [("inject_include_usage", "false"), ("per_step_max_length", "10")],
)
def test_a_keyword_of_the_wrong_type_is_an_error(keyword: str, value: object) -> None:
    """Keywords are checked by name only (README: "Unknown keywords ... are an error"),
    so one of the wrong type, as a configuration file's string gives it, was taken as it
    came: ``inject_include_usage="false"`` is truthy and turned injection on;
    ``per_step_max_length="10"`` made every call an internal error ("'<=' not supported
    between instances of 'int' and 'str'", logged) whose span had no outcome and no
    record. Either is a ``TypeError`` naming the keyword when instrumenting."""
    import openai

    import spec_decode_otel

    client = openai.OpenAI(api_key="sk-test")
    try:
        with pytest.raises(TypeError, match=keyword):
            spec_decode_otel.instrument_client(client, **{keyword: value})
    finally:
        client.close()
