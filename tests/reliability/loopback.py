"""A real HTTP server on loopback that answers with whatever body a test hands it (the
simulator only speaks well-formed engine shapes; a hostile server sends anything) and
keeps the headers of every request it received.

    with LoopbackServer() as server:
        server.reply(body_bytes)                  # JSON, or SSE when it starts with "data:"
        client = openai.OpenAI(base_url=server.url, ...)
        server.requests[-1].headers["traceparent"]
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    header_lines: list[tuple[str, str]]  # as sent, repeats included
    body: bytes


class LoopbackServer:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._status = 200
        self._body = b"{}"
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                lines = list(self.headers.items())
                server.requests.append(
                    Received(self.path, {k.lower(): v for k, v in lines}, lines, body)
                )
                stream = server._body.startswith(b"data:")
                self.send_response(server._status)
                kind = "text/event-stream" if stream else "application/json"
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(server._body)))
                self.end_headers()
                self.wfile.write(server._body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def reply(self, body: bytes, status: int = 200) -> None:
        """Answer every following request with ``body``."""
        self._body, self._status = body, status

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
