"""``RecordsFileProcessor`` on real calls: one line per instrumented call whatever its
outcome, whose record is the one the response's own payload gives, and which
``spec-decode-otel summarize`` reads back.

The calls go through the real ``openai`` SDK to the simulator subprocess; the payload
each line is checked against is the same seeded request sent again without the SDK.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from instrumentation_helpers import MESSAGES, MODEL, Otel, raw_payload, server_of
from opentelemetry.sdk.trace import TracerProvider

from spec_decode_otel import record_from_json
from spec_decode_otel.cli import main as cli_main
from spec_decode_otel.records import RecordsFileProcessor

#: (headers, extra kwargs, how the call is read, outcome)
CALLS: list[tuple[dict[str, str], dict[str, Any], str, str]] = [
    ({}, {}, "create", "recorded"),
    ({"x-spec-decode-engine": "llamacpp"}, {}, "create", "partial"),
    ({}, {"stream": True, "stream_options": {"include_usage": True}}, "read", "recorded"),
    ({"x-spec-decode-engine": "none"}, {}, "create", "no_stats"),
    ({}, {"stream": True}, "break", "not_read_to_end"),
    ({"x-sim-fault": "http-500"}, {}, "error", "error"),
]


def _call(client: openai.OpenAI, kwargs: dict[str, Any], how: str) -> None:
    if how == "create":
        client.chat.completions.create(**kwargs)
    elif how == "read":
        assert list(client.chat.completions.create(**kwargs))
    elif how == "break":
        with client.chat.completions.create(**kwargs) as stream:
            next(iter(stream))
    else:
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(**kwargs)


def test_one_line_per_call_with_its_record(
    otel: Otel, simulator_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "records.jsonl"
    processor = RecordsFileProcessor(path)
    otel.tracer_provider.add_span_processor(processor)
    otel.instrument(record_per_step=True)
    sent = []
    with openai.OpenAI(api_key="sk-test", base_url=simulator_url, max_retries=0) as client:
        for seed, (headers, extra, how, _) in enumerate(CALLS, start=700):
            kwargs = {
                "model": MODEL,
                "messages": MESSAGES,
                "extra_headers": {"x-sim-seed": str(seed), **headers},
                **extra,
            }
            _call(client, kwargs, how)
            sent.append(kwargs)
    assert processor.force_flush()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    spans = otel.spans()
    assert len(lines) == len(spans) == len(CALLS)

    host, port = server_of(simulator_url)
    for row, span, kwargs, (_, _, _, outcome) in zip(lines, spans, sent, CALLS, strict=True):
        want = None
        if outcome in ("recorded", "partial"):
            want = record_from_json(raw_payload(simulator_url, "chat", kwargs))
            assert want is not None
        assert row == {
            "model": MODEL,
            "server": f"{host}:{port}",
            "outcome": outcome,
            "engine": want.engine if want else None,
            "trace_id": f"{span.context.trace_id:032x}",
            "span_id": f"{span.context.span_id:016x}",
            "record": want.model_dump(mode="json") if want else None,
        }
    # vLLM detailed: the per-step arrays travel too (record_per_step=True).
    assert lines[0]["record"]["per_step_accepted"]

    assert cli_main(["summarize", "--json", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    (model,) = summary["models"]
    assert model["outcomes"] == {
        "error": 1,
        "no_stats": 1,
        "not_read_to_end": 1,
        "partial": 1,
        "recorded": 2,
    }
    assert {e["engine"]: e["requests"] for e in model["engines"]} == {"llamacpp": 1, "vllm": 2}

    processor.shutdown()
    assert processor.force_flush()  # harmless once closed


def test_an_open_stream_is_left_open(tmp_path: Path) -> None:
    """Given a stream, the processor writes to it and never closes it."""
    with open(tmp_path / "out.jsonl", "w", encoding="utf-8") as handle:
        provider = TracerProvider()
        provider.add_span_processor(RecordsFileProcessor(handle))
        span = provider.get_tracer("t").start_span(
            "call", attributes={"spec_decode.outcome": "error"}
        )
        span.end()
        provider.get_tracer("t").start_span("unrelated").end()
        provider.shutdown()
        assert not handle.closed
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in rows] == ["error"]


class FullDisk(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")


def test_a_failing_write_never_fails_the_span_end(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="spec_decode_otel")
    provider = TracerProvider()
    provider.add_span_processor(RecordsFileProcessor(FullDisk()))
    provider.get_tracer("t").start_span("call", attributes={"spec_decode.outcome": "error"}).end()
    provider.shutdown()
    assert [r.getMessage() for r in caplog.records if r.name == "spec_decode_otel"] == [
        "could not write a record line"
    ]


FILE_SIZE_LIMIT_APP = """
import os, resource, signal, sys
from opentelemetry.sdk.trace import TracerProvider
from spec_decode_otel.records import RecordsFileProcessor

path = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
provider = TracerProvider()
provider.add_span_processor(RecordsFileProcessor(path))
tracer = provider.get_tracer("app")
attributes = {"spec_decode.outcome": "no_stats", "gen_ai.request.model": "m"}
for _ in range(3):
    tracer.start_span("call", attributes=attributes).end()
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 20, hard))
tracer.start_span("call", attributes=attributes).end()  # 20 bytes of it, then EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # room again
for _ in range(2):
    tracer.start_span("call", attributes=attributes).end()
provider.shutdown()
"""


def test_a_line_cut_short_by_a_full_file_system_loses_only_itself(tmp_path: Path) -> None:
    """The kernel refuses a write past the file size limit (``RLIMIT_FSIZE``, EFBIG) as
    it refuses one on a full disk (ENOSPC): part of the line is written, the rest is not.
    The next line, once there is room again, was appended to the torn one, and
    ``summarize`` skipped both; it now starts on a line of its own."""
    path = tmp_path / "records.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMIT_APP, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = path.read_text(encoding="ascii").splitlines()
    assert len(lines[3]) == 20  # the torn line, alone
    assert [json.loads(line)["outcome"] for line in lines[:3] + lines[4:]] == ["no_stats"] * 5
