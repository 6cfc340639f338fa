"""One-time hints: when data goes missing for a reason we can see, say so once, with
the fix, at WARNING (visible wherever the application shows warnings).

Per-server state is bounded (``MAX_SERVERS``); the hints are process-wide, since each is
said once per process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from spec_decode_otel._logging import warn_once
from spec_decode_otel.outcome import Outcome

#: Calls to one server with no stats, while other servers sent stats, before the hint.
QUIET_SERVER_CALLS = 20
#: Servers tracked; later ones get no per-server hints.
MAX_SERVERS = 256


@dataclass
class _Server:
    calls: int = 0
    with_stats: int = 0
    non_stream_stats: bool = False


class Hints:
    def __init__(self) -> None:
        self._servers: dict[str, _Server] = {}
        self._any_stats = False
        self._lock = threading.Lock()

    def observe(
        self,
        server: str,
        outcome: Outcome,
        *,
        streaming: bool,
        include_usage: bool,
        reason: str | None,
    ) -> None:
        """Note one call's outcome; say a hint the first time its condition holds."""
        has_stats = outcome in (Outcome.RECORDED, Outcome.PARTIAL)
        if outcome is Outcome.INVALID:
            warn_once(
                "invalid",
                "spec-decode stats from %s were rejected as invalid (%s); calls with such "
                "payloads get no record. Check the server's version against README's "
                "supported engines.",
                server,
                reason or "no reason given",
            )
        with self._lock:
            state = self._servers.get(server)
            if state is None and len(self._servers) < MAX_SERVERS:
                state = self._servers[server] = _Server()
            if state is None:
                return
            state.calls += 1
            if has_stats:
                state.with_stats += 1
                self._any_stats = True
                state.non_stream_stats |= not streaming
            stream_lost = (
                streaming
                and not include_usage
                and outcome is Outcome.NO_STATS
                and state.non_stream_stats
            )
            quiet = state.with_stats == 0 and state.calls >= QUIET_SERVER_CALLS and self._any_stats
        if stream_lost:
            warn_once(
                "include-usage",
                "%s sends spec-decode stats on non-streaming calls but none arrived on a "
                "stream made without stream_options.include_usage: set "
                "inject_include_usage=True, or start vLLM with --enable-force-include-usage",
                server,
            )
        if quiet:
            warn_once(
                "quiet-server",
                "%s sent no spec-decode stats in %d calls while other servers did: is "
                "speculative decoding and its per-request stats flag on there (vLLM "
                "--per-request-spec-decode-metrics; SGLang request_engine_stats=['sglang'])? "
                "A gateway in between may strip the fields (README: Through a gateway).",
                server,
                state.calls,
            )


hints = Hints()
