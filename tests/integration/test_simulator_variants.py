"""Simulator behaviour beyond the basic shapes: levels, n > 1, usage-chunk rules, SGLang
request flags, draft schedules, stop strings, seeds, per-model acceptance, server flags.

Most tests share the session simulator (``simulator_url``); the few that need other
server flags start their own subprocess through ``start_simulator``.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from spec_decode_otel import record_from_json
from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer

PROMPT = [{"role": "user", "content": "Say something."}]
MODEL = "spec-sim"


def extra(obj: Any) -> dict[str, Any]:
    return obj.model_extra or {}


def chat(client: openai.OpenAI, engine: str = "vllm", headers: dict | None = None, **kw: Any):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", PROMPT)
    kw.setdefault("max_tokens", 40)
    result = client.chat.completions.create(
        extra_headers={"x-spec-decode-engine": engine, **(headers or {})}, **kw
    )
    return list(result) if kw.get("stream") else result


def dump(obj: Any) -> Any:
    if isinstance(obj, list):
        return [o.model_dump(exclude_unset=True) for o in obj]
    return obj.model_dump(exclude_unset=True)


def spec(resp: Any) -> Any:
    return extra(resp)["metrics"]["speculative_decoding"]


# --- vLLM: usage chunk and levels ---------------------------------------------------------


def test_vllm_stream_without_include_usage_has_no_usage_chunk_and_no_stats(openai_client):
    chunks = chat(openai_client, stream=True)
    assert all(c.choices for c in chunks), "no choices: [] chunk without include_usage"
    assert all(c.usage is None and "metrics" not in extra(c) for c in chunks)
    assert record_from_json(dump(chunks)) is None


def test_force_include_usage_sends_the_stats_chunk_anyway(start_simulator):
    url = start_simulator("--engine", "vllm", "--force-include-usage", "--seed", "3")
    with openai.OpenAI(api_key="sk-test", base_url=url, max_retries=0) as client:
        chunks = chat(client, stream=True)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert spec(chunks[-1])["num_spec_steps"] > 0
    assert record_from_json(dump(chunks)).completion_tokens == 40


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_level_none_sends_no_speculative_decoding_object(openai_client, stream):
    """vLLM 0.34.0 dumps a body whole (``speculative_decoding: null``) and the usage
    chunk with ``exclude_none`` (no key)."""
    kw = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    out = chat(openai_client, headers={"x-spec-decode-level": "none"}, **kw)
    carrier = out[-1] if stream else out
    metrics = extra(carrier)["metrics"]
    assert metrics.get("speculative_decoding") is None and "time_to_first_token_ms" in metrics
    assert ("speculative_decoding" in metrics) is not stream
    assert record_from_json(dump(out)) is None


def test_vllm_summary_level_has_no_per_step_arrays(openai_client):
    """A vLLM 0.34.0 body is dumped whole: the unpopulated per-step keys say null."""
    resp = chat(openai_client, headers={"x-spec-decode-level": "summary"})
    s = spec(resp)
    assert set(s) == {
        "mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram",
        "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens",
        "per_step_accepted", "per_step_drafted",
    }  # fmt: skip
    assert s["per_step_accepted"] is None and s["per_step_drafted"] is None
    record = record_from_json(dump(resp))
    assert record.per_step_accepted is None and record.num_spec_steps == s["num_spec_steps"]


def test_premerge_level_none_is_null_on_every_choice(openai_client):
    resp = chat(openai_client, "vllm-premerge", {"x-spec-decode-level": "none"}, n=2)
    assert [extra(c)["speculative_decoding_stats"] for c in resp.choices] == [None, None]


def test_zero_step_request(openai_client):
    """max_tokens=1: the prefill token only, so no verify step at all."""
    resp = chat(openai_client, max_tokens=1)
    s = spec(resp)
    assert s["acceptance_histogram"] == [0] * 5 and s["num_spec_steps"] == 0
    assert (s["mean_acceptance_length"], s["draft_acceptance_rate"]) == (1.0, 0.0)
    assert record_from_json(dump(resp)).num_spec_steps == 0
    trt = chat(openai_client, "trtllm", max_tokens=1)
    assert "speculative_decoding" not in extra(trt.choices[0])  # absent: nothing drafted
    llama = chat(openai_client, "llamacpp", max_tokens=1)
    assert "draft_n" not in extra(llama)["timings"]


# --- n > 1 ------------------------------------------------------------------------------


def test_vllm_n2_is_null(openai_client):
    """vLLM 0.33.0 and 0.34.0 null the whole ``metrics`` object for n > 1 (timing fields too;
    0.34.0 ``entrypoints/openai/chat_completion/serving.py``: ``if (request.n or 1) == 1``)."""
    resp = chat(openai_client, n=2)
    assert len(resp.choices) == 2 and extra(resp)["metrics"] is None
    assert record_from_json(dump(resp)) is None


def test_vllm_n2_stream_usage_chunk_has_no_metrics(openai_client):
    """vLLM 0.33.0 and 0.34.0 dump the streaming usage chunk with exclude_none (0.34.0
    ``chat_completion/serving.py``: ``exclude_none=not chunk.choices``): a null ``metrics``
    is left out."""
    chunks = chat(openai_client, n=2, stream=True, stream_options={"include_usage": True})
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all("metrics" not in extra(c) for c in chunks)


def test_vllm_multi_prompt_completion_is_null(openai_client):
    resp = openai_client.completions.create(
        model=MODEL, prompt=["one", "two"], max_tokens=10, extra_headers={}
    )
    assert [c.index for c in resp.choices] == [0, 1]
    assert extra(resp)["metrics"] is None


@pytest.mark.parametrize("stream", [False, True])
def test_premerge_n2_each_choice_has_its_own_stats(openai_client, stream):
    kw = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    out = chat(openai_client, "vllm-premerge", n=2, max_tokens=30, **kw)
    if stream:
        stats = {c.index: extra(c)["speculative_decoding_stats"]
                 for o in out for c in o.choices if c.finish_reason}  # fmt: skip
        usage = out[-1].usage
    else:
        stats = {c.index: extra(c)["speculative_decoding_stats"] for c in out.choices}
        usage = out.usage
    assert set(stats) == {0, 1}
    total = 0
    for s in stats.values():
        assert s["num_spec_steps"] + s["num_accepted_draft_tokens"] + 1 == 30
        total += 30
    assert usage.completion_tokens == total
    assert record_from_json(dump(out)) is None  # request-level usage: no record for n > 1


@pytest.mark.parametrize("stream", [False, True])
def test_sglang_n2_details_are_a_list(openai_client, stream):
    kw = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    out = chat(openai_client, "sglang", n=2, extra_body={"return_spec_tokens_details": True}, **kw)
    carrier = next(o for o in out if "sglext" in extra(o)) if stream else out
    details = extra(carrier)["sglext"]["spec_tokens_details"]
    assert isinstance(details, list) and len(details) == 2
    for d in details:
        assert sum(d["spec_correct_drafts_histogram"]) == d["spec_verify_ct"]


def test_trtllm_n2_per_choice(openai_client):
    resp = chat(openai_client, "trtllm", n=2)
    for c in resp.choices:
        s = extra(c)["speculative_decoding"]
        assert s["num_spec_steps"] + s["total_accepted_draft_tokens"] + 1 == 40


# --- SGLang request flags ---------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_sglang_sends_nothing_unless_asked(openai_client, stream):
    kw = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    out = chat(openai_client, "sglang", **kw)
    objs = out if stream else [out]
    # SGLang 0.5.23 always sends body ``metadata`` and choice ``matched_stop``, never stats
    assert all(set(extra(o)) <= {"metadata"} for o in objs)
    assert all(set(extra(c)) == {"matched_stop"} for o in objs for c in o.choices)
    assert record_from_json(dump(out)) is None


def test_sglang_details_without_meta_info(openai_client):
    resp = chat(openai_client, "sglang", extra_body={"return_spec_tokens_details": True})
    assert "sglext" in extra(resp) and set(extra(resp.choices[0])) == {"matched_stop"}
    record = record_from_json(dump(resp))
    d = extra(resp)["sglext"]["spec_tokens_details"]
    assert record.mean_acceptance_length == pytest.approx(
        1 + d["spec_num_correct_drafts"] / d["spec_verify_ct"]
    )


# --- draft schedules ----------------------------------------------------------------------


def test_schedule_vllm_histogram_by_draft_length(openai_client):
    resp = chat(openai_client, headers={"x-sim-draft-schedule": "2,4,4,6"}, max_tokens=80)
    s = spec(resp)
    assert s["num_spec_tokens"] == 6 and len(s["acceptance_histogram"]) == 7
    steps = s["num_spec_steps"]
    assert s["per_step_drafted"] == [(2, 4, 4, 6)[i % 4] for i in range(steps)]
    by_len = s["acceptance_histogram_by_draft_length"]
    assert all(type(k) is str and len(h) == int(k) + 1 for k, h in by_len.items())
    flat = [0] * 7
    for h in by_len.values():
        for j, c in enumerate(h):
            flat[j] += c
    assert flat == s["acceptance_histogram"]
    assert s["num_draft_tokens"] == sum(s["per_step_drafted"])
    assert record_from_json(dump(resp)) is not None


def test_schedule_trtllm_num_spec_tokens_is_null(openai_client):
    resp = chat(openai_client, "trtllm", {"x-sim-draft-schedule": "2,4,4,6"}, max_tokens=80)
    s = extra(resp.choices[0])["speculative_decoding"]
    assert s["num_spec_tokens"] is None and len(s["acceptance_histogram"]) == 7
    assert record_from_json(dump(resp)).num_spec_tokens is None


# --- lengths, stop strings, seeds ---------------------------------------------------------


def test_natural_length_and_max_completion_tokens(openai_client):
    resp = chat(openai_client, max_tokens=None)
    assert resp.choices[0].finish_reason == "stop"
    assert 64 <= resp.usage.completion_tokens <= 256
    capped = chat(openai_client, max_tokens=None, max_completion_tokens=12)
    assert capped.choices[0].finish_reason == "length" and capped.usage.completion_tokens == 12


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_truncates_text_and_counts(openai_client, stream):
    seed = {"x-sim-seed": "4242"}
    full = chat(openai_client, headers=seed, max_tokens=None).choices[0].message.content
    words = full.split()
    stop_word = words[len(words) // 2]
    expected = full[: full.find(" " + stop_word)]
    kw = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    out = chat(openai_client, headers=seed, max_tokens=None, stop=[" " + stop_word], **kw)
    if stream:
        text = "".join(c.delta.content or "" for o in out for c in o.choices)
        reasons = [c.finish_reason for o in out for c in o.choices if c.finish_reason]
        usage, s = out[-1].usage, spec(out[-1])
    else:
        text, reasons = out.choices[0].message.content, [out.choices[0].finish_reason]
        usage, s = out.usage, spec(out)
    assert text == expected and reasons == ["stop"]
    # the token that completed the stop string was generated, so it is counted
    assert usage.completion_tokens == len(expected.split()) + 1
    assert s["num_spec_steps"] + s["num_accepted_draft_tokens"] + 1 == usage.completion_tokens


def test_seed_header_reproduces_a_request(openai_client):
    def stats(seed: str) -> Any:
        return spec(chat(openai_client, headers={"x-sim-seed": seed}, max_tokens=None))

    assert stats("7") == stats("7")
    assert stats("7") != stats("8")


def test_server_seed_reproduces_the_request_sequence():
    results = []
    for _ in range(2):
        with (
            SimulatorServer(SimulatorConfig(seed=99)) as sim,
            openai.OpenAI(api_key="sk-test", base_url=sim.base_url, max_retries=0) as client,
        ):
            results.append([spec(chat(client, max_tokens=None)) for _ in range(3)])
    assert results[0] == results[1]
    assert results[0][0] != results[0][1]


# --- per-model acceptance, llama.cpp rounds ---------------------------------------------


def test_per_model_alpha_and_models_endpoint(start_simulator):
    url = start_simulator("--model", "always=1.0", "--model", "never=0", "--alpha", "0.5")
    with openai.OpenAI(api_key="sk-test", base_url=url, max_retries=0) as client:
        assert {m.id for m in client.models.list()} == {"spec-sim", "always", "never"}
        never = spec(chat(client, model="never", max_tokens=50))
        assert never["num_accepted_draft_tokens"] == 0 and never["num_spec_steps"] == 49
        always = spec(chat(client, model="always", max_tokens=51))
        assert always["acceptance_histogram"] == [0, 0, 0, 0, 10]  # 1 + 10 * 5 tokens
        assert always["draft_acceptance_rate"] == 1.0


def test_alpha_vector_flag(start_simulator):
    url = start_simulator("--alpha-vector", "1,1,0", "--k", "4")
    with openai.OpenAI(api_key="sk-test", base_url=url, max_retries=0) as client:
        s = spec(chat(client, max_tokens=31))
    assert s["acceptance_histogram"] == [0, 0, 10, 0, 0]


def test_mlx_vlm_engine_flag(start_simulator):
    """mlx-vlm 0.7.10's timings: llama.cpp's counters plus draft_rounds and draft_kind."""
    url = start_simulator("--engine", "mlx-vlm", "--seed", "5")
    with openai.OpenAI(api_key="sk-test", base_url=url, max_retries=0) as client:
        resp = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=40
        )
    t = extra(resp)["timings"]
    assert t["draft_rounds"] + t["draft_n_accepted"] + 1 == t["predicted_n"] == 40
    assert t["draft_kind"] == "mtp"
    record = record_from_json(dump(resp))
    assert record.engine == "mlx_vlm" and record.draft_method == "mtp"
    assert record.num_spec_steps == t["draft_rounds"]
    assert record.mean_acceptance_length == pytest.approx(
        1 + t["draft_n_accepted"] / t["draft_rounds"]
    )


def test_health_and_models(openai_client, simulator_url):
    import httpx

    root = simulator_url.removesuffix("/v1")
    assert httpx.get(root + "/health").status_code == 200
    assert [m.id for m in openai_client.models.list()] == ["spec-sim"]


@pytest.mark.parametrize(
    "engine", ["vllm", "vllm-premerge", "sglang", "trtllm", "trtllm-released", "llamacpp", "none"]
)
def test_no_usage_chunk_without_include_usage(openai_client, engine):
    body = {"return_spec_tokens_details": True} if engine == "sglang" else None
    chunks = chat(openai_client, engine, stream=True, extra_body=body)
    assert all(c.usage is None for c in chunks)
    empty = [i for i, c in enumerate(chunks) if not c.choices]
    if engine == "sglang":  # only the sglext chunk, after the finish_reason chunk
        assert empty == [len(chunks) - 1] and "sglext" in extra(chunks[-1])
    else:
        assert empty == []
    assert chunks[-1 if engine != "sglang" else -2].choices[0].finish_reason == "length"
    if engine == "llamacpp":  # the final chunk is now the finish_reason chunk
        assert [i for i, c in enumerate(chunks) if "timings" in extra(c)] == [len(chunks) - 1]
