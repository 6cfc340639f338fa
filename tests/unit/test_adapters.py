"""Adapter rules from wire-formats.md, one engine shape at a time.

Payloads are built from a small set of consistent counts (k=3, 14 steps, histogram
[5, 4, 3, 2]: 16 accepted of 42 drafted) so each test changes exactly the thing it is
about. Everything goes through ``record_from_json`` (and so through ``detect``).
"""

from __future__ import annotations

import copy
import logging

import pytest

from spec_decode_otel import record_from_json
from spec_decode_otel.adapters import (
    LlamaCppAdapter,
    SglangAdapter,
    TensorRtLlmAdapter,
    VllmAdapter,
)
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import MAX_SPEC_STEPS

DENSE = [5, 4, 3, 2]
K, STEPS, ACCEPTED, DRAFTED = 3, 14, 16, 42
MEAN, RATE = 1 + ACCEPTED / STEPS, ACCEPTED / DRAFTED
USAGE = {"prompt_tokens": 7, "completion_tokens": STEPS + ACCEPTED + 1, "total_tokens": 38}


def body(*, choices=None, usage=USAGE, **root) -> dict:
    if choices is None:
        choices = [choice()]
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": choices,
        **({"usage": usage} if usage is not None else {}),
        **root,
    }


def choice(index=0, finish_reason="stop", **extra) -> dict:
    return {
        "index": index,
        "message": {"role": "assistant", "content": "ok"},
        "finish_reason": finish_reason,
        "logprobs": None,
        **extra,
    }


def chunk(choices=(), usage=None, **root) -> dict:
    out = {
        "id": "s",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": list(choices),
        **root,
    }
    if usage is not None:
        out["usage"] = usage
    return out


def delta(index=0, finish_reason=None, content="x", **extra) -> dict:
    return {
        "index": index,
        "delta": {"content": content} if content else {},
        "finish_reason": finish_reason,
        **extra,
    }


def vllm_stats(**changes) -> dict:
    stats = {
        "mean_acceptance_length": MEAN,
        "draft_acceptance_rate": RATE,
        "acceptance_histogram": list(DENSE),
        "num_spec_steps": STEPS,
        "num_accepted_draft_tokens": ACCEPTED,
        "num_draft_tokens": DRAFTED,
        "num_spec_tokens": K,
    }
    stats.update(changes)
    return {k: v for k, v in stats.items() if v is not ...}


def vllm_merged(**changes) -> dict:
    return body(
        metrics={"time_to_first_token_ms": 3.0, "speculative_decoding": vllm_stats(**changes)}
    )


def premerge_stats(**changes) -> dict:
    return vllm_stats(**{"acceptance_histogram": {"0": 5, "1": 4, "2": 3, "3": 2}, **changes})


def sglang_details(**changes) -> dict:
    details = {
        "spec_accept_rate": RATE,
        "spec_accept_length": (STEPS + ACCEPTED + 1) / STEPS,
        "spec_num_correct_drafts": ACCEPTED,
        "spec_num_proposed_drafts": DRAFTED,
        "spec_verify_ct": STEPS,
        "spec_correct_drafts_histogram": list(DENSE),
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_cap_lens_histogram": [],
    }
    details.update(changes)
    return {k: v for k, v in details.items() if v is not ...}


def trt_stats(**changes) -> dict:
    stats = {
        "acceptance_rate": RATE,
        "total_accepted_draft_tokens": ACCEPTED,
        "total_draft_tokens": DRAFTED,
        "num_spec_steps": STEPS,
        "acceptance_histogram": list(DENSE),
        "num_spec_tokens": K,
    }
    stats.update(changes)
    return {k: v for k, v in stats.items() if v is not ...}


def assert_full_counts(record, engine):
    assert record is not None
    assert record.engine == engine
    assert record.acceptance_histogram == {0: 5, 1: 4, 2: 3, 3: 2}
    assert (record.num_spec_steps, record.num_accepted_draft_tokens) == (STEPS, ACCEPTED)
    assert record.num_draft_tokens == DRAFTED
    assert record.mean_acceptance_length == pytest.approx(MEAN, abs=1e-12)
    assert record.draft_acceptance_rate == pytest.approx(RATE, abs=1e-12)


# ================================================================ n > 1 gives no record


N2_CASES = {
    "vllm_merged_null": body(
        choices=[choice(0), choice(1)], metrics={"speculative_decoding": None}
    ),
    "vllm_merged_object_two_choices": body(
        choices=[choice(0), choice(1)], metrics={"speculative_decoding": vllm_stats()}
    ),
    "vllm_premerge_two_choices_with_stats": body(
        choices=[
            choice(0, speculative_decoding_stats=premerge_stats()),
            choice(1, speculative_decoding_stats=premerge_stats()),
        ]
    ),
    "sglang_sglext_list_of_two": body(
        sglext={"spec_tokens_details": [sglang_details(), sglang_details()]}
    ),
    "sglang_meta_info_on_two_choices": body(
        choices=[choice(0, meta_info=sglang_details()), choice(1, meta_info=sglang_details())]
    ),
    "trtllm_choice_index_1": body(choices=[choice(1, speculative_decoding=trt_stats())]),
    "trtllm_average_on_two_choices": body(
        choices=[
            choice(0, avg_decoded_tokens_per_iter=2.0),
            choice(1, avg_decoded_tokens_per_iter=2.0),
        ]
    ),
    "llamacpp_n2": body(
        choices=[choice(0), choice(1)], timings={"draft_n": DRAFTED, "draft_n_accepted": ACCEPTED}
    ),
}


@pytest.mark.parametrize("payload", N2_CASES.values(), ids=N2_CASES.keys())
def test_more_than_one_sequence_gives_no_record(payload):
    assert record_from_json(payload) is None


@pytest.mark.parametrize("payload", N2_CASES.values(), ids=N2_CASES.keys())
def test_the_same_payload_with_one_sequence_gives_a_record(payload):
    # Proves each n>1 case is rejected for n>1 and not for some other defect.
    single = copy.deepcopy(payload)
    # Keep the last choice (the index-1 one when there is one) and make it index 0.
    single["choices"] = [{**single["choices"][-1], "index": 0}]
    if "metrics" in single and single["metrics"]["speculative_decoding"] is None:
        single["metrics"]["speculative_decoding"] = vllm_stats()  # what n=1 would carry
    details = single.get("sglext", {}).get("spec_tokens_details")
    if isinstance(details, list):
        single["sglext"]["spec_tokens_details"] = details[:1]
    assert record_from_json(single) is not None


def test_premerge_stream_with_stats_on_two_choice_indices_gives_no_record():
    chunks = [
        chunk([delta(0, "stop", speculative_decoding_stats=premerge_stats())]),
        chunk([delta(1, "stop", speculative_decoding_stats=premerge_stats())]),
        chunk(usage=USAGE),
    ]
    assert record_from_json(chunks) is None
    assert record_from_json([chunks[0], chunks[2]]) is not None


def test_sglang_sglext_list_of_one_is_the_single_choice():
    record = record_from_json(body(sglext={"spec_tokens_details": [sglang_details()]}))
    assert_full_counts(record, "sglang")


# ================================================================ empty object = absent


@pytest.mark.parametrize(
    "payload",
    [
        body(metrics={"speculative_decoding": {}}),
        body(choices=[choice(speculative_decoding_stats={})]),
        body(sglext={"spec_tokens_details": {}}),
        body(choices=[choice(speculative_decoding={})]),
        body(timings={}),
    ],
    ids=["vllm-merged", "vllm-premerge", "sglang", "trtllm", "llamacpp"],
)
def test_an_empty_stats_object_is_absent(payload):
    assert record_from_json(payload) is None


def test_an_empty_stats_object_after_real_stats_does_not_hide_them():
    chunks = [
        chunk([delta(0, "stop", speculative_decoding_stats=premerge_stats())]),
        chunk([delta(0, None, content="", speculative_decoding_stats={})]),
        chunk(usage=USAGE),
    ]
    assert_full_counts(record_from_json(chunks), "vllm")


def test_trtllm_empty_stats_object_falls_back_to_the_average():
    record = record_from_json(
        body(choices=[choice(speculative_decoding={}, avg_decoded_tokens_per_iter=2.25)])
    )
    assert record is not None
    assert record.mean_acceptance_length == 2.25
    assert record.num_spec_steps is None


# ================================================================ last one wins, usage


def test_vllm_last_stats_carrying_chunk_wins():
    first = {
        "speculative_decoding": vllm_stats(
            acceptance_histogram=[1, 0, 0, 0],
            num_spec_steps=1,
            num_accepted_draft_tokens=0,
            num_draft_tokens=3,
            mean_acceptance_length=1.0,
            draft_acceptance_rate=0.0,
        )
    }
    chunks = [
        chunk(usage=USAGE, metrics=first),
        chunk(usage=USAGE, metrics={"speculative_decoding": vllm_stats()}),
    ]
    assert_full_counts(record_from_json(chunks), "vllm")


def test_trtllm_average_on_every_chunk_last_one_wins():
    chunks = [
        chunk([delta(0, None, avg_decoded_tokens_per_iter=1.5)]),
        chunk([delta(0, None, avg_decoded_tokens_per_iter=1.75)]),
        chunk([delta(0, "stop", content="", avg_decoded_tokens_per_iter=2.125)]),
        chunk(usage=USAGE),
    ]
    record = record_from_json(chunks)
    assert record is not None
    assert record.mean_acceptance_length == 2.125
    assert record.completion_tokens == USAGE["completion_tokens"]


def test_completion_tokens_come_from_the_last_non_empty_usage():
    early = {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}
    chunks = [
        chunk([delta(0)], usage=early),
        chunk(
            usage={"prompt_tokens": 7, "completion_tokens": 29, "total_tokens": 36},
            metrics={"speculative_decoding": vllm_stats()},
        ),
        chunk([delta(0, None, content="")], usage={}),
    ]
    record = record_from_json(chunks)
    assert record is not None
    assert record.completion_tokens == 29


def test_no_usage_leaves_completion_tokens_unknown():
    record = record_from_json(body(usage=None, metrics={"speculative_decoding": vllm_stats()}))
    assert record is not None
    assert record.completion_tokens is None


# ================================================================ vLLM


def test_vllm_merged_floats_are_kept_verbatim():
    mean = MEAN + 5e-8  # within the record's agreement tolerance, not equal to the derived value
    record = record_from_json(vllm_merged(mean_acceptance_length=mean))
    assert record is not None
    assert record.mean_acceptance_length == mean


def test_vllm_merged_floats_absent_are_derived_from_counts():
    record = record_from_json(vllm_merged(mean_acceptance_length=..., draft_acceptance_rate=...))
    assert_full_counts(record, "vllm")


@pytest.mark.parametrize(
    "changes",
    [
        {"mean_acceptance_length": MEAN + 0.01},
        {"draft_acceptance_rate": RATE - 0.01},
        {"mean_acceptance_length": 0.5},
    ],
    ids=["mean", "rate", "mean-below-one"],
)
def test_vllm_float_contradicting_counts_gives_no_record(changes):
    assert record_from_json(vllm_merged(**changes)) is None


@pytest.mark.parametrize("hist", [[5, 4, 3, 2, 0], [5, 4, 5], []], ids=["k+2", "k", "empty"])
def test_vllm_dense_histogram_of_wrong_length_gives_no_record(hist):
    assert record_from_json(vllm_merged(acceptance_histogram=hist)) is None


def test_vllm_merged_without_num_spec_tokens_gives_no_record():
    assert record_from_json(vllm_merged(num_spec_tokens=...)) is None


@pytest.mark.parametrize(
    "hist",
    [[5, 4, True, 2], [5, 4, 3.0, 2], [5, 4, -3, 2], {"0": 5, "1": 4, "2": 3, "3": 2}],
    ids=["bool", "float", "negative", "sparse-in-merged"],
)
def test_vllm_merged_histogram_entries_must_be_exact_ints(hist):
    assert record_from_json(vllm_merged(acceptance_histogram=hist)) is None


def test_vllm_histogram_by_draft_length_agreeing_with_the_flat_one_gives_a_record():
    by_length = {"3": [4, 3, 3, 2], "2": [1, 1, 0], "0": [0]}
    record = record_from_json(vllm_merged(acceptance_histogram_by_draft_length=by_length))
    assert_full_counts(record, "vllm")


@pytest.mark.parametrize(
    "by_length",
    [
        {"3": [4, 3, 3, 2]},
        {"3": [5, 4, 3, 2], "1": [1, 0]},
        {"3": [5, 4, 3]},
        {"4": [5, 4, 3, 2, 0]},
        {"x": [5, 4, 3, 2]},
        {"3": [5, 4, 3, "2"]},
        [5, 4, 3, 2],
    ],
    ids=["short-sum", "extra-length", "entry-length", "d-beyond-k", "bad-key", "bad-count", "list"],
)
def test_vllm_histogram_by_draft_length_disagreeing_gives_no_record(by_length):
    assert record_from_json(vllm_merged(acceptance_histogram_by_draft_length=by_length)) is None


def test_vllm_premerge_string_keyed_histogram_is_int_cast():
    record = record_from_json(body(choices=[choice(speculative_decoding_stats=premerge_stats())]))
    assert_full_counts(record, "vllm")
    assert record.num_spec_tokens == K


@pytest.mark.parametrize(
    "hist",
    [{"a": 5}, {"-1": 5}, {"0": True}, {"0": 5.0}, [5, 4, 3, 2]],
    ids=["non-digit", "negative-key", "bool", "float", "dense-in-premerge"],
)
def test_vllm_premerge_malformed_histogram_gives_no_record(hist):
    stats = premerge_stats(acceptance_histogram=hist)
    assert record_from_json(body(choices=[choice(speculative_decoding_stats=stats)])) is None


@pytest.mark.parametrize("k", ["3", 3.0, True, -3])
def test_vllm_premerge_malformed_num_spec_tokens_gives_no_record(k):
    stats = premerge_stats(num_spec_tokens=k)
    assert record_from_json(body(choices=[choice(speculative_decoding_stats=stats)])) is None


def test_vllm_premerge_without_num_spec_tokens_has_unknown_k():
    stats = premerge_stats(num_spec_tokens=...)
    record = record_from_json(body(choices=[choice(speculative_decoding_stats=stats)]))
    assert_full_counts(record, "vllm")
    assert record.num_spec_tokens is None


def test_vllm_detailed_per_step_arrays_are_kept():
    per_acc = [0] * 5 + [1] * 4 + [2] * 3 + [3] * 2
    record = record_from_json(vllm_merged(per_step_accepted=per_acc, per_step_drafted=[3] * 14))
    assert record is not None
    assert record.per_step_accepted == per_acc
    assert record.per_step_drafted == [3] * 14


@pytest.mark.parametrize(
    "changes",
    [
        {"per_step_accepted": [1] * 14},
        {"per_step_drafted": [3] * 13},
        {"per_step_drafted": "3,3,3"},
        {"per_step_drafted": {"0": 3}},
        {"per_step_drafted": [3] * 13 + [True]},
    ],
    ids=["wrong-sum", "wrong-length", "string", "object", "bool-entry"],
)
def test_vllm_malformed_per_step_arrays_give_no_record(changes):
    assert record_from_json(vllm_merged(**changes)) is None


def test_vllm_per_step_arrays_over_the_bound_are_dropped_and_the_totals_kept():
    """vLLM 0.33.0 sends one entry per verify step; past MAX_SPEC_STEPS the arrays are
    an unbounded detail, so only they go (issue "Wire fidelity", item 6)."""
    over = MAX_SPEC_STEPS + 1
    record = record_from_json(
        vllm_merged(per_step_accepted=[0] * over, per_step_drafted=[3] * over)
    )
    assert record is not None
    assert record.per_step_accepted is None and record.per_step_drafted is None
    assert record.num_spec_steps == 14


def test_vllm_null_per_step_arrays_are_absent():
    record = record_from_json(vllm_merged(per_step_accepted=None, per_step_drafted=None))
    assert record is not None
    assert record.per_step_accepted is None


# ================================================================ SGLang


def test_sglang_mean_is_derived_from_counts_not_its_own_accept_length():
    details = sglang_details(spec_accept_length=3.99, spec_accept_rate=0.9)
    record = record_from_json(body(sglext={"spec_tokens_details": details}))
    assert_full_counts(record, "sglang")
    assert record.num_spec_tokens == K


@pytest.mark.parametrize(
    "aliases",
    [
        {
            "spec_accepted_drafts": ACCEPTED,
            "spec_proposed_drafts": DRAFTED,
            "spec_accept_histogram": list(DENSE),
        },
        {
            "spec_accept_token_num": ACCEPTED,
            "spec_draft_token_num": DRAFTED,
            "spec_accept_histogram": list(DENSE),
        },
    ],
    ids=["older", "oldest"],
)
def test_sglang_older_field_names_are_read(aliases):
    details = sglang_details(
        spec_num_correct_drafts=...,
        spec_num_proposed_drafts=...,
        spec_correct_drafts_histogram=...,
        **aliases,
    )
    assert_full_counts(record_from_json(body(sglext={"spec_tokens_details": details})), "sglang")


def test_sglang_oldest_counts_without_histogram_give_a_partial_record():
    details = {
        "spec_verify_ct": STEPS,
        "spec_accept_token_num": ACCEPTED,
        "spec_draft_token_num": DRAFTED,
    }
    record = record_from_json(body(sglext={"spec_tokens_details": details}))
    assert record is not None
    assert record.is_partial
    assert record.acceptance_histogram is None
    assert record.num_spec_tokens == K  # 42 drafted / 14 steps
    assert record.mean_acceptance_length == pytest.approx(MEAN)
    assert record.draft_acceptance_rate == pytest.approx(RATE)


def test_sglang_meta_info_per_choice_is_read():
    record = record_from_json(body(choices=[choice(meta_info=sglang_details())]))
    assert_full_counts(record, "sglang")


def test_sglang_meta_info_without_spec_fields_is_not_claimed():
    payload = body(choices=[choice(meta_info={"id": "r", "prompt_tokens": 7})])
    assert not SglangAdapter.can_adapt([ParsedResponse.from_dict(payload)])
    assert record_from_json(payload) is None


def test_sglang_streaming_sglext_rides_its_own_empty_choices_chunk():
    chunks = [
        chunk([delta(0, None, content="Hi")]),
        chunk([delta(0, "stop", content="")]),
        chunk([], sglext={"spec_tokens_details": sglang_details()}),
        chunk([], usage=USAGE),
    ]
    record = record_from_json(chunks)
    assert_full_counts(record, "sglang")
    assert record.completion_tokens == USAGE["completion_tokens"]


@pytest.mark.parametrize(
    "changes",
    [
        {"spec_num_proposed_drafts": "42"},
        {"spec_num_proposed_drafts": True},
        {"spec_verify_ct": 14.0},
        {"spec_num_correct_drafts": -16},
        {"spec_correct_drafts_histogram": [5, 4, 3, "2"]},
        {"spec_num_correct_drafts": 15},
    ],
    ids=[
        "string-drafted",
        "bool-drafted",
        "float-steps",
        "negative",
        "bad-hist",
        "inconsistent",
    ],
)
def test_sglang_malformed_details_give_no_record(changes):
    assert record_from_json(body(sglext={"spec_tokens_details": sglang_details(**changes)})) is None


# ================================================================ TensorRT-LLM


def test_trtllm_full_stats_derive_the_mean():
    record = record_from_json(body(choices=[choice(speculative_decoding=trt_stats())]))
    assert_full_counts(record, "tensorrt_llm")
    assert record.num_spec_tokens == K


def test_trtllm_null_num_spec_tokens_means_variable_draft_length():
    stats = trt_stats(num_spec_tokens=None, acceptance_histogram=[5, 4, 3, 2, 0, 0])
    record = record_from_json(body(choices=[choice(speculative_decoding=stats)]))
    assert_full_counts(record, "tensorrt_llm")
    assert record.num_spec_tokens is None
    assert record.dense_histogram() == DENSE


def test_trtllm_stats_on_the_finish_reason_chunk_of_a_stream():
    chunks = [
        chunk([delta(0, None, avg_decoded_tokens_per_iter=2.0)]),
        chunk(
            [
                delta(
                    0,
                    "stop",
                    content="",
                    avg_decoded_tokens_per_iter=2.1,
                    speculative_decoding=trt_stats(),
                )
            ]
        ),
        chunk(usage=USAGE),
    ]
    assert_full_counts(record_from_json(chunks), "tensorrt_llm")


def test_trtllm_released_server_gives_a_partial_record_with_only_the_mean():
    record = record_from_json(body(choices=[choice(avg_decoded_tokens_per_iter=2.5)]))
    assert record is not None
    assert record.engine == "tensorrt_llm"
    assert record.is_partial
    dumped = record.model_dump()
    reported = {k for k, v in dumped.items() if v is not None}
    assert reported == {"engine", "mean_acceptance_length", "completion_tokens"}
    assert record.mean_acceptance_length == 2.5


@pytest.mark.parametrize("average", ["2.5", True, None, 0.5, float("nan")])
def test_trtllm_unusable_average_gives_no_record(average):
    assert record_from_json(body(choices=[choice(avg_decoded_tokens_per_iter=average)])) is None


def test_trtllm_average_of_zero_means_no_decoding_iteration_not_a_malformed_payload():
    """TensorRT-LLM's ``LlmRequest::getAvgDecodedTokensPerIter`` (``cpp/include/
    tensorrt_llm/batch_manager/llmRequest.h``, main branch, Dec 2026) returns ``0.F``
    while ``mDecodingIter == 0``: a request answered from its prefill alone (the C++
    runtime with ``max_tokens: 1``) sends 0.0. That is "no stats" (outcome ``no_stats``),
    not ``invalid``, which the dashboard counts as a server sending garbage; a stream
    whose early chunks say 0.0 still takes the last chunk's average."""
    from spec_decode_otel.adapters.registry import detect_outcome
    from spec_decode_otel.outcome import Outcome

    prefill_only = ParsedResponse.from_dict(
        body(choices=[choice(finish_reason="length", avg_decoded_tokens_per_iter=0.0)])
    )
    assert prefill_only is not None
    found = detect_outcome([prefill_only])
    assert (found.record, found.outcome) == (None, Outcome.NO_STATS)

    streamed = [
        chunk([delta(0, None, avg_decoded_tokens_per_iter=0.0)]),
        chunk([delta(0, "stop", content="", avg_decoded_tokens_per_iter=2.5)]),
    ]
    record = record_from_json(streamed)
    assert record is not None and record.mean_acceptance_length == 2.5


@pytest.mark.parametrize(
    "changes",
    [
        {"num_spec_tokens": 4},
        {"num_spec_tokens": "3"},
        {"acceptance_rate": "0.38"},
        {"acceptance_rate": 0.9},
        {"total_draft_tokens": None},
        {"acceptance_histogram": None},
    ],
    ids=["k-vs-length", "string-k", "string-rate", "rate-contradicts", "no-drafted", "no-hist"],
)
def test_trtllm_malformed_stats_give_no_record(changes):
    assert (
        record_from_json(body(choices=[choice(speculative_decoding=trt_stats(**changes))])) is None
    )


# ================================================================ llama.cpp


def test_llamacpp_without_draft_rounds_gives_counts_and_rate_only():
    timings = {"predicted_n": 31, "draft_n": DRAFTED, "draft_n_accepted": ACCEPTED}
    record = record_from_json(body(timings=timings))
    assert record is not None
    assert record.engine == "llamacpp"
    assert (record.num_draft_tokens, record.num_accepted_draft_tokens) == (DRAFTED, ACCEPTED)
    assert record.draft_acceptance_rate == pytest.approx(RATE)
    assert record.num_spec_steps is None
    assert record.mean_acceptance_length is None
    assert record.acceptance_histogram is None


def test_mlx_vlm_draft_rounds_derive_the_mean():
    timings = {
        "draft_n": DRAFTED,
        "draft_n_accepted": ACCEPTED,
        "draft_rounds": STEPS,
        "draft_kind": "mtp",
    }
    record = record_from_json(body(timings=timings))
    assert record is not None
    assert record.engine == "mlx_vlm"  # llama.cpp sends neither draft_rounds nor draft_kind
    assert record.draft_method == "mtp"
    assert record.num_spec_steps == STEPS
    assert record.mean_acceptance_length == pytest.approx(MEAN)


def test_llamacpp_stats_on_the_final_chunk_of_a_stream():
    chunks = [
        chunk([delta(0)], timings={"predicted_n": 1}),
        chunk(
            [delta(0, "stop", content="")],
            timings={"draft_n": DRAFTED, "draft_n_accepted": ACCEPTED},
        ),
    ]
    record = record_from_json(chunks)
    assert record is not None
    assert record.num_draft_tokens == DRAFTED


def test_llamacpp_without_draft_n_gives_no_record():
    payload = body(timings={"predicted_n": 31, "draft_n_accepted": ACCEPTED})
    assert not LlamaCppAdapter.can_adapt([ParsedResponse.from_dict(payload)])
    assert record_from_json(payload) is None


@pytest.mark.parametrize(
    "timings",
    [
        {"draft_n": DRAFTED},
        {"draft_n": ACCEPTED - 1, "draft_n_accepted": ACCEPTED},
        {"draft_n": DRAFTED, "draft_n_accepted": ACCEPTED, "draft_rounds": "14"},
        {"draft_n": DRAFTED, "draft_n_accepted": ACCEPTED, "draft_rounds": None},
        {"draft_n": float(DRAFTED), "draft_n_accepted": ACCEPTED},
    ],
    ids=["no-accepted", "accepted-exceeds", "string-rounds", "null-rounds", "float-drafted"],
)
def test_llamacpp_malformed_timings_give_no_record(timings):
    assert record_from_json(body(timings=timings)) is None


# ================================================================ signatures


@pytest.mark.parametrize(
    ("adapter", "payload"),
    [
        (VllmAdapter, vllm_merged()),
        (VllmAdapter, body(choices=[choice(speculative_decoding_stats=premerge_stats())])),
        (SglangAdapter, body(sglext={"spec_tokens_details": sglang_details()})),
        (TensorRtLlmAdapter, body(choices=[choice(speculative_decoding=trt_stats())])),
        (TensorRtLlmAdapter, body(choices=[choice(avg_decoded_tokens_per_iter=2.0)])),
        (LlamaCppAdapter, body(timings={"draft_n": 4, "draft_n_accepted": 2})),
    ],
    ids=["vllm-merged", "vllm-premerge", "sglang", "trtllm", "trtllm-average", "llamacpp"],
)
def test_each_engine_signature_is_claimed_by_exactly_its_own_adapter(adapter, payload):
    responses = [ParsedResponse.from_dict(payload)]
    claims = [
        a
        for a in (VllmAdapter, SglangAdapter, TensorRtLlmAdapter, LlamaCppAdapter)
        if a.can_adapt(responses)
    ]
    assert claims == [adapter]


def test_vllm_timing_metrics_without_spec_decode_are_not_claimed():
    payload = body(metrics={"time_to_first_token_ms": 3.0, "tokens_per_second": 99.0})
    assert not VllmAdapter.can_adapt([ParsedResponse.from_dict(payload)])
    assert record_from_json(payload) is None


@pytest.mark.parametrize("index", [[], {}, [0], "0", None, 1.5])
@pytest.mark.parametrize(
    "extra",
    [
        {"speculative_decoding_stats": premerge_stats()},
        {"meta_info": sglang_details()},
        {"speculative_decoding": trt_stats()},
    ],
    ids=["vllm-premerge", "sglang", "trtllm"],
)
def test_any_json_as_choice_index_never_makes_an_adapter_raise(caplog, index, extra):
    caplog.set_level(logging.DEBUG, logger="spec_decode_otel")
    payload = body(choices=[{**choice(), **extra, "index": index}])
    responses = [ParsedResponse.from_dict(payload)]
    for adapter in (VllmAdapter, SglangAdapter, TensorRtLlmAdapter):
        if adapter.can_adapt(responses):
            adapter.adapt(responses)  # must not raise
    record_from_json(payload)
    assert not [r for r in caplog.records if "raised" in r.getMessage()]
