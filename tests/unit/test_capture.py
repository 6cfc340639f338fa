"""ParsedResponse: the engine-neutral view of a body or chunk, from dicts and SDK objects."""

from __future__ import annotations

import json

import openai
import pytest
from openai._models import construct_type
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from openai_sdk import http, mock_client
from record_json import WIRE_EXAMPLES, dump_like
from spec_decode_otel.adapters import ParsedResponse, detect
from spec_decode_otel.capture import is_multi_sequence, last_completion_tokens


def vector(stem: str) -> dict:
    return json.loads((WIRE_EXAMPLES / f"{stem}.json").read_text(encoding="utf-8"))


def chunk(**fields) -> ChatCompletionChunk:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", **fields}
    return construct_type(type_=ChatCompletionChunk, value=body)


# ---------------------------------------------------------------- from_dict


def test_from_dict_keeps_the_body_as_root_and_reads_choices_and_usage():
    body = vector("vllm_premerge_chat")["response"]
    parsed = ParsedResponse.from_dict(body)
    assert parsed.root is body
    assert len(parsed.choices) == 1
    assert parsed.choices[0]["speculative_decoding_stats"]["num_spec_steps"] == 43
    assert parsed.usage == {"prompt_tokens": 12, "completion_tokens": 54, "total_tokens": 66}


@pytest.mark.parametrize("body", [None, [], "text", 3, 2.5, True])
def test_from_dict_of_a_non_object_is_none(body):
    assert ParsedResponse.from_dict(body) is None


def test_from_dict_tolerates_malformed_choices_and_usage():
    parsed = ParsedResponse.from_dict({"choices": [1, None, {"index": 0}], "usage": [1]})
    assert parsed.choices == ({}, {}, {"index": 0})
    assert parsed.usage is None
    assert ParsedResponse.from_dict({"choices": {"index": 0}}).choices == ()


def test_choice_count_is_the_largest_index_plus_one():
    assert ParsedResponse.from_dict({"choices": [{"index": 1}]}).choice_count == 2
    assert ParsedResponse.from_dict({"choices": [{}, {}]}).choice_count == 2
    assert ParsedResponse.from_dict({"choices": []}).choice_count == 0
    assert ParsedResponse.from_dict({"choices": [{"index": "7"}]}).choice_count == 1


# ---------------------------------------------------------------- from_sdk


def test_from_sdk_root_is_model_extra_without_standard_fields():
    completion = construct_type(
        type_=ChatCompletion, value=vector("vllm_merged_summary_chat")["response"]
    )
    parsed = ParsedResponse.from_sdk(completion)
    assert set(parsed.root) == {"metrics"}
    assert parsed.root["metrics"]["speculative_decoding"]["num_spec_steps"] == 43


def test_from_sdk_choice_view_holds_extras_index_and_finish_reason_but_no_content():
    completion = construct_type(
        type_=ChatCompletion, value=vector("trtllm_pr19311_chat")["response"]
    )
    (view,) = ParsedResponse.from_sdk(completion).choices
    assert set(view) == {
        "index",
        "finish_reason",
        "avg_decoded_tokens_per_iter",
        "speculative_decoding",
    }
    assert view["index"] == 0
    assert view["finish_reason"] == "stop"


def test_from_sdk_usage_view_has_counts_and_extras():
    completion = construct_type(
        type_=ChatCompletion,
        value={
            **vector("plain_openai_no_stats")["response"],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "x": 9},
        },
    )
    usage = ParsedResponse.from_sdk(completion).usage
    assert usage["completion_tokens"] == 2
    assert usage["x"] == 9


def test_from_sdk_without_usage_has_none():
    parsed = ParsedResponse.from_sdk(chunk(choices=[{"index": 0, "delta": {}}]))
    assert parsed.usage is None
    assert parsed.root == {}


def test_from_sdk_never_calls_model_dump(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("model_dump must not be called")

    monkeypatch.setattr(openai.BaseModel, "model_dump", refuse)
    monkeypatch.setattr(openai.BaseModel, "model_dump_json", refuse)
    completion = construct_type(
        type_=ChatCompletion, value=vector("vllm_premerge_chat")["response"]
    )
    with pytest.raises(AssertionError):  # the trap is armed on this very object
        completion.model_dump()
    record = detect([ParsedResponse.from_sdk(completion)])
    assert record is not None
    assert record.num_spec_steps == 43


def test_from_sdk_reads_legacy_completions():
    body = vector("vllm_merged_summary_chat")["response"]
    body = {
        **body,
        "object": "text_completion",
        "choices": [{"index": 0, "text": "x", "finish_reason": "stop", "logprobs": None}],
    }
    completion = construct_type(type_=Completion, value=body)
    record = detect([ParsedResponse.from_sdk(completion)])
    assert record is not None
    assert record.engine == "vllm"
    assert record.completion_tokens == 54


# ---------------------------------------------------------------- helpers


def test_is_multi_sequence_looks_at_every_response():
    one = ParsedResponse.from_dict({"choices": [{"index": 0}]})
    two = ParsedResponse.from_dict({"choices": [{"index": 1}]})
    assert not is_multi_sequence([one, one])
    assert is_multi_sequence([one, two])


def test_completion_tokens_come_from_the_last_non_empty_usage():
    responses = [
        ParsedResponse.from_dict({"usage": {"completion_tokens": 5}}),
        ParsedResponse.from_dict({"usage": {"completion_tokens": 9}}),
        ParsedResponse.from_dict({"usage": {}}),
        ParsedResponse.from_dict({"usage": None}),
        ParsedResponse.from_dict({}),
    ]
    assert last_completion_tokens(responses) == 9


@pytest.mark.parametrize("bad", [-1, True, 3.0, "3", None])
def test_completion_tokens_that_are_not_a_count_are_unknown(bad):
    responses = [
        ParsedResponse.from_dict({"usage": {"completion_tokens": 5}}),
        ParsedResponse.from_dict({"usage": {"completion_tokens": bad, "prompt_tokens": 1}}),
    ]
    assert last_completion_tokens(responses) is None


#: A Responses API body whose usage also carries the Chat Completions names, other counts
#: (a gateway's addition); openai 3.63.0's ``ResponseUsage`` declares the Responses names.
BOTH_NAMINGS = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "m",
    "output": [],
    "usage": {
        "input_tokens": 5,
        "output_tokens": 40,
        "total_tokens": 45,
        "prompt_tokens": 7,
        "completion_tokens": 41,
    },
}


@pytest.mark.parametrize("form", ["dict", "sdk", "event-dict", "event-sdk"])
def test_a_responses_usage_with_both_namings_counts_by_its_own_names(form):
    """The record's ``completion_tokens`` of a Responses answer is its ``output_tokens``,
    as its span's ``gen_ai.usage.output_tokens`` is; the Chat name, a gateway's addition,
    won here. A chat body's own names still win over Responses ones it carries."""
    event = {"type": "response.completed", "sequence_number": 1, "response": BOTH_NAMINGS}
    if form == "dict":
        parsed = ParsedResponse.from_dict(BOTH_NAMINGS)
    elif form == "event-dict":
        parsed = ParsedResponse.from_dict(event)
    else:
        kind = openai.types.responses.ResponseCompletedEvent if "event" in form else None
        sdk_object = construct_type(
            type_=kind or openai.types.responses.Response,
            value=event if kind else BOTH_NAMINGS,
        )
        parsed = ParsedResponse.from_sdk(sdk_object)
    assert parsed.usage is not None
    assert (parsed.usage["prompt_tokens"], parsed.usage["completion_tokens"]) == (5, 40)
    assert last_completion_tokens([parsed]) == 40
    chat = ParsedResponse.from_dict({"choices": [], "usage": BOTH_NAMINGS["usage"]})
    assert chat.usage is not None and chat.usage["completion_tokens"] == 41


# ---------------------------------------------------------------- through a real client


def test_real_client_response_carries_stats_through_to_a_record():
    example = vector("sglang_sglext_chat")

    def handler(request):
        return http.Response(200, json=example["response"])

    completion = mock_client(handler).chat.completions.create(model="qwen", messages=[])
    record = detect([ParsedResponse.from_sdk(completion)])
    assert record is not None
    want = example["expected_record"]
    got = dump_like(record, want)
    floats = ("mean_acceptance_length", "draft_acceptance_rate")
    assert {k: v for k, v in got.items() if k not in floats} == {
        k: v for k, v in want.items() if k not in floats
    }
    assert [got[k] for k in floats] == pytest.approx([want[k] for k in floats], abs=1e-9)


def test_real_client_stream_chunks_carry_stats_through_to_a_record():
    example = vector("vllm_merged_stream_chat")
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in example["chunks"]) + "data: [DONE]\n\n"

    def handler(request):
        return http.Response(
            200, content=sse.encode(), headers={"content-type": "text/event-stream"}
        )

    stream = mock_client(handler).chat.completions.create(model="m", messages=[], stream=True)
    chunks = list(stream)
    assert len(chunks) == len(example["chunks"])
    record = detect([ParsedResponse.from_sdk(c) for c in chunks])
    assert record is not None
    assert dump_like(record, example["expected_record"]) == example["expected_record"]
