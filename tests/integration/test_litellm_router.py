"""LiteLLM's ``Router`` (the real ``litellm`` 1.110.2) in front of two simulator processes.

The Router load-balances a model group over several deployments and, when a deployment
fails, retries within the group or falls back to another group. Each attempt is one
``litellm.completion`` / ``acompletion`` call (``Router._completion`` /
``Router._acompletion``, litellm/router.py), which LiteLLM's own OpenTelemetry callback
gives one ``litellm_request`` span, failed attempts included. So do we: every attempt
gets one span on the deployment it reached, a failed one with error status, outcome
``error`` and no record, the answering one the record of the response it got; one
``spec_decode.requests`` point per attempt, labelled with that deployment's server.

LiteLLM reports a failed attempt's end inline (``utils.client``'s wrappers: "DO NOT
MAKE THREADED - router retry fallback relies on this!") before the Router starts the
next attempt, and the LiteLLM proxy hands every attempt of one request the same
``litellm_call_id`` (``resolve_litellm_call_id``, proxy/common_request_processing.py),
as any caller who passes one does: an attempt that starts under an id already ended is
a new attempt, not a repeat report of the old one.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm
import pytest
from instrumentation_helpers import (
    MESSAGES,
    MODEL,
    Otel,
    expected_outcome,
    expected_span_attributes,
    raw_payload,
    server_of,
    spec_decode_attributes,
)
from litellm import Router
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, StatusCode
from test_litellm import (  # noqa: F401  # the fixtures are used by name
    collect_litellm_leaks,
    litellm_callbacks,
    litellm_clients,
    pytestmark,
    settled_spans,
)

import spec_decode_otel
from spec_decode_otel.integrations.litellm import SpecDecodeLiteLLMCallback

#: A second simulator process: the other deployment of each model group.
SECOND_SIMULATOR = (
    "--engine", "vllm", "--level", "detailed", "--k", "4", "--alpha", "0.7", "--seed", "99",
)  # fmt: skip
#: Calls at most until the shuffle has reached both deployments of a group.
MAX_BALANCED_CALLS = 40


@pytest.fixture
def second_url(start_simulator: Callable[..., str]) -> str:
    return start_simulator(*SECOND_SIMULATOR)


def deployment(
    group: str, provider: str, base_url: str, engine: str, seed: int, fault: str | None = None
) -> dict[str, Any]:
    """One Router deployment: the engine's shape, seed and fault are per-deployment
    headers, as a real gateway's per-backend settings would be."""
    headers = {"x-spec-decode-engine": engine, "x-sim-seed": str(seed)}
    if fault is not None:
        headers["x-sim-fault"] = fault
    params: dict[str, Any] = {
        "model": f"{provider}/{MODEL}",
        "api_base": base_url,
        "api_key": "sk-t",
        "extra_headers": headers,
    }
    if engine == "sglang":
        params["extra_body"] = {"return_spec_tokens_details": True}
    return {"model_name": group, "litellm_params": params}


def expected_record(dep: dict[str, Any], stream: bool) -> Any:
    """``record_from_json`` of the same seeded request sent straight to the deployment."""
    params = dep["litellm_params"]
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "stream": stream,
        "extra_headers": params["extra_headers"],
        "extra_body": params.get("extra_body"),
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return spec_decode_otel.record_from_json(raw_payload(params["api_base"], "chat", body))


def request(group: str, stream: bool, **extra: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"model": group, "messages": MESSAGES, "stream": stream, **extra}
    if stream:
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


async def route(router: Router, mode: str, kwargs: dict[str, Any]) -> list[Any]:
    """One Router call; the response, or every chunk of a fully read stream."""
    stream = kwargs.get("stream") is True
    if mode == "async":
        result = await router.acompletion(**kwargs)
        return [c async for c in result] if stream else [result]
    result = router.completion(**kwargs)
    return list(result) if stream else [result]


def content(results: list[Any], stream: bool) -> str:
    if not stream:
        return str(results[0].choices[0].message.content)
    return "".join(c.choices[0].delta.content or "" for c in results if c.choices)


def check_answer_span(span: Any, dep: dict[str, Any], record: Any) -> None:
    """The attempt that answered: its deployment's server, the record of its response."""
    attrs = dict(span.attributes)
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    assert attrs["gen_ai.request.model"] == MODEL
    assert (attrs["server.address"], attrs["server.port"]) == server_of(
        dep["litellm_params"]["api_base"]
    )
    assert spec_decode_attributes(attrs) == (
        {} if record is None else expected_span_attributes(record)
    )
    assert attrs["spec_decode.outcome"] == expected_outcome(record)


def check_failed_span(span: Any, dep: dict[str, Any], error: str) -> None:
    """A failed attempt: error status, its deployment's server, no record."""
    attrs = dict(span.attributes)
    assert span.status.status_code is StatusCode.ERROR
    assert attrs["error.type"] == error
    assert attrs["spec_decode.outcome"] == "error"
    assert spec_decode_attributes(attrs) == {}
    assert (attrs["server.address"], attrs["server.port"]) == server_of(
        dep["litellm_params"]["api_base"]
    )


def counted(otel: Otel) -> dict[tuple[str, int], int]:
    """``spec_decode.requests`` by (outcome, server port)."""
    points = otel.points(otel.metrics(), "spec_decode.requests")
    return {(p.attributes["spec_decode.outcome"], p.attributes["server.port"]): p.value
            for p in points}  # fmt: skip


def port(dep: dict[str, Any]) -> int:
    return server_of(dep["litellm_params"]["api_base"])[1]


def own_handler_stream(provider: str, stream: bool) -> bool:
    """LiteLLM's own handler rebuilds stream chunks and drops the stats (README: LiteLLM)."""
    return provider == "hosted_vllm" and stream


# -- load balancing ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
async def test_each_balanced_call_has_one_span_with_the_record_of_the_deployment_that_answered(
    provider: str, mode: str, stream: bool, otel: Otel, simulator_url: str, second_url: str
) -> None:
    """A model group over a vLLM-shaped and an SGLang-shaped server (litellm 1.110.2
    ``Router``, default ``simple-shuffle``): called until both have answered, each call
    has exactly one span and one ``spec_decode.requests`` point, with the engine and
    ``server.*`` of the deployment that answered and the record of its response."""
    otel.instrument()
    vllm = deployment("pool", provider, simulator_url, "vllm", 31)
    sglang = deployment("pool", provider, second_url, "sglang", 32)
    by_port = {port(vllm): vllm, port(sglang): sglang}
    router = Router(model_list=[vllm, sglang])
    calls = 0
    while calls < MAX_BALANCED_CALLS:
        assert content(await route(router, mode, request("pool", stream)), stream)
        calls += 1
        spans = await settled_spans(otel, calls)
        assert len(spans) == calls
        if {s.attributes["server.port"] for s in spans} == set(by_port):
            break
    assert calls < MAX_BALANCED_CALLS, "the shuffle never reached both deployments"

    records = {p: expected_record(d, stream) for p, d in by_port.items()}
    assert {r.engine for r in records.values()} == {"vllm", "sglang"}
    for span in spans:
        answered = span.attributes["server.port"]
        record = None if own_handler_stream(provider, stream) else records[answered]
        check_answer_span(span, by_port[answered], record)
    outcome = "no_stats" if own_handler_stream(provider, stream) else "recorded"
    per_port = {p: sum(s.attributes["server.port"] == p for s in spans) for p in by_port}
    assert counted(otel) == {(outcome, p): n for p, n in per_port.items()}


# -- retries and fallbacks --------------------------------------------------------------


def retrying_router(provider: str, first: str, second: str) -> tuple[Router, Any, Any]:
    """One group: the preferred deployment (``order`` 1) answers 429, which cools it down
    at once in a group of two (``_should_cooldown_deployment``), so the Router's retry
    goes to the other one (``order`` 2)."""
    failing = deployment("pool", provider, first, "vllm", 41, fault="http-429")
    healthy = deployment("pool", provider, second, "sglang", 42)
    failing["litellm_params"]["order"] = 1
    healthy["litellm_params"]["order"] = 2
    return Router(model_list=[failing, healthy], num_retries=1, retry_after=0), failing, healthy


def falling_back_router(provider: str, first: str, second: str) -> tuple[Router, Any, Any]:
    """Two groups: ``primary`` answers 500, ``Router(fallbacks=...)`` sends the call on to
    ``backup``."""
    failing = deployment("primary", provider, first, "vllm", 51, fault="http-500")
    healthy = deployment("backup", provider, second, "sglang", 52)
    router = Router(
        model_list=[failing, healthy], num_retries=0, fallbacks=[{"primary": ["backup"]}]
    )
    return router, failing, healthy


ROUTERS = {
    "retry": (retrying_router, "pool", "RateLimitError"),
    "fallback": (falling_back_router, "primary", "InternalServerError"),
}


@pytest.mark.parametrize("call_id", ["litellm's", "callers"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
@pytest.mark.parametrize("how", sorted(ROUTERS))
async def test_a_recovered_call_has_an_error_span_then_the_answering_ones_record(
    how: str,
    provider: str,
    mode: str,
    stream: bool,
    call_id: str,
    otel: Otel,
    simulator_url: str,
    second_url: str,
) -> None:
    """The first attempt fails, the Router retries in the group or falls back to another
    (litellm 1.110.2): the user gets the same answer as without us; the call has two
    spans, both children of the caller's span: the failed attempt's (error status, no
    record) and the answering one's (its record), and one ``spec_decode.requests`` point
    each. With a ``litellm_call_id`` given by the caller, as the LiteLLM proxy gives one
    to every attempt of a request, the answer's record must not be lost."""
    make, group, error = ROUTERS[how]
    extra = (
        {"litellm_call_id": f"req-{how}-{provider}-{mode}-{stream}"} if call_id == "callers" else {}
    )
    bare_router, _, _ = make(provider, simulator_url, second_url)
    bare = await route(bare_router, mode, request(group, stream, **extra))

    otel.instrument()
    router, failing, healthy = make(provider, simulator_url, second_url)
    with otel.tracer.start_as_current_span("agent step") as parent:
        seen = await route(router, mode, request(group, stream, **extra))
    assert content(seen, stream) == content(bare, stream)
    if not stream:
        volatile = {"id", "created"}
        assert seen[0].model_dump(exclude=volatile) == bare[0].model_dump(exclude=volatile)

    spans = sorted(await settled_spans(otel, 2), key=lambda s: s.start_time)
    assert len(spans) == 2, [dict(s.attributes) for s in spans]
    first, answer = spans
    check_failed_span(first, failing, error)
    record = None if own_handler_stream(provider, stream) else expected_record(healthy, stream)
    assert own_handler_stream(provider, stream) or record.engine == "sglang"
    check_answer_span(answer, healthy, record)
    assert first.end_time <= answer.start_time
    for span in spans:
        assert span.parent is not None
        assert span.parent.span_id == parent.get_span_context().span_id
    assert counted(otel) == {
        ("error", port(failing)): 1,
        (expected_outcome(record), port(healthy)): 1,
    }


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
async def test_when_every_deployment_fails_the_user_gets_the_same_error_and_error_spans(
    provider: str, mode: str, otel: Otel, simulator_url: str, second_url: str
) -> None:
    """Both groups fail (litellm 1.110.2 ``Router(fallbacks=...)``): the exception the
    user sees is the one they see without us, and each attempt has one ended error span,
    one ``error`` count, no record."""

    def make() -> tuple[Router, Any, Any]:
        primary = deployment("primary", provider, simulator_url, "vllm", 61, fault="http-500")
        backup = deployment("backup", provider, second_url, "sglang", 62, fault="http-500")
        router = Router(
            model_list=[primary, backup], num_retries=0, fallbacks=[{"primary": ["backup"]}]
        )
        return router, primary, backup

    async def attempt(router: Router) -> BaseException:
        with pytest.raises(litellm.InternalServerError) as info:
            await route(router, mode, request("primary", False, litellm_call_id="req-doomed"))
        return info.value

    bare = await attempt(make()[0])
    otel.instrument()
    router, primary, backup = make()
    seen = await attempt(router)
    assert type(seen) is type(bare) and seen.status_code == bare.status_code == 500
    assert str(seen) == str(bare)

    spans = sorted(await settled_spans(otel, 2), key=lambda s: s.start_time)
    assert len(spans) == 2
    check_failed_span(spans[0], primary, "InternalServerError")
    check_failed_span(spans[1], backup, "InternalServerError")
    assert counted(otel) == {("error", port(primary)): 1, ("error", port(backup)): 1}


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_callback_alone_records_the_answer_of_a_call_that_fell_back(
    mode: str, otel: Otel, simulator_url: str, second_url: str
) -> None:
    """The LiteLLM proxy's set-up in short: the callback alone (no openai wrapper), a
    Router with fallbacks, and a ``litellm_call_id`` shared by every attempt of the
    request (``resolve_litellm_call_id``, litellm 1.110.2 proxy). The ``openai/`` route's
    answer is then the callback's to record, from LiteLLM's ``original_response``."""
    callback = SpecDecodeLiteLLMCallback(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
    )
    litellm.callbacks.append(callback)
    try:
        router, failing, healthy = falling_back_router("openai", simulator_url, second_url)
        results = await route(router, mode, request("primary", False, litellm_call_id="req-1"))
        assert content(results, False)
        spans = sorted(await settled_spans(otel, 2), key=lambda s: s.start_time)
    finally:
        callback.unregister()
    assert len(spans) == 2
    check_failed_span(spans[0], failing, "InternalServerError")
    record = expected_record(healthy, False)
    assert record is not None and record.engine == "sglang"
    check_answer_span(spans[1], healthy, record)
    assert counted(otel) == {("error", port(failing)): 1, ("recorded", port(healthy)): 1}


# -- litellm.completion(fallbacks=...): LiteLLM's own fallbacks, without a Router ---------


def fallback_kwargs(provider: str, first: str, second: str, seed: str) -> dict[str, Any]:
    """``litellm.completion`` to a failing vLLM-shaped server (500), falling back to an
    SGLang-shaped one: each fallback is a dict of its own ``litellm_params``."""
    failing = deployment("-", provider, first, "vllm", 71, fault="http-500")["litellm_params"]
    healthy = deployment("-", provider, second, "sglang", 72)["litellm_params"]
    return {
        **failing,
        "messages": MESSAGES,
        "num_retries": 0,
        "litellm_call_id": f"req-fallbacks-{seed}",
        "fallbacks": [healthy],
    }


#: LiteLLM 1.110.2 leaves its logging worker's task on the loop it closes, and says so
#: when the task is collected.
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <coroutine object LoggingWorker._worker_loop"
    ":pytest.PytestUnraisableExceptionWarning"
)
@pytest.mark.parametrize("thread", ["caller", "worker"])
@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
async def test_sync_completion_with_fallbacks_records_each_attempt_when_it_happens(
    provider: str, thread: str, otel: Otel, simulator_url: str, second_url: str
) -> None:
    """``litellm.completion(..., fallbacks=[...])`` (litellm 1.110.2) runs each attempt as
    ``litellm.acompletion`` on an event loop made for the call and closed when it
    returns (``completion_with_fallbacks``, litellm_core_utils/fallback_utils.py, through
    ``run_async_function``, asyncify.py: in a worker thread when the caller's thread
    runs a loop, else in the caller's). A failed attempt's failure event comes inline;
    the answering attempt's success event is only queued on LiteLLM's logging worker
    (``_client_async_logging_helper``, utils.py), which that loop never gets to run, and
    no sync success event comes (``Logging._success_handler_body``,
    litellm_core_utils/litellm_logging.py, skips a ``CustomLogger``'s sync hook once the
    shared logging object says ``acompletion``). The queued event runs only when LiteLLM
    next runs a loop (``LoggingWorker._ensure_queue`` carries it over,
    litellm_core_utils/logging_worker.py) or at exit (``_flush_on_exit``).

    So the answer's record (LiteLLM's own handler: the callback's) came whenever the
    application next made an async LiteLLM call, or at exit, or never. The callback now
    records such an attempt when LiteLLM logs its response (``log_post_api_call``, in
    the attempt's loop, with the body), and the late event finds it recorded. Either
    way: two spans by the time the call returns, the failed attempt's and the answer's,
    and none more when the queued event finally runs."""
    otel.instrument()
    kwargs = fallback_kwargs(provider, simulator_url, second_url, f"{provider}-{thread}")
    with otel.tracer.start_as_current_span("agent step") as parent:
        if thread == "caller":  # the test's loop runs here: LiteLLM uses a worker thread
            response = litellm.completion(**kwargs)
        else:  # no loop in this thread: LiteLLM makes one here
            context = otel_context.get_current()

            def in_worker() -> Any:
                token = otel_context.attach(context)
                try:
                    return litellm.completion(**kwargs)
                finally:
                    otel_context.detach(token)

            response = await asyncio.to_thread(in_worker)
    assert response.choices[0].message.content

    spans = sorted(await settled_spans(otel, 2), key=lambda s: s.start_time)
    assert len(spans) == 2, [dict(s.attributes) for s in spans]
    failing = {"litellm_params": {"api_base": simulator_url}}
    healthy = {"litellm_params": {**kwargs["fallbacks"][0]}}
    check_failed_span(spans[0], failing, "InternalServerError")
    record = expected_record(healthy, False)
    assert record is not None and record.engine == "sglang"
    check_answer_span(spans[1], healthy, record)
    assert spans[0].end_time <= spans[1].start_time
    for span in spans:
        if thread == "caller":
            # run_async_function's worker thread starts without the caller's context
            # (``executor.submit(run_in_new_loop)``): LiteLLM loses the parent for us.
            assert span.parent is None
        else:
            assert span.parent is not None
            assert span.parent.span_id == parent.get_span_context().span_id
    assert counted(otel) == {("error", port(failing)): 1, ("recorded", port(healthy)): 1}

    # LiteLLM's next loop runs the queued success event: it must not give a third span.
    later = deployment("-", provider, second_url, "sglang", 73)["litellm_params"]
    await litellm.acompletion(**later, messages=MESSAGES)
    spans = await settled_spans(otel, 3)
    assert len(spans) == 3
    assert counted(otel) == {("error", port(failing)): 1, ("recorded", port(healthy)): 2}
