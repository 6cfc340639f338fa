"""The simulated vLLM answers as vLLM 0.34.0 does where a client or an adapter can tell.

Read from the released wheel's own source (``vllm==0.34.0``):

- ``entrypoints/openai/chat_completion/api_router.py`` (and ``completion/``): a body is
  ``JSONResponse(content=generator.model_dump())``, every field dumped, so
  ``metrics.speculative_decoding`` (``entrypoints/generate/base/protocol.py``
  ``SpeculativeDecodingMetrics``) says ``per_step_accepted: null`` and
  ``per_step_drafted: null`` below the detailed level.
- ``chat_completion/serving.py`` ``chat_completion_stream_generator``: chunks are dumped
  with ``exclude_unset=True`` (and ``exclude_none`` when ``choices`` is empty), and
  ``v1/metrics/stats.py`` ``RequestSpecDecodeMetrics.to_dict`` sets the per-step keys only
  when populated: the usage chunk's stats have no per-step keys at summary level.
- ``stop_reason`` (``ChatCompletionResponseChoice``, ``CompletionResponseChoice``): the
  stop string that matched, null for EOS or the length limit; on every body choice, on a
  chat stream's finish chunk only (the only choice built with it), on every completions
  chunk (``completion/serving.py`` sets it on each).
- Bodies (``chat_completion/protocol.py``, ``completion/protocol.py``, dumped whole):
  every field of the response, choice and message models in their order, null ones too,
  except what a model itself leaves out: ``ChatMessage.annotations`` (``exclude_if``
  None), an empty ``tool_calls`` (``ChatMessage._serialize`` pops it),
  ``UsageInfo.prompt_tokens_details`` (``exclude_if`` None). ``system_fingerprint`` is
  ``vllm-<version>-<hash8>`` (``serve/utils/fingerprint.py``, default mode ``full``).
- Streams (``chat_completion_stream_generator_raw``, ``completion_stream_generator``,
  ``exclude_unset``): a chunk has exactly the fields its constructor was given, null or
  not; one chunk per engine step; a sequence's last text rides its finish chunk.
- ``metrics``' timing fields come only with ``--enable-per-request-metrics`` (default
  off, ``common/cli_args.py``); the spec-decode stats come without it
  (``build_spec_decoding_metrics`` in ``generate/base/serving.py``). The simulator's
  ``vllm_timing_metrics`` (default on) says which.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from spec_decode_otel import record_from_json
from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer, shapes


@pytest.fixture(scope="module")
def http() -> Iterator[Any]:
    with (
        SimulatorServer(SimulatorConfig(engine="vllm", k=4, seed=5)) as sim,
        httpx.Client(base_url=sim.base_url, timeout=30.0) as client,
    ):
        yield client


def post(
    http: Any, path: str, level: str = "summary", sim_seed: int | None = None, **body: Any
) -> Any:
    """``sim_seed``: the same sample for every request that names it."""
    body.setdefault("model", "spec-sim")
    if path == "/chat/completions":
        body.setdefault("messages", [{"role": "user", "content": "vllm wire"}])
    else:
        body.setdefault("prompt", "vllm wire")
    headers = {"x-spec-decode-level": level}
    if sim_seed is not None:
        headers["x-sim-seed"] = str(sim_seed)
    return http.post(path, json=body, headers=headers)


def sse_chunks(text: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
@pytest.mark.parametrize("level", ["summary", "detailed"])
def test_per_step_keys_are_null_in_a_body_and_absent_from_a_stream(
    http: Any, path: str, level: str
):
    stats = post(http, path, level).json()["metrics"]["speculative_decoding"]
    assert "per_step_accepted" in stats and "per_step_drafted" in stats
    if level == "summary":
        assert stats["per_step_accepted"] is None and stats["per_step_drafted"] is None
    else:
        assert len(stats["per_step_accepted"]) == stats["num_spec_steps"]
    chunks = sse_chunks(
        post(http, path, level, stream=True, stream_options={"include_usage": True}).text
    )
    streamed = chunks[-1]["metrics"]["speculative_decoding"]
    assert ("per_step_accepted" in streamed) == (level == "detailed")
    assert None not in streamed.values()


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
@pytest.mark.parametrize(
    "extra,stop_reason",
    [({"stop": " "}, " "), ({"max_tokens": 3}, None), ({}, None)],
    ids=["stop-string", "length", "eos"],
)
def test_stop_reason_names_the_stop_string_only(
    http: Any, path: str, extra: dict[str, Any], stop_reason: str | None
):
    (choice,) = post(http, path, **extra).json()["choices"]
    assert "stop_reason" in choice and choice["stop_reason"] == stop_reason
    chunks = sse_chunks(post(http, path, stream=True, **extra).text)
    choices = [ch for c in chunks for ch in c["choices"]]
    finish = [ch for ch in choices if ch["finish_reason"]]
    assert [ch["stop_reason"] for ch in finish] == [stop_reason]
    others = [ch for ch in choices if not ch["finish_reason"]]
    if path == "/completions":
        assert all("stop_reason" in ch and ch["stop_reason"] is None for ch in others)
    else:
        assert all("stop_reason" not in ch for ch in others)


#: ``vllm==0.34.0`` ``ChatCompletionResponse``/``CompletionResponse`` field order, and of
#: their choices and ``ChatMessage`` (``annotations`` and empty ``tool_calls`` left out).
CHAT_BODY = [
    "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
    "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
    "ec_transfer_params", "metrics",
]  # fmt: skip
COMPLETION_BODY = [
    "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
    "usage", "kv_transfer_params", "ec_transfer_params", "metrics",
]  # fmt: skip
CHAT_CHOICE = [
    "index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
    "routed_experts", "weight_versions",
]  # fmt: skip
COMPLETION_CHOICE = [
    "index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
    "prompt_logprobs", "prompt_token_ids", "routed_experts", "weight_versions",
]  # fmt: skip
MESSAGE = ["role", "content", "refusal", "audio", "function_call", "reasoning"]
#: ``UsageInfo``: ``prompt_tokens_details`` (None) excluded, ``completion_tokens_details``
#: null without a reasoning parser.
BODY_USAGE = ["prompt_tokens", "total_tokens", "completion_tokens", "completion_tokens_details"]
FINGERPRINT = re.compile(r"vllm-0\.34\.0-[0-9a-f]{8}")


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_a_body_sends_every_field_of_vllms_models_null_or_not_in_their_order(http: Any, path: str):
    body = post(http, path).json()
    chat = path == "/chat/completions"
    assert list(body) == (CHAT_BODY if chat else COMPLETION_BODY)
    (choice,) = body["choices"]
    assert list(choice) == (CHAT_CHOICE if chat else COMPLETION_CHOICE)
    if chat:
        assert list(choice["message"]) == MESSAGE
        assert [choice["message"][k] for k in MESSAGE[2:]] == [None] * 4
    assert list(body["usage"]) == BODY_USAGE and body["usage"]["completion_tokens_details"] is None
    assert FINGERPRINT.fullmatch(body["system_fingerprint"])
    set_fields = {"id", "object", "created", "model", "choices", "system_fingerprint", "usage"}
    assert all(body[k] is None for k in body if k not in set_fields | {"metrics"})
    extra = [k for k in choice if k not in ("index", "message", "text", "finish_reason")]
    assert all(choice[k] is None for k in extra)  # no stop string matched


def test_a_body_without_spec_decode_stats_says_speculative_decoding_null(http: Any):
    """``PerRequestMetrics`` dumped whole: its unset ``speculative_decoding`` is null."""
    metrics = post(http, "/chat/completions", "none").json()["metrics"]
    assert "speculative_decoding" in metrics and metrics["speculative_decoding"] is None
    assert metrics["time_to_first_token_ms"] is not None


def steps(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in chunks if c["choices"] and "role" not in c["choices"][0].get("delta", {})]


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_a_streams_last_text_rides_its_finish_chunk(http: Any, path: str):
    chat = path == "/chat/completions"
    (whole,) = post(http, path, sim_seed=11).json()["choices"]
    chunks = sse_chunks(post(http, path, sim_seed=11, stream=True).text)
    choices = [ch for c in steps(chunks) for ch in c["choices"]]
    text = [ch["delta"]["content"] if chat else ch["text"] for ch in choices]
    assert [ch["finish_reason"] for ch in choices] == [None] * (len(choices) - 1) + [
        whole["finish_reason"]
    ]
    assert text[-1] != ""
    assert "".join(text) == (whole["message"]["content"] if chat else whole["text"])
    # one chunk per engine step: the prefill token, then one per verify step
    stats = post(http, path, sim_seed=11).json()["metrics"]["speculative_decoding"]
    assert len(text) == 1 + stats["num_spec_steps"]


def test_a_stop_string_cut_sends_the_finish_chunk_with_empty_text(http: Any):
    """The text the stop string ended is empty, and vLLM sends the step anyway
    (``ChatStreamProcessor.step``: ``DeltaMessage(content=delta_text)``)."""
    chunks = sse_chunks(post(http, "/chat/completions", stream=True, stop=" ").text)
    (last,) = chunks[-1]["choices"]
    assert last["delta"] == {"content": ""} and last["stop_reason"] == " "


#: The chat chunks' choice keys, as each constructor call sets them.
CHAT_ROLE_CHOICE = ["index", "delta", "logprobs", "finish_reason"]
CHAT_STEP_CHOICE = ["index", "delta", "logprobs", "finish_reason", "token_ids"]
CHAT_FINISH_CHOICE = [
    "index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids", "weight_versions",
]  # fmt: skip
COMPLETION_STEP_CHOICE = [
    "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids",
    "token_ids", "weight_versions",
]  # fmt: skip
ROOT = ["id", "object", "created", "model", "choices"]


@pytest.mark.parametrize("include_usage", [False, True], ids=["no-usage", "usage"])
def test_chat_chunks_carry_the_null_fields_their_constructor_sets(http: Any, include_usage: bool):
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = sse_chunks(post(http, "/chat/completions", stream=True, **options).text)
    role, *middle, finish = [c for c in chunks if c["choices"]]
    assert list(role) == [*ROOT, "prompt_token_ids", "prompt_text"]
    assert role["prompt_token_ids"] is None and role["prompt_text"] is None
    assert list(role["choices"][0]) == CHAT_ROLE_CHOICE
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for chunk in middle:
        assert list(chunk) == [*ROOT, "kv_transfer_params"] and chunk["kv_transfer_params"] is None
        assert list(chunk["choices"][0]) == CHAT_STEP_CHOICE
        assert chunk["choices"][0]["logprobs"] is None and chunk["choices"][0]["token_ids"] is None
    assert list(finish["choices"][0]) == CHAT_FINISH_CHOICE
    tail = ["system_fingerprint"] if not include_usage else []
    assert list(finish) == [*ROOT, *tail, "kv_transfer_params"]
    if include_usage:
        usage_chunk = chunks[-1]
        assert list(usage_chunk) == [*ROOT, "usage", "system_fingerprint", "metrics"]
        assert FINGERPRINT.fullmatch(usage_chunk["system_fingerprint"])
        assert list(usage_chunk["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]
    else:
        assert FINGERPRINT.fullmatch(finish["system_fingerprint"])


@pytest.mark.parametrize("include_usage", [False, True], ids=["no-usage", "usage"])
def test_completion_chunks_carry_every_choice_field_on_every_step(http: Any, include_usage: bool):
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = sse_chunks(post(http, "/completions", stream=True, **options).text)
    *middle, finish = [c for c in chunks if c["choices"]]
    for chunk in [*middle, finish]:
        (choice,) = chunk["choices"]
        assert list(choice) == COMPLETION_STEP_CHOICE
        assert [choice[k] for k in COMPLETION_STEP_CHOICE[5:]] == [None] * 3
    assert all(list(c) == [*ROOT, "kv_transfer_params"] for c in middle)
    assert list(finish) == [
        *ROOT,
        *(["system_fingerprint"] * (not include_usage)),
        "kv_transfer_params",
    ]
    if include_usage:
        assert list(chunks[-1]) == [*ROOT, "usage", "system_fingerprint", "metrics"]


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_continuous_usage_stats_put_the_running_usage_on_every_chunk(http: Any, path: str):
    """``stream_options.continuous_usage_stats`` (with ``include_usage``): each chunk's
    usage counts its sequence so far; chat sets ``completion_tokens_details`` (null), so
    ``exclude_unset`` keeps it; completions do not set it."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = sse_chunks(post(http, path, stream=True, stream_options=options).text)
    *with_choices, final = chunks
    counts = [c["usage"]["completion_tokens"] for c in with_choices]
    assert counts == sorted(counts) and counts[-1] == final["usage"]["completion_tokens"]
    prompt = final["usage"]["prompt_tokens"]
    for chunk in with_choices:
        usage = chunk["usage"]
        assert usage["total_tokens"] == prompt + usage["completion_tokens"]
        details = ["completion_tokens_details"] if path == "/chat/completions" else []
        assert list(usage) == ["prompt_tokens", "total_tokens", "completion_tokens", *details]
    without = sse_chunks(
        post(http, path, stream=True, stream_options={"continuous_usage_stats": True}).text
    )
    assert not any("usage" in c for c in without)  # only with include_usage


def test_force_include_usage_also_forces_continuous_usage():
    """``should_include_usage``: ``--enable-force-include-usage`` gives (True, True)."""
    config = SimulatorConfig(engine="vllm", k=4, seed=5, force_include_usage=True)
    with SimulatorServer(config) as sim, httpx.Client(base_url=sim.base_url, timeout=30.0) as c:
        chunks = sse_chunks(post(c, "/completions", stream=True).text)
    assert all("usage" in chunk for chunk in chunks)


@pytest.fixture(scope="module")
def untimed() -> Iterator[Any]:
    """vLLM as it starts without ``--enable-per-request-metrics`` (its default)."""
    config = SimulatorConfig(engine="vllm", k=4, seed=5, vllm_timing_metrics=False)
    with SimulatorServer(config) as sim, httpx.Client(base_url=sim.base_url, timeout=30.0) as c:
        yield c


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_without_timing_metrics_a_body_has_null_timing_fields_beside_the_stats(
    untimed: Any, path: str
):
    """vLLM 0.34.0 (``chat_completion/serving.py`` ``chat_completion_full_generator``,
    ``completion/serving.py``): the timing fields need ``--enable-per-request-metrics``
    (``common/cli_args.py``, default False); without it ``metrics`` is a bare
    ``PerRequestMetrics()`` given only ``speculative_decoding``, dumped whole. The
    record is read from it all the same."""
    body = post(untimed, path, "summary").json()
    metrics = body["metrics"]
    assert {k: metrics[k] for k in shapes.VLLM_TIMING_FIELDS} == dict.fromkeys(
        shapes.VLLM_TIMING_FIELDS
    )
    stats = metrics["speculative_decoding"]
    record = record_from_json(body)
    assert record is not None and record.engine == "vllm"
    assert record.num_draft_tokens == stats["num_draft_tokens"]
    assert record.completion_tokens == body["usage"]["completion_tokens"]


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_without_timing_metrics_the_usage_chunk_has_the_stats_alone(untimed: Any, path: str):
    """The usage chunk (``exclude_none``) carries ``metrics: {"speculative_decoding":
    ...}`` and nothing else in it."""
    chunks = sse_chunks(
        post(untimed, path, "summary", stream=True, stream_options={"include_usage": True}).text
    )
    assert set(chunks[-1]["metrics"]) == {"speculative_decoding"}
    record = record_from_json(chunks)
    assert record is not None and record.num_spec_steps is not None
    assert not any("metrics" in c for c in chunks[:-1])


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_without_timing_metrics_or_stats_metrics_is_null(untimed: Any, path: str):
    """Neither timing nor spec-decode stats: ``metrics`` stays None, so a body says
    ``"metrics": null`` and the usage chunk has no ``metrics``; the Responses API leaves
    it out (``responses/protocol.py``: ``exclude_if`` None)."""
    assert post(untimed, path, "none").json()["metrics"] is None
    chunks = sse_chunks(
        post(untimed, path, "none", stream=True, stream_options={"include_usage": True}).text
    )
    assert "usage" in chunks[-1] and not any("metrics" in c for c in chunks)
    response = untimed.post("/responses", json={"model": "spec-sim", "input": "vllm wire"})
    assert response.status_code == 200 and "metrics" not in response.json()
