"""One-time hints: when data goes missing for a reason we can see, say so once, with
the fix, at WARNING (visible wherever the application shows warnings).

Four hints, each said at most once per process (by the module's ``hints`` object):

- ``no-sdk``: calls are instrumented but the OpenTelemetry API still has its stand-in
  providers (no SDK configured) for traces, metrics or both, so what is recorded there is
  dropped. Common causes: ``opentelemetry-instrument`` without ``opentelemetry-distro``
  (nothing configures the SDK), or a tracing-only set-up (a TracerProvider and no
  MeterProvider). Not when the application passed a provider itself;
- ``invalid``: a payload was rejected (the first rule it broke is in the message);
- ``include-usage``: a server sent stats on non-streaming calls, from an engine whose
  streams carry them only on the usage chunk (vLLM; the adapters say which,
  ``usage_chunk_engines``), but a stream made without ``stream_options.include_usage``
  and read to its end got none. Not for the other engines: a llama.cpp stream without
  counts is one that drafted nothing (an n-gram drafter finds nothing to draft on text
  that does not repeat), not one that missed its usage chunk;
- ``quiet-server``: a server answered ``QUIET_SERVER_CALLS`` calls without stats, and none
  with, while other servers did send stats.

Per-server state is bounded (``MAX_SERVERS``). ``Hints.reset()`` forgets everything, so
a hint can be said again (tests use it).
"""

from __future__ import annotations

from dataclasses import dataclass

from spec_decode_otel._fork import fork_safe_lock
from spec_decode_otel._logging import logger
from spec_decode_otel.adapters.registry import stats_need_usage_chunk
from spec_decode_otel.outcome import Outcome

#: Calls to one server answered without stats, while other servers sent stats, before
#: the quiet-server hint.
QUIET_SERVER_CALLS = 20
#: Servers tracked; later ones get no per-server hints.
MAX_SERVERS = 256

INVALID = (
    "spec-decode stats from %s were rejected as invalid (%s), so calls with such payloads "
    "get no record (outcome invalid). The server, or a gateway in front of it, sends "
    "numbers that contradict each other or exceed a bound: check that the server's "
    "version is one README's 'Supported engines' lists, and if it is, report the payload "
    "(spec-decode-otel parse FILE shows what is read from a saved response)."
)
INCLUDE_USAGE = (
    "%s sends spec-decode stats on non-streaming calls but none arrived on a stream made "
    "without stream_options.include_usage (it sends streaming stats only on the usage "
    "chunk, as vLLM does): set inject_include_usage=True "
    "(SPEC_DECODE_OTEL_INJECT_INCLUDE_USAGE=true), or, on vLLM, start it with "
    "--enable-force-include-usage"
)
#: What gets a server's stats to the client (also said by ``spec-decode-otel check``).
TURN_STATS_ON = (
    "turn the server's per-request stats on (vLLM --per-request-spec-decode-metrics "
    "summary; SGLang request_engine_stats=('sglang',); TensorRT-LLM "
    "per_request_spec_decode_stats: true; llama.cpp --spec-type: draft-simple with -md, "
    "or an n-gram type, which drafts only where the text repeats), make vLLM "
    "streams ask for them (inject_include_usage=True), and check that no gateway in front "
    "of it strips the fields"
)
NO_SDK = (
    "calls are instrumented but no OpenTelemetry SDK is configured for %s, so the "
    "spec-decode data recorded there is dropped: configure it before the first call "
    "(spec_decode_otel.setup(), your own TracerProvider and MeterProvider, or "
    "opentelemetry-instrument with opentelemetry-distro installed, which configures the "
    "SDK from the OTEL_* variables)"
)
QUIET_SERVER = (
    "%s answered %d calls without spec-decode stats while other servers sent them: "
    + TURN_STATS_ON.replace("%", "%%")
    + " (README: Why is my dashboard empty?)"
)


@dataclass
class _Server:
    #: Calls answered in full without stats (outcome no_stats).
    without_stats: int = 0
    #: Calls with a record (recorded or partial).
    with_stats: int = 0
    #: A non-streaming call had stats from an engine that streams them on the usage chunk.
    non_stream_stats: bool = False
    #: A stream without include_usage, read to its end, had none.
    stream_lost: bool = False


class Hints:
    """Per-server observations and the hints already said."""

    def __init__(self) -> None:
        self._servers: dict[str, _Server] = {}
        self._any_stats = False
        self._said: set[str] = set()
        self._lock = fork_safe_lock()

    def reset(self) -> None:
        """Forget every server and every hint said."""
        with self._lock:
            self._servers.clear()
            self._any_stats = False
            self._said.clear()

    def observe(
        self,
        server: str,
        outcome: Outcome,
        *,
        streaming: bool,
        include_usage: bool,
        reason: str | None,
        engine: str | None,
    ) -> None:
        """Note one call's outcome; say a hint the first time its condition holds."""
        say: list[tuple[str, tuple[object, ...]]] = []
        with self._lock:
            if outcome is Outcome.INVALID and self._first("invalid"):
                say.append((INVALID, (server, reason or "no reason given")))
            state = self._servers.get(server)
            if state is None and len(self._servers) < MAX_SERVERS:
                state = self._servers[server] = _Server()
            if state is not None:
                if outcome in (Outcome.RECORDED, Outcome.PARTIAL):
                    state.with_stats += 1
                    if not streaming and engine is not None:
                        state.non_stream_stats |= stats_need_usage_chunk(engine)
                    self._any_stats = True
                elif outcome is Outcome.NO_STATS:
                    state.without_stats += 1
                    state.stream_lost |= streaming and not include_usage
                if state.non_stream_stats and state.stream_lost and self._first("include-usage"):
                    say.append((INCLUDE_USAGE, (server,)))
                if (
                    state.with_stats == 0
                    and state.without_stats >= QUIET_SERVER_CALLS
                    and self._any_stats
                    and self._first("quiet-server")
                ):
                    say.append((QUIET_SERVER, (server, state.without_stats)))
        for message, args in say:
            logger.warning(message, *args)

    def observe_sdk(self, *, traces_unset: bool, metrics_unset: bool) -> None:
        """Note that a call's traces or metrics go to the API's stand-in providers."""
        if not (traces_unset or metrics_unset):
            return
        with self._lock:
            first = self._first("no-sdk")
        if not first:
            return
        if traces_unset and metrics_unset:
            signals = "traces and metrics"
        elif traces_unset:
            signals = "traces"
        else:
            signals = "metrics (spans keep the record)"
        logger.warning(NO_SDK, signals)

    def _first(self, key: str) -> bool:
        """True the first time ``key`` is asked for (the caller holds the lock)."""
        if key in self._said:
            return False
        self._said.add(key)
        return True


hints = Hints()
