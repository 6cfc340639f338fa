"""Recognising a span another GenAI instrumentation already made for this call.

When opentelemetry-instrumentation-openai-v2 (or its successor genai-openai), OpenLLMetry
or OpenInference wraps ``create``, its span is current when our request-path wrapper
runs. A second span for the same call would double every GenAI dashboard, so in ``auto``
mode we add our attributes to theirs instead. Recognition is by instrumentation scope
first (exact and cheap), then by the GenAI attributes those libraries set, so a user's
own parent span (an agent step, a request handler) is never mistaken for one.
"""

from __future__ import annotations

from typing import Any

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
    """True when the instrumentation of ``span`` (a foreign GenAI span) records the GenAI
    client metrics of its call itself: openai-v2, genai-openai and OpenLLMetry do,
    OpenInference does not."""
    scope = getattr(span, "instrumentation_scope", None)
    name = getattr(scope, "name", None)
    if isinstance(name, str) and name.startswith(_NO_METRICS_SCOPE_PREFIX):
        return False
    attrs: Any = getattr(span, "attributes", None) or {}
    return "openinference.span.kind" not in attrs
