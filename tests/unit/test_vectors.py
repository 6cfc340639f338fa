"""Every wire example, through both entry points, gives exactly its expected record.

Two paths per vector: the decoded JSON through ``record_from_json`` (what ``parse`` and
log replay use), and ``openai`` SDK objects built the way the SDK builds a response it
received (``openai._models.construct_type``, no validation, unknown keys kept in
``model_extra``) through ``ParsedResponse.from_sdk`` and ``detect`` (what the client
wrapper uses). Both get the vector's ``request`` body, as the wrapper does. Both must
match ``expected_record``: floats to 1e-9, all else exact.

Chat and completion bodies become ``ChatCompletion``/``ChatCompletionChunk``; Responses
API bodies (``"object": "response"``) a ``Response``, and their stream events (a
``type``) ``ResponseStreamEvent``s: types of openai 1.66 and later, imported only for those
vectors (scripts/test-matrix.sh deselects them by name on the oldest openai).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from openai._models import construct_type
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from record_json import WIRE_EXAMPLES, dump_like
from spec_decode_otel import SpecDecodeAcceptanceRecord, record_from_json
from spec_decode_otel.adapters import ParsedResponse, detect

VECTOR_FILES = sorted(WIRE_EXAMPLES.glob("*.json"))
FLOAT_FIELDS = {"mean_acceptance_length", "draft_acceptance_rate"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _payload(vector: dict):
    """The response body (dict) or the list of stream chunks, as on the wire."""
    assert ("response" in vector) != ("chunks" in vector), "a vector has a body or chunks"
    return vector["response"] if "response" in vector else vector["chunks"]


def _sdk_type(body: dict, chunk: bool) -> type:
    if "type" in body or body.get("object") == "response":
        from openai.types.responses import Response, ResponseStreamEvent

        return ResponseStreamEvent if "type" in body else Response
    return ChatCompletionChunk if chunk else ChatCompletion


def _sdk_objects(vector: dict) -> list:
    """SDK models built exactly as the SDK builds received JSON (no validation)."""
    if "response" in vector:
        body = copy.deepcopy(vector["response"])
        return [construct_type(type_=_sdk_type(body, False), value=body)]
    return [
        construct_type(type_=_sdk_type(c, True), value=c) for c in copy.deepcopy(vector["chunks"])
    ]


def assert_matches_expected(record: SpecDecodeAcceptanceRecord | None, expected: dict | None):
    if expected is None:
        assert record is None
        return
    assert record is not None
    got = dump_like(record, expected)
    assert got is not None and set(got) == set(expected)
    for key, want in expected.items():
        if key in FLOAT_FIELDS and want is not None:
            assert got[key] is not None
            assert math.isclose(got[key], want, rel_tol=0, abs_tol=1e-9), key
        else:
            assert got[key] == want, key


def test_the_vector_directory_holds_every_wire_example():
    # An empty or half-copied directory must fail loudly, not parametrize to nothing.
    assert len(VECTOR_FILES) >= 26
    names = {p.stem for p in VECTOR_FILES}
    assert {"vllm_merged_summary_chat", "vllm_premerge_stream", "sglang_sglext_chat"} <= names
    assert {"sglang_lazy_histogram", "llamacpp_responses_stream", "litellm_proxy_trtllm"} <= names


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_vector_from_decoded_json_gives_expected_record(path: Path):
    vector = _load(path)
    record = record_from_json(_payload(vector), vector.get("request"))
    assert_matches_expected(record, vector["expected_record"])


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_vector_from_openai_sdk_objects_gives_expected_record(path: Path):
    vector = _load(path)
    objects = _sdk_objects(vector)
    request = vector.get("request")
    record = detect([ParsedResponse.from_sdk(obj, request) for obj in objects])
    assert_matches_expected(record, vector["expected_record"])


@pytest.mark.parametrize(
    "path",
    [p for p in VECTOR_FILES if _load(p)["expected_record"] is not None],
    ids=lambda p: p.stem,
)
def test_vector_expected_record_is_itself_a_valid_record(path: Path):
    expected = _load(path)["expected_record"]
    record = SpecDecodeAcceptanceRecord.model_validate(expected)
    assert dump_like(record, expected) == expected


def test_sdk_objects_keep_unknown_root_fields_in_model_extra():
    vector = _load(WIRE_EXAMPLES / "vllm_merged_summary_chat.json")
    (completion,) = _sdk_objects(vector)
    assert isinstance(completion, ChatCompletion)
    assert completion.model_extra["metrics"] == vector["response"]["metrics"]
    assert isinstance(completion.model_extra["metrics"]["speculative_decoding"], dict)


def test_sdk_objects_keep_unknown_choice_fields_with_string_histogram_keys():
    vector = _load(WIRE_EXAMPLES / "vllm_premerge_chat.json")
    (completion,) = _sdk_objects(vector)
    stats = completion.choices[0].model_extra["speculative_decoding_stats"]
    assert stats["acceptance_histogram"] == {"0": 39, "1": 1, "3": 3}


def test_sdk_stream_chunks_keep_metrics_on_the_usage_chunk_only():
    vector = _load(WIRE_EXAMPLES / "vllm_merged_stream_chat.json")
    chunks = _sdk_objects(vector)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    with_metrics = [i for i, c in enumerate(chunks) if "metrics" in (c.model_extra or {})]
    assert with_metrics == [len(chunks) - 1]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 31
