"""The library's logger: silent unless the application configures logging, and
rate-limited, so a misbehaving server cannot flood the application's logs."""

from __future__ import annotations

import logging
import time

from spec_decode_otel._fork import fork_safe_lock

logger = logging.getLogger("spec_decode_otel")
# The convention for libraries: no output of ours unless the application asks for it.
logger.addHandler(logging.NullHandler())


class RateLimitedLog:
    """Logs each key at most once per ``interval`` seconds; counts what it suppressed."""

    def __init__(self, interval: float = 60.0) -> None:
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = fork_safe_lock()

    def log(self, level: int, key: str, msg: str, *args: object, exc_info: bool = False) -> None:
        if not logger.isEnabledFor(level):
            return
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return
            if len(self._last) > 1024:  # keys come from code paths, but stay bounded anyway
                self._last.clear()
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            msg += " (%d similar messages suppressed)"
            args = (*args, suppressed)
        logger.log(level, msg, *args, exc_info=exc_info)


rate_limited = RateLimitedLog()

_once_lock = fork_safe_lock()
_said_once: set[str] = set()


def warn_once(key: str, msg: str, *args: object, exc_info: bool = False) -> bool:
    """Log ``msg`` at WARNING the first time ``key`` is seen in this process; True then."""
    with _once_lock:
        if key in _said_once:
            return False
        _said_once.add(key)
    logger.warning(msg, *args, exc_info=exc_info)
    return True


def report_internal_error(where: str) -> None:
    """An instrumentation bug: never raised to the caller, but visible. The first one of
    the process is a WARNING with its traceback; later ones are rate-limited DEBUG."""
    if not warn_once(
        "internal-error",
        "spec_decode_otel internal error in %s (the call itself was not affected); "
        "later internal errors are logged at DEBUG",
        where,
        exc_info=True,
    ):
        rate_limited.log(
            logging.DEBUG,
            f"internal:{where}",
            "spec_decode_otel internal error in %s",
            where,
            exc_info=True,
        )
