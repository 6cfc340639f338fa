"""Transparent stream proxies: see every chunk, change none, finalize exactly once.

One :class:`StreamObserver` holds everything a stream teaches us, with the shape of
util-genai's stream wrapper: ``observe(chunk)`` per chunk, then exactly one of
``on_end`` (exhausted), ``on_error`` (the stream raised) or ``on_stop`` (closed, left
its ``with`` block, or garbage-collected before its end: then on the finalizer's thread,
see :mod:`.finalizer`). The sync and async proxies only forward to the SDK's stream and
call those hooks.

A stream the user stops reading early is not an error: its span ends with status unset
and ``spec_decode.read_to_end=false``, with whatever stats had arrived. So does one whose
read is cancelled or interrupted (``CancelledError``, ``KeyboardInterrupt``): ``on_error``
hands those over, and the ``Call`` counts only an ``Exception`` as a failure.

The span is never made current while the user iterates: between chunks the caller's own
context is in force.

A stop that arrives from inside one of our own reads (called, however deep, from our read
loop while the SDK's stream produces the next chunk) waits for that read: the SDK's stream
closes its HTTP response in its iterator's ``finally`` as it reaches the end, and an
instrumentation hooked on that close (genai-openai 1.3b0) closes our proxy from there. The
read then ends the call: read to the end on ``StopIteration``, failed on an error, stopped
early after a chunk it hands over.

``copy.copy()`` of a proxy copies what it wraps the way the SDK does (a shallow copy: the
same stream, its iterator and response shared) and watches the copy with the same
observer, so the call still ends once; ``copy.deepcopy()`` and ``pickle`` do exactly what
they do to the SDK's object (see :class:`CopiedLikeTheSdk`).
"""

from __future__ import annotations

import copy
import functools
import os
import sys
import time
import typing
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from types import FrameType
from typing import Any, NamedTuple

import wrapt

from spec_decode_otel._logging import report_internal_error
from spec_decode_otel.capture import sdk_choices
from spec_decode_otel.instrumentation import finalizer
from spec_decode_otel.instrumentation.call import (
    MAX_FINISH_REASONS,
    Call,
    field_of,
    responses_finish_reason,
)
from spec_decode_otel.integrations import note_openai_stream, note_openai_stream_error
from spec_decode_otel.record import MAX_CHOICES

#: Chunks kept for detection: only those carrying something adapters read. "Last wins"
#: everywhere, so a stream whose every chunk carries a field needs only its tail.
KEEP_CHUNKS = 32
#: The Responses API stream events that carry the finished response.
RESPONSES_TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.incomplete", "response.failed"}
)
#: The Responses API stream events that say the response failed: each names the call's
#: ``error.type`` (a fixed value, never the server's text: it is a metric attribute too).
RESPONSES_FAILURE_EVENTS = frozenset({"response.failed", "error"})


class Injected(NamedTuple):
    """What our opt-in amendments added to a streaming request. The server then sends
    chunks the user never asked for, with no choices: hidden from their code."""

    #: ``stream_options.include_usage``: the usage chunk.
    usage: bool = False
    #: An engine's stats switch (SGLang's ``return_spec_tokens_details``): a chunk with
    #: neither choices nor usage, there for the stats alone (SGLang's ``sglext`` chunk).
    engine_fields: bool = False

    def hides(self, usage: Any) -> bool:
        """Whether a chunk without choices, with this ``usage``, is ours to hide."""
        return self.usage if usage is not None else self.engine_fields


NOTHING_INJECTED = Injected()


class StreamObserver:
    """What a stream proxy learns from the chunks it passes on."""

    def __init__(self, call: Call, injected: Injected) -> None:
        self.call = call
        self.injected = injected
        self.kept: deque[Any] = deque(maxlen=KEEP_CHUNKS)
        self.finish_reasons: list[str] = []
        self.first_at: float | None = None
        self.model: str | None = None
        #: ``model`` is the one an event ending a Responses stream named.
        self.model_final = False
        self.multi = False
        #: The Responses event that said the response failed, if one did.
        self.failure: str | None = None
        #: A stop arrived from inside one of our reads: that read's end ends the call.
        self._stop_pending = False
        finalizer.watch(self)

    def read_returned(self, chunk: Any) -> bool:
        """One of our reads returned ``chunk``: noted, and True when the user gets it. A
        stop that arrived from inside the read ends the call now, after the chunk (a
        read that ends the stream or raises ends it through ``on_end``/``on_error``)."""
        shown = self.observe(chunk)
        if self._stop_pending:
            self._stop_pending = False
            self._finish(read_to_end=False)
        return shown

    def observe(self, chunk: Any) -> bool:
        """Note one chunk; True when the user gets it (all but our injected usage chunk).

        A chunk is kept when it carries anything an adapter reads: a non-standard field
        on the chunk or a choice, usage, or a finish reason.
        """
        try:
            if not hasattr(chunk, "choices"):
                return self._observe_other(chunk)
            if self.first_at is None:
                self._first(getattr(chunk, "model", None), getattr(chunk, "id", None))
            choices = sdk_choices(chunk)
            keep = bool(chunk.model_extra) or chunk.usage is not None
            self.multi = self.multi or len(choices) > 1
            for choice in choices[:MAX_CHOICES]:
                try:  # only an object in the JSON became a Choice (missing fields None)
                    index, extra, reason = choice.index, choice.model_extra, choice.finish_reason
                except AttributeError:  # a number, a string, null: kept as it came
                    continue
                if self._note_choice(index, bool(extra), reason):
                    keep = True
            if keep:
                self.kept.append(chunk)
                return choices != [] or not self.injected.hides(chunk.usage)
        except Exception:
            report_internal_error("stream.observe")
        return True

    def observe_payload(self, payload: Mapping[str, Any]) -> None:
        """Note one chunk or Responses event decoded from SSE the user reads raw: the
        same notes as :meth:`observe`, read from the JSON. A raw reader never has the SDK
        build its chunk objects, which cost several times the reading itself, so neither
        do we; the SDK's own field names tell a non-standard field."""
        try:
            if self.call.plan.responses_api:
                # A Responses API event, kept as .parse() keeps the SDK's event for it (see
                # _observe_other): the fields the SDK declares for its type tell an extra.
                response = payload.get("response")
                if self.first_at is None:
                    self._first(field_of(response, "model"), field_of(response, "id"))
                kind = payload.get("type")
                if _is_terminal(kind) or not _responses_event_fields(kind).issuperset(payload):
                    self.kept.append(payload)
                self._note_event(kind, response)
                return
            if self.first_at is None:
                self._first(payload.get("model"), payload.get("id"))
            choices = payload.get("choices")
            choices = choices if isinstance(choices, list) else []
            root_fields, choice_fields = _sdk_fields()
            keep = payload.get("usage") is not None or not root_fields.issuperset(payload)
            self.multi = self.multi or len(choices) > 1
            for choice in choices[:MAX_CHOICES]:
                if isinstance(choice, Mapping) and self._note_choice(
                    choice.get("index"),
                    not choice_fields.issuperset(choice),
                    choice.get("finish_reason"),
                ):
                    keep = True
            if keep:
                self.kept.append(payload)
        except Exception:
            report_internal_error("stream.observe_payload")

    def _observe_other(self, chunk: Any) -> bool:
        """A chunk without ``choices``: a chunk or event the SDK left as the server's JSON
        (a stream parsed with ``to=Stream[dict]``), or a Responses API event. An event is
        kept when it carries a non-standard field (llama.cpp's ``timings`` on
        ``response.completed``) or the finished response (its usage, status and root
        fields, e.g. vLLM's ``metrics``)."""
        if isinstance(chunk, Mapping):
            self.observe_payload(chunk)
            return chunk.get("choices") != [] or not self.injected.hides(chunk.get("usage"))
        if chunk is None:
            # ``data: null``: llama.cpp (b11312) starts a stream of several prompts with
            # one. It is no first chunk: it names neither the model nor the response.
            return True
        response = getattr(chunk, "response", None)
        if self.first_at is None:  # a Responses event names its response's model and id
            holder = chunk if response is None else response
            self._first(getattr(holder, "model", None), getattr(holder, "id", None))
        kind = getattr(chunk, "type", None)
        if getattr(chunk, "model_extra", None) or _is_terminal(kind):
            self.kept.append(chunk)
        self._note_event(kind, response)
        return True

    # -- what both kinds of chunk note --------------------------------------------------

    def _first(self, model: Any, response_id: Any) -> None:
        self.first_at = time.perf_counter()
        self.model = model if isinstance(model, str) else None
        # A LiteLLM call this stream carries is ours: its callback must not record it too.
        note_openai_stream(response_id, self.call.plan.server)

    def _note_choice(self, index: Any, non_standard: bool, reason: Any) -> bool:
        """One choice of a chunk; True when it carries something adapters read."""
        if index:
            self.multi = True
        if reason is None:
            return non_standard
        self._finish_reason(reason)
        return True

    def _note_event(self, kind: Any, response: Any) -> None:
        """A Responses API event that says the response failed, and the finish reason of
        the first that ends it (one response, one reason, however often it is sent).

        The model is that of the first event that ends the response, which carries the
        finished response, else of the first event carrying a response: an earlier event
        may name another (a gateway routing the call, a server's alias)."""
        model = field_of(response, "model")
        if isinstance(model, str) and (
            self.model is None or (_is_terminal(kind) and not self.model_final)
        ):
            self.model = model
            self.model_final = _is_terminal(kind)
        if isinstance(kind, str) and kind in RESPONSES_FAILURE_EVENTS:
            self.failure = kind
        if not _is_terminal(kind) or self.finish_reasons:
            return
        reason = responses_finish_reason(response)
        if reason is not None:
            self._finish_reason(reason)

    def _finish_reason(self, reason: Any) -> None:
        if len(self.finish_reasons) < MAX_FINISH_REASONS:
            self.finish_reasons.append(reason)

    def on_end(self) -> None:
        """The stream was read to its end."""
        self._finish(read_to_end=True)

    def on_error(self, error: BaseException) -> None:
        """Reading the stream raised ``error`` (re-raised to the user)."""
        # A LiteLLM call whose failure this error causes is ours: see note_openai_stream.
        note_openai_stream_error(error, self.call.plan.server)
        self._finish(read_to_end=False, error=error)

    def on_stop(self) -> None:
        """Closed, exited or collected: before its end, unless ``on_end`` came first.

        From inside one of our reads, it waits for that read."""
        if _inside_read(self):
            self._stop_pending = True
            return
        self._finish(read_to_end=False)

    def on_exit(self) -> None:
        """The process is exiting with the stream still held: stopped there, unless its
        call ended before or is a forked parent's."""
        if self.call.pid == os.getpid():
            self._finish(read_to_end=False)

    def _finish(self, *, read_to_end: bool, error: BaseException | None = None) -> None:
        if self.call.done:
            return
        # Cleared only after the call has ended (whichever thread ended it): a close from
        # another thread racing the reader's end must not leave the winner an empty copy.
        self.call.finish_stream(
            list(self.kept),
            response_model=self.model,
            finish_reasons=self.finish_reasons,
            multi_sequence=self.multi,
            first_chunk_at=self.first_at,
            read_to_end=read_to_end,
            error=error,
            failure=self.failure,
        )
        self.kept.clear()  # the user may keep the proxy: it no longer keeps their chunks


def _inside_read(observer: StreamObserver) -> bool:
    """Called from inside one of ``observer``'s reads: one of the proxies' read loops
    (:data:`_READ_LOOPS`), reading for ``observer``, is on this thread's stack. The frames
    of a running generator or coroutine link to those of whatever resumed it, so this
    holds for an async read too, through every ``await`` of its task."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code in _READ_LOOPS and frame.f_locals.get("observer") is observer:
            return True
        frame = frame.f_back
    return False


def _is_terminal(kind: Any) -> bool:
    """A Responses stream event type that carries the finished response (the server may
    send any JSON as the type: the SDK does not check it)."""
    return isinstance(kind, str) and kind in RESPONSES_TERMINAL_EVENTS


def _responses_event_fields(kind: Any) -> frozenset[str]:
    """The fields the SDK declares on the Responses stream event of type ``kind``: what
    it would not put in the event's ``model_extra``. A type it does not know it builds
    as the first event of its union (its discriminated-union fallback), as here."""
    by_type, fallback = _responses_events()
    return by_type.get(kind, fallback) if isinstance(kind, str) else fallback


@functools.cache
def _responses_events() -> tuple[Mapping[str, frozenset[str]], frozenset[str]]:
    """Each Responses stream event type's declared fields, and those of the union's first
    event. Read once, from the ``openai`` package installed (none: every event is kept)."""
    try:
        from openai.types.responses import ResponseStreamEvent
    except ImportError:
        return {}, frozenset()
    variants = typing.get_args(ResponseStreamEvent)
    if typing.get_origin(ResponseStreamEvent) is typing.Annotated:
        variants = typing.get_args(variants[0])  # Annotated[Union[...], discriminator]
    by_type: dict[str, frozenset[str]] = {}
    for variant in variants:
        fields = variant.model_fields
        kind_field = fields.get("type")
        for kind in typing.get_args(None if kind_field is None else kind_field.annotation):
            by_type.setdefault(kind, frozenset(fields))
    return by_type, frozenset(variants[0].model_fields) if variants else frozenset()


@functools.cache
def _sdk_fields() -> tuple[frozenset[str], frozenset[str]]:
    """The fields the SDK declares on a stream chunk and on a chunk's choice (chat and text
    completions): what it would not put in ``model_extra``. Read once, on first use: the
    ``openai`` package is optional and not imported with this one."""
    from openai.types import Completion, CompletionChoice
    from openai.types.chat import ChatCompletionChunk
    from openai.types.chat.chat_completion_chunk import Choice

    root = frozenset(ChatCompletionChunk.model_fields) | frozenset(Completion.model_fields)
    return root, frozenset(Choice.model_fields) | frozenset(CompletionChoice.model_fields)


class CopiedLikeTheSdk(wrapt.ObjectProxy):  # type: ignore[type-arg]  # generic from wrapt 2
    """A proxy that ``copy`` and ``pickle`` treat as the SDK's object they wrap.

    wrapt's ``ObjectProxy`` raises ``NotImplementedError`` from all of them, where the
    SDK's objects copy (and its ``httpx`` response also deep-copies and pickles). A
    shallow copy is the SDK's copy of the wrapped object, wrapped by :meth:`_twin` (the
    same body: watched by the same observer, it ends the same call). A deep copy or a
    pickle is a new, independent object, the SDK's own and unobserved, or the SDK's error.
    Its ``repr`` is the wrapped object's, not wrapt's ``<... at 0x... for ...>``.
    """

    def __repr__(self) -> str:
        return repr(self.__wrapped__)

    def _twin(self, wrapped: Any) -> Any:
        raise NotImplementedError

    def __copy__(self) -> Any:
        return self._twin(copy.copy(self.__wrapped__))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy.deepcopy(self.__wrapped__, memo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__wrapped__.__reduce_ex__(protocol)

    def __reduce__(self) -> Any:
        return self.__wrapped__.__reduce__()


class _HttpResponseProxy(CopiedLikeTheSdk):
    """The stream's ``httpx`` response, whose ``close``/``aclose`` also end the call.

    The SDK's ``chat.completions.stream()`` helper (and some user code) closes a stream
    through ``stream.response`` rather than ``stream.close()``.
    """

    def __init__(self, wrapped: Any, observer: StreamObserver) -> None:
        super().__init__(wrapped)
        self._self_observer = observer

    def _twin(self, wrapped: Any) -> _HttpResponseProxy:
        return _HttpResponseProxy(wrapped, self._self_observer)

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_observer.on_stop()

    async def aclose(self) -> None:
        try:
            await self.__wrapped__.aclose()
        finally:
            self._self_observer.on_stop()


class _StreamProxyBase(CopiedLikeTheSdk):
    #: The SDK stream's ``close``, which each subclass wraps (sync or async).
    close: Callable[[], Any]

    def __init__(
        self,
        wrapped: Any,
        call: Call,
        injected: Injected = NOTHING_INJECTED,
        origin: _StreamProxyBase | None = None,
    ) -> None:
        super().__init__(wrapped)
        self._self_observer: StreamObserver = (
            origin._self_observer if origin is not None else StreamObserver(call, injected)
        )
        #: A copy's: the proxy first made, kept alive by its copies, so that its reclaim,
        #: which ends the call, comes after theirs (which end nothing).
        self._self_origin = origin
        self._self_response: Any = None
        finalizer.start()

    def _twin(self, wrapped: Any) -> Any:
        return type(self)(wrapped, self._self_observer.call, origin=self._self_origin or self)

    @property
    def response(self) -> Any:
        """``stream.response``, wrapped once (the same object on every access)."""
        if self._self_response is None:
            self._self_response = _HttpResponseProxy(self.__wrapped__.response, self._self_observer)
        return self._self_response

    @response.setter
    def response(self, value: Any) -> None:
        # A plain attribute on the SDK's stream: the assignment goes there, and the next
        # read wraps what was set.
        self.__wrapped__.response = value
        self._self_response = None

    def _close_set_on_proxy(self) -> Any:
        """A ``close`` someone set on the stream after we wrapped it, else None.

        wrapt's ``ObjectProxy.__setattr__`` keeps a name the proxy's class has on the
        proxy, so ``stream.close = theirs`` (Langfuse 5.2.0 ends its generation so) lands
        here, not on the SDK's stream, whose ``__exit__``/``__aexit__`` (``self.close()``)
        would pass it by: ours call it instead, as the SDK's would have."""
        close = self.close
        ours = getattr(type(self), "close", None)
        return None if getattr(close, "__func__", None) is ours else close

    def __del__(self) -> None:
        observer = self._self_observer
        if self._self_origin is None and observer.call.reclaimed():
            finalizer.defer(observer.on_stop)


class SyncStreamProxy(_StreamProxyBase):
    """Wraps ``openai.Stream``: same chunks, same methods, ``isinstance`` still holds.

    ``for`` goes through the SDK's own ``__iter__`` and ``next()`` through its
    ``__next__``, so whatever else wraps those methods still runs.
    """

    def __iter__(self) -> Iterator[Any]:
        return self._observed(iter(self.__wrapped__))

    def _observed(self, source: Iterator[Any]) -> Iterator[Any]:
        # A generator method: it holds the proxy, whose __del__ reports a stream the
        # user stopped reading, for as long as a ``for`` loop holds the generator. The
        # ``yield`` is outside the read: an exception thrown in there (``close()``'s
        # GeneratorExit, a relay's ``throw()``) leaves the stream as the SDK's own
        # generator leaves it, readable, and close/exit/GC of the proxy ends the call if
        # the user reads no further.
        while True:
            try:
                chunk = self._read_kept(source.__next__)
            except StopIteration:
                return
            yield chunk

    def __next__(self) -> Any:
        return self._read_kept(self.__wrapped__.__next__)

    def _read_kept(self, read: Callable[[], Any]) -> Any:
        """The next chunk the user sees, read with ``read``: only what reading the SDK's
        stream raises ends the call (its end, or a failed read)."""
        observer = self._self_observer
        while True:
            try:
                chunk = read()
            except StopIteration:
                observer.on_end()
                raise
            except BaseException as exc:
                observer.on_error(exc)
                raise
            if observer.read_returned(chunk):
                return chunk

    def __contains__(self, value: object) -> bool:
        # ``in`` reads a Stream through its __iter__ (it has no __contains__ of its own);
        # wrapt's proxy would hand ``in`` to the SDK's stream, its chunks passing unseen.
        return any(chunk is value or chunk == value for chunk in self)

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_observer.on_stop()

    def __enter__(self) -> SyncStreamProxy:
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> Any:
        try:
            close = self._close_set_on_proxy()
            if close is not None:
                close()
                return None
            return self.__wrapped__.__exit__(*exc_info)
        finally:
            self._self_observer.on_stop()


class AsyncStreamProxy(_StreamProxyBase):
    """Wraps ``openai.AsyncStream`` the same way; ``aclose``/``async with`` finalize."""

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._observed(self.__wrapped__.__aiter__())

    async def _observed(self, source: AsyncIterator[Any]) -> AsyncIterator[Any]:
        while True:  # as the sync proxy's
            try:
                chunk = await self._read_kept(source.__anext__)
            except StopAsyncIteration:
                return
            yield chunk

    async def __anext__(self) -> Any:
        return await self._read_kept(self.__wrapped__.__anext__)

    async def _read_kept(self, read: Callable[[], Awaitable[Any]]) -> Any:
        """As the sync proxy's, awaiting each read."""
        observer = self._self_observer
        while True:
            try:
                chunk = await read()
            except StopAsyncIteration:
                observer.on_end()
                raise
            except BaseException as exc:
                observer.on_error(exc)
                raise
            if observer.read_returned(chunk):
                return chunk

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            self._self_observer.on_stop()

    async def aclose(self) -> None:
        # Only some SDK releases have aclose(); forward to whichever the stream has.
        closer = getattr(self.__wrapped__, "aclose", None) or self.__wrapped__.close
        try:
            await closer()
        finally:
            self._self_observer.on_stop()

    async def __aenter__(self) -> AsyncStreamProxy:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        try:
            close = self._close_set_on_proxy()
            if close is not None:
                await close()
                return None
            return await self.__wrapped__.__aexit__(*exc_info)
        finally:
            self._self_observer.on_stop()


#: The code of the proxies' reads, each with its ``observer`` (see :func:`_inside_read`).
_READ_LOOPS = frozenset((SyncStreamProxy._read_kept.__code__, AsyncStreamProxy._read_kept.__code__))
