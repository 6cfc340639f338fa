"""``RecordsFileProcessor``: an OpenTelemetry SDK span processor that writes the records
file (one JSON line per instrumented call, the format in :mod:`spec_decode_otel.summary`),
which ``spec-decode-otel summarize`` reads.

It needs the SDK (the ``otlp`` extra, or any SDK set-up of your own); ``import
spec_decode_otel`` does not import this module::

    from spec_decode_otel.records import RecordsFileProcessor

    tracer_provider.add_span_processor(RecordsFileProcessor("records.jsonl"))
    # or: spec_decode_otel.setup(span_processors=[RecordsFileProcessor("records.jsonl")])

A line is written and flushed when the call's span ends, so the file is complete at any
moment, also for a server that is read while it runs or stopped without an atexit flush;
``force_flush`` flushes it and ``shutdown`` closes a file the processor opened. The SDK
hands its processors every span that records, sampled or not; a call whose span the
sampler drops gets no line (the metrics still count it).
"""

from __future__ import annotations

import json
import logging
import os
from typing import TextIO

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from spec_decode_otel._fork import fork_waiting_lock
from spec_decode_otel._logging import rate_limited
from spec_decode_otel.summary import row_for_span


class RecordsFileProcessor(SpanProcessor):
    """Appends one JSON line per instrumented call to ``target``: a path (opened for
    appending, closed on shutdown) or an open text stream (left open)."""

    def __init__(self, target: str | os.PathLike[str] | TextIO) -> None:
        if isinstance(target, (str, os.PathLike)):
            self._file: TextIO = open(target, "a", encoding="utf-8")  # noqa: SIM115
            self._owned = True
        else:
            self._file = target
            self._owned = False
        # A fork waits for the line being written: a child forked in the middle of one
        # would wait forever for the file's own buffer lock. (Under gevent, a child's
        # greenlet that ends a span before the after-fork hooks have run waits too.)
        self._lock = fork_waiting_lock()

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        row = row_for_span(
            span.attributes or {},
            context.trace_id if context is not None else None,
            context.span_id if context is not None else None,
        )
        if row is None:
            return
        line = json.dumps(row) + "\n"
        with self._lock:
            if self._file.closed:
                return
            try:
                self._file.write(line)
                # On disk now: a server is read while it runs, and may end without
                # running atexit (uvicorn re-raises SIGTERM), so nothing may wait in
                # the buffer.
                self._file.flush()
            except (OSError, ValueError):  # a full disk must not fail the caller's span.end()
                rate_limited.log(
                    logging.WARNING, "records-file", "could not write a record line", exc_info=True
                )

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.flush()
            if self._owned:
                self._file.close()
