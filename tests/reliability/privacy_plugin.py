"""Session-wide privacy scan: nothing a test exports may carry content, keys or request ids.

Registered from ``tests/conftest.py`` (``pytest_plugins``), so it watches the WHOLE suite,
not only the tests in this directory. At configure time it hooks three places every
in-process telemetry path goes through:

- ``opentelemetry.sdk.trace.Span.end``: every SDK span, whatever processor or exporter a
  test attached (in-memory, batch, OTLP), is scanned once when it ends: name, attributes,
  events (name + attributes), status description and resource attributes;
- ``MetricReader._set_collect_callback``: every collection by every metric reader
  (in-memory, periodic OTLP) is scanned: data-point attributes and exemplar attributes;
- ``oteltap``'s message channel: OTLP spans and metrics that arrive at an in-process
  OTLP receiver (from subprocesses too) are scanned as protobuf messages.

Scanning happens on the spot and keeps only counters and the first findings, so the
hooks cost no memory per span (the leak tests rely on that).

What counts as a leak (``scan_text``): the canary prompts the reliability tests send
(``CANARY-PROMPT-<uuid>``); three or more consecutive words of the simulator's completion
vocabulary (its filler text, ``simulator/plan.py``); the API keys the tests use (``sk-...``
keys, ``Bearer`` headers, the demo's key ``demo`` as a whole value); response ids
(``chatcmpl-...``/``cmpl-...``).

Whose telemetry: findings in spans or metrics of the ``spec_decode_otel`` scope, and in
``spec_decode.*`` attributes anywhere (our enrich mode writes onto other libraries' spans),
are FATAL: the session fails at the end with the list. Findings elsewhere (another
instrumentation's own attributes, e.g. openai-v2's ``gen_ai.response.id``, or a test's
own spans) are reported in the terminal summary only.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from spec_decode_otel.simulator.plan import FILLER
from spec_decode_otel.telemetry import SCOPE_NAME

CANARY_PREFIX = "CANARY-PROMPT-"
#: The API keys the suite uses (tests/conftest.py: ``sk-test``; the demo: ``demo``).
WHOLE_VALUE_SECRETS = frozenset({"demo", "sk-test"})
OWN_KEY_PREFIX = "spec_decode."
MAX_KEPT_FINDINGS = 50
_MAX_SEEN_METRIC_SETS = 200_000

_WORDS = "|".join(sorted(FILLER, key=len, reverse=True))
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("canary prompt", re.compile(re.escape(CANARY_PREFIX))),
    ("completion text", re.compile(rf"(?i)\b(?:{_WORDS})(?:[ \t]+(?:{_WORDS})){{2,}}\b")),
    ("api key", re.compile(r"\bsk-[A-Za-z0-9_-]{3,}|\bBearer\s+\S")),
    ("response id", re.compile(r"\b(?:chatcmpl|cmpl)-[A-Za-z0-9_-]+")),
)


def scan_text(value: str) -> list[str]:
    """The names of the rules ``value`` breaks (empty when it is clean)."""
    hits = [name for name, pattern in RULES if pattern.search(value)]
    if value in WHOLE_VALUE_SECRETS and "api key" not in hits:
        hits.append("api key")
    return hits


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, str):
                yield item


@dataclass
class Finding:
    source: str  # span | metric | otlp-span | otlp-metric
    scope: str
    where: str  # span or metric name
    key: str
    value: str
    rule: str
    fatal: bool

    def __str__(self) -> str:
        return (
            f"[{self.rule}] {self.source} {self.where!r} (scope {self.scope!r}) "
            f"{self.key} = {self.value[:120]!r}"
        )


@dataclass
class Registry:
    """Counters and findings for the whole session (plus quarantined self-test findings)."""

    spans: int = 0
    own_spans: int = 0
    metric_points: int = 0
    own_metric_points: int = 0
    otlp_messages: int = 0
    fatal: list[Finding] = field(default_factory=list)
    fatal_total: int = 0
    informational: list[Finding] = field(default_factory=list)
    informational_total: int = 0
    _quarantine: list[Finding] | None = None
    _seen_metric_sets: set[tuple[str, str, frozenset]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, finding: Finding) -> None:
        with self._lock:
            if self._quarantine is not None:
                self._quarantine.append(finding)
            elif finding.fatal:
                self.fatal_total += 1
                if len(self.fatal) < MAX_KEPT_FINDINGS:
                    self.fatal.append(finding)
            else:
                self.informational_total += 1
                if len(self.informational) < MAX_KEPT_FINDINGS:
                    self.informational.append(finding)

    @contextlib.contextmanager
    def quarantine(self) -> Iterator[list[Finding]]:
        """Findings made inside go to the returned list, not to the session verdict.

        For the tests that prove the hooks are live (they plant a canary on purpose).
        """
        caught: list[Finding] = []
        with self._lock:
            previous, self._quarantine = self._quarantine, caught
        try:
            yield caught
        finally:
            with self._lock:
                self._quarantine = previous

    def first_sighting(self, key: tuple[str, str, frozenset]) -> bool:
        with self._lock:
            if key in self._seen_metric_sets:
                return False
            if len(self._seen_metric_sets) < _MAX_SEEN_METRIC_SETS:
                self._seen_metric_sets.add(key)
            return True


REGISTRY = Registry()


def _check(source: str, scope: str, where: str, key: str, value: Any, own: bool) -> None:
    for text in _strings(value):
        for rule in scan_text(text):
            fatal = own or key.startswith(OWN_KEY_PREFIX)
            REGISTRY.add(Finding(source, scope, where, key, text, rule, fatal))


def _check_mapping(source: str, scope: str, where: str, attrs: Any, own: bool) -> None:
    if not attrs:
        return
    for key, value in attrs.items():
        _check(source, scope, where, str(key), value, own)


# --------------------------------------------------------------------------- SDK spans


def scan_span(span: Any) -> None:
    scope_obj = getattr(span, "instrumentation_scope", None)
    scope = getattr(scope_obj, "name", "") or ""
    own = scope == SCOPE_NAME
    with REGISTRY._lock:
        REGISTRY.spans += 1
        REGISTRY.own_spans += own
    name = span.name or ""
    _check("span", scope, name, "<span name>", name, own)
    _check_mapping("span", scope, name, span.attributes, own)
    for event in span.events or ():
        _check("span", scope, name, "<event name>", event.name, own)
        _check_mapping("span", scope, name, event.attributes, own)
    status = getattr(span, "status", None)
    if status is not None and status.description:
        _check("span", scope, name, "<status description>", status.description, own)
    resource = getattr(span, "resource", None)
    if resource is not None:
        _check_mapping("span", scope, name, resource.attributes, False)


# --------------------------------------------------------------------------- metrics


def scan_metrics_data(data: Any) -> None:
    if data is None:
        return
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope.name
            own = scope == SCOPE_NAME
            for metric in scope_metrics.metrics:
                points = getattr(metric.data, "data_points", ()) or ()
                for point in points:
                    with REGISTRY._lock:
                        REGISTRY.metric_points += 1
                        REGISTRY.own_metric_points += own
                    attrs = point.attributes or {}
                    key = (scope, metric.name, frozenset(attrs.items()))
                    if REGISTRY.first_sighting(key):
                        _check_mapping("metric", scope, metric.name, attrs, own)
                    for exemplar in getattr(point, "exemplars", None) or ():
                        _check_mapping(
                            "metric", scope, metric.name, exemplar.filtered_attributes, own
                        )


# --------------------------------------------------------------------------- OTLP protobuf


def _proto_attributes(key_values: Iterable[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in key_values:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "string_value":
            out[kv.key] = value.string_value
        elif kind == "array_value":
            out[kv.key] = [
                v.string_value for v in value.array_value.values if v.HasField("string_value")
            ]
    return out


def scan_otlp_message(message: Any) -> None:
    """An OTLP ``Span`` or ``Metric`` protobuf as oteltap hands it over (scope unknown)."""
    with REGISTRY._lock:
        REGISTRY.otlp_messages += 1
    kind = type(message).__name__
    if kind == "Span":
        attrs = _proto_attributes(message.attributes)
        own = any(k.startswith(OWN_KEY_PREFIX) for k in attrs)
        scope = SCOPE_NAME + "?" if own else "<otlp>"
        _check("otlp-span", scope, message.name, "<span name>", message.name, own)
        _check_mapping("otlp-span", scope, message.name, attrs, own)
        for event in message.events:
            _check("otlp-span", scope, message.name, "<event name>", event.name, own)
            _check_mapping(
                "otlp-span", scope, message.name, _proto_attributes(event.attributes), own
            )
        if message.status.message:
            _check(
                "otlp-span", scope, message.name, "<status description>",
                message.status.message, own,
            )  # fmt: skip
    elif kind == "Metric":
        own = message.name.startswith(OWN_KEY_PREFIX)
        scope = SCOPE_NAME + "?" if own else "<otlp>"
        which = message.WhichOneof("data")
        if which is None:
            return
        for point in getattr(message, which).data_points:
            attrs = _proto_attributes(point.attributes)
            _check_mapping("otlp-metric", scope, message.name, attrs, own)


# --------------------------------------------------------------------------- hooks


_RESTORE: list[tuple[Any, str, Any]] = []


def _patch(owner: Any, name: str, replacement: Any) -> None:
    _RESTORE.append((owner, name, owner.__dict__[name]))
    setattr(owner, name, replacement)


def _install() -> None:
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.trace import Span

    original_end = Span.end

    def end(self: Any, end_time: int | None = None) -> None:
        already = self._end_time is not None
        original_end(self, end_time)
        if not already and self._end_time is not None:
            try:
                scan_span(self)
            except Exception as exc:  # the scan must never break a test's telemetry
                REGISTRY.add(Finding("span", "?", "?", "<scanner error>", repr(exc), "error", True))

    _patch(Span, "end", end)

    original_set = MetricReader._set_collect_callback

    def set_collect_callback(self: Any, func: Any) -> None:
        if func is None:
            original_set(self, func)
            return

        def collect(*args: Any, **kwargs: Any) -> Any:
            data = func(*args, **kwargs)
            try:
                scan_metrics_data(data)
            except Exception as exc:
                REGISTRY.add(
                    Finding("metric", "?", "?", "<scanner error>", repr(exc), "error", True)
                )
            return data

        original_set(self, collect)

    _patch(MetricReader, "_set_collect_callback", set_collect_callback)

    try:
        from oteltap._message_channel import _MessageChannel
    except ImportError:  # oteltap is in the test extra; without it there is nothing to watch
        return
    original_write = _MessageChannel.write

    def write(self: Any, message: Any) -> None:
        try:
            scan_otlp_message(message)
        except Exception as exc:
            REGISTRY.add(Finding("otlp", "?", "?", "<scanner error>", repr(exc), "error", True))
        original_write(self, message)

    _patch(_MessageChannel, "write", write)


def pytest_configure(config: pytest.Config) -> None:
    if not _RESTORE:
        _install()


def pytest_unconfigure(config: pytest.Config) -> None:
    while _RESTORE:
        owner, name, original = _RESTORE.pop()
        setattr(owner, name, original)


@pytest.fixture
def privacy_registry() -> Registry:
    """The session's privacy registry (for tests that check their own deltas)."""
    return REGISTRY


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if REGISTRY.fatal_total and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    r = REGISTRY
    terminalreporter.write_sep("-", "privacy scan (tests/reliability/privacy_plugin.py)")
    terminalreporter.write_line(
        f"scanned {r.spans} spans ({r.own_spans} spec_decode_otel), {r.metric_points} metric "
        f"points ({r.own_metric_points} spec_decode_otel), {r.otlp_messages} OTLP messages; "
        f"{r.fatal_total} leaks, {r.informational_total} findings in other libraries' telemetry"
    )
    for finding in r.fatal:
        terminalreporter.write_line(f"LEAK {finding}", red=True)
    for finding in r.informational[:10]:
        terminalreporter.write_line(f"note {finding}")
    if r.fatal_total:
        terminalreporter.write_line(
            "privacy scan FAILED: spec_decode_otel telemetry carried content, keys or ids",
            red=True,
        )
