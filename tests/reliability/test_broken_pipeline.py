"""The app's own telemetry pipeline failing never reaches the app's calls.

A span processor, an exemplar filter or the context runtime belongs to the user (or to a
vendor distribution); when one of them raises inside our start or end, the OTel SDK lets
the exception through to us. Each test runs the same seeded request bare and
instrumented over HTTP to the simulator SUBPROCESS, with the real OTel SDK set up to fail
in one place, and compares what user code saw. Then it checks what is left: the internal
error reported (once as a WARNING, so the user can find the broken part), and no span of
ours left open (the SDK marks a span ended before it calls ``on_end``).

The failing parts are the SDK's public extension points (``SpanProcessor``,
``ExemplarFilter``, ``_RuntimeContext`` as selected by ``OTEL_PYTHON_CONTEXT``);
opentelemetry-sdk's ``SynchronousMultiSpanProcessor`` and ``SyncMeasurementConsumer``
call them without a guard, so their exceptions reach the instrumentation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.sdk.metrics import ExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor
from reliability_helpers import API_KEY, Otel, instrumented, internal_errors

from spec_decode_otel.telemetry import SD_OUTCOME


class _RaisingProcessor(SpanProcessor):
    """A vendor's span processor with a bug in one hook."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.hook == "on_start":
            raise RuntimeError("processor bug in on_start")

    def on_end(self, span: Any) -> None:
        if self.hook == "on_end":
            raise RuntimeError("processor bug in on_end")


class _RaisingExemplarFilter(ExemplarFilter):
    """Called by the SDK on every measurement: a bug here fails every ``record``."""

    def should_sample(self, value: Any, time_unix_nano: int, attributes: Any, context: Any) -> bool:
        raise RuntimeError("exemplar filter bug")


class _AttachFails(ContextVarsRuntimeContext):
    """A context runtime that, while ``failing`` is set, refuses to make a span current
    (our span, while the SDK sends the request); the exporting processor's own attach,
    which carries no span, still works."""

    failing = False

    def attach(self, context: Any) -> object:
        if self.failing and trace.get_current_span(context).is_recording():
            raise RuntimeError("context runtime bug")
        return super().attach(context)


def _request(stream: bool, seed: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "spec-sim",
        "messages": [{"role": "user", "content": "broken pipeline"}],
        "max_tokens": 24,
        "extra_headers": {"x-sim-seed": str(seed)},
    }
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def _visible(obj: Any) -> dict[str, Any]:
    return obj.model_dump(exclude={"id", "created"}, warnings=False)


def _sync_sees(url: str, stream: bool, seed: int) -> list[dict[str, Any]]:
    with openai.OpenAI(api_key=API_KEY, base_url=url, max_retries=0) as client:
        result = client.chat.completions.create(**_request(stream, seed))
        return [_visible(c) for c in result] if stream else [_visible(result)]


def _async_sees(url: str, stream: bool, seed: int) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        async with openai.AsyncOpenAI(api_key=API_KEY, base_url=url, max_retries=0) as client:
            result = await client.chat.completions.create(**_request(stream, seed))
            if stream:
                return [_visible(c) async for c in result]
            return [_visible(result)]

    return asyncio.run(run())


CALLS = {"sync": _sync_sees, "async": _async_sees}


@contextlib.contextmanager
def _broken(part: str) -> Iterator[Otel]:
    """Fresh providers, instrumented, with ``part`` of the pipeline failing."""
    otel = Otel()
    if part in ("on_start", "on_end"):
        otel.tracer_provider.add_span_processor(_RaisingProcessor(part))
    elif part == "exemplar_filter":
        otel.reader = InMemoryMetricReader()
        otel.meter_provider = MeterProvider(
            metric_readers=[otel.reader],
            exemplar_filter=_RaisingExemplarFilter(),
            shutdown_on_exit=False,
        )
    with instrumented(otel):
        if part != "context_attach":
            yield otel
            return
        saved = otel_context._RUNTIME_CONTEXT
        runtime = _AttachFails()
        otel_context._RUNTIME_CONTEXT = runtime
        runtime.failing = True
        try:
            yield otel
        finally:
            runtime.failing = False
            otel_context._RUNTIME_CONTEXT = saved


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("calls", sorted(CALLS))
@pytest.mark.parametrize("part", ["on_start", "on_end", "exemplar_filter", "context_attach"])
def test_a_failing_pipeline_part_leaves_the_call_as_the_bare_sdk_makes_it(
    simulator_url: str, part: str, calls: str, stream: bool
) -> None:
    sees = CALLS[calls]
    bare = sees(simulator_url, stream, seed=11)
    with internal_errors() as errors, _broken(part) as otel:
        seen = sees(simulator_url, stream, seed=11)
        if part == "on_start":
            # The SDK raised out of ``start_span`` after the processors before the
            # failing one saw the start: the span never reached us, so nothing can end
            # it. The call went through without one.
            assert otel.counter.open_after(5.0) == 1
        else:
            assert otel.counter.open_after(5.0) == 0, "a span was left open"
    assert seen == bare
    assert errors, f"a failing {part} must be reported as an internal error"
    if part == "on_start":
        assert otel.spans() == []
    else:
        # The call was made and ended, and its span says what the server sent.
        (span,) = otel.spans()
        assert span.attributes[SD_OUTCOME] == "recorded"
