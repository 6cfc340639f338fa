"""Ending the calls of streams and responses that the garbage collector reclaims.

A proxy's ``__del__`` cannot end its call itself. The collector runs ``__del__`` on
whichever thread it interrupts, at any allocation or bytecode boundary, including inside
a lock that ending a call needs: the SDK's metric aggregations (a histogram being read
by the metric reader's thread), span processors, this package's own counters. Taking
that lock again there deadlocks the thread, and with it every later call that needs the
lock. So ``__del__`` only queues the end on a ``queue.SimpleQueue``, whose ``put`` the
standard library documents as safe in ``__del__`` methods and weakref callbacks, and one
daemon thread ends the queued calls, holding nothing.

At exit, the streams still referenced (a module-level variable, a stream kept in a
long-lived object) are ended before the providers flush: the collector would reclaim
them only after the providers' own exit handlers had stopped exporting.

The queue and its thread are made together, when the first proxy is made, from the
``queue`` and ``threading`` modules as they are then. An application that monkey-patches
them later than it imports this package (gevent under ``opentelemetry-instrument``, or a
gunicorn gevent worker) then gets a queue and a thread of one kind: a greenlet waiting on
the C queue made at import would block the only OS thread, and the whole process with it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Protocol

from spec_decode_otel._logging import report_internal_error

#: Ends waiting at most. Past it an end is dropped (its span stays unexported) rather than
#: kept: the thread only falls that far behind when a span processor blocks for good.
MAX_PENDING = 10_000

_pending: queue.SimpleQueue[Callable[[], None]] | None = None
_worker: threading.Thread | None = None
_lock = threading.Lock()


class Watched(Protocol):
    """What ends a stream's call when the process exits with the stream still held."""

    def on_exit(self) -> None: ...


#: The stream observers alive in this process (whose calls may still be open at exit).
_watched: weakref.WeakSet[Watched] = weakref.WeakSet()


def watch(observer: Watched) -> None:
    """End ``observer``'s call at exit if it is still open then (``observer`` is held
    weakly: reclaimed, it ends its call through :func:`defer`)."""
    with contextlib.suppress(TypeError):  # a proxy of what is not hashable: ended when reclaimed
        _watched.add(observer)


def start() -> None:
    """Make sure the queue and its thread exist: called where a proxy is made, never
    from ``__del__``. A forked child makes its own, on its first proxy.

    The exit hook is kept at the end of atexit's list (:func:`_keep_exit_hook_last`),
    so it runs before the exit handlers of every provider made before this proxy
    (atexit runs the last one first), those of providers made after the first stream
    included.

    The thread is started after the lock is released: under gevent ``Thread.start()``
    waits on the hub, which runs other greenlets, and one of them here would wait for
    a lock held across that switch, blocking the only OS thread.
    """
    global _pending, _worker
    _keep_exit_hook_last()
    if _worker is not None:
        return
    with _lock:
        if _worker is not None:
            return
        _pending = queue.SimpleQueue()
        worker = _worker = threading.Thread(
            target=_run, args=(_pending,), name="spec-decode-otel-finalizer", daemon=True
        )
    worker.start()


#: ``atexit._ncallbacks()`` right after the exit hook was last put at the end of the list.
_hook_moved_at: int | None = None


def _keep_exit_hook_last() -> None:
    """Put the exit hook at the end of atexit's list, unless it is there already.

    Moving it on every proxy would cost more with every stream: CPython's
    ``atexit.unregister`` leaves an empty slot that is never reused, and scans every
    slot, so a long-running process would make each stream slower and the list longer
    for good. The count of registered handlers (``atexit._ncallbacks``, CPython)
    grows only by registering, so while it is what it was after the last move, nothing
    was registered after the hook. Where that count is missing the hook is registered
    once, on the first proxy.
    """
    global _hook_moved_at
    count = getattr(atexit, "_ncallbacks", None)
    if _hook_moved_at is not None and (count is None or count() == _hook_moved_at):
        return
    atexit.unregister(_end_open_at_exit)
    atexit.register(_end_open_at_exit)
    _hook_moved_at = count() if count is not None else 0


def _after_fork_in_child() -> None:
    """A forked child keeps only the thread that forked: the lock may be held for good
    by a thread that was inside :func:`start` at the fork, and the ends still queued are
    the parent's calls, which the parent ends."""
    global _pending, _worker, _lock
    _pending = None
    _worker = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def defer(end: Callable[[], None]) -> None:
    """End a call later, on the finalizer thread; safe in ``__del__``.

    Before this process made a proxy of its own there is no queue, and the proxy being
    reclaimed is a forked parent's copy, whose call the parent ends.
    """
    pending = _pending
    if pending is not None and pending.qsize() < MAX_PENDING:
        pending.put(end)


def _end_open_at_exit() -> None:
    """The ends still queued, then the calls of streams still held, ended here and now:
    the daemon thread may not get to them before the providers stop."""
    pending = _pending
    while pending is not None:
        try:
            end = pending.get_nowait()
        except queue.Empty:
            break
        _end(end)
    try:
        observers = list(_watched)
    except RuntimeError:  # another (daemon) thread made a stream meanwhile
        observers = []
    for observer in observers:
        _end(observer.on_exit)


def _end(end: Callable[[], None]) -> None:
    try:
        end()
    except BaseException:  # see _run: nothing here may stop the thread
        report_internal_error("finalizer")


def _run(pending: queue.SimpleQueue[Callable[[], None]]) -> None:
    """End the queued calls, for as long as the process runs.

    Whatever an end raises is reported and the thread goes on: ``BaseException`` too
    (a span processor or exporter calling ``sys.exit()``, re-raising ``KeyboardInterrupt``
    or ``GeneratorExit``), or the thread would die and every call reclaimed later keep
    its span open. None of those can be a request to stop the process here: off the main
    thread ``SystemExit`` ends only its thread, and signals reach the main thread only.
    The interpreter's exit stops this daemon thread without raising in it.
    """
    while True:
        _end(pending.get())
