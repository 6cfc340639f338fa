"""Faults switched per request with ``x-sim-fault``: each does what it promises on the
wire, the SDK still parses the corrupted payloads, and the adapters reject them."""

from __future__ import annotations

import math
import time
from typing import Any

import openai
import pytest

from spec_decode_otel import record_from_json

PROMPT = [{"role": "user", "content": "Say something."}]
SGLANG = {"return_spec_tokens_details": True}


def extra(obj: Any) -> dict[str, Any]:
    return obj.model_extra or {}


def request(client: openai.OpenAI, engine: str, fault: str, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 40)
    headers = {"x-spec-decode-engine": engine, "x-sim-fault": fault}
    return client.chat.completions.create(
        model="spec-sim",
        messages=PROMPT,
        extra_headers=headers,
        extra_body=SGLANG if engine == "sglang" else None,
        **kw,
    )


def stats_of(resp: Any, engine: str) -> dict[str, Any]:
    """The stats object where the engine puts it (non-streaming)."""
    if engine == "vllm":
        return extra(resp)["metrics"]["speculative_decoding"]
    if engine == "vllm-premerge":
        return extra(resp.choices[0])["speculative_decoding_stats"]
    if engine == "sglang":
        return extra(resp)["sglext"]["spec_tokens_details"]
    if engine == "trtllm":
        return extra(resp.choices[0])["speculative_decoding"]
    if engine == "llamacpp":
        return extra(resp)["timings"]
    return extra(resp.choices[0])  # trtllm-released: avg_decoded_tokens_per_iter only


HIST = {
    "vllm": "acceptance_histogram",
    "vllm-premerge": "acceptance_histogram",
    "sglang": "spec_correct_drafts_histogram",
    "trtllm": "acceptance_histogram",
}
STEPS = {"sglang": "spec_verify_ct"}
FLOATS = {
    "vllm": "mean_acceptance_length",
    "vllm-premerge": "mean_acceptance_length",
    "sglang": "spec_accept_length",
    "trtllm": "acceptance_rate",
    "trtllm-released": "avg_decoded_tokens_per_iter",
    "llamacpp": "draft_n_accepted",
}


def values(hist: Any) -> list[Any]:
    return list(hist.values()) if isinstance(hist, dict) else list(hist)


PAYLOAD_ENGINES = ["vllm", "vllm-premerge", "sglang", "trtllm", "trtllm-released", "llamacpp"]


@pytest.mark.parametrize("engine", PAYLOAD_ENGINES)
def test_malformed_types(openai_client, engine):
    resp = request(openai_client, engine, "malformed-types")
    s = stats_of(resp, engine)
    if engine in HIST:
        assert any(type(v) is str for v in values(s[HIST[engine]]))
    elif engine == "llamacpp":
        assert type(s["draft_n"]) is str
    else:
        assert type(s["avg_decoded_tokens_per_iter"]) is str
    assert record_from_json(resp.model_dump(exclude_unset=True)) is None


@pytest.mark.parametrize("engine", PAYLOAD_ENGINES)
def test_inconsistent(openai_client, engine):
    resp = request(openai_client, engine, "inconsistent")
    s = stats_of(resp, engine)
    if engine in HIST:
        assert sum(values(s[HIST[engine]])) != s[STEPS.get(engine, "num_spec_steps")]
    elif engine == "llamacpp":
        assert s["draft_n_accepted"] > s["draft_n"]
    else:
        assert s["avg_decoded_tokens_per_iter"] < 1
    assert record_from_json(resp.model_dump(exclude_unset=True)) is None


@pytest.mark.parametrize("engine", PAYLOAD_ENGINES)
def test_bools(openai_client, engine):
    resp = request(openai_client, engine, "bools")
    s = stats_of(resp, engine)
    if engine in HIST:
        assert any(type(v) is bool for v in values(s[HIST[engine]]))
    elif engine == "llamacpp":
        assert s["draft_n_accepted"] is True
    else:
        assert s["avg_decoded_tokens_per_iter"] is True
    assert record_from_json(resp.model_dump(exclude_unset=True)) is None


@pytest.mark.parametrize("engine", PAYLOAD_ENGINES)
def test_nan(openai_client, engine):
    raw = openai_client.chat.completions.with_raw_response.create(
        model="spec-sim",
        messages=PROMPT,
        max_tokens=40,
        extra_headers={"x-spec-decode-engine": engine, "x-sim-fault": "nan"},
        extra_body=SGLANG if engine == "sglang" else None,
    )
    assert "NaN" in raw.text  # the bare JSON token, as Python's json writes it
    resp = raw.parse()
    assert math.isnan(stats_of(resp, engine)[FLOATS[engine]])
    record = record_from_json(resp.model_dump(exclude_unset=True))
    if engine == "sglang":
        # SGLang's floats are not the record's (the adapter derives them from the
        # counts), so the payload may still yield a record; NaN must never reach it.
        assert record is None or all(
            math.isfinite(v)
            for v in (record.mean_acceptance_length, record.draft_acceptance_rate)
            if v is not None
        )
    else:
        assert record is None


@pytest.mark.parametrize("engine", ["vllm", "vllm-premerge", "sglang", "trtllm"])
def test_huge_array(openai_client, engine):
    resp = request(openai_client, engine, "huge-array")
    s = stats_of(resp, engine)
    assert len(s[HIST[engine]]) > 100_000
    if engine == "vllm":  # level detailed: the per-step arrays too
        assert len(s["per_step_accepted"]) > 100_000
    assert record_from_json(resp.model_dump(exclude_unset=True)) is None


def test_payload_faults_also_hit_streams(openai_client):
    chunks = list(
        request(
            openai_client,
            "vllm-premerge",
            "malformed-types",
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    stats = [extra(c)["speculative_decoding_stats"] for o in chunks for c in o.choices if extra(c)]
    assert any(type(v) is str for v in stats[0]["acceptance_histogram"].values())
    assert record_from_json([o.model_dump(exclude_unset=True) for o in chunks]) is None


def test_faults_combine(openai_client):
    resp = request(openai_client, "vllm", "bools, inconsistent")
    s = stats_of(resp, "vllm")
    assert any(type(v) is bool for v in s["acceptance_histogram"])
    assert sum(s["acceptance_histogram"]) != s["num_spec_steps"]


# --- transport faults -------------------------------------------------------------------


def test_drop_mid_stream_sync(openai_client):
    received = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in request(openai_client, "vllm", "drop-mid-stream", stream=True):
            received.append(chunk)
    assert 0 < len(received) < 10
    assert all(c.choices for c in received)  # never got a terminating/usage chunk


async def test_drop_mid_stream_async(async_openai_client):
    received = []
    stream = await async_openai_client.chat.completions.create(
        model="spec-sim",
        messages=PROMPT,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-sim-fault": "drop-mid-stream"},
    )
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            received.append(chunk)
    assert 0 < len(received) < 10


def test_drop_mid_body_non_streaming(openai_client):
    with pytest.raises(openai.APIConnectionError):
        request(openai_client, "vllm", "drop-mid-stream")


def test_the_server_survives_a_drop(openai_client):
    with pytest.raises(openai.APIConnectionError):
        list(request(openai_client, "vllm", "drop-mid-stream", stream=True))
    assert request(openai_client, "vllm", "").usage.completion_tokens == 40


def test_http_429(openai_client):
    with pytest.raises(openai.RateLimitError) as info:
        request(openai_client, "vllm", "http-429")
    err = info.value
    assert err.status_code == 429 and err.response.headers["retry-after"] == "1"
    body = err.response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["param"] is None


async def test_http_500_async(async_openai_client):
    with pytest.raises(openai.InternalServerError) as info:
        await async_openai_client.chat.completions.create(
            model="spec-sim", messages=PROMPT, extra_headers={"x-sim-fault": "http-500"}
        )
    assert info.value.status_code == 500
    assert set(info.value.response.json()["error"]) == {"message", "type", "param", "code"}


def test_slow_stream(openai_client):
    start = time.monotonic()
    chunks = list(
        openai_client.chat.completions.create(
            model="spec-sim",
            messages=PROMPT,
            max_tokens=10,
            stream=True,
            extra_headers={"x-sim-fault": "slow", "x-sim-delay-ms": "40"},
        )
    )
    elapsed = time.monotonic() - start
    assert elapsed >= 0.04 * (len(chunks) - 1) * 0.9


def test_unknown_fault_is_a_400(openai_client):
    with pytest.raises(openai.BadRequestError):
        request(openai_client, "vllm", "gremlins")
