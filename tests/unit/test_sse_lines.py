"""Lines as ``iter_lines()`` hands them over give the events the raw text gives.

httpx's ``iter_lines()`` splits the body as ``str.splitlines`` does (httpx 0.28.1 and
httpx2 2.17, ``_decoders.py``: ``LineDecoder`` and its ``NEWLINE_CHARS``), so it also ends
a line at U+0085, U+2028 and U+2029, which a JSON string may hold raw (RFC 8259 escapes
only the controls below U+0020): a server writing UTF-8 JSON sends model output so. The
``openai`` SDK's own SSE decoder splits the bytes at ``\\r`` and ``\\n`` only
(``_streaming.py``, ``SSEDecoder``), so ``.parse()`` reads such an event whole.
"""

from __future__ import annotations

import json

import pytest

from spec_decode_otel.sse import SseSplitter, ends_in_json_string

SEPARATORS = ["\u2028", "\u2029", "\u0085"]


def _events(contents: list[str]) -> list[dict[str, object]]:
    return [
        {"choices": [{"delta": {"content": content}}], "usage": {"completion_tokens": i}}
        for i, content in enumerate(contents)
    ]


def _sse(events: list[dict[str, object]]) -> str:
    return "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events)


def _by_lines(lines: list[str], splitter: SseSplitter) -> list[str]:
    """What ``splitter`` makes of ``lines`` given one at a time, as ``iter_lines()`` reads."""
    return [data for line in lines for data in splitter.line(line)]


@pytest.mark.parametrize("separator", SEPARATORS)
def test_a_json_string_cut_by_iter_lines_gives_the_whole_event(separator: str) -> None:
    contents = [
        f"one{separator}two",
        f'say "hi"{separator}{separator} twice',  # escaped quotes, two cuts in a row
        f"a backslash \\{separator}",  # an escaped backslash just before the cut
        f"{separator}at both ends{separator}",
        "no cut",
    ]
    text = _sse(_events(contents))
    assert len(text.splitlines()) > 2 * len(contents)  # the premise: the lines were cut
    by_lines = _by_lines(text.splitlines(), SseSplitter())
    assert len(by_lines) == len(contents)
    decoded = [json.loads(data) for data in by_lines]
    # Which separator cut the line is lost; the event is whole, every number kept.
    want = _events([c.replace(separator, "\u2028") for c in contents])
    assert decoded == want
    whole = [json.dumps(e, ensure_ascii=False) for e in _events(contents)]
    assert SseSplitter().feed(text) == whole  # the raw text, as the SDK splits it


def test_only_a_data_line_cut_inside_a_string_is_joined() -> None:
    """A ``data:`` line that closes its strings is complete, and other fields cut by
    ``iter_lines()`` are not joined to what follows (they carry nothing we read)."""
    text = 'event: x\u2028y\ndata: {"a": "b"}\n\ndata: {"c": 1}\n\n'
    assert text.splitlines()[:2] == ["event: x", "y"]
    assert _by_lines(text.splitlines(), SseSplitter()) == ['{"a": "b"}', '{"c": 1}']


@pytest.mark.parametrize("between", ["", ": keep-alive\n\n", "event: x\nid: 1\n"])
def test_a_truncated_event_is_one_event_as_in_the_raw_text(between: str) -> None:
    """An event cut short inside a string (a server that died mid-event, or any text
    that is no JSON) is not a cut JSON string: the next field shows where it ended, and
    the events after it are those of the raw text. (A comment line between is taken
    into the broken event, which decodes no better or worse for it: a comment can start
    model output after a cut, a field name hardly.)"""
    text = f'data: {{"a": "cut\n\n{between}data: {{"b": 1}}\n\ndata: [DONE]\n\n'
    broken, *rest = _by_lines(text.splitlines(), SseSplitter())
    assert broken.startswith('{"a": "cut')
    assert rest == SseSplitter().feed(text)[1:] == ['{"b": 1}', "[DONE]"]


def test_a_string_that_never_closes_is_dropped_at_the_event_bound() -> None:
    """A ``data:`` line that opens a string and never closes it keeps at most the event
    bound; past it the event is dropped and the events after it are read."""
    splitter = SseSplitter(max_event_chars=100)
    lines = ['data: {"a": "', *["x" * 10] * 50, "", "data: {}", ""]
    assert _by_lines(lines, splitter) == ["{}"]


@pytest.mark.parametrize(
    ("text", "inside", "ends_inside"),
    [
        ('{"a": "b', False, True),
        ('{"a": "b"}', False, False),
        ('{"a": "say \\"hi', False, True),
        ('{"a": "\\\\', False, True),
        ('\\\\"', False, True),
        ('c", "d": 1}', True, False),
        ("\\u0022", True, True),
        ("", True, True),
    ],
)
def test_ends_in_json_string_follows_quotes_and_escapes(
    text: str, inside: bool, ends_inside: bool
) -> None:
    assert ends_in_json_string(text, inside) is ends_inside
