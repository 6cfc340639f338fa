"""The wrappers around the ``openai`` client's request path.

Why the request path and not each resource method: ``chat.completions.parse()`` and the
``chat.completions.stream()`` helper never call ``create``, and ``with_raw_response`` /
``with_streaming_response`` return response wrappers from it. Every one of them goes
through ``SyncAPIClient.request`` / ``AsyncAPIClient.request`` exactly once per call
(retries included), with the endpoint path and the JSON body in ``options``. Wrapping
there captures all variants with two wrappers, gives one span per logical call across
retries, and lets the Responses API and every other endpoint pass straight through.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind

from spec_decode_otel.attributes import current_attributes
from spec_decode_otel.config import ENGINE_REQUEST_FIELDS, Settings
from spec_decode_otel.instrumentation.call import Call, report_internal_error
from spec_decode_otel.instrumentation.coexistence import is_foreign_genai_span
from spec_decode_otel.instrumentation.responses import (
    AsyncRawResponseProxy,
    SyncRawResponseProxy,
)
from spec_decode_otel.instrumentation.streams import AsyncStreamProxy, SyncStreamProxy
from spec_decode_otel.telemetry import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    SERVER_ADDRESS,
    SERVER_PORT,
    MetricAttributes,
    Telemetry,
)

logger = logging.getLogger("spec_decode_otel")

#: Endpoint path → GenAI operation name. Everything else passes through untouched.
OPERATIONS: Mapping[str, str] = {
    "/chat/completions": "chat",
    "/completions": "text_completion",
}
PROVIDER = "openai"
#: Distinct (operation, model, server) keys whose attribute dicts are cached.
_ATTR_CACHE_MAX = 256


class Instrumentation:
    """Settings + instruments shared by every wrapped call; the wrappers' ``self``."""

    def __init__(self, settings: Settings, telemetry: Telemetry) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self._allowed_user_keys = frozenset(settings.metric_attributes)
        self._server_cache: tuple[Any, str | None, int | None] | None = None
        #: (operation, model, host, port) → (span attributes, metric attributes), shared
        #: by every call with that key; the dicts are never mutated.
        self._attr_cache: dict[tuple[Any, ...], tuple[dict[str, Any], MetricAttributes]] = {}

    # -- request start ---------------------------------------------------------

    def start(self, client: Any, options: Any) -> tuple[Call, Any, bool, Any] | None:
        """A Call for ``options`` if it is ours, the (possibly amended) options, whether
        we injected ``include_usage``, and the context to attach for the request (our
        span's; None when enriching the current span).

        Returns None for endpoints we leave alone. Never raises.
        """
        try:
            if options.method.lower() != "post":
                return None
            operation = OPERATIONS.get(options.url)
            if operation is None:
                return None
            body = options.json_data
            if type(body) is not dict and not isinstance(body, Mapping):
                return None
            settings = self.settings
            model = body.get("model")
            model = model if isinstance(model, str) else None
            streaming = body.get("stream") is True
            n = body.get("n")
            sequences = n if type(n) is int and n > 1 else 1
            prompt = body.get("prompt")
            if type(prompt) is list and len(prompt) > 1 and type(prompt[0]) is not int:
                # several prompts (strings or token lists): a sequence (or n) for each
                sequences *= len(prompt)
            options, injected_usage = self._amend(options, body, streaming)

            host, port = self._server(client)
            telemetry = self.telemetry
            span_attrs, metric_attrs = self._attributes(operation, model, host, port)
            user = current_attributes()
            if user:
                allowed = self._allowed_user_keys
                extra = {k: telemetry.bound(k, v) for k, v in user.items() if k in allowed}
                if extra:
                    metric_attrs = telemetry.metric_attributes({**metric_attrs.base, **extra})

            current = trace.get_current_span()
            mode = settings.mode
            enrich = current.is_recording() and (
                mode == "enrich" or (mode == "auto" and is_foreign_genai_span(current))
            )
            if enrich:
                span = current
                if user:
                    span.set_attributes(user)
                context = None
            else:
                if user:
                    span_attrs = {**span_attrs, **user}
                span = telemetry.tracer.start_span(
                    f"{operation} {model}" if model else operation,
                    kind=SpanKind.CLIENT,
                    attributes=span_attrs,
                )
                context = trace.set_span_in_context(span)
            call = Call(
                telemetry,
                span,
                own_span=not enrich,
                metric_attributes=metric_attrs,
                # Opt-in; never when the span is another GenAI instrumentation's: it
                # records these itself, and twice would double every GenAI dashboard.
                genai_metrics=settings.genai_metrics
                and not (enrich and is_foreign_genai_span(current)),
                record_per_step=settings.record_per_step,
                per_step_max_length=settings.per_step_max_length,
                requested_sequences=sequences,
                context=context,
            )
            if settings.inject_traceparent:
                options = self._inject_traceparent(options, span)
            return call, options, injected_usage, context
        except Exception:
            report_internal_error("start")
            return None

    def _attributes(
        self, operation: str, model: str | None, host: str | None, port: int | None
    ) -> tuple[dict[str, Any], MetricAttributes]:
        """The span's start attributes and the base metric attributes for one call.

        Cached per key: the bounded metric values a key maps to never change once seen
        (a bounded attribute only ever gains values, up to its limit). The cache stops
        growing at ``_ATTR_CACHE_MAX`` keys; past that, calls build their own dicts.
        """
        key = (operation, model, host, port)
        cached = self._attr_cache.get(key)
        if cached is not None:
            return cached
        span_attrs: dict[str, Any] = {
            GEN_AI_OPERATION_NAME: operation,
            GEN_AI_PROVIDER_NAME: PROVIDER,
        }
        if model is not None:
            span_attrs[GEN_AI_REQUEST_MODEL] = model
        if host is not None:
            span_attrs[SERVER_ADDRESS] = host
        if port is not None:
            span_attrs[SERVER_PORT] = port
        telemetry = self.telemetry
        metric_attrs = {
            GEN_AI_OPERATION_NAME: operation,
            GEN_AI_PROVIDER_NAME: PROVIDER,
            GEN_AI_REQUEST_MODEL: telemetry.bound(GEN_AI_REQUEST_MODEL, model or ""),
            SERVER_ADDRESS: telemetry.bound(SERVER_ADDRESS, host or ""),
        }
        if port is not None:
            metric_attrs[SERVER_PORT] = port
        value = (span_attrs, telemetry.metric_attributes(metric_attrs))
        if len(self._attr_cache) < _ATTR_CACHE_MAX:
            self._attr_cache[key] = value
        return value

    def _amend(self, options: Any, body: Mapping[str, Any], streaming: bool) -> tuple[Any, bool]:
        """Opt-in request changes, on a copy: the user's own objects are never mutated."""
        settings = self.settings
        if not settings.request_engine_stats and not (streaming and settings.inject_include_usage):
            return options, False
        additions: dict[str, Any] = {}
        injected_usage = False
        if streaming and settings.inject_include_usage:
            stream_options = body.get("stream_options")
            if stream_options is None or (
                isinstance(stream_options, Mapping) and "include_usage" not in stream_options
            ):
                additions["stream_options"] = {**(stream_options or {}), "include_usage": True}
                injected_usage = True
        for engine in settings.request_engine_stats:
            for key, value in ENGINE_REQUEST_FIELDS.get(engine, {}).items():
                if key not in body:
                    additions[key] = value
        if not additions:
            return options, False
        options = options.model_copy()
        options.json_data = {**body, **additions}
        return options, injected_usage

    @staticmethod
    def _inject_traceparent(options: Any, span: Span) -> Any:
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        if not carrier:
            return options
        headers = options.headers if isinstance(options.headers, Mapping) else {}
        if any(k.lower() == "traceparent" for k in headers):
            return options
        options = options.model_copy()
        options.headers = {**headers, **carrier}
        return options

    def _server(self, client: Any) -> tuple[str | None, int | None]:
        base_url = client.base_url
        cached = self._server_cache
        if cached is not None and cached[0] is base_url:
            return cached[1], cached[2]
        host = base_url.host or None
        port = base_url.port
        if port is None:
            port = {"https": 443, "http": 80}.get(base_url.scheme)
        self._server_cache = (base_url, host, port)
        return host, port

    # -- the wrappers ------------------------------------------------------------

    def sync_request(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        options = args[1] if len(args) > 1 else kwargs.get("options")
        started = self.start(instance, options) if options is not None else None
        if started is None:
            return wrapped(*args, **kwargs)
        call, options, injected_usage, context = started
        args, kwargs = _with_options(args, kwargs, options)
        token = _attach(context)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            _detach(token)
            call.finish_error(exc)
            raise
        _detach(token)
        return wrap_result(call, result, injected_usage)

    async def async_request(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        options = args[1] if len(args) > 1 else kwargs.get("options")
        started = self.start(instance, options) if options is not None else None
        if started is None:
            return await wrapped(*args, **kwargs)
        call, options, injected_usage, context = started
        args, kwargs = _with_options(args, kwargs, options)
        token = _attach(context)
        try:
            result = await wrapped(*args, **kwargs)
        except BaseException as exc:
            _detach(token)
            call.finish_error(exc)
            raise
        _detach(token)
        return wrap_result(call, result, injected_usage)


def _with_options(args: tuple, kwargs: dict, options: Any) -> tuple[tuple, dict]:
    if len(args) > 1:
        if args[1] is options:
            return args, kwargs
        return (args[0], options, *args[2:]), kwargs
    if kwargs.get("options") is options:
        return args, kwargs
    return args, {**kwargs, "options": options}


def _attach(context: Any) -> object | None:
    if context is None:
        return None
    try:
        return otel_context.attach(context)
    except Exception:
        report_internal_error("attach")
        return None


def _detach(token: object | None) -> None:
    if token is not None:
        try:
            otel_context.detach(token)
        except Exception:
            report_internal_error("detach")


_OPENAI_TYPES: tuple[type, ...] = ()


def _openai_types() -> tuple[type, ...]:
    """(LegacyAPIResponse, AsyncAPIResponse, BaseAPIResponse, Stream, AsyncStream,
    BaseModel), imported on first use (not at import time: ``openai`` is an optional
    dependency). None of the response or stream classes is a ``BaseModel``."""
    global _OPENAI_TYPES
    if not _OPENAI_TYPES:
        from openai import AsyncStream, BaseModel, Stream
        from openai._legacy_response import LegacyAPIResponse
        from openai._response import AsyncAPIResponse, BaseAPIResponse

        _OPENAI_TYPES = (
            LegacyAPIResponse,
            AsyncAPIResponse,
            BaseAPIResponse,
            Stream,
            AsyncStream,
            BaseModel,
        )
    return _OPENAI_TYPES


def wrap_result(call: Call, result: Any, hide_usage: bool) -> Any:
    """What the user gets back: the same object, or a transparent proxy. Never raises."""
    try:
        types = _OPENAI_TYPES or _openai_types()
        if isinstance(result, types[5]):  # a parsed model: the usual non-streaming result
            return wrap_parsed(call, result, hide_usage)
        LegacyAPIResponse, AsyncAPIResponse, BaseAPIResponse = types[:3]
        if isinstance(result, LegacyAPIResponse):
            if not getattr(result, "_stream", False):
                # with_raw_response: the body is already read; parse our own copy so the
                # user's later .parse() is untouched.
                call.finish_dict(json.loads(result.http_response.content))
                return result
            return SyncRawResponseProxy(result, call, hide_usage)
        if isinstance(result, AsyncAPIResponse):
            return AsyncRawResponseProxy(result, call, hide_usage)
        if isinstance(result, BaseAPIResponse):
            return SyncRawResponseProxy(result, call, hide_usage)
        return wrap_parsed(call, result, hide_usage)
    except Exception:
        report_internal_error("wrap_result")
        if not call.done:
            call.finish_empty()
        return result


def wrap_parsed(call: Call, parsed: Any, hide_usage: bool) -> Any:
    """A parsed body: proxy a stream, or finish the call with the object."""
    Stream, AsyncStream = (_OPENAI_TYPES or _openai_types())[3:5]
    if isinstance(parsed, Stream):
        return SyncStreamProxy(parsed, call, hide_usage)
    if isinstance(parsed, AsyncStream):
        return AsyncStreamProxy(parsed, call, hide_usage)
    if hasattr(parsed, "choices"):
        call.finish_object(parsed)
    elif not call.done:
        call.finish_empty()
    return parsed
