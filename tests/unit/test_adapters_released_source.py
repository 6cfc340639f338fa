"""Adapters, capture and the SSE splitter against what a server can really send.

Evidence per test: the released engine source it was read from (wheels from the package
registry: ``vllm==0.34.0``, ``sglang==0.5.23``), or the file of this repository whose
bound it checks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from openai_sdk import chat_completion
from spec_decode_otel.adapters import Detection, ParsedResponse, detect_outcome
from spec_decode_otel.sse import SseSplitter

T = TypeVar("T")

USAGE = {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}
PREMERGE_STATS = {
    "mean_acceptance_length": 2.0,
    "draft_acceptance_rate": 0.5,
    "acceptance_histogram": {"0": 2, "2": 2},
    "num_spec_steps": 4,
    "num_accepted_draft_tokens": 4,
    "num_draft_tokens": 8,
    "num_spec_tokens": 2,
}
TRTLLM_STATS = {
    "acceptance_rate": 0.5,
    "total_accepted_draft_tokens": 4,
    "total_draft_tokens": 8,
    "num_spec_steps": 4,
    "acceptance_histogram": [2, 0, 2],
    "num_spec_tokens": 2,
}
SGLANG_META = {"spec_verify_ct": 4, "spec_num_correct_drafts": 4, "spec_num_proposed_drafts": 8}

#: One choice carrying per-choice stats, in each engine's own per-choice field.
PER_CHOICE_STATS = {
    "vllm-premerge": {"speculative_decoding_stats": PREMERGE_STATS},
    "tensorrt_llm": {"speculative_decoding": TRTLLM_STATS},
    "sglang-meta_info": {"meta_info": SGLANG_META},
}


def deepest_json_list() -> Any:
    """The most deeply nested JSON list the decoder accepts when called from here."""
    low, high = 1, 100_000
    while low < high:
        middle = (low + high + 1) // 2
        try:
            json.loads("[" * middle + "]" * middle)
            low = middle
        except RecursionError:
            high = middle - 1
    return json.loads("[" * low + "]" * low)


def frames_deeper(frames: int, call: Callable[[], T]) -> T:
    """``call()`` run ``frames`` Python frames below the caller."""
    return call() if frames == 0 else frames_deeper(frames - 1, call)


def detection_of(body: dict[str, Any]) -> Detection:
    return detect_outcome([ParsedResponse.from_dict(body)])


@pytest.mark.parametrize("fields", PER_CHOICE_STATS.values(), ids=PER_CHOICE_STATS.keys())
def test_a_choice_index_nested_as_deep_as_json_allows_changes_nothing(
    fields: dict[str, Any],
) -> None:
    """src/spec_decode_otel/adapters/_fields.py ``stats_choice_indices`` keys a choice that
    carries stats by its ``index``, and keyed a non-int index by ``repr()``: a cost that
    grew with the index's size on every path (the SDK's included), and, where detection
    runs deeper than the JSON was decoded (``record_from_json`` called below the frame
    that decoded a replayed body), a RecursionError for an ``index`` nested as deep as the
    decoder allows: the adapter was isolated as broken (a warning with a traceback,
    outcome ``invalid``) where a shallow list index gives a record. (The instrumented
    SDK's own paths decode deeper than they detect, or, for streams, call a non-int
    index n > 1 before any adapter runs.)"""
    deep = chat_completion(usage=USAGE, choice={**fields, "index": deepest_json_list()})
    shallow = chat_completion(usage=USAGE, choice={**fields, "index": [[0]]})
    expected = detection_of(shallow)
    assert expected.record is not None
    assert frames_deeper(30, lambda: detection_of(deep)) == expected


def test_an_event_of_empty_data_lines_is_bounded_like_any_other() -> None:
    """src/spec_decode_otel/sse.py: an event holding more than ``MAX_EVENT_CHARS``
    characters is dropped, its text never kept. Its data is its ``data:`` lines joined
    with ``\\n``, but only the lines' values were counted: an event of empty ``data:``
    lines counted as 0 characters however many it had, so a raw stream that never ends
    it kept one list entry per line, and its end gave an event of that many newlines."""
    splitter = SseSplitter(max_event_chars=100)
    assert splitter.feed("data:\n" * 1000) == []
    assert splitter.feed("\n") == []
    # the splitter reads on: the next event, within the bound, comes out whole
    assert splitter.feed("data: {}\ndata:\ndata: x\n\n") == ["{}\n\nx"]
