"""Records from saved payloads, without any client: JSON bodies, chunk lists, SSE text.

For ``spec-decode-otel parse`` and anyone replaying logs or captures (core only: no SDK,
no server, no extra). A response body gives one record; a list of stream chunks gives one
record for the whole stream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from spec_decode_otel._logging import logger
from spec_decode_otel.adapters.registry import Detection, detect_outcome
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.outcome import Outcome
from spec_decode_otel.record import SpecDecodeAcceptanceRecord
from spec_decode_otel.sse import LINE_END, SseSplitter

#: Inputs larger than this are refused by :func:`parse_payloads` (64 MiB of text is
#: far beyond any real response or stream capture).
MAX_TEXT_BYTES = 64 * 1024 * 1024

#: Payloads (bodies, chunks, events) decoded from one input at most: a stream of 128k
#: tokens has about as many chunks, while 64 MiB of ``{}`` lines would be 22 million,
#: each decoded, kept and detected.
MAX_PAYLOADS = 262_144
#: How much of an SSE capture is split into events at a time.
_SSE_SLICE = 1024 * 1024

#: What an SSE capture's first line starts with (a JSON body or JSON lines never do).
_SSE_FIELDS = ("data:", "event:", "id:", ":", "retry:")


def record_from_json(
    body: Any, request: Mapping[str, Any] | None = None
) -> SpecDecodeAcceptanceRecord | None:
    """The record for a decoded response body (dict) or stream (list of chunk dicts).

    ``request`` is the JSON body of the request the payload answers, when known. Some
    shapes are read only with it: ``usage.completion_tokens_details``' prediction-token
    pair counts speculative decoding only when the request carried no ``prediction``
    (otherwise it is OpenAI's Predicted Outputs), so without a request it is not read.

    Never raises: anything that is not a recognisable, self-consistent payload gives None.
    """
    return detection_from_json(body, request).record


def detection_from_json(body: Any, request: Mapping[str, Any] | None = None) -> Detection:
    """As :func:`record_from_json`, with the outcome and, for ``invalid``, the rule the
    payload broke: why there is no record (``spec-decode-otel parse`` says it)."""
    try:
        if isinstance(body, Mapping):
            chunks: Sequence[Any] = (body,)
        elif isinstance(body, list):
            chunks = body
        else:
            return Detection(None, Outcome.NO_STATS)
        if not isinstance(request, Mapping):
            request = None
        responses = [
            p for p in (ParsedResponse.from_dict(c, request) for c in chunks) if p is not None
        ]
        return detect_outcome(responses)
    except Exception:  # defensive: detection already isolates adapters
        logger.debug("record_from_json failed", exc_info=True)
        return Detection(None, Outcome.INVALID, "the payload could not be read")


def record_from_text(
    text: str, request: Mapping[str, Any] | None = None
) -> SpecDecodeAcceptanceRecord | None:
    """Decode ``text`` (any form :func:`parse_payloads` reads) and detect its record
    (``request`` as in :func:`record_from_json`)."""
    return detection_from_text(text, request).record


def detection_from_text(text: str, request: Mapping[str, Any] | None = None) -> Detection:
    """As :func:`record_from_text`, with the outcome and its reason
    (:func:`detection_from_json`)."""
    payloads = parse_payloads(text)
    return detection_from_json(payloads[0] if len(payloads) == 1 else payloads, request)


def parse_payloads(text: str) -> list[Any]:
    """Decode a JSON body, a JSON array of chunks, JSON lines, or raw SSE into payloads.

    Raises ValueError when the text is none of those. SSE events whose data does not
    decode (a capture cut mid-line) are skipped, as a client would drop them.
    """
    if len(text) > MAX_TEXT_BYTES:
        raise ValueError("input too large")
    stripped = text.strip()
    if not stripped:
        raise ValueError("empty input")
    try:
        if stripped.startswith(_SSE_FIELDS):
            return _parse_sse(stripped)
        try:
            whole = json.loads(stripped)
        except json.JSONDecodeError:
            return _parse_json_lines(stripped)
        payloads = whole if isinstance(whole, list) else [whole]
        _check_count(payloads)
        return payloads
    except RecursionError:  # json raises it for deeply nested arrays/objects
        raise ValueError("JSON nested too deeply") from None


def _parse_json_lines(text: str) -> list[Any]:
    """One JSON value per line; a line ends as an SSE line does
    (:data:`~spec_decode_otel.sse.LINE_END`)."""
    payloads: list[Any] = []
    start = number = 0
    for number, end in enumerate(LINE_END.finditer(text), 1):
        _add_line(payloads, number, text[start : end.start()])
        start = end.end()
    _add_line(payloads, number + 1, text[start:])
    return payloads


def _add_line(payloads: list[Any], number: int, line: str) -> None:
    if line.strip():
        try:
            payloads.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {number} is not JSON: {exc.msg}") from None
        _check_count(payloads)


def _check_count(payloads: list[Any]) -> None:
    if len(payloads) > MAX_PAYLOADS:
        raise ValueError(f"more than {MAX_PAYLOADS:,} payloads")


def _parse_sse(text: str) -> list[Any]:
    """The JSON data of each event, read as the instrumentation reads a raw stream
    (:class:`~spec_decode_otel.sse.SseSplitter`): the last event needs no blank line
    after it here, since a saved capture often ends without one."""
    payloads: list[Any] = []
    splitter = SseSplitter()
    text += "\n\n"
    for at in range(0, len(text), _SSE_SLICE):
        for event in splitter.feed(text[at : at + _SSE_SLICE]):
            if event.strip() == "[DONE]":
                continue
            try:
                payloads.append(json.loads(event))
            except (ValueError, RecursionError):  # not JSON, past the digit limit, too deep
                logger.debug("skipping an SSE event whose data is not JSON")
            _check_count(payloads)
    if not payloads:
        raise ValueError("no JSON data events in SSE input")
    return payloads
