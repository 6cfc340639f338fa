"""``decode_json``: the one decoder of a server's JSON text (a body read raw, an SSE event,
the body LiteLLM logged). It is bounded and never raises; each caller decides what to log.

The through-the-client behaviours it serves are tested where they happen:
tests/reliability/test_trust_at_the_edges.py (a raw body that is not JSON, a LiteLLM body
over the bound) and tests/integration/test_raw_stream_reads.py.
"""

from __future__ import annotations

import pytest

from spec_decode_otel.sse import MAX_EVENT_CHARS, Undecoded, decode_json


def test_a_valid_text_over_the_bound_is_never_decoded() -> None:
    text = '{"pad": "' + "x" * MAX_EVENT_CHARS + '"}'
    assert decode_json(text) is Undecoded.TOO_LARGE
    assert decode_json(text.encode()) is Undecoded.TOO_LARGE


def test_a_text_at_the_bound_is_decoded() -> None:
    text = '{"pad": "' + "x" * (MAX_EVENT_CHARS - 11) + '"}'
    assert len(text) == MAX_EVENT_CHARS
    assert decode_json(text) == {"pad": "x" * (MAX_EVENT_CHARS - 11)}


@pytest.mark.parametrize(
    "text",
    ["<html>a gateway's error page</html>", "", "[" * 100_000 + "]" * 100_000, b"\xff{}"],
    ids=["html", "empty", "nested-too-deep", "not-utf8"],
)
def test_text_that_is_not_json_gives_a_reason_not_an_exception(text: str | bytes) -> None:
    assert decode_json(text) is Undecoded.NOT_JSON


def test_json_null_is_a_value_not_a_failure() -> None:
    """A caller tells "the server sent null" from "no JSON" by the reason, not by None."""
    assert decode_json("null") is None
    assert decode_json(b'{"choices": []}') == {"choices": []}
