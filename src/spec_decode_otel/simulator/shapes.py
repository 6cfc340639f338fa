"""Each engine's speculative-decoding payload, cut from one sampled generation.

Shapes follow /work/shared/wire-formats.md (and the vectors in tests/data/wire-examples):
where a field rides, its name and its JSON type. Every builder reads the same
:class:`~spec_decode_otel.simulator.acceptance.Generation`, so the numbers agree across
engines and satisfy each engine's identities (histogram sums, accepted = sum j*h[j], ...).
"""

from __future__ import annotations

from spec_decode_otel.simulator.acceptance import AcceptanceProfile, Generation
from spec_decode_otel.simulator.protocol import JSON


def vllm_merged(gen: Generation, profile: AcceptanceProfile, level: str) -> JSON:
    """``metrics.speculative_decoding`` (vLLM >= 0.29): dense histogram of length k + 1.

    Under a draft-length schedule ``num_spec_tokens`` is the longest draft (the histogram
    must hold every step) and the pending-upstream ``acceptance_histogram_by_draft_length``
    (string keys, one dense ``d + 1`` list per draft length) says how steps split.
    """
    k = profile.max_draft
    out: JSON = {
        "mean_acceptance_length": gen.mean_acceptance_length,
        "draft_acceptance_rate": gen.draft_acceptance_rate,
        "acceptance_histogram": gen.histogram(k + 1),
        "num_spec_steps": gen.num_spec_steps,
        "num_accepted_draft_tokens": gen.num_accepted_draft_tokens,
        "num_draft_tokens": gen.num_draft_tokens,
        "num_spec_tokens": k,
    }
    if profile.fixed_k is None:
        out["acceptance_histogram_by_draft_length"] = {
            str(d): h for d, h in gen.histogram_by_draft_length().items()
        }
    if level == "detailed":
        out["per_step_accepted"] = list(gen.per_step_accepted)
        out["per_step_drafted"] = list(gen.per_step_drafted)
    return out


def vllm_premerge(gen: Generation, profile: AcceptanceProfile, level: str) -> JSON:
    """Per-choice ``speculative_decoding_stats``: same names, SPARSE string-keyed histogram."""
    out = vllm_merged(gen, profile, level)
    out.pop("acceptance_histogram_by_draft_length", None)
    out["acceptance_histogram"] = {
        str(j): c for j, c in enumerate(gen.histogram(profile.max_draft + 1)) if c
    }
    return out


#: vLLM 0.34.0's ``system_fingerprint`` (``serve/utils/fingerprint.py``, default mode
#: ``full``: ``vllm-<version>-<first 8 hex of hash_config(vllm_config)>``, one GPU).
VLLM_SYSTEM_FINGERPRINT = "vllm-0.34.0-5ec0de0d"


#: SGLang's ``--weight-version`` default, echoed in ``meta_info`` and the body's ``metadata``.
SGLANG_WEIGHT_VERSION = "default"


def sglang_details(gen: Generation, histogram: bool = True) -> JSON:
    """``sglext.spec_tokens_details`` (SGLang 0.5.23 ``SpecTokensDetails``, its key order).

    SGLang's ``spec_accept_length`` is completion_tokens / verify steps (the prefill token
    counted), not vLLM's 1 + accepted/steps; a consumer must derive its own from counts.
    ``spec_num_proposed_drafts`` is verify steps x draft length (``tokenizer_manager.py``
    computes it from the config), and the histogram is grown lazily (``schedule_batch.py``:
    from ``[]``, one bucket past the largest acceptance seen, never to k + 1); without one
    (``histogram=False``) SGLang fills the key with ``[]``.
    """
    steps = gen.num_spec_steps
    largest = max(gen.per_step_accepted, default=-1)
    return {
        "spec_accept_rate": gen.draft_acceptance_rate,
        "spec_accept_length": gen.completion_tokens / max(steps, 1),
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": gen.num_accepted_draft_tokens,
        "spec_num_proposed_drafts": gen.num_draft_tokens,
        "spec_verify_ct": steps,
        "spec_correct_drafts_histogram": gen.histogram(largest + 1) if histogram else [],
        "spec_cap_lens_histogram": [],
    }


def smg_completion_tokens_details(gen: Generation) -> JSON:
    """The smg gateway's (PR smg-project/smg#2481) spec-decode counts in OpenAI's
    Predicted Outputs fields: accepted drafts, and rejected = proposed - accepted."""
    return {
        "accepted_prediction_tokens": gen.num_accepted_draft_tokens,
        "rejected_prediction_tokens": gen.num_draft_tokens - gen.num_accepted_draft_tokens,
        "reasoning_tokens": 0,
    }


def sglang_meta_info(
    gen: Generation,
    request_id: str,
    finish: str,
    prompt: int,
    engine: str = "sglang",
    matched: str | int | None = None,
) -> JSON:
    """Per-choice ``meta_info`` (``return_meta_info: true``): bookkeeping plus spec keys
    (SGLang's names, or TokenSpeed's for ``engine="tokenspeed"``).

    SGLang 0.5.23 sends the tokenizer manager's own dict (``TokenizerManager.
    _handle_batch_output`` and ``_calculate_spec_decoding_metrics``): its finish reason
    says what matched (or the length limit), the spec keys come only once a verify step
    ran, the histogram only when it is non-empty, and no ``spec_cap_*`` or
    ``spec_block_accept_length`` outside their special modes.

    TokenSpeed's spec keys (PR lightseekorg/tokenspeed#1443): accepted drafts with the
    bonus token excluded (completion_tokens - 1 - verify steps), and drafts proposed as
    verify steps x draft length.
    """
    if engine == "tokenspeed":
        return {
            "id": request_id,
            "finish_reason": {"type": finish},
            "prompt_tokens": prompt,
            "completion_tokens": gen.completion_tokens,
            "cached_tokens": 0,
            "spec_verify_ct": gen.num_spec_steps,
            "spec_accepted_tokens": gen.num_accepted_draft_tokens,
            "spec_draft_tokens": gen.num_draft_tokens,
        }
    reason: JSON = {"type": finish}
    if finish == "length":
        reason["length"] = gen.completion_tokens
    elif matched is not None:
        reason["matched"] = matched
    out: JSON = {
        "id": request_id,
        "finish_reason": reason,
        "prompt_tokens": prompt,
        "weight_version": SGLANG_WEIGHT_VERSION,
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": gen.completion_tokens,
        "cached_tokens": 0,
        "e2e_latency": round((12.0 + 6.0 * gen.num_spec_steps) / 1000.0, 6),
    }
    if gen.num_spec_steps > 0:
        spec = sglang_details(gen, histogram=engine != "sglang-no-histogram")
        for key in (
            "spec_accept_rate",
            "spec_accept_length",
            "spec_num_correct_drafts",
            "spec_num_proposed_drafts",
            "spec_verify_ct",
        ):
            out[key] = spec[key]
        if spec["spec_correct_drafts_histogram"]:
            out["spec_correct_drafts_histogram"] = spec["spec_correct_drafts_histogram"]
    return out


def trtllm_stats(gen: Generation, profile: AcceptanceProfile) -> JSON | None:
    """PR #19311 per-choice ``speculative_decoding``; None (absent) when nothing was drafted."""
    if gen.num_draft_tokens == 0:
        return None
    return {
        "acceptance_rate": gen.draft_acceptance_rate,
        "total_accepted_draft_tokens": gen.num_accepted_draft_tokens,
        "total_draft_tokens": gen.num_draft_tokens,
        "num_spec_steps": gen.num_spec_steps,
        "acceptance_histogram": gen.histogram(profile.max_draft + 1),
        "num_spec_tokens": profile.fixed_k,
    }


def trtllm_avg_decoded(steps: int, accepted: int) -> float:
    """``avg_decoded_tokens_per_iter`` after ``steps`` verify steps: the tokens generated
    over the decoding iterations, the prefill iteration and its token included
    (``getAvgDecodedTokensPerIter`` in TensorRT-LLM's ``llmRequest.h``; its PyTorch
    sampler counts the context step as an iteration), so (1 + steps + accepted) /
    (1 + steps), not the record's 1 + accepted/steps."""
    return (1 + steps + accepted) / (1 + steps)


#: The drafter the simulated mlx-vlm names in ``timings.draft_kind``.
MLX_VLM_DRAFT_KIND = "mtp"


def llamacpp_timings(gen: Generation, prompt_tokens: int, mlx_vlm: bool = False) -> JSON:
    """Root ``timings``; ``draft_n``/``draft_n_accepted`` only when something was drafted
    (llama.cpp). mlx-vlm 0.7.10 (``GenerationTimings`` in ``server/schemas.py``) adds
    ``peak_memory``, ``draft_rounds`` (verify steps) and ``draft_kind`` (the drafter),
    and sends its four draft fields null when no verify round ran
    (``speculative_stats_since`` in ``speculative/common.py``)."""
    prompt_ms = round(0.35 * max(prompt_tokens, 1), 3)
    predicted_ms = round(6.0 * max(gen.num_spec_steps, 1), 3)
    out: JSON = {
        "cache_n": 0,
        "prompt_n": prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / max(prompt_tokens, 1),
        "prompt_per_second": 1000.0 * prompt_tokens / prompt_ms,
        "predicted_n": gen.completion_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / gen.completion_tokens,
        "predicted_per_second": 1000.0 * gen.completion_tokens / predicted_ms,
    }
    if mlx_vlm:  # GenerationTimings: every field, null ones too (no round: all null)
        rounds = gen.num_spec_steps > 0
        out["peak_memory"] = 1.5
        out["draft_kind"] = MLX_VLM_DRAFT_KIND if rounds else None
        out["draft_rounds"] = gen.num_spec_steps if rounds else None
        out["draft_n"] = gen.num_draft_tokens if rounds else None
        out["draft_n_accepted"] = gen.num_accepted_draft_tokens if rounds else None
    elif gen.num_draft_tokens > 0:
        out["draft_n"] = gen.num_draft_tokens
        out["draft_n_accepted"] = gen.num_accepted_draft_tokens
    return out


#: vLLM's ``PerRequestMetrics`` timing fields (``entrypoints/generate/base/protocol.py``).
VLLM_TIMING_FIELDS = (
    "time_to_first_token_ms",
    "generation_time_ms",
    "queue_time_ms",
    "mean_itl_ms",
    "tokens_per_second",
)


def vllm_timing_metrics(gen: Generation, prompt_tokens: int) -> JSON:
    """The non-spec-decode timing fields vLLM puts beside ``speculative_decoding``."""
    ttft = round(12.0 + 0.02 * prompt_tokens, 3)
    generation = round(ttft + 6.0 * gen.num_spec_steps, 3)
    return {
        "time_to_first_token_ms": ttft,
        "generation_time_ms": generation,
        "queue_time_ms": 0.1,
        "mean_itl_ms": round((generation - ttft) / max(gen.completion_tokens - 1, 1), 3),
        "tokens_per_second": round(1000.0 * gen.completion_tokens / generation, 3),
    }
