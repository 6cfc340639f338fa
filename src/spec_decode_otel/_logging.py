"""Rate-limited logging: a misbehaving server must not flood the application's logs."""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("spec_decode_otel")


class RateLimitedLog:
    """Logs each key at most once per ``interval`` seconds; counts what it suppressed."""

    def __init__(self, interval: float = 60.0) -> None:
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

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
