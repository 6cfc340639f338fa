"""Locks a forked child never inherits held.

``fork()`` copies a lock as it is, but only the thread that forked: a lock that another
thread held at that moment stays held in the child for good, and the child's first call
that needs it waits forever (multiprocessing's default start method on Linux, gunicorn,
Celery, in a process whose other threads are ending calls). The locks a call's end takes
are therefore taken just before a fork and released just after it, in the parent and the
child, as the standard library's ``logging`` does with its handlers' locks. Each is held
only briefly, so a fork waits for it at most that long. Only the records file's lock is
ever held while another is taken (the log limiter's, to report a failed write); it is
made later, and ``fork()`` runs its hooks in the reverse order they were registered, so
it is taken first and nothing waits in a circle.
"""

from __future__ import annotations

import os
import threading


def fork_safe_lock() -> threading.Lock:
    """A new lock that ``fork()`` takes before it forks and releases after."""
    lock = threading.Lock()
    if hasattr(os, "register_at_fork"):  # POSIX
        os.register_at_fork(
            before=lock.acquire, after_in_parent=lock.release, after_in_child=lock.release
        )
    return lock
