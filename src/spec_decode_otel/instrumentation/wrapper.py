"""The wrapper around the ``openai`` client's request path.

Why the request path and not each resource method: ``chat.completions.parse()`` and the
``chat.completions.stream()`` helper never call ``create``, and ``with_raw_response`` /
``with_streaming_response`` return response wrappers from it. Every one of them goes
through ``SyncAPIClient.request`` / ``AsyncAPIClient.request`` exactly once per call
(retries included), with the endpoint path and the JSON body in ``options``. Wrapping
there captures all variants with two wrappers, gives one span per logical call across
retries, and lets every other endpoint pass straight through.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from spec_decode_otel._attributes import current_attributes
from spec_decode_otel._logging import report_internal_error
from spec_decode_otel.adapters.protocol import request_fields
from spec_decode_otel.adapters.registry import registered_adapters
from spec_decode_otel.instrumentation.call import Call, CallPlan, is_short_text
from spec_decode_otel.instrumentation.coexistence import (
    is_foreign_genai_span,
    recording_wrapper_on_stack,
    records_genai_metrics,
)
from spec_decode_otel.instrumentation.genai_metrics import GenAiMetrics
from spec_decode_otel.instrumentation.hints import hints
from spec_decode_otel.instrumentation.responses import wrap_result
from spec_decode_otel.instrumentation.settings import Settings
from spec_decode_otel.instrumentation.streams import NOTHING_INJECTED, Injected
from spec_decode_otel.record import MAX_COUNT
from spec_decode_otel.telemetry import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    SD_OUTCOME,
    SERVER_ADDRESS,
    SERVER_PORT,
    SpecDecodeInstruments,
)

#: Endpoint path → GenAI operation name. Everything else passes through untouched. The
#: Responses API is a chat operation in the GenAI conventions for OpenAI (genai-openai
#: names its Responses spans ``chat`` too, so ``auto`` mode enriches them).
OPERATIONS: Mapping[str, str] = {
    "/chat/completions": "chat",
    "/completions": "text_completion",
    "/responses": "chat",
}
#: Endpoints whose requests the opt-in amendments (``include_usage``, engines'
#: ``request_fields``) may change: the Responses API has neither field.
_AMENDABLE = frozenset({"/chat/completions", "/completions"})
PROVIDER = "openai"
_TRACE_CONTEXT = TraceContextTextMapPropagator()
#: Request settings put on our spans as GenAI ``gen_ai.request.*`` attributes (never on
#: metrics), by body key; acceptance moves with the sampling settings, so a trace search
#: can slice it by them. Stop sequences are left out: they are text from the prompt's side.
_REQUEST_NUMBERS: Mapping[str, str] = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}
_REQUEST_COUNTS: Mapping[str, str] = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",  # the Responses API's name
    "seed": "gen_ai.request.seed",
}

#: Spans that an earlier call already enriched with ``spec_decode.*``: a second call under
#: the same span gets a child span of its own instead of overwriting the first's figures.
_enriched: weakref.WeakSet[Any] = weakref.WeakSet()


class Instrumentation:
    """Settings + instruments shared by every wrapped call; the wrappers' ``self``."""

    def __init__(
        self,
        settings: Settings,
        instruments: SpecDecodeInstruments,
        tracer: trace.Tracer,
        genai_metrics: GenAiMetrics | None,
        *,
        global_tracer_provider: bool,
        global_meter_provider: bool,
    ) -> None:
        self.settings = settings
        self.instruments = instruments
        self.tracer = tracer
        self.genai_metrics = genai_metrics
        #: Whether the tracer and the instruments come from the global providers (none
        #: was passed), which may still be the API's stand-ins: see hints' ``no-sdk``.
        self._global_tracer_provider = global_tracer_provider
        self._global_meter_provider = global_meter_provider
        self._request_fields: dict[str, Any] = {}
        for adapter in registered_adapters():
            if adapter.engine in settings.request_engine_stats:
                self._request_fields.update(request_fields(adapter))

    # -- request start ---------------------------------------------------------

    def _start(
        self, client: Any, options: Any, operation: str, body: Mapping[str, Any]
    ) -> tuple[Call, Any, Injected]:
        streaming = body.get("stream") is True
        if options.url in _AMENDABLE:
            options, injected = self._amend(options, body, streaming)
        else:
            injected = NOTHING_INJECTED
        stream_options = body.get("stream_options")
        asked_usage = isinstance(stream_options, Mapping) and stream_options.get("include_usage")
        # A Responses stream always ends with its usage (``response.completed``): it has
        # no stream_options, so a stream without stats is never for want of them.
        responses_api = options.url == "/responses"
        plan = self.plan(
            operation,
            model=body.get("model"),
            server=_server(client),
            user=current_attributes(),
            parent=otel_context.get_current(),
            requested_sequences=_requested_sequences(body),
            request=_sent_body(options) or body,
            streaming=streaming,
            include_usage=injected.usage or asked_usage is True or responses_api,
            responses_api=responses_api,
            genai_metrics_recorded=self.genai_metrics is not None and recording_wrapper_on_stack(),
        )
        if self.settings.inject_traceparent:
            options = _inject_trace_context(options, plan.span)
        return Call(plan), options, injected

    def plan(
        self,
        operation: str,
        *,
        model: Any,
        server: tuple[str | None, int | None],
        user: Mapping[str, Any],
        parent: Context,
        requested_sequences: int,
        request: Mapping[str, Any] | None,
        streaming: bool,
        include_usage: bool,
        responses_api: bool = False,
        start_time: int | None = None,
        genai_metrics_recorded: bool = False,
    ) -> CallPlan:
        """A call's span and metric attributes, for the openai wrapper and the LiteLLM
        callback alike. The span that is current in ``parent`` is enriched when the mode
        says so (``enrich``; ``auto`` and another GenAI instrumentation's span), unless an
        earlier call enriched it already; otherwise the call gets a span of its own.
        ``genai_metrics_recorded``: another instrumentation records the call's GenAI client
        metrics (the openai wrapper found its wrapper on the stack), so we do not."""
        settings = self.settings
        model = model if is_short_text(model) else None  # "" is no model
        host, port = server
        span_attrs: dict[str, Any] = {
            GEN_AI_OPERATION_NAME: operation,
            GEN_AI_PROVIDER_NAME: PROVIDER,
        }
        metric_attrs = dict(span_attrs)
        bound = self.instruments.bound
        for key, value in (
            (GEN_AI_REQUEST_MODEL, model),
            (SERVER_ADDRESS, host),
            (SERVER_PORT, port),
        ):
            if value is not None:
                span_attrs[key] = value
                metric_attrs[key] = bound(key, value)
        for key in settings.metric_attributes:
            if key in user:
                metric_attrs[key] = bound(key, user[key])
        span_attrs.update(_request_attributes(request, streaming))

        current = trace.get_current_span(parent)
        foreign = is_foreign_genai_span(current)
        enrich = (
            current.is_recording()
            and not _already_enriched(current)
            and (settings.mode == "enrich" or (settings.mode == "auto" and foreign))
        )
        self._observe_sdk(enrich)
        name = f"{operation} {model}" if model else operation
        late_span: Callable[[int], Span] | None = None
        if enrich:
            span = current
            _mark_enriched(span)
            if user:
                span.set_attributes(user)

            def late_span(started_ns: int) -> Span:
                return self.tracer.start_span(
                    name,
                    context=trace.set_span_in_context(current, parent),
                    kind=SpanKind.CLIENT,
                    attributes={**span_attrs, **user},
                    start_time=start_time if start_time is not None else started_ns,
                )
        else:
            span = self.tracer.start_span(
                name,
                context=parent,
                kind=SpanKind.CLIENT,
                attributes={**span_attrs, **user},
                start_time=start_time,
            )
        return CallPlan(
            instruments=self.instruments,
            span=span,
            own_span=not enrich,
            metric_attributes=metric_attrs,
            # Another instrumentation records the call's GenAI metrics (its wrapper is
            # around the call, or its span is current): whether we enrich that span or
            # (mode "span") start our own, and whether it was sampled or not.
            genai_metrics=(
                None
                if genai_metrics_recorded or (foreign and records_genai_metrics(current))
                else self.genai_metrics
            ),
            per_step_max_length=settings.per_step_max_length if settings.record_per_step else None,
            requested_sequences=requested_sequences,
            request=request,
            server=f"{host}:{port}",
            streaming=streaming,
            include_usage=include_usage,
            context=trace.set_span_in_context(span, parent),
            late_span=late_span,
            responses_api=responses_api,
        )

    def _observe_sdk(self, enrich: bool) -> None:
        """For the ``no-sdk`` hint: whether this call's span (unless it enriches another
        tracer's) and its metrics go to the API's stand-in providers."""
        ours = self._global_tracer_provider and not enrich
        global_meter = self._global_meter_provider
        hints.observe_sdk(
            traces_unset=ours and _api_stand_in(trace.get_tracer_provider()),
            metrics_unset=global_meter and _api_stand_in(metrics.get_meter_provider()),
        )

    def _amend(
        self, options: Any, body: Mapping[str, Any], streaming: bool
    ) -> tuple[Any, Injected]:
        """Opt-in request changes, on a copy: the user's own objects are never mutated."""
        additions = {k: v for k, v in self._request_fields.items() if k not in body}
        engine_fields = bool(additions)
        injected_usage = False
        if streaming and self.settings.inject_include_usage:
            stream_options = body.get("stream_options")
            # With continuous_usage_stats, include_usage puts usage on every chunk the user
            # sees (vLLM), which hiding the last chunk cannot undo: leave such a request be.
            if stream_options is None or (
                isinstance(stream_options, Mapping)
                and "include_usage" not in stream_options
                and not stream_options.get("continuous_usage_stats")
            ):
                additions["stream_options"] = {**(stream_options or {}), "include_usage": True}
                injected_usage = True
        if not additions:
            return options, NOTHING_INJECTED
        options = options.model_copy()
        options.json_data = {**options.json_data, **additions}
        extra = getattr(options, "extra_json", None)
        if isinstance(extra, Mapping) and extra.keys() & additions.keys():
            # The user's extra_body is merged over the body when the SDK sends it: an
            # addition to a key it holds goes there too, or it would be overridden.
            options.extra_json = {**extra, **{k: v for k, v in additions.items() if k in extra}}
        return options, Injected(usage=injected_usage, engine_fields=engine_fields)

    # -- the wrappers ------------------------------------------------------------

    def sync_request(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: Any
    ) -> Any:
        started = self._begin(instance, args, kwargs)
        if started is None:
            return wrapped(*args, **kwargs)
        call, args, kwargs, injected = started
        return wrap_result(call, send_within(call, wrapped, args, kwargs), injected)

    async def async_request(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: Any
    ) -> Any:
        started = self._begin(instance, args, kwargs)
        if started is None:
            return await wrapped(*args, **kwargs)
        call, args, kwargs, injected = started
        result = await send_within_async(call, wrapped, args, kwargs)
        return wrap_result(call, result, injected)

    def _begin(
        self, client: Any, args: tuple[Any, ...], kwargs: Any
    ) -> tuple[Call, tuple[Any, ...], Any, Injected] | None:
        """Start a call from ``request(cast_to, options, ...)``'s arguments: the Call, the
        arguments to send (the options amended on a copy), and what our amendments added.
        None for other endpoints, and inside ``suppress_instrumentation()`` (every
        OpenTelemetry instrumentation's off switch for a block of code). Never raises."""
        try:
            options = args[1] if len(args) > 1 else kwargs.get("options")
            if (
                options is None
                or not is_instrumentation_enabled()
                or str(options.method).lower() != "post"
            ):
                return None
            operation = OPERATIONS.get(options.url)
            body = _sent_body(options)
            if operation is None or body is None:
                return None
            call, new_options, injected = self._start(client, options, operation, body)
        except Exception:
            report_internal_error("start")
            return None
        if len(args) > 1:
            args = (args[0], new_options, *args[2:])
        else:
            kwargs = {**kwargs, "options": new_options}
        return call, args, kwargs, injected


def _sent_body(options: Any) -> Mapping[str, Any] | None:
    """The JSON body as the SDK sends it: ``extra_body`` (``options.extra_json``) merged
    over the body, its keys winning; None when the body is not a JSON object."""
    body = options.json_data
    if not isinstance(body, Mapping):
        return None
    extra = getattr(options, "extra_json", None)
    return {**body, **extra} if isinstance(extra, Mapping) and extra else body


def _request_attributes(body: Mapping[str, Any] | None, streaming: bool) -> dict[str, Any]:
    """The GenAI ``gen_ai.request.*`` span attributes of a request body: its sampling
    settings, token limit, seed and ``n`` as sent (numbers only; anything else is left
    out), and ``gen_ai.request.stream`` when it streams."""
    attrs: dict[str, Any] = {"gen_ai.request.stream": True} if streaming else {}
    if body is None:
        return attrs
    for key, name in _REQUEST_NUMBERS.items():
        value = body.get(key)
        if _fits_int64(value) or (type(value) is float and math.isfinite(value)):
            attrs[name] = value
    for key, name in _REQUEST_COUNTS.items():
        value = body.get(key)
        if _fits_int64(value):
            attrs[name] = value
    n = body.get("n")
    if _fits_int64(n) and n != 1:
        attrs["gen_ai.request.choice.count"] = n
    return attrs


def _fits_int64(value: Any) -> bool:
    """An int OTLP can carry (int64)."""
    return type(value) is int and -MAX_COUNT <= value <= MAX_COUNT


def _requested_sequences(body: Mapping[str, Any]) -> int:
    """``n``, times the prompts of a completion with several (each gets ``n``)."""
    n = body.get("n")
    sequences = n if type(n) is int and n > 1 else 1
    prompt = body.get("prompt")
    if type(prompt) is list and len(prompt) > 1 and type(prompt[0]) is not int:
        sequences *= len(prompt)  # several prompts (strings or token lists)
    return sequences


def _api_stand_in(provider: Any) -> bool:
    """Whether ``provider`` is what the OpenTelemetry API hands out when no SDK has been
    set: a proxy that drops everything until ``set_*_provider()`` (named
    ``_ProxyMeterProvider`` for metrics in opentelemetry-api 1.31 to 1.45: the API has
    no public name for it), or a no-op provider."""
    return (
        isinstance(
            provider,
            (trace.ProxyTracerProvider, trace.NoOpTracerProvider, metrics.NoOpMeterProvider),
        )
        or type(provider).__name__ == "_ProxyMeterProvider"
    )


def _server(client: Any) -> tuple[str | None, int | None]:
    base_url = client.base_url
    port = base_url.port
    if port is None:
        port = {"https": 443, "http": 80}.get(base_url.scheme)
    return base_url.host or None, port


def _already_enriched(span: Span) -> bool:
    attributes = getattr(span, "attributes", None) or {}
    try:
        return span in _enriched or SD_OUTCOME in attributes
    except TypeError:  # a span type that cannot be weakly referenced
        return SD_OUTCOME in attributes


def _mark_enriched(span: Span) -> None:
    with contextlib.suppress(TypeError):  # not weakly referenceable: the attribute tells
        _enriched.add(span)


def _inject_trace_context(options: Any, span: Span) -> Any:
    """Add ``traceparent`` (and ``tracestate``) for ``span``, on a copy of the options.

    The W3C trace context only — never baggage or any other globally configured
    propagator, which could carry the application's private data to the server. The
    user's own headers win: if they set ``traceparent`` in any case, nothing is added.
    """
    headers = options.headers if isinstance(options.headers, Mapping) else {}
    if any(str(name).lower() in ("traceparent", "tracestate") for name in headers):
        return options
    carrier: dict[str, str] = {}
    _TRACE_CONTEXT.inject(carrier, context=trace.set_span_in_context(span))
    if not carrier:
        return options
    options = options.model_copy()
    options.headers = {**headers, **carrier}
    return options


def send_within(
    call: Call, send: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """``send(*args, **kwargs)`` (the client sending ``call``'s request) with the call's
    span current; a failure ends the call with its error and reaches the caller as is."""
    token = _attach(call.plan)
    try:
        return send(*args, **kwargs)
    except BaseException as exc:
        call.finish_error(exc)
        raise
    finally:
        _detach(token)


async def send_within_async(
    call: Call, send: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """:func:`send_within` for a coroutine function."""
    token = _attach(call.plan)
    try:
        return await send(*args, **kwargs)
    except BaseException as exc:
        call.finish_error(exc)
        raise
    finally:
        _detach(token)


def _attach(plan: CallPlan) -> object | None:
    """Make our span current while the SDK sends the request (not when enriching: the
    enriched span is current already)."""
    if not plan.own_span:
        return None
    try:
        return otel_context.attach(plan.context)
    except Exception:
        report_internal_error("attach")
        return None


def _detach(token: object | None) -> None:
    if token is not None:
        try:
            otel_context.detach(token)  # type: ignore[arg-type]
        except Exception:
            report_internal_error("detach")
