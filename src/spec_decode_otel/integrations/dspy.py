"""DSPy: records for the calls DSPy sends with its own client, lm15.

DSPy 3.4's default ``dspy.LM(model, engine="auto")`` sends a model its vendored client
knows (``openai/...``, ``hosted_vllm/...``), given only ``api_key``, ``api_base``,
``base_url`` or ``timeout``, through that client, ``dspy/_vendor/lm15``, over its own
sockets (``dspy/clients/backend_selection.py`` ``select_backend``): neither the openai SDK
nor LiteLLM runs. Every Chat Completions request lm15 makes (the ``openai-chat``,
``vllm`` and other OpenAI-compatible presets, all ``OpenAIChatLM``) passes through three
methods, read in DSPy 3.4.1's source, which this module wraps:

- ``BaseProviderLM._send(request)`` (``_vendor/lm15/providers/base.py``) and its async
  twin ``AsyncBaseProviderLM._send`` (``providers/async_base.py``): a non-streamed
  request, the ``TransportRequest`` (method, url, the JSON body as bytes) in, the whole
  answer out (``HttpResponse``: status, body bytes). ``complete`` parses that body
  afterwards (``OpenAIChatLM.parse_response``).
- ``BaseProviderLM._stream_raw(request, req)`` / ``AsyncBaseProviderLM._stream_raw``: a
  streamed request, a (async) generator sending ``req`` when first read and yielding
  lm15's stream events; ``stream`` hands it to ``coalesce_stream``, which closes it.
- ``OpenAIChatLM.parse_stream_events(request, raw_event)`` (``providers/openai_chat.py``),
  called by both ``_stream_raw`` with each server-sent event as it arrived
  (``raw_event.data``: the chunk's JSON text), the async one through its sync sibling
  (``AsyncOpenAIChatLM._inner``).

Each request becomes a ``Call`` planned by the openai wrapper's ``Instrumentation.plan``
from the JSON body lm15 sends (same span, metric attributes and coexistence rules) and
ended through the same ends: ``finish_dict`` with the decoded answer, ``finish_error``,
or a ``StreamObserver`` fed each event's decoded JSON (``observe_payload``, as for a
stream the user reads raw) while the stream proxy reads lm15's generator. Nothing lm15
or DSPy sees changes: the same request is sent (none of the opt-in request amendments
apply), the same answer and events come back, and every wrapper passes straight through
when it is not ours, is uninstrumented, or fails. The request is kept only without its
content (``request_kept``), as the LiteLLM callback keeps it.

A failed request ends with the class of error lm15 raises for it: the exception itself,
the class the provider's ``normalize_error`` gives an HTTP error status and body (what
lm15's ``_http_error`` raises), or the one ``error_class_for_code`` gives a stream's error event
(as DSPy's ``stream_guard`` raises). A stream ends when read to its end, when lm15 or
DSPy closes it (``coalesce_stream``, ``closing_stream``), or, dropped unread to its end,
when the garbage collector reclaims it (on the finalizer's thread, like the openai
wrapper's stream proxies). A stream is planned when first read, when its request goes
out: one never read sent nothing and records nothing.

One record per call: DSPy under ``engine="litellm"`` (or any LM setting lm15 does not
take) never reaches lm15, and lm15 never calls the openai SDK or LiteLLM.
"""

from __future__ import annotations

import contextvars
import sys
import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import wrapt
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from spec_decode_otel._attributes import current_attributes
from spec_decode_otel._logging import report_internal_error
from spec_decode_otel.instrumentation import finalizer
from spec_decode_otel.instrumentation.call import Call
from spec_decode_otel.instrumentation.patches import Patches
from spec_decode_otel.instrumentation.streams import NOTHING_INJECTED, StreamObserver
from spec_decode_otel.instrumentation.wrapper import (
    Instrumentation,
    _requested_sequences,
    send_within,
    send_within_async,
)
from spec_decode_otel.integrations._litellm_kwargs import request_kept, url_server
from spec_decode_otel.sse import MAX_EVENT_CHARS, decode_json

#: The module whose import brings every class wrapped here (it imports ``base`` and
#: ``openai_chat``); ``import dspy`` imports it.
HOOKED_MODULE = "dspy._vendor.lm15.providers.async_base"
#: The endpoint recorded (``OpenAIChatLM.build_request``'s URL).
CHAT_PATH = "/chat/completions"
#: Bytes of an error body handed to lm15's error mapping, which decodes it whole (as
#: lm15 does, to read the envelope's code) and keeps 500 characters of its message: the
#: largest body the instrumentation reads (``sse.MAX_EVENT_CHARS``). A longer one is cut,
#: and then typed by its status alone.
MAX_ERROR_BODY = MAX_EVENT_CHARS

_lock = threading.Lock()
#: The instrumentation recording lm15's calls, or None.
_active: Instrumentation | None = None
_hook_registered = False
#: The methods wrapped.
_patches = Patches("dspy.unpatch")
#: The instrumentation ``_patches`` were made for.
_patched_for: Instrumentation | None = None
#: What the wrappers need of lm15, set when its module is imported.
_lm15: dict[str, Any] = {}
#: The observer of the stream whose next event is being read in this context: set only
#: while the stream proxy reads lm15's generator, so ``parse_stream_events`` sees it.
_observing: contextvars.ContextVar[StreamObserver | None] = contextvars.ContextVar(
    "spec_decode_otel_lm15_stream", default=None
)


def watch_dspy(instrumentation: Instrumentation) -> None:
    """Wrap lm15's request methods for ``instrumentation`` now if DSPy is imported, else
    as soon as the application imports it. Costs nothing where DSPy is never imported."""
    global _active, _hook_registered
    with _lock:
        _active = instrumentation
        register = not _hook_registered
        _hook_registered = True
    if register:
        # Runs at once when the module is already imported, else right after its import.
        wrapt.register_post_import_hook(_on_import, HOOKED_MODULE)
    elif HOOKED_MODULE in sys.modules:
        _on_import(sys.modules[HOOKED_MODULE])


def unwatch_dspy() -> None:
    """Put back every method :func:`watch_dspy` wrapped (unless someone has since wrapped
    ours: theirs stays, and ours inside it passes every call through)."""
    global _active
    with _lock:
        _active = None
        _restore()


def _restore() -> None:
    """Put back what ``_patches`` wrapped (under ``_lock``)."""
    global _patched_for
    _patches.restore()
    _patched_for = None


def _on_import(_module: Any) -> None:
    global _patched_for
    try:
        from dspy._vendor.lm15 import errors
        from dspy._vendor.lm15.providers import async_base, base, openai_chat

        targets: list[tuple[type, str, Callable[..., Any]]] = [
            (base.BaseProviderLM, "_send", _sync_send),
            (async_base.AsyncBaseProviderLM, "_send", _async_send),
            (base.BaseProviderLM, "_stream_raw", partial(_stream_raw, _SyncEvents)),
            (async_base.AsyncBaseProviderLM, "_stream_raw", partial(_stream_raw, _AsyncEvents)),
            (openai_chat.OpenAIChatLM, "parse_stream_events", _parse_stream_event),
        ]
        with _lock:
            instrumentation = _active
            if instrumentation is None or _patched_for is instrumentation:
                return
            _restore()
            if not all(callable(cls.__dict__.get(name)) for cls, name, _ in targets):
                return  # another lm15: its request path is not the one read here
            _lm15.update(
                chat=(openai_chat.OpenAIChatLM, async_base.AsyncOpenAIChatLM),
                error_class_for_code=errors.error_class_for_code,
            )
            for cls, name, wrapper in targets:
                # Ours records only while its own instrumentation is the active one: one
                # left inside someone else's wrapper by an uninstrument, then instrumenting
                # again, passes every call through (no call is recorded twice).
                patched = wrapt.FunctionWrapper(
                    cls.__dict__[name],
                    partial(wrapper, instrumentation),
                    enabled=lambda: _active is instrumentation,
                )
                _patches.set(cls, name, patched)
            _patched_for = instrumentation
    except Exception:
        report_internal_error("dspy.patch")


# -- starting a call ---------------------------------------------------------------------


class _Pending:
    """What a chat request's call is planned from: its JSON body (without content), and
    the caller's context and attributes where it was made."""

    __slots__ = ("body", "context", "server", "user")

    def __init__(self, body: Mapping[str, Any], server: tuple[str | None, int | None]) -> None:
        self.body = body
        self.server = server
        self.context = otel_context.get_current()
        self.user = current_attributes()

    def start(self, instrumentation: Instrumentation, streaming: bool) -> Call | None:
        """The call, started now; None if that failed. Never raises."""
        body = self.body
        stream_options = body.get("stream_options")
        try:
            return Call(
                instrumentation.plan(
                    "chat",
                    model=body.get("model"),
                    server=self.server,
                    user=self.user,
                    parent=self.context,
                    requested_sequences=_requested_sequences(body),
                    request=body,
                    streaming=streaming,
                    include_usage=isinstance(stream_options, Mapping)
                    and stream_options.get("include_usage") is True,
                )
            )
        except Exception:
            report_internal_error("dspy.start")
            return None


def _pending(instance: Any, req: Any) -> _Pending | None:
    """A call's plan for ``req`` (lm15's ``TransportRequest``) when it is a Chat
    Completions request of lm15's OpenAI-compatible client, sync or async, and we are
    recording; else None. Never raises."""
    try:
        if not is_instrumentation_enabled() or not isinstance(instance, _lm15["chat"]):
            return None
        if req is None or str(getattr(req, "method", "")).upper() != "POST":
            return None
        url = str(req.url)
        if not urlsplit(url).path.endswith(CHAT_PATH):
            return None
        body = decode_json(req.body)
        if not isinstance(body, Mapping):
            return None
        return _Pending(request_kept(body), url_server(url))
    except Exception:
        report_internal_error("dspy.start")
        return None


def _argument(args: tuple[Any, ...], kwargs: Any, index: int, name: str) -> Any:
    """The wrapped method's argument ``name``, given at ``index`` or by name (else None)."""
    return args[index] if len(args) > index else kwargs.get(name)


def _send_call(instrumentation: Instrumentation, instance: Any, req: Any) -> Call | None:
    pending = _pending(instance, req)
    return None if pending is None else pending.start(instrumentation, streaming=False)


# -- non-streamed requests ---------------------------------------------------------------


def _sync_send(
    instrumentation: Instrumentation,
    wrapped: Callable[..., Any],
    instance: Any,
    args: tuple[Any, ...],
    kwargs: Any,
) -> Any:
    call = _send_call(instrumentation, instance, _argument(args, kwargs, 0, "request"))
    if call is None:
        return wrapped(*args, **kwargs)
    response = send_within(call, wrapped, args, kwargs)
    _end(call, instance, response)
    return response


async def _async_send(
    instrumentation: Instrumentation,
    wrapped: Callable[..., Any],
    instance: Any,
    args: tuple[Any, ...],
    kwargs: Any,
) -> Any:
    call = _send_call(instrumentation, instance, _argument(args, kwargs, 0, "request"))
    if call is None:
        return await wrapped(*args, **kwargs)
    response = await send_within_async(call, wrapped, args, kwargs)
    _end(call, instance, response)
    return response


def _end(call: Call, instance: Any, response: Any) -> None:
    """End a non-streamed call with lm15's ``HttpResponse``: its decoded body, or, for
    an error status, the class of error lm15 raises for it. Never raises."""
    try:
        status = response.status
        if isinstance(status, int) and status >= 400:
            call.finish_error(_status_error(instance, status, response.body))
            return
        body = decode_json(response.body)
        call.finish_dict(body if isinstance(body, Mapping) else None)
    except Exception:
        report_internal_error("dspy.end")
    finally:
        call.finish_empty()  # a no-op once ended: the span never stays open


def _status_error(instance: Any, status: int, body: Any) -> BaseException:
    """The error lm15's ``_http_error`` makes of this status and body (only its class is
    read): the provider's own ``normalize_error``, which reads the error envelope's code
    (``OpenAIChatLM`` borrows ``OpenAILM``'s: ``context_length_exceeded`` is a
    ``ContextLengthError``, ``insufficient_quota`` on a 429 a ``BillingError``), not the
    status alone. Whatever it raises instead is what lm15 would raise."""
    text = bytes(body[:MAX_ERROR_BODY]).decode("utf-8", errors="replace")
    try:
        error: BaseException = instance.normalize_error(status, text)
    except Exception as exc:
        return exc
    return error


# -- streamed requests -------------------------------------------------------------------


def _stream_raw(
    events: type[_EventsBase],
    instrumentation: Instrumentation,
    wrapped: Callable[..., Any],
    instance: Any,
    args: tuple[Any, ...],
    kwargs: Any,
) -> Any:
    """lm15's generator for ``_stream_raw(request, req=None)``, read through ``events``.
    A ``req`` of None (lm15 to build it, which its ``stream`` never leaves it to) is not
    recorded."""
    source = wrapped(*args, **kwargs)
    pending = _pending(instance, _argument(args, kwargs, 1, "req"))
    return source if pending is None else events(source, pending, instrumentation)


def _parse_stream_event(
    instrumentation: Instrumentation,
    wrapped: Callable[..., Any],
    instance: Any,
    args: tuple[Any, ...],
    kwargs: Any,
) -> Any:
    observer = _observing.get()
    if observer is not None:
        raw = _argument(args, kwargs, 1, "raw_event")
        _observe_raw(observer, getattr(raw, "data", None))
    return wrapped(*args, **kwargs)


def _observe_raw(observer: StreamObserver, data: Any) -> None:
    """One server-sent event's data, as lm15 received it: a chunk's JSON is noted; the
    end marker and error events are left to the stream proxy (lm15 turns them into
    events it yields)."""
    try:
        if not isinstance(data, str) or not data or data == "[DONE]" or observer.call.done:
            return
        payload = decode_json(data)
        if isinstance(payload, Mapping) and not isinstance(payload.get("error"), Mapping):
            observer.observe_payload(payload)
    except Exception:
        report_internal_error("dspy.stream_event")


class _EventsBase(wrapt.ObjectProxy):  # type: ignore[type-arg]  # generic from wrapt 2
    """lm15's generator of stream events, read through: its call starts at the first
    read (when lm15 sends the request) and ends exactly once."""

    def __init__(self, wrapped: Any, pending: _Pending, instrumentation: Instrumentation) -> None:
        super().__init__(wrapped)
        self._self_pending: _Pending | None = pending
        self._self_instrumentation = instrumentation
        self._self_observer: StreamObserver | None = None
        finalizer.start()

    def __repr__(self) -> str:
        return repr(self.__wrapped__)

    def _self_begin(self) -> StreamObserver | None:
        """The stream's observer, its call started at the first read; None when not
        recorded (uninstrumented since, the stream passes through). Never raises."""
        pending, self._self_pending = self._self_pending, None
        instrumentation = self._self_instrumentation
        if pending is not None and _active is instrumentation:
            call = pending.start(instrumentation, streaming=True)
            if call is not None:
                self._self_observer = StreamObserver(call, NOTHING_INJECTED)
        return self._self_observer

    def _self_event(self, observer: StreamObserver, event: Any) -> None:
        """An lm15 event read: a stream error event fails the call with the class of
        error raised for it."""
        try:
            if getattr(event, "type", None) == "error":
                code = getattr(getattr(event, "error", None), "code", None)
                error_class = _lm15["error_class_for_code"](str(code))
                observer.on_error(error_class("stream error event"))
        except Exception:
            report_internal_error("dspy.stream_error")
            observer.on_stop()

    def _self_stop(self) -> None:
        observer = self._self_observer
        if observer is not None:
            observer.on_stop()

    def __del__(self) -> None:
        observer = getattr(self, "_self_observer", None)
        if observer is not None and observer.call.reclaimed():
            finalizer.defer(observer.on_stop)


class _SyncEvents(_EventsBase):
    def __iter__(self) -> Any:
        return self

    def __next__(self) -> Any:
        observer = self._self_observer or self._self_begin()
        if observer is None:
            return next(self.__wrapped__)
        token = _observing.set(observer)
        try:
            event = next(self.__wrapped__)
        except StopIteration:
            observer.on_end()
            raise
        except BaseException as exc:
            observer.on_error(exc)
            raise
        finally:
            _observing.reset(token)
        self._self_event(observer, event)
        return event

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_stop()


class _AsyncEvents(_EventsBase):
    def __aiter__(self) -> Any:
        return self

    async def __anext__(self) -> Any:
        observer = self._self_observer or self._self_begin()
        if observer is None:
            return await self.__wrapped__.__anext__()
        token = _observing.set(observer)
        try:
            event = await self.__wrapped__.__anext__()
        except StopAsyncIteration:
            observer.on_end()
            raise
        except BaseException as exc:
            observer.on_error(exc)
            raise
        finally:
            _observing.reset(token)
        self._self_event(observer, event)
        return event

    async def aclose(self) -> None:
        try:
            await self.__wrapped__.aclose()
        finally:
            self._self_stop()


__all__ = ["unwatch_dspy", "watch_dspy"]
