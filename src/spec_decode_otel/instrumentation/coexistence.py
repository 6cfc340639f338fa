"""Recognising another GenAI instrumentation of the same call.

When opentelemetry-instrumentation-openai-v2 (or its successor genai-openai), OpenLLMetry
or OpenInference wraps ``create``, its span is current when our request-path wrapper
runs. A second span for the same call would double every GenAI dashboard, so in ``auto``
mode we add our attributes to theirs instead. Recognition is by instrumentation scope
first (exact and cheap), then by the GenAI attributes those libraries set, so a user's
own parent span (an agent step, a request handler) is never mistaken for one.

Whether they record the call's GenAI client metrics cannot rest on their span: they
record them whether the span is sampled or not, and a span the sampler dropped is a
``NonRecordingSpan``, which carries a span context and nothing else (no scope, name,
kind or attributes), so it cannot be told from the user's own unsampled span. What
tells, sampled or not, is their wrapper on the stack of the call: see
:func:`recording_wrapper_on_stack`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Span, SpanKind

#: The instrumentation scopes of their spans, as each release names it (checked against the
#: installed packages by tests/integration/test_coexistence_matrix.py). openai-v2 2.4b0
#: (with opentelemetry-util-genai 1.1b0) makes its chat spans through util-genai's handler,
#: whose scope (``opentelemetry.util.genai.handler``) also names agent and tool spans:
#: those spans are recognised by their attributes instead.
FOREIGN_SCOPES = frozenset(
    {
        "opentelemetry.instrumentation.openai_v2",  # openai-v2's own tracer
        "opentelemetry.instrumentation.genai.openai",  # genai-openai
        "opentelemetry.instrumentation.openai.v1",  # OpenLLMetry with openai >= 1
        "openinference.instrumentation.openai",  # OpenInference
    }
)
_LLM_OPERATIONS = frozenset({"chat", "text_completion"})
#: OpenInference records no metrics (openinference-instrumentation-openai 0.1.66): the
#: GenAI client metrics of a call whose span is theirs are ours to record, if opted in.
_NO_METRICS_SCOPE_PREFIX = "openinference."


def is_foreign_genai_span(span: Span) -> bool:
    """True when ``span`` is another instrumentation's span for an LLM call."""
    scope = getattr(span, "instrumentation_scope", None)
    name = getattr(scope, "name", None)
    if name in FOREIGN_SCOPES:
        return True
    if getattr(span, "kind", None) is not SpanKind.CLIENT:
        return False
    attrs: Any = getattr(span, "attributes", None) or {}
    return (
        attrs.get("gen_ai.operation.name") in _LLM_OPERATIONS
        or attrs.get("llm.request.type") in ("chat", "completion")
        or attrs.get("openinference.span.kind") == "LLM"
    )


def records_genai_metrics(span: Span) -> bool:
    """True when the instrumentation of ``span`` (a foreign GenAI span, recognised by its
    attributes) records the GenAI client metrics of its call itself, as far as a span can
    tell: OpenInference records none. For the instrumentations :data:`FOREIGN_SCOPES`
    names, False: :func:`recording_wrapper_on_stack` tells, call by call, sampled or not
    (OpenLLMetry's completion span, for one, comes with no metrics)."""
    scope = getattr(span, "instrumentation_scope", None)
    name = getattr(scope, "name", None)
    if name in FOREIGN_SCOPES:
        return False
    if isinstance(name, str) and name.startswith(_NO_METRICS_SCOPE_PREFIX):
        return False
    attrs: Any = getattr(span, "attributes", None) or {}
    return "openinference.span.kind" not in attrs


def _openllmetry_records() -> bool:
    """OpenLLMetry (opentelemetry-instrumentation-openai 0.62.4) makes its histograms only
    if ``TRACELOOP_METRICS_ENABLED`` is unset or true (utils.py ``is_metrics_enabled``),
    and its ``chat_wrapper`` passes a call made under its suppression key straight on."""
    enabled = (os.environ.get("TRACELOOP_METRICS_ENABLED") or "true").lower() == "true"
    return enabled and not otel_context.get_value("suppress_language_model_instrumentation")


def _always() -> bool:
    return True


#: The modules whose wrappers record the GenAI client metrics (duration, token usage) of
#: the call they wrap, sampled or not, and when they do. Checked against the installed
#: packages by tests/integration/test_coexistence_matrix.py.
RECORDING_WRAPPERS: Mapping[str, Callable[[], bool]] = {
    # openai-v2 2.4b0: chat create, sync and async (patch.py ``traced_method``)
    "opentelemetry.instrumentation.openai_v2.patch": _always,
    # genai-openai 1.3b0: chat create and parse (patch.py), the Responses API
    # (patch_responses.py); reached only while instrumented (__init__.py ``_active``)
    "opentelemetry.instrumentation.genai.openai.patch": _always,
    "opentelemetry.instrumentation.genai.openai.patch_responses": _always,
    # OpenLLMetry 0.62.4: chat create and parse; its completion and Responses wrappers
    # (completion_wrappers.py, v1/responses_wrappers.py) record no metrics
    "opentelemetry.instrumentation.openai.shared.chat_wrappers": _openllmetry_records,
}


def recording_wrapper_on_stack() -> bool:
    """True when the call being made (our request-path wrapper is on the stack) runs
    inside a wrapper of :data:`RECORDING_WRAPPERS` that records its GenAI client metrics.
    Their wrappers sit around ``create`` (or ``parse``), so they are on the stack when the
    SDK sends the request, in async code too (an awaiting coroutine's frame is the
    awaited one's ``f_back`` while it runs). Cheap when none of them is imported."""
    modules = sys.modules
    if not any(name in modules for name in RECORDING_WRAPPERS):
        return False
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        records = RECORDING_WRAPPERS.get(frame.f_globals.get("__name__", ""))
        if records is not None:
            return records()
        frame = frame.f_back
    return False
