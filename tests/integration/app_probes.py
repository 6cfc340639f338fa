"""What the coexistence apps (litellm_coexistence_app.py, sentry_langfuse_app.py) watch
in their own process: spans left open, warnings logged, what a call returned, and the end of
the calls whose streams the collector reclaimed; and the metric totals that those and
other apps (no_sdk_app.py, litellm_openinference_app.py) print. They run as scripts, some
in other venvs, with this directory first on ``sys.path``."""

from __future__ import annotations

import gc
import logging
import threading
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor


class OpenSpans(SpanProcessor):
    """A span processor noting the spans started and not yet ended, and the spans
    carrying ``spec_decode.*`` that ended."""

    def __init__(self) -> None:
        self.open: dict[int, tuple[str, str]] = {}
        self.recorded = 0
        self._lock = threading.Lock()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        with self._lock:
            self.open[span.context.span_id] = (span.instrumentation_scope.name, span.name)

    def on_end(self, span: Any) -> None:
        with self._lock:
            self.open.pop(span.context.span_id, None)
            if any(k.startswith("spec_decode.") for k in span.attributes or {}):
                self.recorded += 1

    def open_of(self, scope: str) -> list[str]:
        with self._lock:
            return [name for s, name in self.open.values() if s == scope]


class Logged(logging.Handler):
    """What any logger said at WARNING or above."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.levelname}: {record.getMessage()}")


def usage_of(usage: Any) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        k: getattr(usage, k, None) for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    }


def text_of(choice: Any, api: str, stream: bool) -> str:
    if api == "text":
        return getattr(choice, "text", None) or ""
    part = choice.delta if stream else choice.message
    return getattr(part, "content", None) or ""


def content_and_usage(api: str, stream: bool, answer: list[Any]) -> dict[str, Any]:
    """The content and the usage the user got: of the response, or of every chunk."""
    content = ""
    usage = None
    for item in answer:
        for choice in getattr(item, "choices", None) or ():
            content += text_of(choice, api, stream)
        usage = usage_of(getattr(item, "usage", None)) or usage
    return {"content": content, "usage": usage}


def finish() -> None:
    """Wait for the ends of the calls whose streams were reclaimed (spec-decode-otel's
    finalizer thread runs them in order: a marker queued after them runs after them)."""
    from spec_decode_otel.instrumentation import finalizer

    gc.collect()
    done = threading.Event()
    finalizer.start()
    finalizer.defer(done.set)
    assert done.wait(10), "the finalizer thread ended nothing for 10 s"


def metric_totals(reader: Any) -> dict[str, float]:
    """Per metric an ``InMemoryMetricReader`` collected: its counter sum, or its
    histogram count, over every series."""
    totals: dict[str, float] = {}
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "count", None)
                    value = point.value if value is None else value
                    totals[metric.name] = totals.get(metric.name, 0) + value
    return totals
