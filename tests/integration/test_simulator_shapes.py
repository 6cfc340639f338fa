"""Every engine shape, over real HTTP from a simulator subprocess, read by the real SDK.

For each flavour x (chat, legacy completions) x (JSON, SSE) x (sync, async client) the
test checks where the stats ride and their JSON types (wire-formats.md), the engine's own
identities, agreement with ``usage``, and that the adapters' ``record_from_json`` reads
back exactly the counts on the wire. Extra fields are read from the SDK objects through
``model_extra`` (as the instrumentation does); the full payload for the record check is
the object's ``model_dump(exclude_unset=True)``, which equals the raw JSON.

One session-scoped simulator serves everything: the engine is chosen per request with the
``x-spec-decode-engine`` header.
"""

from __future__ import annotations

from typing import Any

import pytest

PROMPT = "Describe a zebra-unicorn in exactly three words."
MODEL = "spec-sim"
K = 4  # the session simulator runs --k 4 --level detailed
ENGINES = ["vllm", "vllm-premerge", "sglang", "trtllm", "trtllm-released", "llamacpp", "none"]
# (the shapes added for issue 16 are checked in test_wire_fidelity.py)
# SGLang 0.5.23 refuses return_meta_info on a stream (HTTP 400) and has no such field on
# its completion request, so per-choice meta_info is asked for on non-streamed chat only
# (tests/simulator/test_sglang_wire.py pins both).
SGLANG_DETAILS = {"return_spec_tokens_details": True}
SGLANG_OPTS = {**SGLANG_DETAILS, "return_meta_info": True}

JSON = dict[str, Any]


def extra(obj: Any) -> JSON:
    return obj.model_extra or {}


async def call(
    clients: tuple[Any, Any],
    mode: str,
    api: str,
    *,
    stream: bool,
    headers: dict[str, str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """One request through the SDK; the SDK objects (one response, or every chunk)."""
    sync_client, async_client = clients
    client = sync_client if mode == "sync" else async_client
    kwargs.setdefault("model", MODEL)
    if api == "chat":
        kwargs.setdefault("messages", [{"role": "user", "content": PROMPT}])
        create = client.chat.completions.create
    else:
        kwargs.setdefault("prompt", PROMPT)
        create = client.completions.create
    result = create(stream=stream, extra_headers=headers or {}, **kwargs)
    if mode == "async":
        result = await result
        return [c async for c in result] if stream else [result]
    return list(result) if stream else [result]


def dumps(objs: list[Any]) -> JSON | list[JSON]:
    dicts = [o.model_dump(exclude_unset=True) for o in objs]
    return dicts if len(dicts) > 1 or getattr(objs[0], "object", "").endswith("chunk") else dicts[0]


def is_int(x: object) -> bool:
    return type(x) is int


def text_of(objs: list[Any], api: str, stream: bool, index: int = 0) -> str:
    if not stream:
        choice = objs[0].choices[index]
        return choice.message.content if api == "chat" else choice.text
    parts = []
    for chunk in objs:
        for c in chunk.choices:
            if c.index == index:
                parts.append((c.delta.content if api == "chat" else c.text) or "")
    return "".join(parts)


def final_usage(objs: list[Any]) -> Any:
    usages = [o.usage for o in objs if getattr(o, "usage", None) is not None]
    return usages[-1] if usages else None


def finish_chunks(objs: list[Any]) -> list[int]:
    return [i for i, o in enumerate(objs) if any(c.finish_reason for c in o.choices)]


# --- per-engine readers: assert the location/type rules, return canonical counts -------


def counts_from_dense(hist: list[Any]) -> dict[int, int]:
    assert all(is_int(c) for c in hist), hist
    return {j: c for j, c in enumerate(hist) if c}


#: vLLM 0.34.0's stream choice fields beside OpenAI's (stop_reason: on every completions
#: chunk and a chat finish chunk; the token fields null unless asked for).
VLLM_STREAM_CHOICE_FIELDS = {"stop_reason", "token_ids", "prompt_token_ids", "weight_versions"}


def read_vllm(objs: list[Any], stream: bool) -> JSON:
    if stream:
        carriers = [o for o in objs if "metrics" in extra(o)]
        assert len(carriers) == 1 and carriers[0] is objs[-1]
        assert objs[-1].choices == [] and objs[-1].usage is not None
        for o in objs[:-1]:
            # vLLM 0.34.0 (exclude_unset) sends the null fields each chunk's constructor
            # sets: no stats before the usage chunk
            assert set(extra(o)) <= {"prompt_token_ids", "prompt_text", "kv_transfer_params"}
            assert all(v is None for v in extra(o).values())
            for c in o.choices:
                assert set(extra(c)) <= VLLM_STREAM_CHOICE_FIELDS
                assert all(v is None for k, v in extra(c).items() if k != "stop_reason")
    metrics = extra(objs[-1])["metrics"]
    for timing in ("time_to_first_token_ms", "generation_time_ms", "tokens_per_second"):
        assert isinstance(metrics[timing], float)
    stats = metrics["speculative_decoding"]
    hist = stats["acceptance_histogram"]
    assert isinstance(hist, list) and len(hist) == stats["num_spec_tokens"] + 1 == K + 1
    out = {
        "hist": counts_from_dense(hist),
        "steps": stats["num_spec_steps"],
        "accepted": stats["num_accepted_draft_tokens"],
        "drafted": stats["num_draft_tokens"],
        "k": stats["num_spec_tokens"],
        "mean": stats["mean_acceptance_length"],
        "rate": stats["draft_acceptance_rate"],
        "per_step_accepted": stats["per_step_accepted"],  # level detailed
        "per_step_drafted": stats["per_step_drafted"],
    }
    assert out["mean"] == pytest.approx(1 + out["accepted"] / max(out["steps"], 1))
    return out


def read_premerge(objs: list[Any], stream: bool) -> JSON:
    if stream:
        carriers = [(i, c) for i, o in enumerate(objs) for c in o.choices if extra(c)]
        assert [i for i, _ in carriers] == finish_chunks(objs)
        choice = carriers[0][1]
        assert all(not extra(o) for o in objs)
    else:
        choice = objs[0].choices[0]
    stats = extra(choice)["speculative_decoding_stats"]
    hist = stats["acceptance_histogram"]
    assert isinstance(hist, dict) and all(type(key) is str for key in hist), hist
    assert all(is_int(c) and c > 0 for c in hist.values())
    return {
        "hist": {int(j): c for j, c in hist.items()},
        "steps": stats["num_spec_steps"],
        "accepted": stats["num_accepted_draft_tokens"],
        "drafted": stats["num_draft_tokens"],
        "k": stats["num_spec_tokens"],
        "mean": stats["mean_acceptance_length"],
        "rate": stats["draft_acceptance_rate"],
        "per_step_accepted": stats["per_step_accepted"],
        "per_step_drafted": stats["per_step_drafted"],
    }


def read_sglang(objs: list[Any], stream: bool, completion_tokens: int, meta: bool) -> JSON:
    if stream:
        ext_at = [i for i, o in enumerate(objs) if "sglext" in extra(o)]
        assert len(ext_at) == 1
        i = ext_at[0]
        assert objs[i].choices == [] and objs[i].usage is None
        assert i > max(finish_chunks(objs)), "sglext chunk comes after the finish_reason chunks"
        assert i == len(objs) - 2 and objs[-1].usage is not None, "then the usage chunk"
        details = extra(objs[i])["sglext"]["spec_tokens_details"]
    else:
        details = extra(objs[0])["sglext"]["spec_tokens_details"]
    assert isinstance(details, dict)  # n == 1: an object, not a list
    # every SGLang choice has matched_stop; only a non-streamed chat one has meta_info
    choice_extras = [extra(c) for o in objs for c in o.choices]
    assert all("matched_stop" in e for e in choice_extras)
    meta_infos = [e["meta_info"] for e in choice_extras if "meta_info" in e]
    if meta:
        (info,) = meta_infos
        for key in ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts"):
            assert info[key] == details[key]
        assert info["spec_correct_drafts_histogram"] == details["spec_correct_drafts_histogram"]
    else:
        assert not meta_infos  # no meta_info: stream, or SGLang's completions
    for key in ("spec_cap_length", "spec_block_accept_length", "spec_cap_lens_histogram"):
        assert key in details
    steps = details["spec_verify_ct"]
    # SGLang's accept length counts the prefill token: completion_tokens / verify steps
    assert details["spec_accept_length"] == pytest.approx(completion_tokens / max(steps, 1))
    hist = details["spec_correct_drafts_histogram"]
    # SGLang 0.5.23 grows the histogram lazily: one bucket past the largest acceptance
    # (no trailing zero), and proposed = verify steps x k (schedule_batch.py,
    # tokenizer_manager.py)
    assert len(hist) <= K + 1 and (not hist or hist[-1] > 0)
    assert details["spec_num_proposed_drafts"] == steps * K
    accepted = details["spec_num_correct_drafts"]
    return {
        "hist": counts_from_dense(hist),
        "steps": steps,
        "accepted": accepted,
        "drafted": details["spec_num_proposed_drafts"],
        "k": K if steps else None,
        "mean": 1 + accepted / steps if steps else 1.0,  # derived, not SGLang's number
        "rate": details["spec_accept_rate"],
    }


def read_trtllm(objs: list[Any], stream: bool, released: bool) -> JSON:
    if stream:
        choices = [c for o in objs for c in o.choices]
        assert choices and all("avg_decoded_tokens_per_iter" in extra(c) for c in choices)
        avg = extra(choices[-1])["avg_decoded_tokens_per_iter"]  # last one wins
        stats_at = [i for i, o in enumerate(objs) for c in o.choices
                    if "speculative_decoding" in extra(c)]  # fmt: skip
        assert stats_at == ([] if released else finish_chunks(objs))
        stats = None if released else extra(objs[stats_at[0]].choices[0])["speculative_decoding"]
    else:
        ex = extra(objs[0].choices[0])
        avg = ex["avg_decoded_tokens_per_iter"]
        stats = ex.get("speculative_decoding")
        assert (stats is None) == released
    assert isinstance(avg, float) and avg >= 1.0
    if released:
        return {"mean": avg}
    hist = stats["acceptance_histogram"]
    assert stats["num_spec_tokens"] == K and len(hist) == K + 1
    out = {
        "hist": counts_from_dense(hist),
        "steps": stats["num_spec_steps"],
        "accepted": stats["total_accepted_draft_tokens"],
        "drafted": stats["total_draft_tokens"],
        "k": stats["num_spec_tokens"],
        "mean": 1 + stats["total_accepted_draft_tokens"] / stats["num_spec_steps"],
        "rate": stats["acceptance_rate"],
    }
    # TensorRT-LLM's own average counts the prefill iteration and its token
    # (getAvgDecodedTokensPerIter, llmRequest.h): not the record's mean
    assert avg == pytest.approx((1 + out["steps"] + out["accepted"]) / (1 + out["steps"]))
    return out


def read_llamacpp(objs: list[Any], stream: bool) -> JSON:
    carriers = [i for i, o in enumerate(objs) if "timings" in extra(o)]
    assert carriers == [len(objs) - 1], "timings ride the final chunk only"
    timings = extra(objs[-1])["timings"]
    assert timings["predicted_n"] == final_usage(objs).completion_tokens
    assert is_int(timings["draft_n"]) and is_int(timings["draft_n_accepted"])
    assert "draft_rounds" not in timings and "draft_kind" not in timings  # mlx-vlm's only
    return {"accepted": timings["draft_n_accepted"], "drafted": timings["draft_n"]}


def check_identities(c: JSON, completion_tokens: int) -> None:
    hist, steps, accepted, drafted = c["hist"], c["steps"], c["accepted"], c["drafted"]
    assert sum(hist.values()) == steps
    assert sum(j * n for j, n in hist.items()) == accepted
    assert max(hist, default=0) <= c["k"]
    assert 0 <= accepted <= drafted
    assert drafted == steps * c["k"]  # fixed k
    assert steps + accepted + 1 == completion_tokens
    assert c["rate"] == pytest.approx(accepted / drafted if drafted else 0.0)
    if "per_step_accepted" in c:
        assert len(c["per_step_accepted"]) == len(c["per_step_drafted"]) == steps
        assert sum(c["per_step_accepted"]) == accepted
        assert sum(c["per_step_drafted"]) == drafted


def check_record(record: Any, engine: str, c: JSON, completion_tokens: int) -> None:
    assert record is not None, f"{engine}: record_from_json found nothing"
    assert record.completion_tokens == completion_tokens
    assert record.mean_acceptance_length == pytest.approx(c["mean"]) if "mean" in c else True
    if engine in ("trtllm-released",):
        assert record.engine == "tensorrt_llm"
        assert record.acceptance_histogram is None and record.num_spec_steps is None
        return
    if engine == "llamacpp":
        assert record.engine == "llamacpp"
        assert record.num_accepted_draft_tokens == c["accepted"]
        assert record.num_draft_tokens == c["drafted"]
        assert record.num_spec_steps is None
        return
    expected_engine = {"vllm-premerge": "vllm", "trtllm": "tensorrt_llm"}.get(engine, engine)
    assert record.engine == expected_engine
    assert record.acceptance_histogram == c["hist"]
    assert record.num_spec_steps == c["steps"]
    assert record.num_accepted_draft_tokens == c["accepted"]
    assert record.num_draft_tokens == c["drafted"]
    assert record.num_spec_tokens == c["k"]
    assert record.draft_acceptance_rate == pytest.approx(c["rate"])
    if "per_step_accepted" in c:
        assert record.per_step_accepted == c["per_step_accepted"]
        assert record.per_step_drafted == c["per_step_drafted"]


@pytest.fixture
def clients(openai_client: Any, async_openai_client: Any) -> tuple[Any, Any]:
    return openai_client, async_openai_client


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("engine", ENGINES)
async def test_engine_shape_identities_and_record(
    clients: tuple[Any, Any], engine: str, api: str, stream: bool, mode: str
) -> None:
    from spec_decode_otel import record_from_json

    kwargs: JSON = {"max_tokens": 48}
    if stream:
        kwargs["stream_options"] = {"include_usage": True}
    sglang_meta = api == "chat" and not stream
    if engine == "sglang":
        kwargs["extra_body"] = SGLANG_OPTS if sglang_meta else SGLANG_DETAILS
    objs = await call(
        clients, mode, api, stream=stream, headers={"x-spec-decode-engine": engine}, **kwargs
    )

    # OpenAI-compatible envelope
    first = objs[0]
    # SGLang 0.5.23 answers with its bare request id (uuid4 hex, managers/io_struct.py)
    prefix = "" if engine == "sglang" else "chatcmpl-" if api == "chat" else "cmpl-"
    assert first.id.startswith(prefix) and len(first.id) > len(prefix)
    expected_object = {
        ("chat", False): "chat.completion",
        ("chat", True): "chat.completion.chunk",
    }.get((api, stream), "text_completion")
    assert all(o.object == expected_object for o in objs)
    assert all(o.id == first.id and o.model == MODEL for o in objs)
    text = text_of(objs, api, stream)
    assert text and "zebra" not in text  # synthetic filler, never the prompt
    usage = final_usage(objs)
    assert usage.completion_tokens == 48  # max_tokens 48 < the natural length (>= 64)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    reasons = [c.finish_reason for o in objs for c in o.choices if c.finish_reason]
    assert reasons == ["length"]
    if stream and (engine, api) == ("llamacpp", "completions"):
        # llama.cpp b11312 ends a completions stream with one finish chunk carrying usage
        # and timings, whatever stream_options says: no choices:[] chunk follows
        # (server-task.cpp, checked against the built llama-server; test_llamacpp_wire.py)
        assert objs[-1].choices[0].finish_reason and objs[-1].usage is not None
    elif stream:
        assert objs[-1].choices == [] and objs[-1].usage is not None  # include_usage
        if api == "chat":
            assert objs[0].choices[0].delta.role == "assistant"

    completion = usage.completion_tokens
    if engine == "vllm":
        counts = read_vllm(objs, stream)
    elif engine == "vllm-premerge":
        counts = read_premerge(objs, stream)
    elif engine == "sglang":
        counts = read_sglang(objs, stream, completion, sglang_meta)
    elif engine in ("trtllm", "trtllm-released"):
        counts = read_trtllm(objs, stream, released=engine == "trtllm-released")
    elif engine == "llamacpp":
        counts = read_llamacpp(objs, stream)
    else:
        for o in objs:
            assert not extra(o), extra(o)
            assert all(not extra(c) for c in o.choices)
        assert record_from_json(dumps(objs)) is None
        return

    if "hist" in counts:
        check_identities(counts, completion)
    elif engine == "llamacpp":
        assert counts["accepted"] <= counts["drafted"]
    check_record(record_from_json(dumps(objs)), engine, counts, completion)
