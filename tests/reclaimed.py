"""Waiting for the calls that the garbage collector reclaims to end."""

from __future__ import annotations

import gc
import threading

from spec_decode_otel.instrumentation import finalizer


def collect() -> None:
    """``gc.collect()``, then wait until every call it reclaimed has ended.

    A reclaimed stream or response hands its call's end to the finalizer thread, which runs
    the ends in the order they were queued: a marker queued after them runs after them.
    """
    gc.collect()
    done = threading.Event()
    finalizer.start()
    finalizer.defer(done.set)
    assert done.wait(10), "the finalizer thread ended nothing for 10 s"
