"""Cardinality: a server (or caller) inventing values cannot explode the time series.

Driven through the real instrumentation and SDK over ``httpx2.MockTransport``: a server
that answers each request with a new model name, a new k and a new tenant (allow-listed
user attribute) — 10,000 of each. Every metric attribute keeps at most
``MAX_VALUES_PER_ATTRIBUTE`` (100) distinct values plus the overflow value ``_OTHER``;
the accepted-count and draft-position attributes at most ``MAX_DRAFT_POSITIONS`` (64) plus
``_OTHER``; and the values the server chooses in combination fold past ``MAX_SERIES``
(a histogram's attribute sets) and ``MAX_POINTS`` (a counter's), so the SDK's own
cardinality limit is never hit (no ``otel.metric.overflow`` series).

``SPEC_DECODE_OTEL_CARDINALITY_CALLS`` sizes the run (default 10,000).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

import httpx2
from reliability_helpers import Otel, canary_messages, instrumented, mock_client

import spec_decode_otel
from spec_decode_otel.instrumentation.genai_metrics import (
    M_OPERATION_DURATION,
    M_TOKEN_USAGE,
)
from spec_decode_otel.record import MAX_SPEC_TOKENS
from spec_decode_otel.telemetry import (
    FOLDED_ROOM,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
    M_ACCEPTANCE_LENGTH,
    M_ACCEPTED_AT_POSITION,
    M_ACCEPTED_DRAFT_TOKENS,
    M_DRAFT_ACCEPTANCE_RATE,
    M_DRAFT_TOKENS,
    M_REQUESTS,
    M_VERIFY_STEPS,
    MAX_DRAFT_POSITIONS,
    MAX_POINTS,
    MAX_SERIES,
    MAX_VALUES_PER_ATTRIBUTE,
    OVERFLOW_VALUE,
    SD_ACCEPTED,
    SD_NUM_SPEC_TOKENS,
    SD_POSITION,
    SERVER_ADDRESS,
    SERVER_PORT,
)

CALLS = int(os.environ.get("SPEC_DECODE_OTEL_CARDINALITY_CALLS", "10000"))
METRICS = (
    M_ACCEPTANCE_LENGTH, M_DRAFT_ACCEPTANCE_RATE, M_DRAFT_TOKENS, M_ACCEPTED_DRAFT_TOKENS,
    M_VERIFY_STEPS, M_ACCEPTED_AT_POSITION, M_OPERATION_DURATION, M_TOKEN_USAGE,
)  # fmt: skip
BOUNDED = MAX_VALUES_PER_ATTRIBUTE + 1  # the first N values, then the overflow value
POSITIONS = MAX_DRAFT_POSITIONS + 1


def premerge_body(model: str, k: int, accepted_per_step: list[int]) -> dict[str, Any]:
    """A consistent pre-merge vLLM body (sparse histogram, any k) for ``model``."""
    hist: dict[str, int] = {}
    for j in accepted_per_step:
        hist[str(j)] = hist.get(str(j), 0) + 1
    steps, accepted = len(accepted_per_step), sum(accepted_per_step)
    return {
        "id": "resp",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
                "speculative_decoding_stats": {
                    "acceptance_histogram": hist,
                    "num_spec_steps": steps,
                    "num_accepted_draft_tokens": accepted,
                    "num_draft_tokens": k * steps,
                    "num_spec_tokens": k,
                },
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": steps + accepted, "total_tokens": 9},
    }


def inventive_server(request: httpx2.Request) -> httpx2.Response:
    """Echoes the request's model as the response model (unless ``x-model`` names
    another); k from a header."""
    model = request.headers.get("x-model") or json.loads(request.content)["model"]
    k = int(request.headers["x-k"])
    steps = [int(x) for x in request.headers["x-steps"].split(",")]
    return httpx2.Response(200, json=premerge_body(model, k, steps))


def attribute_census(otel: Otel) -> dict[str, tuple[int, dict[str, set]]]:
    """Per metric: (number of attribute sets, {attribute key: distinct values})."""
    census: dict[str, tuple[int, dict[str, set]]] = {}
    for name in METRICS:
        points = otel.points(name)
        values: dict[str, set] = defaultdict(set)
        sets = set()
        for point in points:
            sets.add(frozenset(point.attributes.items()))
            for key, value in point.attributes.items():
                values[key].add(value)
        census[name] = (len(sets), dict(values))
    return census


def test_invented_models_ks_and_tenants_stay_bounded() -> None:
    otel = Otel(keep_spans=False)
    client = mock_client(inventive_server)
    try:
        with instrumented(otel, metric_attributes=("tenant",), genai_metrics=True):
            for i in range(CALLS):
                with spec_decode_otel.attributes(tenant=f"tenant-{i}"):
                    client.chat.completions.create(
                        model=f"model-{i}",
                        messages=canary_messages(),
                        # a new k per request (up to the largest the record allows):
                        # more than BOUNDED values, moving together with the model
                        extra_headers={
                            "x-k": str(min(i + 1, MAX_SPEC_TOKENS)),
                            "x-steps": "0,1,1,0",
                        },
                    )
    finally:
        client.close()
    assert otel.counter.started == otel.counter.ended == CALLS
    census = attribute_census(otel)
    for name, (sets, values) in census.items():
        assert sets, f"{name} recorded nothing"
        for key in (GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_MODEL, "tenant"):
            assert len(values[key]) <= BOUNDED, (name, key, len(values[key]))
            assert OVERFLOW_VALUE in values[key], (name, key)
        assert "otel.metric.overflow" not in values, name
        if SD_NUM_SPEC_TOKENS in values:
            assert len(values[SD_NUM_SPEC_TOKENS]) <= BOUNDED
            assert OVERFLOW_VALUE in values[SD_NUM_SPEC_TOKENS]
    # The values move together here (request i brings new ones of each), so each metric
    # has the 100 admitted combinations plus the all-overflow one, times its own axis.
    assert census[M_ACCEPTANCE_LENGTH][0] <= BOUNDED
    assert census[M_OPERATION_DURATION][0] <= BOUNDED
    assert census[M_TOKEN_USAGE][0] <= 2 * BOUNDED  # input / output
    assert census[M_VERIFY_STEPS][0] <= 2 * BOUNDED  # accepted 0 and 1
    # Nothing was lost to the bound: the totals still count every request.
    assert otel.histogram_count(M_ACCEPTANCE_LENGTH) == CALLS
    assert otel.counter_total(M_VERIFY_STEPS) == 4 * CALLS
    otel.shutdown()


def test_accepted_counts_and_positions_past_the_limit_fold_into_overflow() -> None:
    """The longest draft the record allows: positions and accepted counts past 64 are one
    series."""
    otel = Otel(keep_spans=False)
    client = mock_client(inventive_server)
    long_steps = ",".join(str(j) for j in range(0, MAX_SPEC_TOKENS + 1, 7))
    try:
        with instrumented(otel, genai_metrics=True):
            for _ in range(3):
                client.chat.completions.create(
                    model="m",
                    messages=canary_messages(),
                    extra_headers={"x-k": str(MAX_SPEC_TOKENS), "x-steps": long_steps},
                )
    finally:
        client.close()
    census = attribute_census(otel)
    steps_sets, steps_values = census[M_VERIFY_STEPS]
    pos_sets, pos_values = census[M_ACCEPTED_AT_POSITION]
    assert len(steps_values[SD_ACCEPTED]) <= POSITIONS and steps_sets <= POSITIONS
    assert len(pos_values[SD_POSITION]) == POSITIONS and pos_sets == POSITIONS
    assert OVERFLOW_VALUE in steps_values[SD_ACCEPTED]
    assert OVERFLOW_VALUE in pos_values[SD_POSITION]
    assert set(pos_values[SD_POSITION]) - {OVERFLOW_VALUE} == set(range(MAX_DRAFT_POSITIONS))
    # Folded, not dropped: every step of each request is still counted.
    assert otel.counter_total(M_VERIFY_STEPS) == 3 * len(long_steps.split(","))
    otel.shutdown()


def test_combinations_a_server_chooses_stay_under_the_sdk_limit() -> None:
    """One server choosing the response model and k in every combination (40 x 20), with
    verify steps accepting every count up to k: each attribute stays under its own bound,
    but their product went past the SDK's limit (2,000 attribute sets per metric), whose
    ``otel.metric.overflow`` series then took every later series, this test's well-behaved
    call's too (found by a helper with 100 ks of one model: 2,001 sets). Past
    ``MAX_SERIES`` / ``MAX_POINTS`` the server's values fold into ``_OTHER`` and the
    caller's stay: the later call is still counted under its own request model."""
    otel = Otel(keep_spans=False)
    client = mock_client(inventive_server)
    steps_sent = 0
    try:
        with instrumented(otel):
            for k in range(1, 21):
                for model in range(40):
                    steps = ",".join(str(j) for j in range(k + 1))
                    steps_sent += k + 1
                    client.chat.completions.create(
                        model="m",
                        messages=canary_messages(),
                        extra_headers={"x-model": f"resp-{model}", "x-k": str(k), "x-steps": steps},
                    )
            client.chat.completions.create(
                model="legit",
                messages=canary_messages(),
                extra_headers={"x-k": "4", "x-steps": "0,1,2,3,4"},
            )
            steps_sent += 5
    finally:
        client.close()
    census = attribute_census(otel)
    for name, (sets, values) in census.items():
        if name in (M_OPERATION_DURATION, M_TOKEN_USAGE):  # not on (genai_metrics off)
            continue
        assert "otel.metric.overflow" not in values, name
        assert "legit" in values[GEN_AI_REQUEST_MODEL], name
        assert sets <= MAX_POINTS + 2 * POSITIONS, (name, sets)
    assert census[M_ACCEPTANCE_LENGTH][0] <= MAX_SERIES + 2
    requests = otel.points(M_REQUESTS)
    assert "otel.metric.overflow" not in {k for p in requests for k in p.attributes}
    # Folded, not dropped: every request and every verify step is still counted.
    assert otel.histogram_count(M_ACCEPTANCE_LENGTH) == 40 * 20 + 1
    assert otel.counter_total(M_VERIFY_STEPS) == steps_sent
    otel.shutdown()


def test_combinations_the_caller_makes_stay_under_the_sdk_limit() -> None:
    """The caller's values multiply too: 60 servers times 60 request models (each
    attribute well under its bound), then one host on 300 ports (model servers started
    with ``--port 0``). ``server.port`` had no bound of its own, and past ``MAX_SERIES`` /
    ``MAX_POINTS`` only the server's values folded, so every new combination was a new
    set: 2,001 sets per metric, the SDK's overflow series among them, and the counters'
    sums grew by one entry per combination without end (found by a helper: +97 MB for
    10,000 ports). Past the folded room a new combination keeps only this package's own
    values (operation, provider, engine, outcome)."""
    otel = Otel(keep_spans=False)
    client = mock_client(inventive_server)
    calls = 0
    try:
        with instrumented(otel, genai_metrics=True):
            for host in range(60):
                at = client.with_options(base_url=f"http://vllm-{host}.internal:8000/v1")
                for model in range(60):
                    at.chat.completions.create(
                        model=f"model-{model}",
                        messages=canary_messages(),
                        extra_headers={"x-k": "3", "x-steps": "0,1,2,3"},
                    )
                    calls += 1
            for port in range(300):
                at = client.with_options(base_url=f"http://127.0.0.1:{20000 + port}/v1")
                at.chat.completions.create(
                    model="m",
                    messages=canary_messages(),
                    extra_headers={"x-k": "3", "x-steps": "1"},
                )
                calls += 1
    finally:
        client.close()
    census = attribute_census(otel)
    for name, (sets, values) in census.items():
        assert "otel.metric.overflow" not in values, name
        assert len(values[SERVER_PORT]) <= BOUNDED, (name, len(values[SERVER_PORT]))
        assert OVERFLOW_VALUE in values[SERVER_ADDRESS], name
        assert sets <= MAX_POINTS + FOLDED_ROOM + 2 * POSITIONS, (name, sets)
    for name in (M_ACCEPTANCE_LENGTH, M_OPERATION_DURATION):
        assert census[name][0] <= MAX_SERIES + FOLDED_ROOM + 1, (name, census[name][0])
    requests = otel.points(M_REQUESTS)
    assert "otel.metric.overflow" not in {k for p in requests for k in p.attributes}
    assert len(requests) <= MAX_POINTS + FOLDED_ROOM + 1
    # Folded, not dropped: every call is still counted.
    assert otel.counter_total(M_REQUESTS) == calls
    assert otel.histogram_count(M_ACCEPTANCE_LENGTH) == calls
    assert otel.histogram_count(M_OPERATION_DURATION) == calls
    otel.shutdown()
