"""DSPy (the real ``dspy`` 3.4.1) against the simulator over HTTP, through LiteLLM.

How DSPy 3.4.1 sends a ``dspy.Predict`` call (read in the installed source):

- ``dspy/clients/lm.py``: ``dspy.LM(model, engine="auto", ...)``. ``engine="litellm"``
  sends every call through ``litellm.completion`` / ``acompletion``
  (``litellm_completion``, ``alitellm_completion``: the LM's keyword arguments, its
  ``headers`` with DSPy's ``User-Agent`` added, ``cache={"no-cache": True, ...}``).
  ``cache=False`` turns DSPy's own response cache off (``_get_cached_completion_fn``), so
  every call reaches the server.
- ``dspy/clients/backend_selection.py`` ``select_backend``: under the default
  ``engine="auto"``, a model lm15 (DSPy's vendored client, ``dspy/_vendor/lm15``) knows,
  ``openai/...`` and ``hosted_vllm/...`` included, goes to lm15 itself ("native") when
  the LM's client settings are only ``api_key``, ``api_base``, ``base_url`` and
  ``timeout``; any other (``headers``, ``extra_headers``, ...) sends it to LiteLLM.
  lm15 speaks HTTP over its own sockets (``_vendor/lm15/transports/_sync.py``,
  ``_async.py``): neither the ``openai`` SDK nor LiteLLM runs, so nothing of ours sees
  the call (pinned below; the way to be covered is ``engine="litellm"``).
- Through LiteLLM 1.110.2, ``openai/`` posts with the ``openai`` SDK (our wrapper's span,
  read from the wire); ``hosted_vllm/`` with LiteLLM's own handler (the LiteLLM
  callback's span, from the response LiteLLM hands its callbacks; see test_litellm.py).
  Which client sent a request shows on the wire: the SDK's ``x-stainless-*`` headers.
- ``dspy.Predict`` with the default ``ChatAdapter`` asks for ``[[ ## answer ## ]]``
  sections; the relay (``framework_relay.py``) answers the simulator's body with that
  text, keeping the engine's stats.
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import dspy
import pytest
from framework_relay import Relay, check_span
from instrumentation_helpers import (
    MODEL,
    Otel,
    expected_outcome,
)
from test_litellm import (  # noqa: F401  # the fixtures are used by name
    SETTLE,
    collect_litellm_leaks,
    litellm_callbacks,
    litellm_clients,
    pytestmark,
)

from reliability.reliability_helpers import SpanCounter
from spec_decode_otel import record_from_json

ROUTES = ("openai", "hosted_vllm")
ENGINES = ("vllm", "sglang", "trtllm", "llamacpp", "none")
#: (engine shape, sync or async call): every shape once, async on two of them
CASES = [*((engine, "sync") for engine in ENGINES), ("vllm", "async"), ("trtllm", "async")]
QUESTION = "What is a zebra-unicorn?"
ANSWER = "A striped horse with a horn."
#: what DSPy's ChatAdapter asks the model for, for ``question -> answer``
ANSWER_TEXT = f"[[ ## answer ## ]]\n{ANSWER}\n\n[[ ## completed ## ]]"


@pytest.fixture
def relay(simulator_url: str) -> Iterator[Relay]:
    with Relay(simulator_url, lambda request: ANSWER_TEXT) as r:
        yield r


def seed_for(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode()) % 100_000 + 1


def lm_for(route: str, relay: Relay, shape: str | None, seed: int, **settings: Any) -> dspy.LM:
    """A DSPy LM on ``route``, its cache off; ``shape`` (the simulator's engine shape) and
    the seed go as headers."""
    headers = {} if shape is None else {"x-spec-decode-engine": shape, "x-sim-seed": str(seed)}
    if shape == "sglang":
        settings["extra_body"] = {"return_spec_tokens_details": True}
    if headers:
        settings["headers"] = headers
    return dspy.LM(f"{route}/{MODEL}", api_base=relay.url, api_key="sk-t", cache=False, **settings)


async def predict(lm: dspy.LM, mode: str) -> dspy.Prediction:
    program = dspy.Predict("question -> answer")
    with dspy.context(lm=lm):
        if mode == "async":
            return await program.acall(question=QUESTION)
        return program(question=QUESTION)


async def settled_spans(otel: Otel, expected: int) -> list[Any]:
    """Our spans once LiteLLM's logging has run (it reports a call after returning it)."""
    deadline = time.monotonic() + SETTLE
    while len(otel.our_spans()) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)  # nothing more may come: a second record would show now
    return otel.our_spans()


def sent_by_the_openai_sdk(relay: Relay, index: int) -> bool:
    return "x-stainless-lang" in relay.requests[index].headers


@pytest.mark.parametrize(("engine", "mode"), CASES)
@pytest.mark.parametrize("route", ROUTES)
async def test_each_predict_call_through_litellm_gets_one_span_with_the_record(
    route: str,
    engine: str,
    mode: str,
    otel: Otel,
    span_counter: SpanCounter,
    relay: Relay,
    no_internal_errors: None,
) -> None:
    """``dspy.LM(engine="litellm", cache=False)``: each ``Predict`` call is one request to
    the server and one span of ours, with the record of that request's answer; the
    ``openai/`` route's span is the openai wrapper's (the request carries the SDK's
    headers), ``hosted_vllm/``'s the LiteLLM callback's, never both. DSPy's prediction is
    the same as without instrumentation."""
    seed = seed_for(route, engine, mode)
    bare = await predict(lm_for(route, relay, engine, seed, engine="litellm"), mode)
    assert otel.spans() == []

    otel.instrument()
    seen = await predict(lm_for(route, relay, engine, seed, engine="litellm"), mode)
    assert seen.toDict() == bare.toDict() == {"answer": ANSWER}

    spans = await settled_spans(otel, 1)
    assert len(relay.requests) == 2  # the bare call and this one: DSPy's cache is off
    assert sent_by_the_openai_sdk(relay, 1) == (route == "openai")
    assert relay.bodies()[1] == relay.bodies()[0]
    record = record_from_json(relay.replay(1))
    assert (record is None) == (engine == "none")
    (span,) = spans
    check_span(span, record)
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {expected_outcome(record): 1}


@pytest.mark.parametrize("route", ROUTES)
async def test_repeated_identical_calls_with_the_cache_off_each_get_a_span(
    route: str, otel: Otel, span_counter: SpanCounter, relay: Relay, no_internal_errors: None
) -> None:
    """The same question three times on one LM (``cache=False``): three requests, three
    spans, each with its own answer's record (the same seed, so the same record)."""
    otel.instrument()
    lm = lm_for(route, relay, "vllm", seed_for("repeat", route), engine="litellm")
    for _ in range(3):
        assert (await predict(lm, "sync")).answer == ANSWER
    spans = await settled_spans(otel, 3)
    assert len(spans) == len(relay.requests) == 3
    for index, span in enumerate(spans):
        record = record_from_json(relay.replay(index))
        assert record is not None and record.engine == "vllm"
        check_span(span, record)
    assert span_counter.open == 0
    assert otel.requests_by_outcome() == {"recorded": 3}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("route", ROUTES)
async def test_headers_alone_send_the_default_engine_through_litellm(
    route: str, mode: str, otel: Otel, relay: Relay, no_internal_errors: None
) -> None:
    """Under the default ``engine="auto"``, an LM with ``headers`` is one lm15 does not
    take (``select_backend``: a client setting other than key, base and timeout), so the
    call goes through LiteLLM and gets its span and record."""
    otel.instrument()
    lm = lm_for(route, relay, "sglang", seed_for("auto", route, mode))
    assert (await predict(lm, mode)).answer == ANSWER
    (span,) = await settled_spans(otel, 1)
    assert sent_by_the_openai_sdk(relay, 0) == (route == "openai")
    record = record_from_json(relay.replay(0))
    assert record is not None and record.engine == "sglang"
    check_span(span, record)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("route", ROUTES)
async def test_the_default_engine_sends_plain_lms_past_the_openai_sdk_and_litellm(
    route: str, mode: str, otel: Otel, relay: Relay, no_internal_errors: None
) -> None:
    """Pins a limit: ``dspy.LM("openai/..." or "hosted_vllm/...", api_base=..., api_key=...)``
    under the default ``engine="auto"`` is sent by DSPy's own lm15 client (its own
    sockets): the server answers, DSPy predicts, and no span of ours exists, since neither
    the openai SDK nor LiteLLM ran. ``engine="litellm"`` is the way to be covered (the
    tests above)."""
    otel.instrument()
    lm = lm_for(route, relay, None, 0)
    assert (await predict(lm, mode)).answer == ANSWER
    await asyncio.sleep(0.3)  # as long as LiteLLM's logging would take to report it
    assert len(relay.requests) == 1
    assert not sent_by_the_openai_sdk(relay, 0)
    assert record_from_json(relay.replay(0)) is not None  # the stats were on the wire
    assert otel.spans() == []
    assert otel.requests_by_outcome() == {}
    if mode == "async":
        await lm.aclose()
    lm.close()
