"""Transparent stream proxies: see every chunk, change none, finalize exactly once.

Per chunk they do no OpenTelemetry work at all: they keep a reference to the few chunks
adapters may need (root or per-choice extras, usage, finish reasons) and note the time of
the first chunk. Everything else — detection, attributes, metrics, ``span.end()`` —
happens once, when the stream is exhausted, fails, is closed, leaves its ``with`` block
or is garbage-collected unfinished (then ``error.type`` is ``abandoned``).

The span is never made current while the user iterates: between chunks the caller's own
context is in force.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import wrapt

from spec_decode_otel.instrumentation.call import ABANDONED, Call, report_internal_error

#: Chunks kept for detection. Engines put stats on the last chunks (finish_reason, usage,
#: SGLang's extra chunk), and "last wins" everywhere, so a long stream whose every chunk
#: carries a field (TensorRT-LLM's running average) needs only its tail.
KEEP_CHUNKS = 32


class _StreamObserver:
    """What a stream proxy collects; shared by the sync and async proxies."""

    __slots__ = ("call", "finish_reasons", "first_at", "hide_usage_chunk", "kept", "model", "multi")

    def __init__(self, call: Call, hide_usage_chunk: bool) -> None:
        self.call = call
        self.hide_usage_chunk = hide_usage_chunk
        self.kept: deque[Any] = deque(maxlen=KEEP_CHUNKS)
        self.finish_reasons: list[str] = []
        self.first_at: float | None = None
        self.model: str | None = None
        self.multi = False

    def observe(self, chunk: Any) -> bool:
        """Note ``chunk``; True when the user must not see it (our injected usage chunk)."""
        if self.first_at is not None:
            # Fast path for a plain content chunk: one choice at index 0, no finish reason,
            # no usage, no non-standard fields (nearly every chunk): nothing to note. Any
            # other chunk, or an object that is not the SDK's pydantic model, goes on.
            try:
                choices = chunk.choices
                if (
                    chunk.usage is None
                    and len(choices) == 1
                    and not chunk.__pydantic_extra__
                    and (choice := choices[0]).finish_reason is None
                    and not choice.index
                    and not choice.__pydantic_extra__
                ):
                    return False
            except Exception:
                pass
        try:
            if self.first_at is None:
                self.first_at = time.perf_counter()
                model = getattr(chunk, "model", None)
                self.model = model if isinstance(model, str) else None
            keep = bool(chunk.model_extra) or chunk.usage is not None
            choices = chunk.choices
            for choice in choices:
                reason = choice.finish_reason
                if reason is not None:
                    keep = True
                    if len(self.finish_reasons) < 16:
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
        if self.call.done:
            return
        self.call.finish_stream(
            self.kept,
            response_model=self.model,
            finish_reasons=self.finish_reasons,
            multi_sequence=self.multi,
            first_chunk_at=self.first_at,
            error=error,
        )


def _iterate(proxy: Any, wrapped: Any, observer: _StreamObserver) -> Iterator[Any]:
    """The chunks of ``wrapped``, observed, minus our hidden usage chunk.

    ``proxy`` is only held, to keep it alive while a ``for`` loop holds just this
    generator: its ``__del__`` is what reports a stream abandoned half-way. Closing this
    generator early (``break``, then garbage collection) ends nothing by itself; the
    proxy's own close/exit/GC do, as with ``__next__``.
    """
    try:
        chunks = iter(wrapped)
        if observer.first_at is None:
            for chunk in chunks:  # the first chunk: its time and model
                if not observer.observe(chunk):
                    yield chunk
                break
        for chunk in chunks:
            # observe()'s fast path, inlined: per chunk, a call costs more than the test.
            try:
                choices = chunk.choices
                plain = (
                    chunk.usage is None
                    and len(choices) == 1
                    and not chunk.__pydantic_extra__
                    and (choice := choices[0]).finish_reason is None
                    and not choice.index
                    and not choice.__pydantic_extra__
                )
            except Exception:
                plain = False
            if plain or not observer.observe(chunk):
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

    @property
    def response(self) -> Any:
        return _response_proxy(self)

    def __iter__(self) -> Iterator[Any]:
        # A generator, as ``openai.Stream.__iter__`` itself returns: a ``for`` loop then
        # resumes it per chunk instead of calling a Python ``__next__`` on the proxy.
        return _iterate(self, self.__wrapped__, self._self_observer)

    def __next__(self) -> Any:
        observer = self._self_observer
        while True:
            try:
                chunk = self.__wrapped__.__next__()
            except StopIteration:
                observer.finish()
                raise
            except BaseException as exc:
                observer.finish(exc)
                raise
            if not observer.observe(chunk):
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

    @property
    def response(self) -> Any:
        return _response_proxy(self)

    def __aiter__(self) -> AsyncStreamProxy:
        return self

    async def __anext__(self) -> Any:
        observer = self._self_observer
        while True:
            try:
                chunk = await self.__wrapped__.__anext__()
            except StopAsyncIteration:
                observer.finish()
                raise
            except BaseException as exc:
                observer.finish(exc)
                raise
            if not observer.observe(chunk):
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
