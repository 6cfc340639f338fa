"""``SpecDecodeInstrumentor``: the opentelemetry-instrumentation entry point.

``opentelemetry-instrument python app.py`` finds it through the
``opentelemetry_instrumentor`` entry point named ``spec_decode``; code calls
``SpecDecodeInstrumentor().instrument(...)``. :func:`instrument_client` instruments one
client instance instead of every client in the process.
"""

from __future__ import annotations

import contextvars
import functools
import os
import sys
import threading
import warnings
from collections.abc import Callable, Collection
from typing import Any

import wrapt
from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from spec_decode_otel._logging import logger, report_internal_error
from spec_decode_otel.instrumentation.genai_metrics import GenAiMetrics
from spec_decode_otel.instrumentation.patches import Patches
from spec_decode_otel.instrumentation.settings import Settings
from spec_decode_otel.instrumentation.wrapper import Instrumentation
from spec_decode_otel.integrations import note_openai_request, unwatch_litellm, watch_litellm
from spec_decode_otel.integrations.dspy import unwatch_dspy, watch_dspy
from spec_decode_otel.package import _instruments
from spec_decode_otel.telemetry import SCOPE_NAME, instruments_for
from spec_decode_otel.version import __version__

_CLIENT_MARK = "_spec_decode_otel_instrumented"
#: The client method every chat/completions call goes through (see wrapper.py).
_METHOD = "request"
#: Set while one of our process-wide wrappers handles a call, so a second one of ours
#: further down the same call path passes it through instead of recording it again.
_RECORDING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "spec_decode_otel_recording", default=False
)
#: Keywords BaseInstrumentor itself takes; they are not our settings.
_BASE_KEYWORDS = ("skip_dep_check", "raise_exception_on_conflict")


#: This package's directory: frames in files under it are ours, not the application's.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def caller_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the function calling this one
    name the application's line: the first frame outside this package, however many of
    ours (``setup()``'s wrapper, ``sdk_setup.setup``, ``instrument()``) lie between."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def _given(kwargs: dict[str, Any]) -> bool:
    """Whether ``instrument()``'s keywords ask for anything: a setting or a provider
    (``None`` is the default, the environment's setting or the global provider), beyond
    BaseInstrumentor's own keywords, which ``opentelemetry-instrument`` passes."""
    return any(v is not None for k, v in kwargs.items() if k not in _BASE_KEYWORDS)


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
        global_tracer_provider=tracer_provider is None,
        global_meter_provider=meter_provider is None,
    )
    return instrumentation, (settings, id(tracer_provider), id(meter_provider))


class SpecDecodeInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Wraps every ``openai`` client's chat/completions calls in this process.

    Keywords: ``tracer_provider``, ``meter_provider`` and the settings README lists
    (``mode``, ``inject_include_usage``, ...), each also read from its
    ``SPEC_DECODE_OTEL_*`` variable.

    Instrumenting again while instrumented keeps the first settings, as BaseInstrumentor
    does, with a ``RuntimeWarning`` at the caller's line if the new ones differ; except
    that when the first call gave no keyword (``opentelemetry-instrument``'s, or a bare
    ``instrument()``: settings from the environment only), options given in code replace
    it, logged at INFO.
    """

    _instrumentation: Instrumentation | None = None
    _identity: tuple[Any, ...] | None = None
    #: Whether the current instrumentation was given keywords in code (see _given).
    _given_in_code = False
    _patches = Patches("unpatch")
    _lock = threading.Lock()

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def instrument(self, **kwargs: Any) -> None:
        with SpecDecodeInstrumentor._lock:
            if not self.is_instrumented_by_opentelemetry:
                super().instrument(**kwargs)
                return
            if not _given(kwargs):
                return  # asks for nothing: what is instrumented already does
            _, identity = _build(dict(kwargs))  # raises for a bad keyword, as at first
            if identity == SpecDecodeInstrumentor._identity:
                SpecDecodeInstrumentor._given_in_code = True
                return
            if not SpecDecodeInstrumentor._given_in_code:
                logger.info(
                    "spec_decode_otel: the options given in code replace the settings "
                    "instrumented from the environment only (by opentelemetry-instrument "
                    "or an instrument() without keywords)"
                )
                self._uninstrument()
                self._instrument(**kwargs)
                return
            warnings.warn(
                "spec_decode_otel is already instrumented with other options given in "
                "code; the first settings stay (call uninstrument() first to change them)",
                RuntimeWarning,
                stacklevel=caller_stacklevel(),
            )

    def uninstrument(self, **kwargs: Any) -> None:
        with SpecDecodeInstrumentor._lock:
            super().uninstrument(**kwargs)

    def _instrument(self, **kwargs: Any) -> None:
        import openai._base_client as base_client

        instrumentation, identity = _build(dict(kwargs))
        for base, wrapper in (
            (base_client.SyncAPIClient, _sync_wrapper(instrumentation)),
            (base_client.AsyncAPIClient, _async_wrapper(instrumentation)),
        ):
            for cls in _classes_defining_request(base):
                patched = wrapt.FunctionWrapper(cls.__dict__[_METHOD], wrapper)
                SpecDecodeInstrumentor._patches.set(cls, _METHOD, patched)
        SpecDecodeInstrumentor._instrumentation = instrumentation
        SpecDecodeInstrumentor._identity = identity
        SpecDecodeInstrumentor._given_in_code = _given(kwargs)
        # LiteLLM's own HTTP handler bypasses the SDK: a LiteLLM callback covers those
        # calls, registered when (if ever) the application imports litellm.
        watch_litellm(instrumentation)
        # DSPy's own client (lm15) bypasses both: its request methods are wrapped when
        # (if ever) the application imports dspy.
        watch_dspy(instrumentation)

    def _uninstrument(self, **kwargs: Any) -> None:
        unwatch_litellm()
        unwatch_dspy()
        SpecDecodeInstrumentor._patches.restore()
        SpecDecodeInstrumentor._instrumentation = None
        SpecDecodeInstrumentor._identity = None
        SpecDecodeInstrumentor._given_in_code = False


def _classes_defining_request(base: type) -> list[type]:
    """``base`` and those of its subclasses in the ``openai`` package that define their
    own ``request``. The SDK defines it only on the base, but an instrumentation loaded
    before us may have wrapped a subclass's (OpenInference wraps ``OpenAI.request`` and
    ``AsyncOpenAI.request``, and its uninstrument leaves a copy there): calls on that
    class never reach the base's, so ours goes on each such attribute too."""
    found: list[type] = [base]
    todo: list[type] = list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        todo.extend(cls.__subclasses__())
        if cls.__module__.split(".")[0] == "openai" and _METHOD in cls.__dict__:
            found.append(cls)
    return found


Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]


def _sync_wrapper(instrumentation: Instrumentation) -> Wrapper:
    """``instrumentation.sync_request`` while it is the active instrumentation and no
    wrapper of ours further up the call path is already recording this call."""

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if SpecDecodeInstrumentor._instrumentation is not instrumentation or _RECORDING.get():
            return wrapped(*args, **kwargs)
        token = _RECORDING.set(True)
        note_openai_request()  # a LiteLLM call made through the SDK is ours to record
        try:
            return instrumentation.sync_request(wrapped, instance, args, kwargs)
        finally:
            _RECORDING.reset(token)

    return wrapper


def _async_wrapper(instrumentation: Instrumentation) -> Wrapper:
    """The async twin of :func:`_sync_wrapper`."""

    async def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if SpecDecodeInstrumentor._instrumentation is not instrumentation or _RECORDING.get():
            return await wrapped(*args, **kwargs)
        token = _RECORDING.set(True)
        note_openai_request()
        try:
            return await instrumentation.async_request(wrapped, instance, args, kwargs)
        finally:
            _RECORDING.reset(token)

    return wrapper


def instrument_client(client: Any, **kwargs: Any) -> Any:
    """Instrument one ``OpenAI``/``AsyncOpenAI`` instance only; returns the client.

    Clients derived from it with ``client.with_options()``/``copy()`` are covered too, with
    the same settings and providers: they are views of the same client with other request
    options, and code (the SDK's own tool runner among it) makes them per call. While
    :class:`SpecDecodeInstrumentor` instruments the whole process, this client's calls are
    left to it, so no call is ever recorded twice. Wrappers other instrumentations put on
    the client's class stay in the call path.

    The cover lives on the instance (no class attribute changes), so ``copy.copy(client)``
    shares it, as it shares the client's cached resources (``client.chat`` and the rest)
    once used: the copy's calls go out through the original. ``client.copy()`` is the way.

    Instrumenting a client again keeps its first settings, with a ``RuntimeWarning`` at
    the caller's line when the new keywords ask for others, as ``instrument()`` does.
    """
    first = getattr(client, _CLIENT_MARK, None)
    if first is not None and not _given(kwargs):
        return client  # asks for nothing: what instruments it already does
    instrumentation, identity = _build(dict(kwargs))  # raises for a bad keyword
    if first is None:
        _cover(client, instrumentation, identity)
    elif identity != first:
        warnings.warn(
            "this client is already instrumented with other options; the first settings "
            "stay (instrument client.copy() to give a client other ones)",
            RuntimeWarning,
            stacklevel=caller_stacklevel(),
        )
    return client


def _cover(client: Any, instrumentation: Instrumentation, identity: tuple[Any, ...]) -> None:
    """Put ``instrumentation`` on this instance's ``request``, and on the clients its
    ``copy``/``with_options`` make; mark it with ``identity``, what its settings were."""
    import openai._base_client as base_client

    is_async = isinstance(client, base_client.AsyncAPIClient)
    wrapper = instrumentation.async_request if is_async else instrumentation.sync_request

    def guarded(wrapped: Any, instance: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        # The class's request as it is now, with whatever wrappers others put there.
        method = functools.partial(type(client).request, client)
        if SpecDecodeInstrumentor._instrumentation is not None:
            return method(*args, **kw)  # the process-wide wrapper records this call
        note_openai_request()
        return wrapper(method, client, args, kw)

    def derive(wrapped: Any, instance: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        derived = wrapped(*args, **kw)
        try:
            if getattr(derived, _CLIENT_MARK, None) is None:
                _cover(derived, instrumentation, identity)
        except Exception:
            report_internal_error("instrument_client: derived client")
        return derived

    object.__setattr__(client, "request", wrapt.FunctionWrapper(client.request, guarded))
    for name in ("copy", "with_options"):
        method = getattr(client, name, None)
        if callable(method):
            object.__setattr__(client, name, wrapt.FunctionWrapper(method, derive))
    object.__setattr__(client, _CLIENT_MARK, identity)


__all__ = ["SpecDecodeInstrumentor", "instrument_client"]
