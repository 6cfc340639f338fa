"""Config G: the least a wrapping instrumentation emitting our telemetry can cost.

The floor (config E) times the OpenTelemetry work alone: one span and two histogram
records with no wrapper around the SDK. Any instrumentation also has to wrap the
request, make its span current while the SDK runs (so HTTP spans nest under it), find
the stats in what the SDK returns and turn them into attributes and counter updates.
This does exactly that and nothing more, for the one response shape the benchmark
replays (vLLM merged stats): no validation, no engine detection, no other endpoint, no
stream bookkeeping beyond one attribute read per chunk, no error handling that keeps
user code safe. It is a yardstick for the benchmark, not an instrumentation: where a
figure computed with G in B's place already misses a target, no instrumentation that
wraps the SDK and emits this telemetry meets it.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import wrapt

#: The SDK methods G wraps (the same ones spec_decode_otel wraps).
_TARGETS = (
    ("openai._base_client", "SyncAPIClient.request"),
    ("openai._base_client", "AsyncAPIClient.request"),
)


class Minimal:
    """Wraps ``SyncAPIClient.request``/``AsyncAPIClient.request`` with the bare minimum."""

    def __init__(self, providers: Any, model: str) -> None:
        from _replay import reference_attributes
        from openai import AsyncStream, Stream
        from opentelemetry import context, trace
        from opentelemetry.metrics import Observation
        from opentelemetry.trace import SpanKind

        from spec_decode_otel import telemetry as t

        self._t = t
        self._streams = (Stream, AsyncStream)
        self._attach = context.attach
        self._detach = context.detach
        self._set_span_in_context = trace.set_span_in_context
        self._kind = SpanKind.CLIENT
        self.tracer = providers.tracer_provider.get_tracer("bench.minimal")
        meter = providers.meter_provider.get_meter("bench.minimal")
        self.h_len = meter.create_histogram(t.M_ACCEPTANCE_LENGTH, unit="{token}")
        self.h_rate = meter.create_histogram(t.M_DRAFT_ACCEPTANCE_RATE, unit="1")
        self._lock = threading.Lock()
        #: counter name → {bucket or position (None: the plain counter): total}. The
        #: observed points carry smaller attribute sets than B's, which only matters when
        #: a reader collects, and the benchmark never collects while timing.
        self.totals: dict[str, dict[Any, int]] = {
            name: {}
            for name in (
                t.M_DRAFT_TOKENS,
                t.M_ACCEPTED_DRAFT_TOKENS,
                t.M_VERIFY_STEPS,
                t.M_ACCEPTED_AT_POSITION,
            )
        }
        for name, totals in self.totals.items():

            def observe(_options: Any, totals: dict[Any, int] = totals) -> list[Any]:
                with self._lock:
                    points = list(totals.items())
                return [Observation(v, {} if k is None else {"k": k}) for k, v in points]

            meter.create_observable_counter(name, callbacks=[observe])
        self.name = f"chat {model}"
        self.start_attrs, self.metric_attrs = reference_attributes(model)

    def install(self) -> None:
        wrapt.wrap_function_wrapper(*_TARGETS[0], self._request)
        wrapt.wrap_function_wrapper(*_TARGETS[1], self._arequest)

    # -- the wrappers -----------------------------------------------------------------

    def _start(self) -> tuple[Any, Any, object]:
        span = self.tracer.start_span(self.name, kind=self._kind, attributes=self.start_attrs)
        ctx = self._set_span_in_context(span)
        return span, ctx, self._attach(ctx)

    def _request(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if args[1].url != "/chat/completions":
            return wrapped(*args, **kwargs)
        span, ctx, token = self._start()
        try:
            result = wrapped(*args, **kwargs)
        finally:
            self._detach(token)
        if isinstance(result, self._streams):
            return _Stream(result, self, span, ctx)
        self.finish(span, ctx, result, result.choices[0].finish_reason)
        return result

    async def _arequest(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if args[1].url != "/chat/completions":
            return await wrapped(*args, **kwargs)
        span, ctx, token = self._start()
        try:
            result = await wrapped(*args, **kwargs)
        finally:
            self._detach(token)
        if isinstance(result, self._streams):
            return _AsyncStream(result, self, span, ctx)
        self.finish(span, ctx, result, result.choices[0].finish_reason)
        return result

    # -- the end of a call --------------------------------------------------------------

    def finish(self, span: Any, ctx: Any, obj: Any, finish_reason: Any) -> None:
        """The response's stats as span attributes, histogram records and counter adds."""
        t = self._t
        stats = obj.model_extra["metrics"]["speculative_decoding"]
        usage = obj.usage
        hist = stats["acceptance_histogram"]
        mal = stats["mean_acceptance_length"]
        rate = stats["draft_acceptance_rate"]
        accepted = stats["num_accepted_draft_tokens"]
        drafted = stats["num_draft_tokens"]
        span.set_attributes(
            {
                t.GEN_AI_RESPONSE_MODEL: obj.model,
                t.GEN_AI_USAGE_INPUT_TOKENS: usage.prompt_tokens,
                t.GEN_AI_USAGE_OUTPUT_TOKENS: usage.completion_tokens,
                t.GEN_AI_RESPONSE_FINISH_REASONS: [finish_reason],
                t.SD_ENGINE: "vllm",
                t.SD_MEAN_ACCEPTANCE_LENGTH: mal,
                t.SD_DRAFT_ACCEPTANCE_RATE: rate,
                t.SD_NUM_SPEC_STEPS: stats["num_spec_steps"],
                t.SD_NUM_ACCEPTED_DRAFT_TOKENS: accepted,
                t.SD_NUM_DRAFT_TOKENS: drafted,
                t.SD_NUM_SPEC_TOKENS: stats["num_spec_tokens"],
                t.SD_ACCEPTANCE_HISTOGRAM: hist,
            }
        )
        attrs = self.metric_attrs
        self.h_len.record(mal, attrs, context=ctx)
        self.h_rate.record(rate, attrs, context=ctx)
        totals = self.totals
        with self._lock:
            plain = totals[t.M_DRAFT_TOKENS]
            plain[None] = plain.get(None, 0) + drafted
            plain = totals[t.M_ACCEPTED_DRAFT_TOKENS]
            plain[None] = plain.get(None, 0) + accepted
            steps = totals[t.M_VERIFY_STEPS]
            positions = totals[t.M_ACCEPTED_AT_POSITION]
            running = 0
            for j in range(len(hist) - 1, -1, -1):
                steps[j] = steps.get(j, 0) + hist[j]
                if j:
                    running += hist[j]
                    positions[j - 1] = positions.get(j - 1, 0) + running
        span.end()


class _Stream(wrapt.ObjectProxy):  # type: ignore[misc]
    """A stream whose chunks are read for ``usage`` only; the call ends when it does.

    It reads the SDK's own generator (``_iterator``), so a ``for`` loop over it goes
    through one generator per chunk, as over the bare stream.
    """

    def __init__(self, wrapped: Any, owner: Minimal, span: Any, ctx: Any) -> None:
        super().__init__(wrapped)
        self._self_end = (owner, span, ctx)

    def __iter__(self) -> Iterator[Any]:
        last = None
        for chunk in self.__wrapped__._iterator:
            if chunk.usage is not None:
                last = chunk
            yield chunk
        owner, span, ctx = self._self_end
        owner.finish(span, ctx, last, "length")


class _AsyncStream(wrapt.ObjectProxy):  # type: ignore[misc]
    """``_Stream`` for ``AsyncStream``."""

    def __init__(self, wrapped: Any, owner: Minimal, span: Any, ctx: Any) -> None:
        super().__init__(wrapped)
        self._self_end = (owner, span, ctx)

    async def __aiter__(self) -> AsyncIterator[Any]:
        last = None
        async for chunk in self.__wrapped__._iterator:
            if chunk.usage is not None:
                last = chunk
            yield chunk
        owner, span, ctx = self._self_end
        owner.finish(span, ctx, last, "length")
