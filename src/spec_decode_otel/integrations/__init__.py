"""Integrations with libraries that reach OpenAI-compatible servers without the openai SDK.

:mod:`spec_decode_otel.integrations.litellm` holds ``SpecDecodeLiteLLMCallback``, a LiteLLM
callback (importing that module imports LiteLLM). This module never imports LiteLLM: it
holds what the instrumentor needs whether LiteLLM is installed or not.

- :func:`watch_litellm` / :func:`unwatch_litellm`: ``SpecDecodeInstrumentor`` registers a
  callback with LiteLLM when (and only when) the application imports ``litellm``, so
  instrumenting costs nothing where LiteLLM is installed but unused.
- :class:`SdkMark` and :func:`note_openai_request`: how one call is recorded once. LiteLLM
  sends some calls through the openai SDK (``openai/``, ``custom_openai/``, ``llamafile/``,
  ``lm_studio/``, every text completion), where the openai wrapper records them from the
  wire, and the LiteLLM callback must not record them again. The openai wrapper notes
  each SDK request it handles in two context variables, and the callback skips a call
  when either shows an SDK request made after the call started:

  - the call's mark, which the callback puts in the caller's context when a call starts:
    for a sync call LiteLLM starts it in the caller's thread, where the SDK request is
    made (a text stream's request only when the caller first reads it);
  - the sequence number of the last SDK request in this context: an async call starts in
    a worker thread, but its SDK request runs in the caller's task, and LiteLLM's logging
    task, which reports the call's end, is created from that task. It is read at the
    call's end only if LiteLLM logged no response before (a stream's end is reported
    from the context that read it, which may have made other SDK requests since).

  Neither reaches a streamed text completion in the LiteLLM proxy, which runs the call in
  three contexts that see nothing of each other: LiteLLM starts it in a worker thread,
  the proxy reads its first chunk (so sends the SDK request) in a task of its own, and
  reads the rest, at whose end LiteLLM reports the call ended, in Starlette's response
  task. For streams the wrapper also notes the response id the server sent and the server
  it called (:func:`note_openai_stream`); the callback skips a streamed call whose
  response carries an id and server noted after the call started, and takes the note, so
  one SDK stream excuses one call (:func:`took_openai_stream`). The wrapper reads the
  stream, so notes its first chunk, before LiteLLM's reader of it can reach its end.
  A stream that fails mid-way (the server cuts it) has no response for LiteLLM to report:
  its failure event carries only the exception. That exception is the one the SDK stream
  raised through the wrapper, or has it in its ``__cause__``/``__context__`` chain, and
  the ``httpx`` error in that chain names the stream's HTTP request; so the wrapper notes
  the failed request (:func:`note_openai_stream_error`, weakly) and the callback skips a
  failed call whose exception chain names a noted one (:func:`took_openai_stream_error`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import itertools
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import wrapt

from spec_decode_otel._fork import fork_safe_lock
from spec_decode_otel._logging import report_internal_error

#: Numbers SDK requests and call starts in one order (``next`` is atomic under the GIL).
_sequence = itertools.count(1)
#: The number of the last openai SDK request the wrapper handled in this context.
last_sdk_request: contextvars.ContextVar[int] = contextvars.ContextVar(
    "spec_decode_otel_last_sdk_request", default=0
)


class SdkMark:
    """Whether the openai wrapper handled an SDK request for one LiteLLM call.

    ``decided``: the call's SDK request, if any, has started; later SDK requests in the
    same context (the mark stays in it after the call returns) belong to other calls and
    no longer tick it.
    """

    __slots__ = ("decided", "started", "via_sdk")

    def __init__(self) -> None:
        self.via_sdk = False
        self.decided = False
        self.started = next(_sequence)

    def went_through_sdk(self) -> bool:
        """True when the openai wrapper handled this call (read where LiteLLM reports
        the call's end; once decided, a later SDK request there is another call's)."""
        return self.via_sdk or (not self.decided and last_sdk_request.get() > self.started)


#: The mark of the LiteLLM call running in this context (set by the LiteLLM callback).
current_mark: contextvars.ContextVar[SdkMark | None] = contextvars.ContextVar(
    "spec_decode_otel_litellm_mark", default=None
)


def note_openai_request() -> None:
    """Called by the openai wrapper as an SDK request starts, in the request's context."""
    last_sdk_request.set(next(_sequence))
    mark = current_mark.get()
    if mark is not None and not mark.decided:
        mark.via_sdk = True


#: SDK streams noted and not yet taken, kept at most (a stream no LiteLLM call took,
#: e.g. the application's own openai call, is forgotten eventually).
MAX_STREAMS = 4096
#: Longest response id noted: a server chooses it, and each note keeps it in memory.
MAX_RESPONSE_ID = 256
#: (response id, ``host:port``) → the sequence number when the wrapper noted the stream.
_streams: OrderedDict[tuple[str, str], int] = OrderedDict()
_streams_lock = fork_safe_lock()
#: LiteLLM calls the callback saw start and not yet end. Streams are noted only while
#: there is one: an application that imports LiteLLM and streams through the openai SDK
#: alone keeps nothing.
_open_litellm_calls = 0


def set_open_litellm_calls(count: int) -> None:
    """Called by the LiteLLM callback whenever its count of open calls changes."""
    global _open_litellm_calls
    _open_litellm_calls = count


def open_litellm_calls() -> int:
    """The LiteLLM callback's count of open calls (read without a lock: safe in
    ``__del__``)."""
    return _open_litellm_calls


def note_openai_stream(response_id: Any, server: str) -> None:
    """Called by the openai wrapper at an SDK stream's first chunk; kept while a LiteLLM
    call is open (only the LiteLLM callback takes these notes)."""
    if (
        not _open_litellm_calls
        or not isinstance(response_id, str)
        or not 0 < len(response_id) <= MAX_RESPONSE_ID
    ):
        return
    key = (response_id, server)
    with _streams_lock:
        _streams[key] = next(_sequence)
        _streams.move_to_end(key)
        if len(_streams) > MAX_STREAMS:
            _streams.popitem(last=False)


def took_openai_stream(response_id: Any, server: str, since: int) -> bool:
    """True when the wrapper noted an SDK stream with this response id from this server
    after ``since`` (a LiteLLM call's start); the note is taken, so it excuses one call."""
    if not isinstance(response_id, str) or not response_id:
        return False
    with _streams_lock:
        noted = _streams.get((response_id, server))
        if noted is None or noted <= since:
            return False
        del _streams[(response_id, server)]
        return True


#: Longest ``__cause__``/``__context__`` chain followed from an exception.
MAX_CHAIN = 16
#: The HTTP requests of SDK streams that failed, each with its ``host:port``. An error
#: cannot be weakly referenced, and holding it would hold its traceback's frames (and the
#: connection they hold) until taken; the request it names can be, so a note lasts only
#: as long as something (LiteLLM's exception, say) still holds the failed request.
_failed_requests: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _requests(error: Any) -> Iterator[Any]:
    """The HTTP requests ``error`` and its ``__cause__``/``__context__`` chain name (an
    ``httpx``/``httpx2`` or ``openai`` error's ``request``; httpx raises when its error was
    made without one). Loops end; at most ``MAX_CHAIN`` links are followed."""
    seen: set[int] = set()
    while isinstance(error, BaseException) and id(error) not in seen and len(seen) < MAX_CHAIN:
        seen.add(id(error))
        try:
            request = getattr(error, "request", None)
        except Exception:
            request = None
        if request is not None:
            yield request
        error = error.__cause__ or error.__context__


def note_openai_stream_error(error: BaseException, server: str) -> None:
    """Called by the openai wrapper when reading an SDK stream raised ``error`` (before
    the error reaches whoever reads the stream); kept while a LiteLLM call is open. Never
    raises: it runs as the user's error is on its way to them."""
    if not _open_litellm_calls:
        return
    try:
        with _streams_lock:
            for request in _requests(error):
                with contextlib.suppress(TypeError):  # not weakly referenceable
                    _failed_requests[request] = server
    except Exception:
        report_internal_error("note_openai_stream_error")


def took_openai_stream_error(error: Any, server: str) -> bool:
    """True when ``error``, or an exception in its cause/context chain, names the request
    of an SDK stream to this server that failed through the wrapper: the wrapper recorded
    the failed call. The note is taken, so it excuses one call."""
    with _streams_lock:
        for request in _requests(error):
            try:
                noted = _failed_requests.get(request) == server
            except TypeError:  # not weakly referenceable: never noted
                continue
            if noted:
                del _failed_requests[request]
                return True
    return False


# -- registering the LiteLLM callback --------------------------------------------------

_lock = threading.Lock()
#: What the instrumentor wants registered: its Instrumentation, or None.
_wanted: Any = None
#: The callback registered with LiteLLM for ``_wanted``, if LiteLLM was imported.
_registered: Any = None
_hook_installed = False


def litellm_installed() -> bool:
    """True when ``litellm`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("litellm") is not None
    except (ImportError, ValueError):
        return False


def watch_litellm(instrumentation: Any) -> None:
    """Register a LiteLLM callback for ``instrumentation`` now if LiteLLM is imported,
    else as soon as the application imports it. Nothing happens without LiteLLM."""
    global _wanted, _hook_installed
    if not litellm_installed():
        return
    with _lock:
        _wanted = instrumentation
        install = not _hook_installed
        _hook_installed = True
    if install:
        # Runs at once when litellm is already imported, else right after its import.
        wrapt.register_post_import_hook(_on_litellm_import, "litellm")
    elif "litellm" in sys.modules:
        _on_litellm_import(sys.modules["litellm"])


def unwatch_litellm() -> None:
    """Remove the callback :func:`watch_litellm` registered (and forget the wish)."""
    global _wanted, _registered
    with _lock:
        _wanted = None
        callback, _registered = _registered, None
    if callback is not None:
        try:
            callback.unregister()
        except Exception:
            report_internal_error("litellm.unregister")


def _on_litellm_import(_module: Any) -> None:
    global _registered
    try:
        from spec_decode_otel.integrations.litellm import SpecDecodeLiteLLMCallback

        with _lock:
            if _wanted is None or _registered is not None:
                return
            callback = SpecDecodeLiteLLMCallback.for_instrumentation(_wanted)
            callback.register()
            _registered = callback
    except Exception:
        report_internal_error("litellm.register")


__all__ = [
    "SdkMark",
    "current_mark",
    "last_sdk_request",
    "note_openai_request",
    "note_openai_stream",
    "note_openai_stream_error",
    "open_litellm_calls",
    "set_open_litellm_calls",
    "took_openai_stream",
    "took_openai_stream_error",
    "unwatch_litellm",
    "watch_litellm",
]
