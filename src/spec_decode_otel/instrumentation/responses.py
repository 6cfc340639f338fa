"""What the user gets back from an instrumented call: the same object, or a transparent
proxy that ends the call when the body is read.

With ``with_raw_response`` / ``with_streaming_response`` the SDK returns a response
wrapper instead of the parsed object, and the body is parsed later by the user's
``.parse()`` — possibly into a stream. The raw proxies leave every method and header as
they are and only watch ``parse()``/``json()`` (and the close that ends a streaming
response).
"""

from __future__ import annotations

import json
from typing import Any

import wrapt

from spec_decode_otel._logging import report_internal_error
from spec_decode_otel.instrumentation.call import Call
from spec_decode_otel.instrumentation.streams import AsyncStreamProxy, SyncStreamProxy


def wrap_result(call: Call, result: Any, hide_usage: bool) -> Any:
    """The SDK's return value, as the user gets it. Never raises."""
    from openai import BaseModel
    from openai._legacy_response import LegacyAPIResponse
    from openai._response import AsyncAPIResponse, BaseAPIResponse

    try:
        if isinstance(result, BaseModel):  # the usual non-streaming result
            return wrap_parsed(call, result, hide_usage)
        if isinstance(result, LegacyAPIResponse):
            if not getattr(result, "_stream", False):
                # with_raw_response: the body is already read; decode our own copy so the
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
        call.finish_empty()
        return result


def wrap_parsed(call: Call, parsed: Any, hide_usage: bool) -> Any:
    """A parsed body: proxy a stream, or end the call with the object."""
    from openai import AsyncStream, Stream

    if isinstance(parsed, Stream):
        return SyncStreamProxy(parsed, call, hide_usage)
    if isinstance(parsed, AsyncStream):
        return AsyncStreamProxy(parsed, call, hide_usage)
    if hasattr(parsed, "choices") or hasattr(parsed, "output"):  # output: a Responses API body
        call.finish_object(parsed)
    else:
        call.finish_empty()
    return parsed


class _RawResponseProxy(wrapt.ObjectProxy):  # type: ignore[type-arg]  # generic from wrapt 2
    def __init__(self, wrapped: Any, call: Call, hide_usage: bool) -> None:
        super().__init__(wrapped)
        self._self_call = call
        self._self_hide_usage = hide_usage
        #: (what the SDK parsed, what the user got): ``parse()`` is cached by the SDK, so
        #: the user gets the same proxy on every call.
        self._self_parsed: tuple[Any, Any] | None = None

    def _observe_parsed(self, parsed: Any) -> Any:
        try:
            if self._self_parsed is not None and self._self_parsed[0] is parsed:
                return self._self_parsed[1]
            result = wrap_parsed(self._self_call, parsed, self._self_hide_usage)
            self._self_parsed = (parsed, result)
            return result
        except Exception:
            report_internal_error("raw.parse")
            return parsed

    def _observe_json(self, body: Any) -> Any:
        self._self_call.finish_dict(body)
        return body

    def _closed(self) -> None:
        if self._self_parsed is None:
            self._self_call.finish_empty(read_to_end=False)

    def __del__(self) -> None:
        self._closed()


class SyncRawResponseProxy(_RawResponseProxy):
    """Wraps ``LegacyAPIResponse``/``APIResponse`` whose body the user reads later."""

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        return self._observe_parsed(self.__wrapped__.parse(*args, **kwargs))

    def json(self, *args: Any, **kwargs: Any) -> Any:
        return self._observe_json(self.__wrapped__.json(*args, **kwargs))

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._closed()


class AsyncRawResponseProxy(_RawResponseProxy):
    """Wraps ``AsyncAPIResponse`` (``with_streaming_response`` on the async client)."""

    async def parse(self, *args: Any, **kwargs: Any) -> Any:
        return self._observe_parsed(await self.__wrapped__.parse(*args, **kwargs))

    async def json(self, *args: Any, **kwargs: Any) -> Any:
        return self._observe_json(await self.__wrapped__.json(*args, **kwargs))

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            self._closed()
