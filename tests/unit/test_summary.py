"""The records file and ``spec-decode-otel summarize``: rows from span attributes, reading
(and refusing) lines, every figure of the summary on records whose answers are worked
out by hand, the text and JSON outputs, and the command, which needs the core only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spec_decode_otel import SpecDecodeAcceptanceRecord
from spec_decode_otel.cli import main as cli_main
from spec_decode_otel.summary import (
    SHOWN_SKIPPED,
    Skipped,
    read_rows,
    render,
    row_for_span,
    summarize,
    to_json,
)
from spec_decode_otel.telemetry import record_attributes


def vllm(histogram: dict[int, int], **extra: Any) -> SpecDecodeAcceptanceRecord:
    """A full vLLM record with k=4 (every step drafts 4), its figures from ``histogram``."""
    steps = sum(histogram.values())
    accepted = sum(j * count for j, count in histogram.items())
    return SpecDecodeAcceptanceRecord(
        engine="vllm",
        mean_acceptance_length=1 + accepted / steps,
        draft_acceptance_rate=accepted / (4 * steps),
        acceptance_histogram=histogram,
        num_accepted_draft_tokens=accepted,
        num_draft_tokens=4 * steps,
        num_spec_steps=steps,
        num_spec_tokens=4,
        **extra,
    )


#: 2 steps accepting 0 and 2 drafts (2 of 8, mean 2.0); 4 steps accepting 1, 1, 4, 4
#: (10 of 16, mean 3.5).
VLLM_A = vllm({0: 1, 2: 1}, completion_tokens=5, per_step_accepted=[0, 2], per_step_drafted=[4, 4])
VLLM_B = vllm({1: 2, 4: 2})
#: llama.cpp: counts and rate, no steps, no histogram.
LLAMACPP = SpecDecodeAcceptanceRecord(
    engine="llamacpp", draft_acceptance_rate=0.3, num_accepted_draft_tokens=3, num_draft_tokens=10
)
#: A released TensorRT-LLM server: the mean only.
TRTLLM = SpecDecodeAcceptanceRecord(engine="tensorrt_llm", mean_acceptance_length=2.5)


def line(model: str | None, outcome: str, record: SpecDecodeAcceptanceRecord | None) -> str:
    return json.dumps(
        {
            "model": model,
            "server": "127.0.0.1:8000",
            "outcome": outcome,
            "engine": record.engine if record else None,
            "trace_id": None,
            "span_id": None,
            "record": record.model_dump(mode="json") if record else None,
        }
    )


LINES = [
    line("m", "recorded", VLLM_A),
    line("m", "recorded", VLLM_B),
    line("m", "no_stats", None),
    line("m", "not_read_to_end", None),
    line("m", "partial", LLAMACPP),
    line("m", "no_stats", None),
    line("other", "partial", TRTLLM),
    line(None, "error", None),
]


# -- rows from spans ----------------------------------------------------------------------


def span_attributes(record: SpecDecodeAcceptanceRecord, outcome: str) -> dict[str, Any]:
    """What the instrumentation puts on a call's span (telemetry's own mapping)."""
    return {
        **record_attributes(record, per_step_max_length=1024),
        "spec_decode.outcome": outcome,
        "gen_ai.request.model": "m",
        "gen_ai.usage.output_tokens": record.completion_tokens,
        "server.address": "10.0.0.7",
        "server.port": 8000,
    }


@pytest.mark.parametrize("record", [VLLM_A, VLLM_B, LLAMACPP, TRTLLM], ids=lambda r: r.engine)
def test_a_span_gives_back_its_record(record: SpecDecodeAcceptanceRecord) -> None:
    outcome = "partial" if record.is_partial else "recorded"
    attrs = {k: v for k, v in span_attributes(record, outcome).items() if v is not None}
    row = row_for_span(attrs, trace_id=0xABC, span_id=0x12)
    assert row == {
        "model": "m",
        "server": "10.0.0.7:8000",
        "outcome": outcome,
        "engine": record.engine,
        "trace_id": f"{0xABC:032x}",
        "span_id": f"{0x12:016x}",
        "record": record.model_dump(mode="json"),
    }
    # The JSON line reads back as the same record.
    skipped = Skipped()
    (row_back,) = read_rows([json.dumps(row)], skipped)
    assert skipped.count == 0 and row_back.record == record


def test_a_call_without_record_is_a_row_and_other_spans_are_not() -> None:
    attrs = {"spec_decode.outcome": "no_stats", "gen_ai.response.model": "served-name"}
    assert row_for_span(attrs) == {
        "model": "served-name",
        "server": None,
        "outcome": "no_stats",
        "engine": None,
        "trace_id": None,
        "span_id": None,
        "record": None,
    }
    assert row_for_span({"gen_ai.request.model": "m", "http.method": "POST"}) is None


# -- reading ------------------------------------------------------------------------------


def test_lines_that_are_not_rows_are_reported_by_number() -> None:
    bad_record = json.loads(line("m", "recorded", VLLM_A))
    bad_record["record"]["num_spec_steps"] = 3  # the histogram sums to 2
    skipped = Skipped()
    rows = list(
        read_rows(
            [
                line("m", "recorded", VLLM_A),
                "",
                "not json",
                json.dumps({**json.loads(line("m", "no_stats", None)), "outcome": "lost"}),
                json.dumps(bad_record),
                "[1, 2]",
                line("m", "no_stats", None),
            ],
            skipped,
        )
    )
    assert [r.outcome for r in rows] == ["recorded", "no_stats"]
    problems = skipped.reasons
    assert [p.split(":")[0] for p in problems] == ["line 3", "line 4", "line 5", "line 6"]
    assert "unknown outcome 'lost'" in problems[1]
    # a rejected record names the field and the rule it broke (pydantic's header alone,
    # "1 validation error for SpecDecodeAcceptanceRecord", said neither), not its values
    assert problems[2].startswith("line 5: record rejected: ")
    assert "num_spec_steps" in problems[2] and "validation error" not in problems[2]
    assert "not a JSON object" in problems[3]


# -- the figures ----------------------------------------------------------------------------


def test_every_figure_pools_the_records_that_report_it() -> None:
    skipped = Skipped()
    summaries = summarize(read_rows(LINES, skipped))
    assert skipped.count == 0
    assert [s.model for s in summaries] == ["m", "other", None]
    m = summaries[0]
    assert m.calls == 6
    assert dict(m.outcomes) == {"recorded": 2, "no_stats": 2, "not_read_to_end": 1, "partial": 1}

    vllm, llamacpp = m.engines["vllm"], m.engines["llamacpp"]
    assert vllm.requests == 2 and vllm.num_spec_tokens == {4}
    assert vllm.mean_acceptance_length == pytest.approx((2.0 + 3.5) / 2)
    assert vllm.token_weighted_acceptance_length == pytest.approx(1 + 12 / 6)
    assert vllm.draft_acceptance_rate == pytest.approx(12 / 24)
    # (accepted + one bonus per step) / (drafted + one bonus per step)
    assert vllm.accepted_per_verified == pytest.approx((12 + 6) / (24 + 6))
    assert dict(vllm.histogram) == {0: 1, 1: 2, 2: 1, 4: 2}
    # Of 6 steps: 5 accepted position 0, 3 position 1, 2 positions 2 and 3.
    assert vllm.acceptance_at_position() == pytest.approx({0: 5 / 6, 1: 3 / 6, 2: 2 / 6, 3: 2 / 6})

    assert llamacpp.requests == 1 and llamacpp.num_spec_tokens == set()
    assert llamacpp.draft_acceptance_rate == pytest.approx(0.3)
    assert llamacpp.mean_acceptance_length is None
    assert llamacpp.token_weighted_acceptance_length is None
    assert llamacpp.accepted_per_verified is None
    assert llamacpp.acceptance_at_position() == {}

    trtllm = summaries[1].engines["tensorrt_llm"]
    assert trtllm.mean_acceptance_length == 2.5 and trtllm.draft_acceptance_rate is None
    assert summaries[2].engines == {} and dict(summaries[2].outcomes) == {"error": 1}


def test_json_and_text_say_the_same() -> None:
    summaries = summarize(read_rows(LINES, Skipped()))
    data = to_json(summaries)
    assert json.loads(json.dumps(data)) == data  # plain JSON types only
    assert data["calls"] == 8
    m = data["models"][0]
    assert (m["model"], m["calls"]) == ("m", 6)
    assert [e["engine"] for e in m["engines"]] == ["llamacpp", "vllm"]
    vllm = m["engines"][1]
    assert vllm["acceptance_histogram"] == {"0": 1, "1": 2, "2": 1, "4": 2}
    assert vllm["acceptance_at_position"]["0"] == pytest.approx(5 / 6)
    assert vllm["num_spec_tokens"] == [4]

    text = render(summaries, "records.jsonl")
    assert "per-request acceptance (from records.jsonl)" in text
    assert "model m   engine vllm   k=4\n  requests                          2\n" in text
    assert "  token-weighted acceptance length  3.000\n" in text
    assert "  accepted per verified             0.600\n" in text
    assert "  per-position acceptance           p0=0.83  p1=0.50  p2=0.33  p3=0.33\n" in text
    assert "     4 | ############################## 2\n" in text
    assert "     3 |                                0\n" in text
    assert "model m   engine llamacpp   k=?\n" in text
    assert "  mean acceptance length (per req)  n/a\n" in text
    assert (
        "calls to m: 6   no_stats 2 (33%), recorded 2 (33%), not_read_to_end 1 (17%), "
        "partial 1 (17%)\n" in text
    )
    assert "calls to ?: 1   error 1 (100%)" in text


# -- the command ------------------------------------------------------------------------------


@pytest.fixture
def records_file(tmp_path: Path) -> Path:
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def test_summarize_prints_the_summary(
    records_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["summarize", str(records_file)]) == 0
    out = capsys.readouterr().out
    assert out.strip() == render(summarize(read_rows(LINES, Skipped())), str(records_file)).strip()


def test_summarize_json(records_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with records_file.open("a", encoding="utf-8") as handle:
        handle.write("garbage\n")
    assert cli_main(["summarize", "--json", str(records_file)]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data == {**to_json(summarize(read_rows(LINES, Skipped()))), "skipped_lines": 1}
    assert captured.err.strip() == (
        f"spec-decode-otel summarize: {records_file}: line 9: "
        "Expecting value: line 1 column 1 (char 0)"
    )


def test_summarize_an_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["summarize", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_summarize_needs_the_core_only(records_file: Path) -> None:
    """The command runs with the OpenTelemetry SDK unimportable, and importing the
    package loads neither the SDK nor the records processor."""
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith(('opentelemetry.sdk', 'openai', 'fastapi')):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import spec_decode_otel\n"
        "assert 'spec_decode_otel.records' not in sys.modules\n"
        "from spec_decode_otel.cli import main\n"
        "sys.exit(main(['summarize', '--json', sys.argv[1]]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(records_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["calls"] == len(LINES)


# -- what no records file holds --------------------------------------------------------------


def test_a_file_that_is_no_records_file_says_why_for_the_first_lines_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong file (a log, a capture) was read whole and said one stderr line per line:
    ten million lines cost a minute, 1.4 GB and 830 MB of stderr, then exit 0 with "no
    calls". The first reasons are said, the rest counted, and exit status 1 says that no
    line was a record."""
    path = tmp_path / "app.log"
    path.write_text("x\n" * 100_000, encoding="utf-8")
    assert cli_main(["summarize", "--json", str(path)]) == 1
    captured = capsys.readouterr()
    said = captured.err.splitlines()
    assert len(said) == SHOWN_SKIPPED + 1
    assert said[-1].endswith(f"{100_000 - SHOWN_SKIPPED} more lines skipped")
    assert json.loads(captured.out)["skipped_lines"] == 100_000


def test_a_line_past_the_bound_is_skipped_and_the_lines_after_it_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "records.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        handle.write(LINES[0] + "\n")
        handle.write('{"model": "' + "m" * (5 * 1024 * 1024) + '"}\n')
        handle.write("\n".join(LINES[1:]) + "\n")
    assert cli_main(["summarize", "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["calls"] == len(LINES)
    assert "line 2: longer than" in captured.err


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_a_line_separator_in_a_model_name_does_not_split_its_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], separator: str
) -> None:
    """``str.splitlines`` also ends lines at U+2028, U+2029 and U+0085, which JSON strings
    hold raw (a model name comes from the server's answer): the row was cut in two and
    the line numbers after it were off. Lines end at LF, CRLF and CR only."""
    row = json.loads(LINES[0])
    row["model"] = f"m{separator}x"
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n" + "bad\n", encoding="utf-8")
    assert cli_main(["summarize", "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["models"][0]["model"] == f"m{separator}x"
    assert "line 2: " in captured.err


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_a_records_file_with_a_byte_order_mark_is_read_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], encoding: str
) -> None:
    """Windows editors write UTF-8 with a BOM, PowerShell 5's ``>`` UTF-16: the BOM made
    the first record a bad line (or the file unreadable)."""
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(LINES) + "\n", encoding=encoding)
    assert cli_main(["summarize", "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["calls"] == len(LINES)
    assert captured.err == ""


def test_a_model_name_with_control_characters_is_printed_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model name comes from the server's answer (``gen_ai.response.model``) or from
    whoever wrote the file: printed raw, ESC[2J cleared the user's terminal."""
    row = json.loads(LINES[0])
    row["model"] = "m\x1b[2J\x9b\u202e"
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    assert cli_main(["summarize", str(path)]) == 0
    out = capsys.readouterr().out
    assert "calls to m\\x1b[2J\\x9b\\u202e: 1" in out
    assert not any(c in out for c in "\x1b\x9b\u202e")
