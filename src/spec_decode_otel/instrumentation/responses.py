"""What the user gets back from an instrumented call: the same object, or a transparent
proxy that ends the call when the body is read.

With ``with_raw_response`` / ``with_streaming_response`` the SDK returns a response
wrapper instead of the parsed object, and the body is parsed later by the user's
``.parse()`` — possibly into a stream — or read raw. The raw proxies leave every method
and header as they are and watch ``parse()``/``json()`` (and the close that ends a
streaming response); a ``with_streaming_response`` proxy also watches the raw reads
(``read()``, ``text()``, ``iter_bytes()``, ``iter_text()``, ``iter_lines()``; see
:class:`RawBody`). The user's reads return exactly what the SDK returns: a raw reader
sees the bytes the server sent, our injected usage chunk included. ``copy.copy()`` of a
proxy is a proxy of the SDK's copy that shares what the proxy learnt (the parsed stream,
the raw reads) and ends the same call.
"""

from __future__ import annotations

import codecs
import functools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

from spec_decode_otel._logging import rate_limited, report_internal_error
from spec_decode_otel.instrumentation import finalizer
from spec_decode_otel.instrumentation.call import Call
from spec_decode_otel.instrumentation.streams import (
    NOTHING_INJECTED,
    AsyncStreamProxy,
    CopiedLikeTheSdk,
    Injected,
    StreamObserver,
    SyncStreamProxy,
)
from spec_decode_otel.sse import (
    CUT_LINE_END,
    MAX_EVENT_CHARS,
    SseSplitter,
    TextPieces,
    Undecoded,
    decode_json,
    ends_in_json_string,
)


def wrap_result(call: Call, result: Any, injected: Injected) -> Any:
    """The SDK's return value, as the user gets it. Never raises."""
    from openai import BaseModel
    from openai._legacy_response import LegacyAPIResponse
    from openai._response import AsyncAPIResponse, BaseAPIResponse

    try:
        if isinstance(result, BaseModel):  # the usual non-streaming result
            return wrap_parsed(call, result, injected)
        if isinstance(result, LegacyAPIResponse):
            if not getattr(result, "_stream", False):
                # with_raw_response: the body is already read; decode our own copy so the
                # user's later .parse() is untouched.
                call.finish_dict(_json_body(result.http_response.content))
                return result
            return SyncRawResponseProxy(result, call, injected)
        if isinstance(result, AsyncAPIResponse):
            return AsyncRawResponseProxy(result, call, injected)
        if isinstance(result, BaseAPIResponse):
            return SyncStreamedResponseProxy(result, call, injected)
        return wrap_parsed(call, result, injected)
    except Exception:
        report_internal_error("wrap_result")
        call.finish_empty()
        return result


def wrap_parsed(call: Call, parsed: Any, injected: Injected) -> Any:
    """A parsed body: proxy a stream, or end the call with the object."""
    from openai import AsyncStream, Stream

    if isinstance(parsed, Stream):
        return SyncStreamProxy(parsed, call, injected)
    if isinstance(parsed, AsyncStream):
        return AsyncStreamProxy(parsed, call, injected)
    if hasattr(parsed, "choices") or hasattr(parsed, "output"):  # output: a Responses API body
        call.finish_object(parsed)
    elif isinstance(parsed, Mapping):  # client.post(..., cast_to=object or dict)
        call.finish_dict(parsed)
    elif isinstance(parsed, (str, bytes)):  # cast_to=str or bytes: the body as read
        call.finish_dict(_json_body(parsed))
    else:
        call.finish_empty()
    return parsed


class RawBody:
    """What the user's raw reads of one response body teach us; ends the call once.

    A streamed (SSE) body: each complete ``data:`` event is decoded and handed to a
    :class:`StreamObserver`, which notes from the JSON what it notes from ``.parse()``'s
    chunks (so the record, outcome and span are those of ``.parse()``); ``[DONE]`` or the
    end of the body ends the call, and an ``error`` event ends it as the ``APIError`` the
    SDK would have raised. A JSON body: its text is kept (at most ``MAX_EVENT_CHARS``) and
    decoded at its end. An event or body that does not decode gives a debug log and no
    record; nothing here raises.
    """

    def __init__(self, call: Call, response: Any) -> None:
        self.call = call
        self.response = response
        self.streamed = bool(getattr(response, "_is_sse_stream", call.plan.streaming))
        #: No chunk is hidden from a raw reader: it reads the server's bytes.
        self.observer = StreamObserver(call, NOTHING_INJECTED)
        self.splitter = SseSplitter()
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.body = TextPieces()
        self.body_chars = 0
        #: A JSON body read by ``iter_lines()``: whether the last line ended in a string.
        self.in_string = False

    # -- what the user read ---------------------------------------------------------

    def feed_bytes(self, data: bytes) -> None:
        if not self.call.done:
            self.feed_text(self.decoder.decode(data))

    def feed_line(self, line: str) -> None:
        """A line from ``iter_lines()``, which drops the line end: ``\\n``, or in a JSON
        string one of the characters ``iter_lines()`` also ends lines at (see ``sse``)."""
        if self.call.done:
            return
        try:
            if self.streamed:
                self._events(self.splitter.line(line))
                return
            if self.body_chars + len(line) <= MAX_EVENT_CHARS:
                self.in_string = ends_in_json_string(line, self.in_string)
            self.feed_text(line + (CUT_LINE_END if self.in_string else "\n"))
        except Exception:
            report_internal_error("raw.feed")

    def feed_text(self, text: str) -> None:
        if self.call.done:
            return
        try:
            if self.streamed:
                self._events(self.splitter.feed(text))
            elif self.body_chars <= MAX_EVENT_CHARS:
                self.body_chars += len(text)
                if self.body_chars <= MAX_EVENT_CHARS:
                    self.body.append(text)
                else:  # over the bound: keep nothing more, decode nothing at the end
                    self.body.clear()
        except Exception:
            report_internal_error("raw.feed")

    def whole(self, body: bytes | str) -> None:
        """The whole body, from ``read()`` (bytes) or ``text()`` (str)."""
        if isinstance(body, bytes):
            self.feed_bytes(body)
        else:
            self.feed_text(body)
        self.end()

    # -- how the reading ended ------------------------------------------------------

    def end(self) -> None:
        """The body was read to its end."""
        if self.call.done:
            return
        try:
            self.feed_text(self.decoder.decode(b"", final=True))
            if self.streamed:
                self.observer.on_end()
                return
            text = self.body.text()
            self.body.clear()
            if self.body_chars > MAX_EVENT_CHARS:
                self.call.finish_empty()
                _debug_over_bound()
                return
            self.call.finish_dict(_json_body(text))
        except Exception:
            report_internal_error("raw.end")
            self.call.finish_empty()

    def error(self, error: BaseException) -> None:
        """Reading the body raised ``error`` (re-raised to the user)."""
        if self.streamed:
            self.observer.on_error(error)
        else:
            self.call.finish_error(error)

    def stop(self) -> None:
        """Closed, exited or collected: before its end, unless ``end`` came first."""
        if self.streamed:
            self.observer.on_stop()
        else:
            self.call.finish_empty(read_to_end=False)

    # -- one SSE event --------------------------------------------------------------

    def _events(self, events: list[str]) -> None:
        for data in events:
            self._event(data)
            if self.call.done:
                return

    def _event(self, data: str) -> None:
        if data.startswith("[DONE]"):
            self.observer.on_end()
            return
        payload = decode_json(data)
        if not isinstance(payload, Mapping):
            _debug(
                "raw.event",
                "an SSE event read raw is not JSON, or not an object (%d chars)",
                len(data),
            )
            return
        if payload.get("error"):
            self.observer.on_error(self._api_error(payload["error"]))
            return
        self.observer.observe_payload(payload)

    def _api_error(self, error: Any) -> BaseException:
        """The ``APIError`` the SDK's stream raises for an ``error`` event."""
        from openai import APIError

        message = error.get("message") if isinstance(error, Mapping) else None
        if not message or not isinstance(message, str):
            message = "An error occurred during streaming"
        return APIError(message, self.response.http_response.request, body=error)


def _debug(key: str, msg: str, *args: object) -> None:
    rate_limited.log(logging.DEBUG, key, "spec_decode_otel: " + msg, *args)


def _debug_over_bound() -> None:
    _debug("raw.body", "a body read raw of over %d characters was not decoded", MAX_EVENT_CHARS)


def _json_body(body: str | bytes) -> Any:
    """A whole response body, decoded; None when it is not JSON (nested too deep for the
    decoder included) or over ``MAX_EVENT_CHARS``: a server's bad body gives a debug log
    and no record, never an internal-error warning."""
    value = decode_json(body)
    if value is Undecoded.TOO_LARGE:
        _debug_over_bound()
        return None
    if value is Undecoded.NOT_JSON:
        _debug("raw.json", "a body read raw is not JSON (%d characters)", len(body))
        return None
    return value


class _BodyState:
    """What the user did with one response body, shared by its proxy and their copies."""

    __slots__ = ("parsed", "raw")

    def __init__(self) -> None:
        #: (what the SDK parsed, what the user got): ``parse()`` is cached by the SDK, so
        #: the user gets the same proxy on every call.
        self.parsed: tuple[Any, Any] | None = None
        #: Set once the user reads the body raw.
        self.raw: RawBody | None = None


def _same_kind(earlier: Any, parsed: Any) -> bool:
    """``earlier`` is our proxy of a stream, and ``parsed`` a stream of the same kind."""
    from openai import AsyncStream, Stream

    if isinstance(earlier, SyncStreamProxy):
        return isinstance(parsed, Stream)
    return isinstance(earlier, AsyncStreamProxy) and isinstance(parsed, AsyncStream)


_Failed = Callable[[BaseException], None]


def _read(read: Callable[..., Any], failed: _Failed, /, *args: Any, **kwargs: Any) -> Any:
    """``read(*args, **kwargs)``; whatever it raises is handed to ``failed``, then re-raised."""
    try:
        return read(*args, **kwargs)
    except BaseException as exc:
        failed(exc)
        raise


async def _read_async(
    read: Callable[..., Awaitable[Any]], failed: _Failed, /, *args: Any, **kwargs: Any
) -> Any:
    """:func:`_read`, awaiting ``read``."""
    try:
        return await read(*args, **kwargs)
    except BaseException as exc:
        failed(exc)
        raise


class _RawResponseProxy(CopiedLikeTheSdk):
    def __init__(
        self,
        wrapped: Any,
        call: Call,
        injected: Injected,
        origin: _RawResponseProxy | None = None,
    ) -> None:
        super().__init__(wrapped)
        self._self_call = call
        self._self_injected = injected
        self._self_state: _BodyState = origin._self_state if origin is not None else _BodyState()
        #: A copy's: the proxy first made, kept alive by its copies, so that its reclaim,
        #: which ends the call, comes after theirs (which end nothing).
        self._self_origin = origin
        finalizer.start()
        if origin is None:
            finalizer.watch(self)

    def _twin(self, wrapped: Any) -> Any:
        return type(self)(wrapped, self._self_call, self._self_injected, self._self_origin or self)

    def _observe_parsed(self, parsed: Any) -> Any:
        state = self._self_state
        try:
            if state.parsed is not None:
                earlier_parsed, earlier = state.parsed
                if earlier_parsed is parsed:
                    return earlier
                if _same_kind(earlier, parsed):
                    # Another stream over the same body: something replaced the SDK's
                    # parse cache after an earlier parse() (OpenInference 0.1.66, loaded
                    # after us, parses in its wrapper and caches its own stream wrapping
                    # the SDK's). Watched by the same observer, whatever the user reads of
                    # it ends the call; the earlier proxy, kept alive by this one, ends
                    # nothing when reclaimed first.
                    result = earlier._twin(parsed)
                    state.parsed = (parsed, result)
                    return result
            result = wrap_parsed(self._self_call, parsed, self._self_injected)
            state.parsed = (parsed, result)
            return result
        except Exception:
            report_internal_error("raw.parse")
            return parsed

    def _observe_json(self, body: Any) -> Any:
        self._self_call.finish_dict(body)
        return body

    def _failed(self, error: BaseException) -> None:
        """The user's ``parse()`` or ``json()`` raised (the content fails their
        ``response_format``, the body is not JSON, the connection broke): the call ends
        with that error, as the same ``parse()`` on the plain client does, not as a body
        left unread."""
        self._self_call.finish_error(error)

    def _raw_body(self) -> RawBody:
        state = self._self_state
        if state.raw is None:
            state.raw = RawBody(self._self_call, self.__wrapped__)
        return state.raw

    def _ending(self) -> Callable[[], None] | None:
        """What ends the call when the response is closed or reclaimed: None when the
        user's ``parse()`` result ends it. It does not hold the proxy."""
        state = self._self_state
        if state.raw is not None:
            return state.raw.stop
        if state.parsed is None:
            return functools.partial(self._self_call.finish_empty, read_to_end=False)
        return None

    def _closed(self) -> None:
        end = self._ending()
        if end is None and self._self_state.parsed is not None:
            # The user's parse() gave a stream: closing the response ends it (the SDK's
            # ``with_streaming_response`` block closes it at its exit). Not on reclaim:
            # the stream may outlive this response object and still be read.
            parsed = self._self_state.parsed[1]
            if isinstance(parsed, (SyncStreamProxy, AsyncStreamProxy)):
                end = parsed._self_observer.on_stop
        if end is not None:
            end()

    def __del__(self) -> None:
        if self._self_origin is not None:
            return
        end = self._ending()
        if end is not None and self._self_call.reclaimed():
            finalizer.defer(end)

    def on_exit(self) -> None:
        """The process is exiting with the response still held, its body unread (or
        read raw in part): stopped there, unless its call ended before or is a forked
        parent's. A stream the user parsed from it ends through its own observer."""
        end = self._ending()
        if end is not None and self._self_call.pid == os.getpid():
            end()


class SyncRawResponseProxy(_RawResponseProxy):
    """Wraps ``LegacyAPIResponse`` (``with_raw_response``) whose body the user parses later."""

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        return self._observe_parsed(_read(self.__wrapped__.parse, self._failed, *args, **kwargs))


class SyncStreamedResponseProxy(SyncRawResponseProxy):
    """Wraps ``APIResponse`` (``with_streaming_response``): also watches ``json()``,
    ``close()`` and the raw reads, which ``LegacyAPIResponse`` does not have."""

    def json(self, *args: Any, **kwargs: Any) -> Any:
        return self._observe_json(_read(self.__wrapped__.json, self._failed, *args, **kwargs))

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._closed()

    def read(self) -> Any:
        return self._whole(self.__wrapped__.read)

    def text(self) -> Any:
        return self._whole(self.__wrapped__.text)

    def _whole(self, read: Callable[[], Any]) -> Any:
        raw = self._raw_body()
        body = _read(read, raw.error)
        raw.whole(body)
        return body

    def iter_bytes(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        raw = self._raw_body()
        return self._observed(self.__wrapped__.iter_bytes(*args, **kwargs), raw, raw.feed_bytes)

    def iter_text(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        raw = self._raw_body()
        return self._observed(self.__wrapped__.iter_text(*args, **kwargs), raw, raw.feed_text)

    def iter_lines(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        raw = self._raw_body()
        return self._observed(self.__wrapped__.iter_lines(*args, **kwargs), raw, raw.feed_line)

    def _observed(
        self, source: Iterator[Any], raw: RawBody, feed: Callable[[Any], None]
    ) -> Iterator[Any]:
        # A generator method: it holds the proxy, whose close/exit/GC ends a body the
        # user stopped reading, for as long as a loop holds the generator.
        try:
            for piece in source:
                feed(piece)
                yield piece
        except GeneratorExit:
            raise
        except BaseException as exc:
            raw.error(exc)
            raise
        raw.end()


class AsyncRawResponseProxy(_RawResponseProxy):
    """Wraps ``AsyncAPIResponse`` (``with_streaming_response`` on the async client):
    ``parse()``/``json()``, and the raw reads (``read()``, ``text()`` and the async
    ``iter_bytes()``/``iter_text()``/``iter_lines()``)."""

    async def parse(self, *args: Any, **kwargs: Any) -> Any:
        parsed = await _read_async(self.__wrapped__.parse, self._failed, *args, **kwargs)
        return self._observe_parsed(parsed)

    async def json(self, *args: Any, **kwargs: Any) -> Any:
        body = await _read_async(self.__wrapped__.json, self._failed, *args, **kwargs)
        return self._observe_json(body)

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            self._closed()

    async def read(self) -> Any:
        return await self._whole(self.__wrapped__.read)

    async def text(self) -> Any:
        return await self._whole(self.__wrapped__.text)

    async def _whole(self, read: Callable[[], Awaitable[Any]]) -> Any:
        raw = self._raw_body()
        body = await _read_async(read, raw.error)
        raw.whole(body)
        return body

    def iter_bytes(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raw = self._raw_body()
        return self._observed(self.__wrapped__.iter_bytes(*args, **kwargs), raw, raw.feed_bytes)

    def iter_text(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raw = self._raw_body()
        return self._observed(self.__wrapped__.iter_text(*args, **kwargs), raw, raw.feed_text)

    def iter_lines(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raw = self._raw_body()
        return self._observed(self.__wrapped__.iter_lines(*args, **kwargs), raw, raw.feed_line)

    async def _observed(
        self, source: AsyncIterator[Any], raw: RawBody, feed: Callable[[Any], None]
    ) -> AsyncIterator[Any]:
        try:
            async for piece in source:
                feed(piece)
                yield piece
        except GeneratorExit:
            raise
        except BaseException as exc:
            raw.error(exc)
            raise
        raw.end()
