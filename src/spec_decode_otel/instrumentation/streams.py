"""Transparent stream proxies: see every chunk, change none, finalize exactly once.

Per chunk they do as little as Python allows. For a request that asked for one sequence
(``n`` = 1, nearly every request) a plain content chunk — one choice, at index 0, no
finish reason, no usage, no non-standard field on the chunk or its choice — is read and
let through: nothing about it is noted and nothing keeps it, so the SDK's chunks are freed
as soon as the user drops them (in the replay benchmark, keeping even one chunk more than
the user holds costs ~0.4 µs per chunk, more than the test: the SDK then parses into
colder memory). Every other chunk goes through ``_StreamObserver.observe``, which keeps
those that carry anything an adapter reads (the last ``KEEP_CHUNKS``: "last wins"
everywhere), notes finish reasons and choice indices, and hides our injected usage chunk.
So the chunks adapters see are exactly those the offline parser would act on, up to that
tail. Requests for several sequences (``n`` > 1, or a completion with several prompts:
``Call.requested_sequences``) send every chunk through ``observe``. Detection,
attributes, metrics and ``span.end()`` happen once, when the stream is exhausted, fails,
is closed, leaves its ``with`` block or is garbage-collected unfinished (then
``error.type`` is ``abandoned``).

Where the SDK's own ``Stream.__iter__``/``__next__`` (and the async pair) only forward to
the stream's generator, the proxy reads that generator directly: a ``for`` loop over the
proxy goes through as many Python frames per chunk as one over the bare stream.

The span is never made current while the user iterates: between chunks the caller's own
context is in force.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from types import FunctionType
from typing import Any

import wrapt

from spec_decode_otel.instrumentation.call import ABANDONED, Call, report_internal_error

#: Chunks kept for detection: only those carrying something adapters read ("last wins"
#: everywhere, so a stream whose every chunk carries a field needs only its tail).
KEEP_CHUNKS = 32
#: Finish reasons reported at most (one per sequence).
MAX_FINISH_REASONS = 16


class _StreamObserver:
    """What a stream proxy collects; shared by the sync and async proxies."""

    __slots__ = (
        "call",
        "every_chunk",
        "finish_reasons",
        "first_at",
        "hide_usage_chunk",
        "kept",
        "model",
        "multi",
    )

    def __init__(self, call: Call, hide_usage_chunk: bool) -> None:
        self.call = call
        self.hide_usage_chunk = hide_usage_chunk
        #: Several sequences asked for: every chunk goes through observe().
        self.every_chunk = call.requested_sequences > 1
        self.kept: deque[Any] = deque(maxlen=KEEP_CHUNKS)
        self.finish_reasons: list[str] = []
        self.first_at: float | None = None
        self.model: str | None = None
        self.multi = self.every_chunk

    def first(self, chunk: Any) -> None:
        """The first chunk: its time and model."""
        self.first_at = time.perf_counter()
        try:
            model = getattr(chunk, "model", None)
            self.model = model if isinstance(model, str) else None
        except Exception:
            report_internal_error("observe")

    def take(self, chunk: Any) -> bool:
        """One chunk read by ``__next__``/``__anext__``: True when the user gets it.

        The same handling as ``_iterate``'s loops, which inline the plain-chunk test: a
        ``for`` loop is the usual way to read a stream, and there a call per chunk costs
        more than the test.
        """
        if self.first_at is None:
            self.first(chunk)
        elif not self.every_chunk:
            try:
                choices = chunk.choices
                if (
                    len(choices) == 1
                    and (choice := choices[0]).finish_reason is None
                    and not choice.index
                    and not choice.__pydantic_extra__
                    and not chunk.__pydantic_extra__
                    and chunk.usage is None
                ):
                    return True
            except Exception:
                pass  # not the SDK's model: observe() decides
        return not self.observe(chunk)

    def observe(self, chunk: Any) -> bool:
        """Note ``chunk``; True when the user must not see it (our injected usage chunk)."""
        try:
            keep = bool(chunk.model_extra) or chunk.usage is not None
            choices = chunk.choices
            for choice in choices:
                reason = choice.finish_reason
                if reason is not None:
                    keep = True
                    if len(self.finish_reasons) < MAX_FINISH_REASONS:
                        self.finish_reasons.append(reason)
                if choice.index:
                    self.multi = True
                elif choice.model_extra:
                    keep = True
            if keep:
                self.kept.append(chunk)
                return self.hide_usage_chunk and not choices and chunk.usage is not None
        except Exception:
            report_internal_error("observe")
        return False

    def finish(self, error: BaseException | str | None = None) -> None:
        call = self.call
        if call.done:
            return
        chunks = list(self.kept)
        # The user may hold the proxy on: it no longer holds their chunks.
        self.kept.clear()
        call.finish_stream(
            chunks,
            response_model=self.model,
            finish_reasons=self.finish_reasons,
            multi_sequence=self.multi,
            first_chunk_at=self.first_at,
            error=error,
        )


# -- the SDK's own iteration methods, when they only forward to the stream's generator --
# Written exactly as openai's Stream/AsyncStream write them: _forwards() compares code.


def _ref_iter(self: Any) -> Iterator[Any]:
    for item in self._iterator:  # noqa: UP028 (not `yield from`: the SDK's own form)
        yield item


def _ref_next(self: Any) -> Any:
    return self._iterator.__next__()


async def _ref_aiter(self: Any) -> AsyncIterator[Any]:
    async for item in self._iterator:
        yield item


async def _ref_anext(self: Any) -> Any:
    return await self._iterator.__anext__()


_KIND_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR
#: function → whether it is exactly its reference (the SDK's methods: a handful of keys).
_FORWARDERS: dict[Any, bool] = {}


def _forwards(function: Any, reference: Any) -> bool:
    """True when ``function`` (an SDK stream method) compiles to the same code as
    ``reference``: it does nothing but forward to ``self._iterator``. Anything else — a
    later SDK doing more there, or a method someone patched — is called as it is."""
    known = _FORWARDERS.get(function)
    if known is not None:
        return known
    same = False
    if type(function) is FunctionType:
        code, ref = function.__code__, reference.__code__
        same = (
            code.co_code == ref.co_code
            and code.co_names == ref.co_names
            and code.co_consts == ref.co_consts
            and code.co_varnames == ref.co_varnames
            and code.co_flags & _KIND_FLAGS == ref.co_flags & _KIND_FLAGS
        )
    if len(_FORWARDERS) < 64:
        _FORWARDERS[function] = same
    return same


def _generator_of(stream: Any, method: str, reference: Any) -> Any:
    """The stream's own generator when ``type(stream).<method>`` only forwards to it."""
    try:
        if _forwards(getattr(type(stream), method, None), reference):
            return stream._iterator
    except Exception:
        report_internal_error("stream.generator")
    return None


# -- iteration -----------------------------------------------------------------------


def _iterate(proxy: Any, source: Iterator[Any], observer: _StreamObserver) -> Iterator[Any]:
    """The chunks of ``source``, observed, minus our hidden usage chunk.

    ``proxy`` is only held, to keep it alive while a ``for`` loop holds just this
    generator: its ``__del__`` is what reports a stream abandoned half-way. Closing this
    generator early (``break``, then garbage collection) ends nothing by itself; the
    proxy's own close/exit/GC do, as with ``__next__``.
    """
    try:
        observe = observer.observe
        if observer.first_at is None:
            for chunk in source:
                observer.first(chunk)
                if not observe(chunk):
                    yield chunk
                break
        if observer.every_chunk:
            for chunk in source:
                if not observe(chunk):
                    yield chunk
        else:
            for chunk in source:
                # observer.take()'s plain-chunk test, inlined: per chunk, a call costs
                # more than the test.
                try:
                    choices = chunk.choices
                    plain = (
                        len(choices) == 1
                        and (choice := choices[0]).finish_reason is None
                        and not choice.index
                        and not choice.__pydantic_extra__
                        and not chunk.__pydantic_extra__
                        and chunk.usage is None
                    )
                except Exception:
                    plain = False  # not the SDK's model: observe() decides
                if plain or not observe(chunk):
                    yield chunk
    except GeneratorExit:
        raise
    except BaseException as exc:
        observer.finish(exc)
        raise
    observer.finish()


async def _aiterate(
    proxy: Any, source: AsyncIterator[Any], observer: _StreamObserver
) -> AsyncIterator[Any]:
    """``_iterate`` for an async stream."""
    try:
        observe = observer.observe
        if observer.first_at is None:
            async for chunk in source:
                observer.first(chunk)
                if not observe(chunk):
                    yield chunk
                break
        if observer.every_chunk:
            async for chunk in source:
                if not observe(chunk):
                    yield chunk
        else:
            async for chunk in source:
                try:
                    choices = chunk.choices
                    plain = (
                        len(choices) == 1
                        and (choice := choices[0]).finish_reason is None
                        and not choice.index
                        and not choice.__pydantic_extra__
                        and not chunk.__pydantic_extra__
                        and chunk.usage is None
                    )
                except Exception:
                    plain = False  # not the SDK's model: observe() decides
                if plain or not observe(chunk):
                    yield chunk
    except GeneratorExit:
        raise
    except BaseException as exc:
        observer.finish(exc)
        raise
    observer.finish()


class _HttpResponseProxy(wrapt.ObjectProxy):  # type: ignore[misc]
    """The stream's ``httpx`` response, whose ``close``/``aclose`` also end the call.

    The SDK's ``chat.completions.stream()`` helper (and some user code) closes a stream
    through ``stream.response`` rather than ``stream.close()``; without this the call
    would stay open until garbage collection and then be reported as abandoned.
    """

    def __init__(self, wrapped: Any, observer: _StreamObserver) -> None:
        super().__init__(wrapped)
        self._self_observer = observer

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_observer.finish()

    async def aclose(self) -> None:
        try:
            await self.__wrapped__.aclose()
        finally:
            self._self_observer.finish()


def _response_proxy(proxy: Any) -> Any:
    """``proxy.response`` wrapped once (the same object on every access)."""
    cached = proxy._self_response
    if cached is None:
        cached = _HttpResponseProxy(proxy.__wrapped__.response, proxy._self_observer)
        proxy._self_response = cached
    return cached


class SyncStreamProxy(wrapt.ObjectProxy):  # type: ignore[misc]
    """Wraps ``openai.Stream``: same chunks, same methods, ``isinstance`` still holds."""

    def __init__(self, wrapped: Any, call: Call, hide_usage_chunk: bool = False) -> None:
        super().__init__(wrapped)
        self._self_observer = _StreamObserver(call, hide_usage_chunk)
        self._self_response: Any = None
        #: The stream's generator, read directly where the SDK's methods only forward.
        self._self_iter = _generator_of(wrapped, "__iter__", _ref_iter)
        generator = _generator_of(wrapped, "__next__", _ref_next)
        self._self_next = wrapped.__next__ if generator is None else generator.__next__

    @property
    def response(self) -> Any:
        return _response_proxy(self)

    def __iter__(self) -> Iterator[Any]:
        # A generator, as ``openai.Stream.__iter__`` itself returns: a ``for`` loop then
        # resumes it per chunk instead of calling a Python ``__next__`` on the proxy.
        source = self._self_iter
        if source is None:
            source = iter(self.__wrapped__)
        return _iterate(self, source, self._self_observer)

    def __next__(self) -> Any:
        observer = self._self_observer
        while True:
            try:
                chunk = self._self_next()
            except StopIteration:
                observer.finish()
                raise
            except BaseException as exc:
                observer.finish(exc)
                raise
            if observer.take(chunk):
                return chunk

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_observer.finish()

    def __enter__(self) -> SyncStreamProxy:
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            return self.__wrapped__.__exit__(exc_type, exc, tb)
        finally:
            self._self_observer.finish(exc if exc is not None else None)

    def __del__(self) -> None:
        try:
            self._self_observer.finish(ABANDONED)
        except Exception:
            report_internal_error("stream.__del__")


class AsyncStreamProxy(wrapt.ObjectProxy):  # type: ignore[misc]
    """Wraps ``openai.AsyncStream`` the same way; ``aclose``/``async with`` finalize."""

    def __init__(self, wrapped: Any, call: Call, hide_usage_chunk: bool = False) -> None:
        super().__init__(wrapped)
        self._self_observer = _StreamObserver(call, hide_usage_chunk)
        self._self_response: Any = None
        self._self_aiter = _generator_of(wrapped, "__aiter__", _ref_aiter)
        generator = _generator_of(wrapped, "__anext__", _ref_anext)
        self._self_anext = wrapped.__anext__ if generator is None else generator.__anext__

    @property
    def response(self) -> Any:
        return _response_proxy(self)

    def __aiter__(self) -> AsyncIterator[Any]:
        # An async generator, as ``openai.AsyncStream.__aiter__`` itself returns.
        source = self._self_aiter
        if source is None:
            source = self.__wrapped__.__aiter__()
        return _aiterate(self, source, self._self_observer)

    async def __anext__(self) -> Any:
        observer = self._self_observer
        while True:
            try:
                chunk = await self._self_anext()
            except StopAsyncIteration:
                observer.finish()
                raise
            except BaseException as exc:
                observer.finish(exc)
                raise
            if observer.take(chunk):
                return chunk

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            self._self_observer.finish()

    async def aclose(self) -> None:
        # Only some SDK releases have aclose(); forward to whichever the stream has.
        closer = getattr(self.__wrapped__, "aclose", None) or self.__wrapped__.close
        try:
            await closer()
        finally:
            self._self_observer.finish()

    async def __aenter__(self) -> AsyncStreamProxy:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            return await self.__wrapped__.__aexit__(exc_type, exc, tb)
        finally:
            self._self_observer.finish(exc if exc is not None else None)

    def __del__(self) -> None:
        try:
            self._self_observer.finish(ABANDONED)
        except Exception:
            report_internal_error("stream.__del__")
