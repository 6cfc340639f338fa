"""``RecordsFileProcessor``: an OpenTelemetry SDK span processor that writes the records
file (one JSON line per instrumented call, the format in :mod:`spec_decode_otel.summary`),
which ``spec-decode-otel summarize`` reads.

It needs the SDK (the ``otlp`` extra, or any SDK set-up of your own); ``import
spec_decode_otel`` does not import this module::

    from spec_decode_otel.records import RecordsFileProcessor

    tracer_provider.add_span_processor(RecordsFileProcessor("records.jsonl"))
    # or: spec_decode_otel.setup(span_processors=[RecordsFileProcessor("records.jsonl")])

A line is written when the call's span ends, past any buffer, so the file is complete at
any moment, also for a server that is read while it runs or stopped without an atexit
flush (uvicorn re-raises SIGTERM); ``shutdown`` closes a file the processor opened. The
SDK hands its processors every span that records, sampled or not; a call whose span the
sampler drops gets no line (the metrics still count it).
"""

from __future__ import annotations

import json
import logging
import os
from typing import TextIO

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from spec_decode_otel._fork import fork_safe_lock
from spec_decode_otel._logging import rate_limited
from spec_decode_otel.summary import row_for_span


class RecordsFileProcessor(SpanProcessor):
    """Appends one JSON line per instrumented call to ``target``: a path (opened for
    appending, closed on shutdown) or an open text stream (left open).

    Each line goes to the file descriptor in one ``write``, bypassing any buffer, when
    there is a descriptor (a path, or a stream with a ``fileno()``, flushed once first):
    a buffer's own lock, held by a thread that was writing when another forked, would
    block the forked child's first line for good, and no after-fork hook can release
    it. Processes forked from one another also append whole lines to a path this way. A
    stream without a descriptor (``io.StringIO``) is written and flushed as a stream.
    """

    def __init__(self, target: str | os.PathLike[str] | TextIO) -> None:
        self._stream: TextIO | None = None
        if isinstance(target, (str, os.PathLike)):
            self._fd: int | None = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        else:
            self._stream = target
            self._fd = _descriptor(target)
        self._closed = False
        #: A line was cut short (a full disk): the next starts on a line of its own.
        self._torn = False
        self._lock = fork_safe_lock()

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        row = row_for_span(
            span.attributes or {},
            context.trace_id if context is not None else None,
            context.span_id if context is not None else None,
        )
        if row is None:
            return
        line = json.dumps(row) + "\n"  # ASCII: any text encoding reads it
        try:
            with self._lock:
                if self._closed or (self._stream is not None and self._stream.closed):
                    return
                if self._torn:
                    line = "\n" + line
                self._torn = True  # until the whole line is written
                if self._fd is not None:
                    _write_all(self._fd, line.encode("ascii"))
                elif self._stream is not None:
                    self._stream.write(line)
                    self._stream.flush()
                self._torn = False
        except (OSError, ValueError):  # a full disk must not fail the caller's span.end()
            # Logged without the lock: a handler may block (under gevent, switch).
            rate_limited.log(
                logging.WARNING, "records-file", "could not write a record line", exc_info=True
            )

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every line is written as its span ends

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._stream is None and self._fd is not None:
                os.close(self._fd)


def _descriptor(stream: TextIO) -> int | None:
    """The stream's file descriptor, its buffer flushed, or None when it has none."""
    try:
        fd = stream.fileno()
        stream.flush()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None
    return fd


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]
