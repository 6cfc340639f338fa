"""Records from saved text: JSON bodies, chunk arrays, JSON lines, raw SSE; the parse CLI."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from record_json import dump_like
from spec_decode_otel import record_from_text
from spec_decode_otel.cli import main as cli_main
from spec_decode_otel.payloads import MAX_PAYLOADS, parse_payloads

DATA = Path(__file__).resolve().parents[1] / "data"
PAYLOADS = DATA / "payloads"
STREAM = json.loads((DATA / "wire-examples" / "vllm_merged_stream_chat.json").read_text())
CHUNKS = STREAM["chunks"]
EXPECTED = STREAM["expected_record"]
PREMERGE = json.loads((DATA / "wire-examples" / "vllm_premerge_chat.json").read_text())


def sse(chunks, *, newline="\n", done=True) -> str:
    events = [f"data: {json.dumps(c)}{newline}{newline}" for c in chunks]
    return "".join(events) + (f"data: [DONE]{newline}{newline}" if done else "")


def dumped(record):
    return dump_like(record, EXPECTED)


# ---------------------------------------------------------------- record_from_text forms


def test_json_body_gives_its_record():
    record = record_from_text(json.dumps(PREMERGE["response"], indent=2))
    assert dumped(record) == PREMERGE["expected_record"]


def test_json_array_of_chunks_gives_the_stream_record():
    assert dumped(record_from_text(json.dumps(CHUNKS))) == EXPECTED


def test_json_lines_of_chunks_give_the_stream_record():
    text = "\n".join(json.dumps(c) for c in CHUNKS) + "\n\n"
    assert dumped(record_from_text(text)) == EXPECTED


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
@pytest.mark.parametrize("form", ["json-lines", "sse"])
def test_unicode_line_separators_inside_content_do_not_split_a_chunk(separator, form):
    """JSON strings may hold U+2028, U+2029 and U+0085 unescaped (RFC 8259 escapes only
    controls below U+0020), and a server that writes UTF-8 JSON sends them raw; only
    ``\\n`` (or ``\\r``) ends a line of a capture."""
    chunks = json.loads(json.dumps(CHUNKS))
    content = next(c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content"))
    content["choices"][0]["delta"]["content"] += f"one{separator}two"
    lines = [json.dumps(c, ensure_ascii=False) for c in chunks]
    assert separator in "".join(lines)
    if form == "json-lines":
        text = "\n".join(lines) + "\n"
    else:
        text = "".join(f"data: {line}\n\n" for line in lines) + "data: [DONE]\n\n"
    assert len(parse_payloads(text)) == len(chunks)
    assert dumped(record_from_text(text)) == EXPECTED


def test_raw_sse_with_done_gives_the_stream_record():
    assert dumped(record_from_text(sse(CHUNKS))) == EXPECTED


def test_raw_sse_with_crlf_line_ends_gives_the_stream_record():
    text = sse(CHUNKS, newline="\r\n")
    assert "\r\n" in text
    assert dumped(record_from_text(text)) == EXPECTED


def test_sse_comment_event_id_and_retry_lines_are_ignored():
    text = ": keep-alive\n\nretry: 100\n\n" + "".join(
        f"id: {i}\nevent: message\ndata: {json.dumps(c)}\n: note\n\n" for i, c in enumerate(CHUNKS)
    )
    assert len(parse_payloads(text)) == len(CHUNKS)
    assert dumped(record_from_text(text)) == EXPECTED


def test_sse_event_split_over_two_data_lines_is_joined():
    last = json.dumps(CHUNKS[-1], indent=1).split("\n")
    split_event = "".join(f"data: {line}\n" for line in last) + "\n"
    text = sse(CHUNKS[:-1], done=False) + split_event + "data: [DONE]\n\n"
    payloads = parse_payloads(text)
    assert payloads[-1] == CHUNKS[-1]
    assert dumped(record_from_text(text)) == EXPECTED


def test_sse_truncated_final_line_is_dropped_and_the_rest_still_counts():
    text = sse(CHUNKS, done=False) + 'data: {"id": "chatcmpl-s1", "object": "chat.comp'
    assert len(parse_payloads(text)) == len(CHUNKS)
    assert dumped(record_from_text(text)) == EXPECTED


def test_sse_data_without_space_after_the_colon_is_read():
    text = "".join(f"data:{json.dumps(c)}\n\n" for c in CHUNKS)
    assert dumped(record_from_text(text)) == EXPECTED


def test_sse_whose_stats_event_was_cut_off_has_no_record():
    text = sse(CHUNKS[:-1], done=False) + "data: " + json.dumps(CHUNKS[-1])[:-40]
    assert record_from_text(text) is None


def test_captured_sse_file_with_every_quirk_gives_the_stream_record():
    raw = (PAYLOADS / "vllm_merged_stream.sse").read_bytes()
    assert b"\r\n" in raw  # the file really has CRLF line ends
    text = raw.decode("utf-8")
    assert parse_payloads(text) == CHUNKS
    assert dumped(record_from_text(text)) == EXPECTED


@pytest.mark.parametrize(
    "text",
    ["", "   \n\t\n", "hello world", "{not json", "data: [DONE]\n\n", ": only a comment\n"],
    ids=["empty", "blank", "garbage", "broken-json", "sse-without-data", "sse-comment-only"],
)
def test_unreadable_text_raises_value_error(text):
    with pytest.raises(ValueError):
        record_from_text(text)


def test_json_lines_with_one_bad_line_name_the_line():
    with pytest.raises(ValueError, match="line 2"):
        parse_payloads('{"a": 1}\n{"b": \n{"c": 3}\n')


def test_deeply_nested_json_is_unreadable_not_a_crash():
    with pytest.raises(ValueError):
        parse_payloads("[" * 100_000)


def test_json_that_is_not_a_response_gives_no_record():
    assert record_from_text("42") is None
    assert record_from_text("[1, 2, 3]") is None
    assert record_from_text('{"choices": "nope"}') is None


# ---------------------------------------------------------------- the parse command


@pytest.mark.parametrize(
    "name",
    ["vllm_merged_stream.sse", "vllm_merged_stream.jsonl", "vllm_merged_stream_chunks.json"],
)
def test_parse_command_prints_the_record_as_json(capsys, name):
    assert cli_main(["parse", str(PAYLOADS / name)]) == 0
    out, err = capsys.readouterr()
    assert dump_like(json.loads(out), EXPECTED) == EXPECTED
    assert err == ""


def test_parse_command_reads_stdin_for_dash(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _stdin(sse(CHUNKS).encode()))
    assert cli_main(["parse", "-"]) == 0
    assert dump_like(json.loads(capsys.readouterr().out), EXPECTED) == EXPECTED


def test_parse_command_prints_null_for_a_body_without_stats_and_says_why(capsys):
    assert cli_main(["parse", str(PAYLOADS / "plain_openai_body.json")]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "null"
    assert err == "spec-decode-otel parse: no record (no_stats)\n"


def test_parse_command_says_which_rule_an_invalid_payload_broke(capsys, tmp_path):
    """README sends a user whose calls end ``invalid`` here, and all it printed was
    ``null``: the outcome and the first rule broken (the span's debug log line) go to
    stderr, stdout stays the JSON a script reads."""
    body = json.loads((PAYLOADS / "vllm_premerge_body.json").read_text(encoding="utf-8"))
    body["choices"][0]["speculative_decoding_stats"]["num_spec_steps"] = 44  # histogram: 43
    assert cli_main(["parse", _write(tmp_path, json.dumps(body).encode())]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "null"
    assert err == (
        "spec-decode-otel parse: no record (invalid: vllm payload: Value error, "
        "histogram counts do not sum to num_spec_steps)\n"
    )


def _stdin(data: bytes) -> io.TextIOWrapper:
    """Standard input holding ``data``, with the binary buffer a real one has."""
    return io.TextIOWrapper(io.BufferedReader(io.BytesIO(data)), encoding="utf-8")


def _write(tmp_path, data: bytes) -> str:
    path = tmp_path / "input"
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    "make_path",
    [
        lambda tmp: str(tmp / "does-not-exist.json"),
        lambda tmp: str(tmp),  # a directory
        lambda tmp: _write(tmp, b""),
        lambda tmp: _write(tmp, b"this is not a capture\nat all\n"),
        lambda tmp: _write(tmp, b"\xc3\x28garbage"),
        lambda tmp: _write(tmp, b"[" * 100_000),
    ],
    ids=["missing", "directory", "empty", "garbage", "not-utf8", "too-deep"],
)
def test_parse_command_unreadable_input_is_one_line_on_stderr_and_exit_2(
    capsys, tmp_path, make_path
):
    path = make_path(tmp_path)
    assert cli_main(["parse", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("spec-decode-otel parse: cannot read")


@pytest.mark.parametrize(
    "data",
    [b"{", b"[" * 100_000 + b"]" * 100_000, b"\xc3\x28"],
    ids=["not-json", "too-deep", "not-utf8"],
)
def test_parse_command_unreadable_request_file_is_one_line_on_stderr_and_exit_2(
    capsys, tmp_path, data
):
    """Too deep, ``json`` raises RecursionError, not ValueError: that was a traceback."""
    body = str(PAYLOADS / "vllm_premerge_body.json")
    assert cli_main(["parse", body, "--request", _write(tmp_path, data)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("spec-decode-otel parse: cannot read")


def test_parse_command_empty_stdin_is_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _stdin(b""))
    assert cli_main(["parse", "-"]) == 2
    assert "empty input" in capsys.readouterr().err


def test_parse_command_reads_a_json_body(capsys):
    assert cli_main(["parse", str(PAYLOADS / "vllm_premerge_body.json")]) == 0
    assert dump_like(json.loads(capsys.readouterr().out), EXPECTED) == PREMERGE["expected_record"]


def test_python_dash_m_parse_from_stdin_in_a_subprocess():
    done = subprocess.run(
        [sys.executable, "-m", "spec_decode_otel", "parse", "-"],
        input=(PAYLOADS / "vllm_merged_stream.sse").read_bytes(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert dump_like(json.loads(done.stdout), EXPECTED) == EXPECTED


def test_python_dash_m_parse_of_garbage_exits_2_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "spec_decode_otel", "parse", _write(tmp_path, b"garbage")],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == b""
    assert len(done.stderr.decode().strip().splitlines()) == 1


def test_an_input_that_never_ends_is_refused_past_the_bound():
    """``parse /dev/zero`` (or a stream piped in and never closed) read everything before
    comparing with the 64 MiB bound: it took all of a 24 GiB machine's memory and was
    killed. At most the bound is read. Run under a 1 GiB address-space limit, so that
    without the bound it fails (MemoryError) instead of taking the machine."""
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from spec_decode_otel.cli import main\n"
        "sys.exit(main(['parse', '/dev/zero']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip() == "spec-decode-otel parse: cannot read /dev/zero: larger than 64 MiB"
    )


@pytest.mark.parametrize(
    ("form", "line"), [("json-lines", "{}\n"), ("sse", "data: {}\n\n")], ids=["jsonl", "sse"]
)
def test_a_capture_of_millions_of_tiny_payloads_is_refused_at_the_payload_bound(
    tmp_path, form, line
):
    """64 MiB of ``{}`` lines is 22 million payloads: each line was split off, decoded,
    kept and run through detection, 3.5 GB and 224 s for the CLI (found by a helper).
    Lines and events are now read one at a time and counted, and past ``MAX_PAYLOADS``
    the input is refused. Run under a 1 GiB address-space limit, which the old way
    broke."""
    capture = tmp_path / f"tiny.{form}"
    capture.write_text(line * ((64 << 20) // len(line) - 1))
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from spec_decode_otel.cli import main\n"
        f"sys.exit(main(['parse', {str(capture)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(f"more than {MAX_PAYLOADS:,} payloads")


def test_a_capture_at_the_payload_bound_is_read():
    """The bound leaves room for a stream of 128k tokens, one chunk each."""
    assert len(parse_payloads("{}\n" * MAX_PAYLOADS)) == MAX_PAYLOADS
    assert len(parse_payloads("data: {}\n\n" * MAX_PAYLOADS)) == MAX_PAYLOADS
    with pytest.raises(ValueError, match="payloads"):
        parse_payloads("[" + ",".join(["{}"] * (MAX_PAYLOADS + 1)) + "]")


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
@pytest.mark.parametrize("name", ["vllm_merged_stream.sse", "vllm_premerge_body.json"])
def test_a_capture_with_a_byte_order_mark_gives_its_record(capsys, tmp_path, encoding, name):
    """Saved on Windows: UTF-8 with a BOM (Notepad) or UTF-16 (PowerShell 5's ``>``). The
    BOM made the capture unreadable ("decode using utf-8-sig", said the error)."""
    text = (PAYLOADS / name).read_text(encoding="utf-8")
    path = _write(tmp_path, text.encode(encoding))
    assert cli_main(["parse", str(PAYLOADS / name)]) == 0
    want = json.loads(capsys.readouterr().out)
    assert cli_main(["parse", path]) == 0
    assert want is not None
    assert json.loads(capsys.readouterr().out) == want


def test_parse_command_refuses_standard_input_for_both_capture_and_request(capsys, monkeypatch):
    """``parse - --request -``: standard input can be read once, so the request was read
    from whatever the capture's read left (nothing), and the error blamed the capture
    ("empty input"). Refused before anything is read, with exit status 2."""
    stdin = io.BytesIO(b'{"model": "m"}')
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stdin))
    assert cli_main(["parse", "-", "--request", "-"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "spec-decode-otel parse: - for both the capture and --request: give one as a file\n"
    )
    assert stdin.tell() == 0
