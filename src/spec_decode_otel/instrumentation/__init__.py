"""``SpecDecodeInstrumentor``: the opentelemetry-instrumentation entry point.

``opentelemetry-instrument python app.py`` finds it through the
``opentelemetry_instrumentor`` entry point named ``spec_decode``; code can call
``SpecDecodeInstrumentor().instrument(...)`` or :func:`spec_decode_otel.instrument`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Collection
from typing import Any

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.instrumentation.utils import unwrap

from spec_decode_otel.config import Settings
from spec_decode_otel.instrumentation.wrappers import Instrumentation
from spec_decode_otel.telemetry import Telemetry

#: The ``openai`` releases whose request path this wraps (checked by BaseInstrumentor).
_INSTRUMENTS = ("openai >= 1.40, < 4",)
_CLIENT_MARK = "_spec_decode_otel_instrumented"


def _build(kwargs: dict[str, Any]) -> Instrumentation:
    tracer_provider = kwargs.pop("tracer_provider", None)
    meter_provider = kwargs.pop("meter_provider", None)
    settings = Settings.from_env(**kwargs)
    return Instrumentation(settings, Telemetry(meter_provider, tracer_provider))


class SpecDecodeInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Wraps every ``openai`` client's chat/completions calls in this process.

    Keywords: ``tracer_provider``, ``meter_provider`` and every field of
    :class:`spec_decode_otel.config.Settings` (README lists them with their
    ``SPEC_DECODE_OTEL_*`` variables).
    """

    _instrumentation: Instrumentation | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _INSTRUMENTS

    def _instrument(self, **kwargs: Any) -> None:
        instrumentation = _build(dict(kwargs))
        SpecDecodeInstrumentor._instrumentation = instrumentation
        wrapt.wrap_function_wrapper(
            "openai._base_client", "SyncAPIClient.request", instrumentation.sync_request
        )
        wrapt.wrap_function_wrapper(
            "openai._base_client", "AsyncAPIClient.request", instrumentation.async_request
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        import openai._base_client as base_client

        unwrap(base_client.SyncAPIClient, "request")
        unwrap(base_client.AsyncAPIClient, "request")
        SpecDecodeInstrumentor._instrumentation = None


_lock = threading.Lock()


def instrument(**kwargs: Any) -> SpecDecodeInstrumentor:
    """Instrument every ``openai`` client in the process (idempotent)."""
    instrumentor = SpecDecodeInstrumentor()
    with _lock:
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(**kwargs)
    return instrumentor


def uninstrument() -> None:
    """Undo :func:`instrument`."""
    instrumentor = SpecDecodeInstrumentor()
    with _lock:
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()


def instrument_client(client: Any, **kwargs: Any) -> Any:
    """Instrument one ``OpenAI``/``AsyncOpenAI`` instance only; returns the client.

    Copies made later with ``client.with_options()``/``copy()`` are new clients and are
    not instrumented. A client already covered by :func:`instrument` is left as it is,
    so no call is ever recorded twice.
    """
    if getattr(client, _CLIENT_MARK, False):
        return client
    instrumentation = _build(dict(kwargs))
    import openai._base_client as base_client

    is_async = isinstance(client, base_client.AsyncAPIClient)
    wrapper = instrumentation.async_request if is_async else instrumentation.sync_request

    def guarded(wrapped: Any, instance: Any, args: tuple, kw: dict) -> Any:
        # Look the class method up per call: while the process-wide wrapper is active it
        # records the call, so defer to it; otherwise wrap the original request.
        method = type(client).request
        if SpecDecodeInstrumentor._instrumentation is not None:
            return method(client, *args, **kw)
        original = getattr(method, "__wrapped__", method)
        return wrapper(functools.partial(original, client), client, args, kw)

    object.__setattr__(client, "request", wrapt.FunctionWrapper(client.request, guarded))
    object.__setattr__(client, _CLIENT_MARK, True)
    return client


__all__ = ["SpecDecodeInstrumentor", "instrument", "instrument_client", "uninstrument"]
