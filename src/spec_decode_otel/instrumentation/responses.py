"""Raw-response proxies: ``with_raw_response`` and ``with_streaming_response``.

With those variants the SDK returns a response wrapper instead of the parsed object, and
the body is parsed later by the user's ``.parse()`` — possibly into a stream. These
proxies leave every method and header as they are and only watch ``parse()``/``json()``
(and the close that ends a streaming response) so the call still gets its record.
"""

from __future__ import annotations

from typing import Any

import wrapt

from spec_decode_otel.instrumentation.call import Call, report_internal_error


def _observe_parsed(proxy: Any, parsed: Any) -> Any:
    """Hand a parsed result to the call: streams get wrapped, objects finish the call."""
    from spec_decode_otel.instrumentation.wrappers import wrap_parsed

    try:
        cached = proxy._self_parsed
        if cached is not None and cached[0] is parsed:
            return cached[1]
        result = wrap_parsed(proxy._self_call, parsed, proxy._self_hide_usage)
        proxy._self_parsed = (parsed, result)
        return result
    except Exception:
        report_internal_error("raw.parse")
        return parsed


class SyncRawResponseProxy(wrapt.ObjectProxy):  # type: ignore[misc]
    """Wraps ``LegacyAPIResponse``/``APIResponse`` whose body the user reads later."""

    def __init__(self, wrapped: Any, call: Call, hide_usage: bool) -> None:
        super().__init__(wrapped)
        self._self_call = call
        self._self_hide_usage = hide_usage
        self._self_parsed: tuple[Any, Any] | None = None

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        return _observe_parsed(self, self.__wrapped__.parse(*args, **kwargs))

    def json(self, *args: Any, **kwargs: Any) -> Any:
        body = self.__wrapped__.json(*args, **kwargs)
        if not self._self_call.done:
            self._self_call.finish_dict(body)
        return body

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            if self._self_parsed is None:
                self._self_call.finish_empty()

    def __del__(self) -> None:
        if self._self_parsed is None:
            self._self_call.finish_empty()


class AsyncRawResponseProxy(wrapt.ObjectProxy):  # type: ignore[misc]
    """Wraps ``AsyncAPIResponse`` (``with_streaming_response`` on the async client)."""

    def __init__(self, wrapped: Any, call: Call, hide_usage: bool) -> None:
        super().__init__(wrapped)
        self._self_call = call
        self._self_hide_usage = hide_usage
        self._self_parsed: tuple[Any, Any] | None = None

    async def parse(self, *args: Any, **kwargs: Any) -> Any:
        return _observe_parsed(self, await self.__wrapped__.parse(*args, **kwargs))

    async def json(self, *args: Any, **kwargs: Any) -> Any:
        body = await self.__wrapped__.json(*args, **kwargs)
        if not self._self_call.done:
            self._self_call.finish_dict(body)
        return body

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            if self._self_parsed is None:
                self._self_call.finish_empty()

    def __del__(self) -> None:
        if self._self_parsed is None:
            self._self_call.finish_empty()
