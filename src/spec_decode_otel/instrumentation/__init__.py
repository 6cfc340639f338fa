"""``SpecDecodeInstrumentor``: the opentelemetry-instrumentation entry point.

``opentelemetry-instrument python app.py`` finds it through the
``opentelemetry_instrumentor`` entry point named ``spec_decode``; code calls
``SpecDecodeInstrumentor().instrument(...)``. :func:`instrument_client` instruments one
client instance instead of every client in the process.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Collection
from typing import Any

import wrapt
from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.instrumentation.utils import unwrap

from spec_decode_otel.instrumentation.genai_metrics import GenAiMetrics
from spec_decode_otel.instrumentation.settings import Settings
from spec_decode_otel.instrumentation.wrapper import Instrumentation
from spec_decode_otel.package import _instruments
from spec_decode_otel.telemetry import SCOPE_NAME, instruments_for
from spec_decode_otel.version import __version__

_CLIENT_MARK = "_spec_decode_otel_instrumented"
#: Keywords BaseInstrumentor itself takes; they are not our settings.
_BASE_KEYWORDS = ("skip_dep_check", "raise_exception_on_conflict")


def _build(kwargs: dict[str, Any]) -> tuple[Instrumentation, tuple[Any, ...]]:
    """The instrumentation for these keywords, and what identifies them (to compare)."""
    for name in _BASE_KEYWORDS:
        kwargs.pop(name, None)
    tracer_provider = kwargs.pop("tracer_provider", None)
    meter_provider = kwargs.pop("meter_provider", None)
    settings = Settings.from_env(**kwargs)
    instrumentation = Instrumentation(
        settings,
        instruments_for(meter_provider),
        trace.get_tracer(SCOPE_NAME, __version__, tracer_provider=tracer_provider),
        GenAiMetrics(meter_provider) if settings.genai_metrics else None,
    )
    return instrumentation, (settings, id(tracer_provider), id(meter_provider))


class SpecDecodeInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Wraps every ``openai`` client's chat/completions calls in this process.

    Keywords: ``tracer_provider``, ``meter_provider`` and the settings README lists
    (``mode``, ``inject_include_usage``, ...), each also read from its
    ``SPEC_DECODE_OTEL_*`` variable. Instrumenting again while instrumented keeps the
    first settings (and warns if the new ones differ).
    """

    _instrumentation: Instrumentation | None = None
    _identity: tuple[Any, ...] | None = None
    _lock = threading.Lock()

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def instrument(self, **kwargs: Any) -> None:
        with SpecDecodeInstrumentor._lock:
            if self.is_instrumented_by_opentelemetry:
                _, identity = _build(dict(kwargs))
                if kwargs and identity != SpecDecodeInstrumentor._identity:
                    warnings.warn(
                        "spec_decode_otel is already instrumented; the first settings "
                        "stay (call uninstrument() first to change them)",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                return
            super().instrument(**kwargs)

    def uninstrument(self, **kwargs: Any) -> None:
        with SpecDecodeInstrumentor._lock:
            super().uninstrument(**kwargs)

    def _instrument(self, **kwargs: Any) -> None:
        instrumentation, identity = _build(dict(kwargs))
        wrapt.wrap_function_wrapper(
            "openai._base_client", "SyncAPIClient.request", instrumentation.sync_request
        )
        wrapt.wrap_function_wrapper(
            "openai._base_client", "AsyncAPIClient.request", instrumentation.async_request
        )
        SpecDecodeInstrumentor._instrumentation = instrumentation
        SpecDecodeInstrumentor._identity = identity

    def _uninstrument(self, **kwargs: Any) -> None:
        import openai._base_client as base_client

        unwrap(base_client.SyncAPIClient, "request")
        unwrap(base_client.AsyncAPIClient, "request")
        SpecDecodeInstrumentor._instrumentation = None
        SpecDecodeInstrumentor._identity = None


def instrument_client(client: Any, **kwargs: Any) -> Any:
    """Instrument one ``OpenAI``/``AsyncOpenAI`` instance only; returns the client.

    Copies made later with ``client.with_options()``/``copy()`` are new clients and are
    not instrumented. While :class:`SpecDecodeInstrumentor` instruments the whole
    process, this client's calls are left to it, so no call is ever recorded twice.
    Wrappers other instrumentations put on the client's class stay in the call path.
    """
    if getattr(client, _CLIENT_MARK, False):
        return client
    instrumentation, _ = _build(dict(kwargs))
    import openai._base_client as base_client

    is_async = isinstance(client, base_client.AsyncAPIClient)
    wrapper = instrumentation.async_request if is_async else instrumentation.sync_request

    def guarded(wrapped: Any, instance: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        # The class's request as it is now, with whatever wrappers others put there.
        method = functools.partial(type(client).request, client)
        if SpecDecodeInstrumentor._instrumentation is not None:
            return method(*args, **kw)  # the process-wide wrapper records this call
        return wrapper(method, client, args, kw)

    object.__setattr__(client, "request", wrapt.FunctionWrapper(client.request, guarded))
    object.__setattr__(client, _CLIENT_MARK, True)
    return client


__all__ = ["SpecDecodeInstrumentor", "instrument_client"]
