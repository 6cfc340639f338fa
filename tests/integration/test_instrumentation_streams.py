"""Streams end their call exactly once, on every way out, and never touch the caller's context.

Ways out: exhaustion, an error mid-stream (the simulator drops the connection), close(),
leaving a ``with`` block, ``break`` then close(), an exception raised by the user's own
loop inside ``with``, and an abandoned stream collected by the GC. Only a failing stream
is an error: a stream the user stopped reading ends with status unset,
``spec_decode.read_to_end=false`` and outcome ``not_read_to_end`` (issue "Trust at the
edges", 4). Each is run sync and async, with a user span current and with none; the
span current after ``create()`` returns and between chunks must be the caller's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
from instrumentation_helpers import MESSAGES, MODEL, Otel, spec_decode_attributes
from opentelemetry import trace
from opentelemetry.trace import Span, StatusCode

from reclaimed import collect

PATHS = ["exhausted", "error", "close", "with", "break-close", "raise-in-with", "abandoned"]
#: What the SDK raises for a stream cut mid-body: openai 3 wraps the transport's error in
#: APIConnectionError; openai 1 and 2 let httpx's RemoteProtocolError through as it came.
CUT_STREAM_ERROR: type[Exception] = (
    openai.APIConnectionError
    if int(openai.__version__.split(".")[0]) >= 3
    else httpx.RemoteProtocolError
)
#: error.type each path leaves on the span (None: no error)
EXPECTED_ERROR = {
    "exhausted": None,
    "error": CUT_STREAM_ERROR.__qualname__,
    "close": None,
    "with": None,
    "break-close": None,
    "raise-in-with": None,
    "abandoned": None,
}
#: spec_decode.outcome each path leaves on the span and in the requests counter
EXPECTED_OUTCOME = {
    "exhausted": "recorded",
    "error": "error",
    "close": "not_read_to_end",
    "with": "recorded",
    "break-close": "not_read_to_end",
    "raise-in-with": "not_read_to_end",
    "abandoned": "not_read_to_end",
}


class UserLoopError(Exception):
    """Raised by the test's own loop body."""


def stream_kwargs(path: str) -> dict[str, Any]:
    headers = {"x-spec-decode-engine": "vllm", "x-sim-seed": "42"}
    if path == "error":
        headers["x-sim-fault"] = "drop-mid-stream"
    return {
        "model": MODEL,
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_headers": headers,
    }


class ContextProbe:
    """Asserts the caller's current span is in force, and counts how often it looked."""

    def __init__(self, expected: Span | None) -> None:
        self.expected = expected
        self.checks = 0

    def __call__(self) -> None:
        current = trace.get_current_span()
        if self.expected is None:
            assert not current.get_span_context().is_valid, current
        else:
            assert current is self.expected, current
        self.checks += 1


@contextmanager
def maybe_parent(otel: Otel, with_parent: bool) -> Iterator[Span | None]:
    if not with_parent:
        yield None
        return
    with otel.tracer.start_as_current_span("user-parent") as parent:
        yield parent


def our_finished(otel: Otel) -> list[Any]:
    return otel.our_spans()


def drive_sync(client: Any, path: str, probe: ContextProbe, otel: Otel) -> None:
    """Run one stream out through ``path``; asserts the span ended right then."""
    stream = client.chat.completions.create(**stream_kwargs(path))
    probe()
    assert our_finished(otel) == []
    if path == "exhausted":
        for _ in stream:
            probe()
    elif path == "error":
        with pytest.raises(CUT_STREAM_ERROR):
            for _ in stream:
                probe()
    elif path == "close":
        next(stream)
        probe()
        stream.close()
    elif path == "with":
        with stream:
            for _ in stream:
                probe()
    elif path == "break-close":
        for _ in stream:
            probe()
            break
        assert our_finished(otel) == []  # a break alone does not end the call
        stream.close()
    elif path == "raise-in-with":
        with pytest.raises(UserLoopError), stream:
            for _ in stream:
                probe()
                raise UserLoopError
    elif path == "abandoned":
        next(stream)
        probe()
        assert our_finished(otel) == []
        del stream
        collect()
        return
    probe()
    assert len(our_finished(otel)) == 1  # ended now, not at garbage collection
    del stream
    collect()


async def drive_async(client: Any, path: str, probe: ContextProbe, otel: Otel) -> None:
    stream = await client.chat.completions.create(**stream_kwargs(path))
    probe()
    assert our_finished(otel) == []
    if path == "exhausted":
        async for _ in stream:
            probe()
    elif path == "error":
        with pytest.raises(CUT_STREAM_ERROR):
            async for _ in stream:
                probe()
    elif path == "close":
        await stream.__anext__()
        probe()
        await stream.close()
    elif path == "with":
        async with stream:
            async for _ in stream:
                probe()
    elif path == "break-close":
        async for _ in stream:
            probe()
            break
        assert our_finished(otel) == []
        await stream.close()
    elif path == "raise-in-with":
        with pytest.raises(UserLoopError):
            async with stream:
                async for _ in stream:
                    probe()
                    raise UserLoopError
    elif path == "abandoned":
        await stream.__anext__()
        probe()
        assert our_finished(otel) == []
        del stream
        collect()
        return
    probe()
    assert len(our_finished(otel)) == 1
    del stream
    collect()


@pytest.mark.parametrize("with_parent", [False, True], ids=["no-parent", "user-parent"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("path", PATHS)
async def test_every_exit_path_ends_the_call_exactly_once(
    path: str,
    mode: str,
    with_parent: bool,
    instrumented: Otel,
    openai_client: Any,
    async_openai_client: Any,
) -> None:
    with maybe_parent(instrumented, with_parent) as parent:
        probe = ContextProbe(parent)
        if mode == "sync":
            drive_sync(openai_client, path, probe, instrumented)
        else:
            await drive_async(async_openai_client, path, probe, instrumented)
        probe()
        assert probe.checks >= 3
    collect()

    (span,) = instrumented.our_spans()
    assert len(instrumented.spans()) == (2 if with_parent else 1)
    assert span.end_time is not None
    if parent is None:
        assert span.parent is None
    else:
        assert span.parent is not None
        assert span.parent.span_id == parent.get_span_context().span_id
        assert span.context.trace_id == parent.get_span_context().trace_id
    error = EXPECTED_ERROR[path]
    assert span.attributes.get("error.type") == error
    assert span.status.status_code is (StatusCode.UNSET if error is None else StatusCode.ERROR)
    outcome = EXPECTED_OUTCOME[path]
    assert span.attributes["spec_decode.outcome"] == outcome
    assert span.attributes.get("spec_decode.read_to_end", True) is (outcome == "recorded")
    stats = spec_decode_attributes(span.attributes)
    if path in ("exhausted", "with"):
        # vLLM's stats ride the final usage chunk: only a fully read stream has them
        assert stats["spec_decode.engine"] == "vllm"
        assert stats["spec_decode.num_spec_steps"] > 0
    else:
        assert stats == {}
    metrics = instrumented.metrics()
    (duration,) = instrumented.points(metrics, "gen_ai.client.operation.duration")
    assert duration.count == 1
    assert dict(duration.attributes).get("error.type") == error
    (requests,) = instrumented.points(metrics, "spec_decode.requests")
    assert (requests.attributes["spec_decode.outcome"], requests.value) == (outcome, 1)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_dropped_stream_raises_what_the_bare_sdk_raises(
    mode: str, otel: Otel, openai_client: Any, async_openai_client: Any
) -> None:
    async def read_until_error() -> tuple[BaseException, int]:
        seen = 0
        kwargs = stream_kwargs("error")
        try:
            if mode == "sync":
                for _ in openai_client.chat.completions.create(**kwargs):
                    seen += 1
            else:
                async for _ in await async_openai_client.chat.completions.create(**kwargs):
                    seen += 1
        except Exception as exc:
            return exc, seen
        raise AssertionError("the stream did not fail")

    bare, bare_seen = await read_until_error()
    otel.instrument()
    ours, ours_seen = await read_until_error()
    assert type(ours) is type(bare)
    assert str(ours) == str(bare)
    assert ours_seen == bare_seen > 0
    (span,) = otel.spans()
    assert span.attributes["error.type"] == type(bare).__qualname__
