"""Fuzzing every way a payload enters: adapters, ``record_from_json``, raw SSE, the live SDK.

Inputs are real payloads (tests/data/wire-examples and the simulator's shapes for every
engine) mutated the ways a broken or hostile server could: wrong JSON types, huge and
negative ints, NaN/inf, bools, deep nesting, deleted and inserted fields, oversized
arrays; for raw SSE also duplicated keys, truncated lines, CRLF, comments, garbage events.

Properties: nothing raises (``parse_payloads``/``record_from_text`` raise only
ValueError, their documented error); every record returned satisfies the invariants
(it re-validates from its own JSON to an equal record); the instrumented SDK gives the
user exactly what the bare SDK gives, and no input makes the library report an internal
error (the SDK builds its objects without validating them: ``choices`` of 5 was one).
Cost is linear in payload size with a hard cap.

Budget: ``SPEC_DECODE_OTEL_FUZZ_EXAMPLES`` examples per property (CI default below).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from reliability_helpers import (
    Otel,
    async_mock_client,
    internal_errors,
    mock_client,
    sse,
    sse_response,
    uninstrumented,
)

from record_json import WIRE_EXAMPLES
from spec_decode_otel import (
    SpecDecodeAcceptanceRecord,
    instrument_client,
    record_from_json,
    record_from_text,
)
from spec_decode_otel.adapters import BUILTIN_ADAPTERS, InvalidPayload, ParsedResponse, detect
from spec_decode_otel.payloads import parse_payloads
from spec_decode_otel.record import MAX_SPEC_STEPS, MAX_SPEC_TOKENS
from spec_decode_otel.telemetry import (
    SD_ENGINE,
    SD_OUTCOME,
    SD_READ_TO_END,
    record_attributes,
)

EXAMPLES = int(os.environ.get("SPEC_DECODE_OTEL_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# The live-SDK property runs two real clients per example: a fifth of the budget.
FUZZ_SDK = settings(FUZZ, max_examples=max(20, EXAMPLES // 5))


def _wire_vectors() -> list[tuple[str, Any]]:
    out = []
    for path in sorted(WIRE_EXAMPLES.glob("*.json")):
        vector = json.loads(path.read_text(encoding="utf-8"))
        payload = vector.get("response") if "response" in vector else vector.get("chunks")
        out.append((path.stem, payload))
    return out


WIRE_VECTORS = _wire_vectors()

#: Field names the adapters look at, so inserted keys hit the code that matters.
FIELD_NAMES = (
    "metrics", "speculative_decoding", "speculative_decoding_stats", "sglext",
    "spec_tokens_details", "meta_info", "timings", "usage", "choices", "index",
    "finish_reason", "acceptance_histogram", "acceptance_histogram_by_draft_length",
    "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens",
    "mean_acceptance_length", "draft_acceptance_rate", "per_step_accepted",
    "per_step_drafted", "spec_verify_ct", "spec_num_correct_drafts",
    "spec_num_proposed_drafts", "spec_correct_drafts_histogram", "spec_accept_histogram",
    "spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_token_num",
    "spec_draft_token_num", "acceptance_rate", "total_accepted_draft_tokens",
    "total_draft_tokens", "avg_decoded_tokens_per_iter", "draft_n", "draft_n_accepted",
    "draft_rounds", "completion_tokens", "prompt_tokens",
)  # fmt: skip
#: Where spec-decode data lives: most mutations land under these keys.
HOT_KEYS = frozenset(
    {"metrics", "sglext", "timings", "usage", "meta_info", "speculative_decoding",
     "speculative_decoding_stats", "avg_decoded_tokens_per_iter"}
)  # fmt: skip

SPECIAL_INTS = (0, 1, -1, 2, 7, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, 10**400)
SPECIAL_STRINGS = ("0", "1", "7", "-1", "1.5", "\u0663", "", " ", "null", "NaN", "[]", "{}")


def nest(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


#: Counts and keys anywhere in int64 and past it (st.integers() alone stays near zero).
wide_ints = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(2**63 - 4, 2**63 + 4),
    st.integers(-(2**130), 2**130),
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    wide_ints,
    st.sampled_from(SPECIAL_INTS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from((math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e308, 1.0000001)),
    st.text(max_size=8),
    st.sampled_from(SPECIAL_STRINGS),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=6), children, max_size=5),
    ),
    max_leaves=16,
)
weird_values = st.one_of(
    scalars,
    json_values,
    st.lists(st.integers(min_value=-2, max_value=50) | wide_ints, max_size=12),  # histogram-like
    st.dictionaries(
        st.sampled_from(("0", "1", "2", "3", "9", "-1", "x")) | wide_ints.map(str),
        st.integers(-2, 60) | wide_ints,
    ),  # a pre-merge histogram, its keys too drawn over int64 and beyond
    st.integers(min_value=1, max_value=400).map(nest),  # deep (JSON-encodable) nesting
    st.sampled_from((MAX_SPEC_TOKENS + 2, MAX_SPEC_STEPS + 1)).map(lambda n: [0] * n),
)


def _paths(node: Any, max_depth: int = 40) -> list[tuple]:
    """Every path into ``node`` (iteratively, not below ``max_depth``: deep nesting is an
    input here, and the walker must not be the thing that overflows the stack)."""
    out: list[tuple] = []
    todo: list[tuple[tuple, Any]] = [((), node)]
    while todo:
        path, value = todo.pop()
        out.append(path)
        if len(path) >= max_depth:
            continue
        if isinstance(value, dict):
            todo.extend(((*path, k), v) for k, v in value.items())
        elif isinstance(value, list):
            todo.extend(((*path, i), v) for i, v in enumerate(value))
    out.reverse()
    return out


def _get(node: Any, path: tuple) -> Any:
    for step in path:
        node = node[step]
    return node


def _tweak(value: Any, draw: Callable[[Any], Any]) -> Any:
    """A near miss of ``value``: off by one, sign, scale, type."""
    if isinstance(value, bool):
        return draw(st.sampled_from((not value, int(value), str(value).lower())))
    if isinstance(value, int):
        near = [value + 1, value - 1, -value - 1, value * 2, value + 2**63, bool(value)]
        if abs(value) < 2**1000:
            near += [float(value), str(value)]
        return draw(st.sampled_from(near))
    if isinstance(value, float):
        return draw(
            st.sampled_from((value * (1 + 1e-5), -value, math.nan, math.inf, str(value), 0.0))
        )
    if isinstance(value, list):
        return draw(st.sampled_from((value[:-1], [*value, 0], [*value, 1], value[::-1], [])))
    return draw(weird_values)


@st.composite
def mutated(draw: Callable[[Any], Any], base: Any) -> Any:
    """``base`` (a body or a chunk list) after one to four mutations."""
    doc = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        hot = [p for p in paths if HOT_KEYS.intersection(str(s) for s in p)]
        path = draw(st.sampled_from(hot if hot and draw(st.integers(0, 4)) else paths))
        action = draw(st.sampled_from(("replace", "tweak", "delete", "insert", "wrap")))
        if not path:
            if action in ("replace", "wrap"):
                doc = draw(weird_values) if action == "replace" else [doc]
            continue
        parent, last = _get(doc, path[:-1]), path[-1]
        current = parent[last]
        if action == "replace":
            parent[last] = draw(weird_values)
        elif action == "tweak":
            parent[last] = _tweak(current, draw)
        elif action == "delete":
            del parent[last]
        elif action == "wrap":
            wrappers = ([current], {"value": current}, [current, current])
            parent[last] = draw(st.sampled_from(wrappers))
        elif isinstance(current, dict):
            current[draw(st.sampled_from(FIELD_NAMES) | st.text(max_size=5))] = draw(weird_values)
        elif isinstance(current, list):
            current.insert(draw(st.integers(0, len(current))), draw(weird_values))
        else:
            parent[last] = draw(weird_values)
    return doc


# --------------------------------------------------------------------------- checks


def check_record(record: SpecDecodeAcceptanceRecord | None) -> None:
    """A returned record satisfies every invariant and is exportable as-is."""
    if record is None:
        return
    assert isinstance(record, SpecDecodeAcceptanceRecord)
    as_json = record.model_dump(mode="json")
    json.dumps(as_json, allow_nan=False)  # no NaN/inf anywhere
    assert SpecDecodeAcceptanceRecord.model_validate(as_json) == record
    # Independent restatement of the invariants (not only the validator's word for it).
    hist = record.acceptance_histogram
    if hist is not None:
        assert sum(hist.values()) == record.num_spec_steps
        assert sum(j * c for j, c in hist.items()) == record.num_accepted_draft_tokens
        assert all(c > 0 for c in hist.values())
        if record.num_spec_tokens is not None and hist:
            assert max(hist) <= record.num_spec_tokens
    if record.num_accepted_draft_tokens is not None and record.num_draft_tokens is not None:
        assert record.num_accepted_draft_tokens <= record.num_draft_tokens
    if record.mean_acceptance_length is not None:
        assert math.isfinite(record.mean_acceptance_length)
        assert record.mean_acceptance_length >= 1.0
    if record.draft_acceptance_rate is not None:
        assert 0.0 <= record.draft_acceptance_rate <= 1.0
    for per_step in (record.per_step_accepted, record.per_step_drafted):
        if per_step is not None:
            assert len(per_step) == record.num_spec_steps <= MAX_SPEC_STEPS
            assert min(per_step, default=0) >= 0
    attrs = record_attributes(record, 1024)
    for value in attrs.values():
        assert isinstance(value, (str, bool, int, float, list))


def check_payload(payload: Any) -> SpecDecodeAcceptanceRecord | None:
    """Run the adapters WITHOUT detect()'s isolation (a raise is a bug), then detect."""
    chunks = payload if isinstance(payload, list) else [payload]
    responses = [r for r in map(ParsedResponse.from_dict, chunks) if r is not None]
    claims = []
    for adapter in BUILTIN_ADAPTERS:
        if adapter.can_adapt(responses):
            claims.append(adapter)
            # InvalidPayload is how an adapter rejects; anything else is a bug
            with contextlib.suppress(InvalidPayload):
                check_record(adapter.adapt(responses))
    record = detect(responses)
    check_record(record)
    if len(claims) != 1:
        assert record is None
    assert record_from_json(payload) == record
    return record


def _all_bases(engine_payloads: dict) -> list[tuple[str, Any]]:
    bases = list(WIRE_VECTORS)
    for label, payload in sorted(engine_payloads.items()):
        bases.append((f"sim-{label}", payload.body))
        bases.append((f"sim-{label}-stream", payload.chunks))
    return bases


# --------------------------------------------------------------------------- the bases


def test_the_unmutated_bases_give_records(engine_payloads) -> None:
    """Sanity: the fuzzers start from payloads that DO produce records."""
    with_record = [name for name, base in _all_bases(engine_payloads) if check_payload(base)]
    for label in engine_payloads:
        assert f"sim-{label}" in with_record
        assert f"sim-{label}-stream" in with_record
    assert "vllm_merged_detailed_chat" in with_record


# --------------------------------------------------------------------------- JSON properties


@FUZZ
@given(data=st.data())
def test_mutated_payloads_never_raise_and_records_hold(engine_payloads, data) -> None:
    _name, base = data.draw(st.sampled_from(_all_bases(engine_payloads)), label="base")
    payload = data.draw(mutated(base), label="mutated")
    event("record" if check_payload(payload) else "no record")


@FUZZ
@given(payload=json_values)
def test_arbitrary_json_never_raises(payload) -> None:
    check_payload(payload)
    check_payload([payload, payload])


# --------------------------------------------------------------------------- raw SSE


def _sse_text(chunks: list[Any]) -> str:
    return sse(chunks).decode()


def _events(text: str) -> list[str]:
    return [e for e in text.split("\n\n") if e.strip()]


GARBAGE_EVENTS = (
    'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "cut',  # truncated
    "data: " + "[" * 5_000,  # nested beyond the decoder's recursion limit
    'data: {"n": ' + "9" * 5_000 + "}",  # an int past Python's str->int digit limit
    "data: not json at all",
    "data: {}",
    "data: []",
    "data: 42",
)
NEUTRAL_LINES = (": keep-alive", "event: message", "id: 17", "retry: 3000", ":")


def dumps_with_duplicate(node: Any, target: tuple, key: str, junk: Any, junk_first: bool) -> str:
    """JSON text of ``node`` where the object at ``target`` has ``key`` twice: once with
    ``junk``. JSON decoders keep the LAST occurrence, so ``junk_first`` must not matter."""

    def render(value: Any, path: tuple) -> str:
        if isinstance(value, dict):
            items = []
            for k, v in value.items():
                pair = f"{json.dumps(k)}: {render(v, (*path, k))}"
                if path == target and k == key:
                    dup = f"{json.dumps(k)}: {json.dumps(junk)}"
                    items.extend([dup, pair] if junk_first else [pair, dup])
                else:
                    items.append(pair)
            return "{" + ", ".join(items) + "}"
        if isinstance(value, list):
            return "[" + ", ".join(render(v, (*path, i)) for i, v in enumerate(value)) + "]"
        return json.dumps(value)

    return render(node, ())


@st.composite
def sse_variants(draw: Callable[[Any], Any], chunks: list[Any]) -> tuple[str, bool]:
    """(text, same_record): same_record when the changes must not change the record."""
    events = [f"data: {json.dumps(c)}" for c in chunks] + ["data: [DONE]"]
    same = True
    for _ in range(draw(st.integers(0, 2))):
        # A duplicated key in the raw JSON of one chunk.
        i = draw(st.integers(0, len(chunks) - 1))
        keyed = [
            (p[:-1], p[-1]) for p in _paths(chunks[i])
            if p and isinstance(p[-1], str) and isinstance(_get(chunks[i], p[:-1]), dict)
        ]  # fmt: skip
        if not keyed:
            continue
        target, key = draw(st.sampled_from(keyed))
        junk_first = draw(st.booleans())
        same = same and junk_first
        events[i] = "data: " + dumps_with_duplicate(
            chunks[i], target, key, draw(weird_values.filter(_small)), junk_first
        )
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(
            st.sampled_from(
                ("comment", "garbage", "split", "crlf", "truncate", "cut-line", "done-early")
            )
        )
        i = draw(st.integers(0, max(0, len(events) - 1)))
        if kind == "comment":
            events.insert(i, draw(st.sampled_from(NEUTRAL_LINES)))
        elif kind == "garbage":
            events.insert(i, draw(st.sampled_from(GARBAGE_EVENTS)))
        elif kind == "split" and events[i].startswith("data: {"):
            # One event's JSON over two data: lines is valid SSE (joined with "\n").
            body = events[i][6:]
            cut = body.find(",") + 1 or len(body)
            events[i] = f"data: {body[:cut]}\ndata: {body[cut:]}"
        elif kind == "crlf":  # CRLF line ends (once: a lone CR also ends a line)
            events = [e.replace("\r\n", "\n").replace("\n", "\r\n") for e in events]
        elif kind == "truncate":
            same = False
            text = "\n\n".join(events)
            events = _events(text[: draw(st.integers(0, len(text)))]) or ["data: [DONE]"]
        elif kind == "cut-line":
            same = False
            events[i] = events[i][: draw(st.integers(0, len(events[i])))]
        elif kind == "done-early":
            same = False
            events.insert(i, "data: [DONE]")
    return "\n\n".join(events) + "\n\n", same


def _small(value: Any) -> bool:
    return len(json.dumps(value)) < 2_000


@FUZZ
@given(data=st.data())
def test_raw_sse_never_raises_and_harmless_noise_changes_nothing(engine_payloads, data) -> None:
    streams = [(n, c) for n, c in _all_bases(engine_payloads) if isinstance(c, list)]
    name, chunks = data.draw(st.sampled_from(streams), label="stream")
    clean = record_from_text(_sse_text(chunks))
    assert clean is not None, name
    text, same = data.draw(sse_variants(chunks), label="sse")
    try:
        payloads = parse_payloads(text)
    except ValueError:
        assert not same, "noise that a client ignores made the whole capture unreadable"
        return
    assert isinstance(payloads, list)
    record = record_from_text(text)
    check_record(record)
    event(f"same={same} record={record is not None}")
    if same:
        assert record == clean


@FUZZ
@given(text=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_arbitrary_text_raises_only_value_error(text: str) -> None:
    for candidate in (text, "data: " + text, text + "\n\ndata: [DONE]\n\n"):
        try:
            record = record_from_text(candidate)
        except ValueError:
            continue
        check_record(record)


# --------------------------------------------------------------------------- live SDK


@pytest.fixture(scope="module")
def sdk_pair() -> Iterator[dict[str, Any]]:
    """A bare client and a client instrumented on its own, sharing one replay handler."""
    state: dict[str, Any] = {"respond": None}

    def handler(request: Any) -> Any:
        return state["respond"]()

    otel = Otel(keep_spans=True)
    with uninstrumented():
        bare = mock_client(handler)
        wrapped = instrument_client(
            mock_client(handler),
            tracer_provider=otel.tracer_provider,
            meter_provider=otel.meter_provider,
        )
        state.update(bare=bare, wrapped=wrapped, otel=otel)
        yield state
    bare.close()
    wrapped.close()
    otel.shutdown()


def _outcome(
    call: Callable[[], Any], stream: bool, read: list[Any] | None = None
) -> tuple[str, Any]:
    """What the user sees; ``read`` collects the stream chunks the user got before any
    exception (the user's own code raising on one, e.g. a ``null`` chunk, included).
    ``stream``: the call returns the SDK's stream, which the user iterates."""
    try:
        result = call()
        if stream:
            dumped = []
            for chunk in result:
                if read is not None:
                    read.append(chunk)
                dumped.append(chunk.model_dump(warnings=False))
            return "ok", dumped
        return "ok", _shown(result)
    except Exception as exc:  # the user's view: which exception, with what message
        return type(exc).__qualname__, str(exc)


READS = ("create", "with_raw_response", "with_streaming_response")


def _shown(chunk: Any) -> Any:
    """A chunk as the SDK shows it, as JSON."""
    return chunk.model_dump(warnings=False) if hasattr(chunk, "model_dump") else chunk


def _draw_response(
    engine_payloads: dict, data: Any
) -> tuple[bool, str, Any, Callable[[], httpx2.Response]]:
    """A mutated body or stream, how the user reads it, and what answers the request."""
    stream = data.draw(st.booleans(), label="stream")
    how = data.draw(st.sampled_from(READS), label="read")
    bases = [(n, b) for n, b in _all_bases(engine_payloads) if isinstance(b, list) == stream]
    _name, base = data.draw(st.sampled_from(bases), label="base")
    payload = data.draw(mutated(base), label="mutated")
    if stream:
        raw = sse(payload if isinstance(payload, list) else [payload])
        return stream, how, payload, lambda: sse_response(raw)
    raw = json.dumps(payload).encode()
    headers = {"content-type": "application/json"}
    return stream, how, payload, lambda: httpx2.Response(200, content=raw, headers=headers)


@FUZZ_SDK
@given(data=st.data())
def test_mutated_bodies_through_the_instrumented_sdk(engine_payloads, sdk_pair, data) -> None:
    """The instrumented client returns/raises exactly what the bare one does, its span
    ends, no internal error is reported, and a record on the span is one the offline
    parser agrees with; read as the SDK's objects (``create``, and ``.parse()`` of
    ``with_raw_response``) or raw (``with_streaming_response``: a stream's lines, a
    body's bytes)."""
    stream, how, payload, respond = _draw_response(engine_payloads, data)
    chunks = payload if isinstance(payload, list) else [payload]
    sdk_pair["respond"] = respond
    otel: Otel = sdk_pair["otel"]
    otel.exporter.clear()
    request = {"model": "spec-sim", "messages": [{"role": "user", "content": "fuzz"}]}
    if stream:
        request.update(stream=True, stream_options={"include_usage": True})

    def run(client: openai.OpenAI) -> Callable[[], Any]:
        chat = client.chat.completions
        if how == "create":
            return lambda: chat.create(**request)
        if how == "with_raw_response":
            return lambda: chat.with_raw_response.create(**request).parse()

        def read_raw() -> Any:
            with chat.with_streaming_response.create(**request) as response:
                return list(response.iter_lines()) if stream else response.read()

        return read_raw

    iterated = stream and how != "with_streaming_response"
    bare = _outcome(run(sdk_pair["bare"]), iterated)
    read: list[Any] = []
    with internal_errors() as reported:
        wrapped = _outcome(run(sdk_pair["wrapped"]), iterated, read)
    assert wrapped == bare
    assert reported == []
    assert otel.counter.open_after(5.0) == 0  # a stream the user's own loop dropped: at GC
    spans = otel.spans()
    assert len(spans) == 1
    event("span with record" if SD_ENGINE in spans[0].attributes else "span without record")
    if SD_ENGINE in spans[0].attributes:
        # A stream the user stopped reading (an exception in the SDK or in their own
        # loop) is recorded from the chunks read, one per data line: that prefix is what
        # the offline parser must agree with.
        seen = payload if not stream or wrapped[0] == "ok" else chunks[: len(read)]
        expected = record_from_json(seen, request)  # the live path knows the request too
        if expected is None:
            # The SDK coerces its own typed fields before anyone reads them (a usage count
            # sent as ``false`` is 0 in its object): the record is then the one of the
            # body as the SDK shows it to the user.
            shown = [_shown(c) for c in read] if stream else bare[1]
            expected = record_from_json(shown, request)
        assert expected is not None, "the live path made a record the offline parser refuses"
        on_span = {
            k: v
            for k, v in spans[0].attributes.items()
            if k.startswith("spec_decode.") and k not in (SD_OUTCOME, SD_READ_TO_END)
        }
        wanted = record_attributes(expected)
        assert on_span == {k: tuple(v) if isinstance(v, list) else v for k, v in wanted.items()}


@FUZZ_SDK
@given(data=st.data())
def test_mutated_bodies_through_the_instrumented_async_sdk(engine_payloads, data) -> None:
    """The same for ``AsyncOpenAI``, whose streams and raw responses have proxies of their
    own: what the user sees is the same, no internal error is reported, the span ends."""
    stream, how, _payload, respond = _draw_response(engine_payloads, data)

    async def seen(client: openai.AsyncOpenAI) -> tuple[str, Any]:
        chat = client.chat.completions
        request: Any = {"model": "spec-sim", "messages": [], "stream": stream}
        try:
            if how == "with_streaming_response":
                async with chat.with_streaming_response.create(**request) as response:
                    lines = [line async for line in response.iter_lines()]
                    return "ok", lines if stream else await response.read()
            if how == "create":
                result = await chat.create(**request)
            else:
                result = (await chat.with_raw_response.create(**request)).parse()
            if stream:
                return "ok", [_shown(chunk) async for chunk in result]
            return "ok", _shown(result)
        except Exception as exc:  # the user's view: which exception, with what message
            return type(exc).__qualname__, str(exc)

    otel = Otel()
    with uninstrumented():
        bare = asyncio.run(seen(async_mock_client(lambda _request: respond())))
        wrapped = instrument_client(
            async_mock_client(lambda _request: respond()),
            tracer_provider=otel.tracer_provider,
            meter_provider=otel.meter_provider,
        )
        with internal_errors() as reported:
            assert asyncio.run(seen(wrapped)) == bare
    assert reported == []
    assert otel.counter.open_after(5.0) == 0
    assert len(otel.spans()) == 1
    otel.shutdown()


# --------------------------------------------------------------------------- cost


def _vllm_detailed(steps: int) -> dict[str, Any]:
    """A valid merged-vLLM detailed body with ``steps`` verify steps (k = 4)."""
    per_acc = [(i * 7) % 5 for i in range(steps)]
    hist = [per_acc.count(j) for j in range(5)]
    accepted = sum(per_acc)
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"content": ""}, "finish_reason": "stop"}],
        "metrics": {
            "speculative_decoding": {
                "mean_acceptance_length": 1 + accepted / steps,
                "draft_acceptance_rate": accepted / (4 * steps),
                "acceptance_histogram": hist,
                "num_spec_steps": steps,
                "num_accepted_draft_tokens": accepted,
                "num_draft_tokens": 4 * steps,
                "num_spec_tokens": 4,
                "per_step_accepted": per_acc,
                "per_step_drafted": [4] * steps,
            }
        },
    }


def _premerge_sparse(keys: int) -> dict[str, Any]:
    """A valid pre-merge body whose sparse histogram has ``keys`` buckets."""
    hist = {str(j): 1 for j in range(keys)}
    steps, accepted = keys, keys * (keys - 1) // 2
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"content": ""},
                "finish_reason": "stop",
                "speculative_decoding_stats": {
                    "acceptance_histogram": hist,
                    "num_spec_steps": steps,
                    "num_accepted_draft_tokens": accepted,
                    "num_draft_tokens": accepted,
                    "num_spec_tokens": keys,
                },
            }
        ],
    }


def _best_time(fn: Callable[[], Any], repeat: int = 5) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


TEN_MILLION = 10_000_000


@pytest.mark.parametrize("engine", ["vllm", "vllm-premerge", "sglang", "trtllm", "per-step"])
def test_a_ten_million_entry_array_is_rejected_at_once(engine: str) -> None:
    huge = [0] * TEN_MILLION
    body = _vllm_detailed(8)
    stats = body["metrics"]["speculative_decoding"]
    if engine == "vllm":
        stats["acceptance_histogram"] = huge
    elif engine == "per-step":
        stats["per_step_accepted"] = huge
    elif engine == "vllm-premerge":
        # A JSON object of 10M keys would take ~1 GB to build here; one past the cap
        # exercises the same early refusal (its size is checked before its keys).
        body = _premerge_sparse(3)
        body["choices"][0]["speculative_decoding_stats"]["acceptance_histogram"] = dict.fromkeys(
            map(str, range(MAX_SPEC_TOKENS + 2)), 0
        )
    elif engine == "sglang":
        body = {"choices": [], "sglext": {"spec_tokens_details": {
            "spec_verify_ct": 3, "spec_num_correct_drafts": 0,
            "spec_num_proposed_drafts": 3, "spec_correct_drafts_histogram": huge}}}  # fmt: skip
    else:
        body = {"choices": [{"index": 0, "finish_reason": "stop", "speculative_decoding": {
            "acceptance_histogram": huge, "num_spec_steps": 0,
            "total_accepted_draft_tokens": 0, "total_draft_tokens": 0}}]}  # fmt: skip
    elapsed = _best_time(lambda: record_from_json(body), repeat=3)
    record = record_from_json(body)
    if engine == "per-step":  # an optional detail over its bound: only the arrays go
        assert record is not None and record.per_step_accepted is None
    else:
        assert record is None
    assert elapsed < 0.25, f"{engine}: {elapsed:.3f}s to refuse 10M entries"


def test_cost_grows_linearly_with_payload_size() -> None:
    make = _vllm_detailed
    times = {}
    for n in (1_000, 10_000, 100_000):
        body = make(n)
        record = record_from_json(body)
        assert record is not None and record.num_spec_steps == n
        times[n] = _best_time(lambda body=body: record_from_json(body))
    # Linear: x100 the size costs about x100 the time (quadratic would be x10,000).
    # Generous bounds: fixed per-call costs make the small case relatively slow.
    assert times[100_000] < 0.5, times
    assert times[100_000] / times[1_000] < 600, times
    assert times[100_000] / times[10_000] < 60, times
    # Past the bound: the arrays are dropped, faster than accepting the largest allowed.
    over = make(MAX_SPEC_STEPS + 1)
    record = record_from_json(over)
    assert record is not None and record.per_step_accepted is None
    assert _best_time(lambda: record_from_json(over)) < times[100_000] * 1.5 + 0.01
