"""Ending the calls of streams and responses that the garbage collector reclaims.

A proxy's ``__del__`` cannot end its call itself. The collector runs ``__del__`` on
whichever thread it interrupts, at any allocation or bytecode boundary, including inside
a lock that ending a call needs: the SDK's metric aggregations (a histogram being read
by the metric reader's thread), span processors, this package's own counters. Taking
that lock again there deadlocks the thread, and with it every later call that needs the
lock. So ``__del__`` only queues the end on a ``queue.SimpleQueue``, whose ``put`` the
standard library documents as safe in ``__del__`` methods and weakref callbacks, and one
daemon thread ends the queued calls, holding nothing.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

from spec_decode_otel._logging import report_internal_error

_pending: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_worker: threading.Thread | None = None
_lock = threading.Lock()


def start() -> None:
    """Make sure the thread runs: called where a proxy is made, never from ``__del__``.

    It is started again in a forked child, on the child's first proxy.
    """
    global _worker
    if _worker is not None and _worker.is_alive():
        return
    with _lock:
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_run, name="spec-decode-otel-finalizer", daemon=True)
            _worker.start()


def _after_fork_in_child() -> None:
    """A forked child keeps only the thread that forked: the lock may be held for good
    by a thread that was inside :func:`start` at the fork, and the ends still queued are
    the parent's calls, which the parent ends."""
    global _pending, _worker, _lock
    _pending = queue.SimpleQueue()
    _worker = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def defer(end: Callable[[], None]) -> None:
    """End a call later, on the finalizer thread; safe in ``__del__``."""
    _pending.put(end)


def _run() -> None:
    while True:
        end = _pending.get()
        try:
            end()
        except Exception:
            report_internal_error("finalizer")
