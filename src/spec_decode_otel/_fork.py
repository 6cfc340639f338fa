"""Locks a forked child never inherits held.

``fork()`` copies a lock as it is, but only the thread that forked: a lock that another
thread held at that moment stays held in the child for good, and the child's first call
that needs it waits forever (multiprocessing's default start method on Linux, gunicorn,
Celery, in a process whose other threads are ending calls).

These locks guard a few dictionary or set operations, or one ``write`` of a records
line, which a child may inherit half-way without harm, so the child simply gets them
unlocked. They are not taken around the fork, as the standard library's ``logging``
takes its handlers' locks: under gevent, other greenlets run in the child before the
after-fork hooks have all run, and one of them would find a lock the fork took still
held, blocking the child's only OS thread for good.
"""

from __future__ import annotations

import os
import threading


def fork_safe_lock() -> threading.Lock:
    """A new lock that a forked child gets unlocked."""
    lock = threading.Lock()
    if hasattr(os, "register_at_fork"):  # POSIX

        def unlock_in_child() -> None:
            if lock.locked():  # by a thread the child does not have
                lock.release()

        os.register_at_fork(after_in_child=unlock_in_child)
    return lock
