"""Locks a forked child never inherits held.

``fork()`` copies a lock as it is, but only the thread that forked: a lock that another
thread held at that moment stays held in the child for good, and the child's first call
that needs it waits forever (multiprocessing's default start method on Linux, gunicorn,
Celery, in a process whose other threads are ending calls).

These locks guard a few dictionary or set operations, or one ``write`` of a records
line, which a child may inherit half-way without harm, so the child simply gets a new,
unlocked lock. It is not released in place: whether a thread holds a lock cannot be
told at the fork. CPython 3.11 marks a lock as held only once the acquiring thread has
the interpreter lock back, so a lock a thread had just taken, still waiting for that,
looked free (``locked()`` False) and stayed taken in the child. Nor are the locks taken
around the fork, as the standard library's ``logging`` takes its handlers' locks: under
gevent, other greenlets run in the child before the after-fork hooks have all run, and
one of them would find a lock the fork took still held, blocking the child's only OS
thread for good. No code of this package forks, nor yields to another greenlet, while
it holds one of these locks, so no holder survives into the child to release the old one.
"""

from __future__ import annotations

import os
import threading
import weakref


class ForkSafeLock:
    """A lock for ``with`` blocks that a forked child gets anew, unlocked."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _live.add(self)

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def fork_safe_lock() -> ForkSafeLock:
    """A new lock that a forked child gets unlocked."""
    return ForkSafeLock()


#: Every lock alive: one after-fork hook renews them all. A hook per lock could never be
#: removed (``os.register_at_fork`` has no counterpart), so each meter provider the
#: package ever served would leave its locks' hooks behind, run at every later fork.
_live: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


def _renew_in_child() -> None:
    for lock in list(_live):
        lock._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_in_child)
