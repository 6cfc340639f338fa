"""A loopback relay in front of the simulator, for the framework tests (Instructor,
LlamaIndex, DSPy).

The simulator writes filler words; frameworks that parse the model's text (a JSON object
for Instructor, DSPy's ``[[ ## field ## ]]`` sections) need the text they asked for. The
relay is a real HTTP server on loopback: it forwards each request to the simulator
unchanged, records it (path, headers, body), and answers with the simulator's answer,
in which only the choices' text may be replaced (``Relay.answer``), or, when the request
offered tools, moved into a call of its first tool (the arguments a tool-calling model
sends): every other field, the engine's speculative-decoding stats, usage, ids, finish
reasons and the number and order of stream events, is the simulator's. Without
``answer`` the bytes pass unchanged.

``check_span`` holds what every framework test asserts of one span.

``Relay.replay(i)`` sends the ``i``-th recorded request again straight to the simulator
(no relay, no instrumentation); with its ``x-sim-seed`` header the simulator answers the
same sample, whose ``record_from_json`` is what the span of that request must carry.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from instrumentation_helpers import (
    MODEL,
    expected_outcome,
    expected_span_attributes,
    spec_decode_attributes,
)
from opentelemetry.trace import SpanKind, StatusCode

from spec_decode_otel.payloads import parse_payloads

#: Request headers forwarded to the simulator (the rest are the client's own business).
FORWARDED = ("content-type", "authorization")


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def split_evenly(text: str, parts: int) -> list[str]:
    """``text`` cut into ``parts`` consecutive pieces of near-equal length."""
    size, extra = divmod(len(text), parts)
    pieces, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


def tool_name(request: dict[str, Any]) -> str | None:
    """The first tool the request offers the model, if any."""
    tools = request.get("tools") or ()
    return tools[0]["function"]["name"] if tools else None


def replace_text(body: dict[str, Any], text: str, tool: str | None = None) -> None:
    """A non-streamed chat or text completion, with every choice's text set to ``text``
    (with ``tool``: its message calls ``tool`` with ``text`` as arguments instead)."""
    for choice in body.get("choices") or ():
        message = choice.get("message")
        if isinstance(message, dict) and tool is not None:
            message["content"] = None
            message["tool_calls"] = [
                {"id": "call_0", "type": "function", "function": {"name": tool, "arguments": text}}
            ]
        elif isinstance(message, dict):
            message["content"] = text
        elif "text" in choice:
            choice["text"] = text


def set_piece(choice: dict[str, Any], piece: str, tool: str | None, first: bool) -> None:
    """One stream choice's piece of the text: its text delta, or (``tool``) a piece of
    the tool call's arguments, the first piece with the call's id and name."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        choice["text"] = piece
    elif tool is None:
        delta["content"] = piece
    else:
        delta.pop("content", None)
        call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
        if first:
            call.update(id="call_0", type="function")
            call["function"]["name"] = tool
        delta["tool_calls"] = [call]


def replace_stream_text(events: list[str], text: str, tool: str | None = None) -> list[str]:
    """SSE events (``data: ...`` each) whose text deltas, per choice, now spell ``text``
    (with ``tool``: the arguments of a call of ``tool``): it is spread over the events
    that carried a non-empty piece, so the stream keeps its events, in order, with only
    their text changed."""
    decoded: list[Any] = []
    carriers: dict[int, list[int]] = {}
    for position, event in enumerate(events):
        data = event[len("data: ") :] if event.startswith("data: ") else None
        chunk = None if data is None or data == "[DONE]" else json.loads(data)
        decoded.append(chunk)
        for choice in (chunk or {}).get("choices") or ():
            piece = (choice.get("delta") or {}).get("content", choice.get("text"))
            if isinstance(piece, str) and piece:
                carriers.setdefault(choice["index"], []).append(position)
    for index, positions in carriers.items():
        pieces = split_evenly(text, len(positions))
        for number, (position, piece) in enumerate(zip(positions, pieces, strict=True)):
            for choice in decoded[position]["choices"]:
                if choice["index"] == index:
                    set_piece(choice, piece, tool, first=number == 0)
    return [
        event if chunk is None else "data: " + json.dumps(chunk)
        for event, chunk in zip(events, decoded, strict=True)
    ]


class Relay:
    """The relay: ``url`` is its base URL (``http://127.0.0.1:PORT/v1``)."""

    def __init__(
        self, upstream: str, answer: Callable[[dict[str, Any]], str | None] | None = None
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: list[Recorded] = []
        #: the text to answer a request (its decoded body) with; None: the simulator's
        self.answer = answer
        self._client = httpx.Client(timeout=30)
        self._lock = threading.Lock()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                headers = {
                    k.lower(): v
                    for k, v in self.headers.items()
                    if k.lower().startswith("x-") or k.lower() in FORWARDED
                }
                status, content_type, payload = relay.forward(self.path, headers, body)
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}/v1"

    def upstream_url(self, path: str) -> str:
        """The simulator's URL for a path the relay was asked (``/v1/...``)."""
        assert path.startswith("/v1/"), path
        return self.upstream + path[len("/v1") :]

    def forward(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        with self._lock:
            self.requests.append(Recorded(path, headers, body))
        response = self._client.post(self.upstream_url(path), content=body, headers=headers)
        content_type = response.headers.get("content-type", "application/json")
        request = json.loads(body)
        text = None if self.answer is None else self.answer(request)
        if text is None or response.status_code != 200:
            return response.status_code, content_type, response.content
        if request.get("stream"):
            events = response.text.strip().split("\n\n")
            rewritten = "\n\n".join(replace_stream_text(events, text, tool_name(request)))
            rewritten += "\n\n"
            return 200, content_type, rewritten.encode()
        decoded = response.json()
        replace_text(decoded, text, tool_name(request))
        return 200, content_type, json.dumps(decoded).encode()

    def bodies(self) -> list[Any]:
        return [r.json for r in self.requests]

    def replay(self, index: int) -> Any:
        """Request ``index`` sent again to the simulator, with no relay and nothing
        instrumented: the decoded body, or the list of stream events."""
        recorded = self.requests[index]
        response = httpx.post(
            self.upstream_url(recorded.path),
            content=recorded.body,
            headers=recorded.headers,
            timeout=30,
        )
        response.raise_for_status()
        return parse_payloads(response.text) if recorded.json.get("stream") else response.json()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
        self._client.close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_span(span: Any, record: Any, operation: str = "chat") -> None:
    """One of our spans, for a call the framework completed normally: a client span named
    after the operation and the model, carrying ``record``'s attributes and outcome."""
    attrs = dict(span.attributes or {})
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    assert span.name == f"{operation} {MODEL}"
    assert attrs["gen_ai.operation.name"] == operation
    assert attrs["gen_ai.request.model"] == MODEL
    assert attrs["spec_decode.outcome"] == expected_outcome(record)
    assert "spec_decode.read_to_end" not in attrs
    assert spec_decode_attributes(attrs) == (
        {} if record is None else expected_span_attributes(record)
    )
