"""Run the simulator: in a background thread (tests, demo) or in the foreground (CLI).

The listening socket is bound here, before uvicorn starts, so ``port=0`` yields a known
free port immediately and nothing races for it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import FrameType, TracebackType

import uvicorn

from spec_decode_otel.simulator.app import create_app
from spec_decode_otel.simulator.config import SimulatorConfig


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 lets the kernel pick a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on accepted
    # sockets whose proto says TCP. Without it, uvicorn's separate header and body
    # writes meet Nagle plus the client's delayed ACK, which stalls every request on a
    # reused keep-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def url_for(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


class QuietExitServer(uvicorn.Server):
    """uvicorn re-raises SIGINT/SIGTERM after a graceful shutdown (so the process dies of
    the signal); a CLI that promises exit status 0 on SIGTERM must not, so we only flag
    the exit here."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == 2:  # a second Ctrl-C: stop waiting for streams
            self.force_exit = True
        self.should_exit = True


def make_server(config: SimulatorConfig, log_level: str = "warning") -> uvicorn.Server:
    uv_config = uvicorn.Config(
        create_app(config),
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
    )
    return QuietExitServer(uv_config)


class SimulatorServer:
    """The simulator on a loopback port in a daemon thread; a context manager.

    >>> with SimulatorServer(SimulatorConfig(engine="sglang")) as sim:
    ...     client = openai.OpenAI(base_url=sim.base_url, api_key="x")
    """

    def __init__(
        self,
        config: SimulatorConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
    ) -> None:
        self.config = config or SimulatorConfig()
        self.host = host
        self._requested_port = port
        self._log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self.port: int = 0

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:41234``."""
        return url_for(self.host, self.port)

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as ``base_url``: the root plus ``/v1``."""
        return self.url + "/v1"

    def start(self, timeout: float = 10.0) -> SimulatorServer:
        if self._thread is not None:
            return self
        self._sock = bind_socket(self.host, self._requested_port)
        self.port = self._sock.getsockname()[1]
        server = self._server = make_server(self.config, self._log_level)
        thread = self._thread = threading.Thread(
            target=server.run,
            kwargs={"sockets": [self._sock]},
            name=f"spec-decode-simulator:{self.port}",
            daemon=True,
        )
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the simulator did not start")
            time.sleep(0.005)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> SimulatorServer:
        # starting takes milliseconds and runs its own loop in another thread
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
