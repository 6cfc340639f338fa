"""The simulated SGLang answers as SGLang 0.5.23 does (the newest release, Dec 2026).

Read from the released wheel's own source (``sglang==0.5.23``,
``sglang/srt/entrypoints/openai/``):

- ``protocol.py``: ``return_meta_info`` is a field of ``ChatCompletionRequest`` only;
  ``CompletionRequest`` has no such field and drops it (no ``meta_info``, no error).
  ``return_spec_tokens_details`` is on both.
- ``serving_chat.py`` ``OpenAIServingChat._convert_to_internal_request``: with
  ``stream: true``, ``return_meta_info`` raises ValueError("return_meta_info is not
  supported with streaming. Please set stream=false when using return_meta_info=true.")
  before anything is generated; ``serving_base.py`` ``OpenAIServingBase.handle_request``
  turns that into HTTP 400 with ``ErrorResponse(object="error", message, type="BadRequest",
  param=None, code=400)`` dumped at the body's root. (SGLang's unreleased main nests the
  same object under ``"error"``; the release is what is deployed.)
- ``serving_chat.py`` ``_generate_chat_stream`` and ``serving_completions.py``
  ``_generate_completion_stream``: a stream's spec-decode stats are
  ``sglext.spec_tokens_details`` (an object for n == 1, a list for n > 1) on one chunk of
  their own with ``choices: []``, after the finish_reason chunks and before the usage
  chunk; no chunk carries ``meta_info``.

Field for field (the tests below ``test_completions_ignore_return_meta_info``):

- ``protocol.py``: ``ChatCompletionResponse``/``CompletionResponse`` have no
  ``system_fingerprint`` but ``metadata`` (``build_endpoint_weight_version_metadata``:
  ``{"weight_version": "default"}``, the ``--weight-version`` default); every choice,
  body or chunk, has ``matched_stop`` (``Union[None, int, str] = None``, never dropped):
  the stop string, the token id of a natural stop, null at the length limit
  (``schedule_batch.py`` ``FINISH_MATCHED_STR``/``FINISH_MATCHED_TOKEN``/``FINISH_LENGTH``);
  ``ChatMessage`` dumps ``reasoning_content: null``; ``UsageInfo`` dumps
  ``prompt_tokens, total_tokens, completion_tokens, prompt_tokens_details,
  reasoning_tokens, completion_tokens_details``. Bodies are dumped whole
  (``utils/json_response.py`` ``model_json_response``: ``model_dump_json``).
- ``sse_utils.py``: chat role/content/finish chunks are msgspec ``StreamChunk``s
  (``omit_defaults``: no ``usage`` key) whose ``StreamDelta`` always has
  ``reasoning_content``; ``serving_chat.py`` ``_generate_chat_stream`` sends a choice's
  role chunk with its first output and the finish_reason chunks after all content. The
  ``sglext`` chunk is a pydantic ``ChatCompletionStreamResponse`` dump: ``usage: null``.
- ``serving_completions.py`` ``_generate_completion_stream``: every chunk, a pydantic
  dump, has ``usage: null``; the last output of a choice carries its finish_reason and
  ``matched_stop`` (no separate finish chunk); the usage chunk is dumped with
  ``exclude_none``.
- ``managers/tokenizer_manager.py`` ``_handle_batch_output`` /
  ``_calculate_spec_decoding_metrics``: ``meta_info`` is the tokenizer manager's dict
  (``id, finish_reason, prompt_tokens, weight_version, num_retractions,
  reasoning_tokens, completion_tokens, cached_tokens, e2e_latency``, then the spec keys
  only once a verify step ran, the histogram only when non-empty);
  ``entrypoints/openai/utils.py`` ``spec_tokens_details_from_meta_info`` makes no
  ``sglext`` for a request without spec keys. The id is the bare request id
  (``io_struct.py``: ``uuid.uuid4().hex``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer

SGLANG_SERVERS = ("sglang", "sglang-no-histogram")
META_STREAM_REFUSED = {
    "object": "error",
    "message": "return_meta_info is not supported with streaming. "
    "Please set stream=false when using return_meta_info=true.",
    "type": "BadRequest",
    "param": None,
    "code": 400,
}
MESSAGES = [{"role": "user", "content": "sglang wire"}]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with SimulatorServer(SimulatorConfig(engine="sglang", k=4, seed=3)) as sim:
        yield sim.base_url


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[Any]:
    with httpx.Client(base_url=base_url, timeout=30.0) as client:
        yield client


def post(http: Any, engine: str, path: str, **body: Any) -> Any:
    body.setdefault("model", "spec-sim")
    body.setdefault("max_tokens", 24)
    if path == "/chat/completions":
        body.setdefault("messages", MESSAGES)
    else:
        body.setdefault("prompt", "sglang wire")
    return http.post(path, json=body, headers={"x-spec-decode-engine": engine})


def sse_chunks(text: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("engine", SGLANG_SERVERS)
@pytest.mark.parametrize("details", [False, True], ids=["meta", "meta+details"])
def test_streamed_chat_with_return_meta_info_is_refused(http: Any, engine: str, details: bool):
    extra = {"return_spec_tokens_details": True} if details else {}
    resp = post(http, engine, "/chat/completions", stream=True, return_meta_info=True, **extra)
    assert resp.status_code == 400
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == META_STREAM_REFUSED


def test_the_sdk_sees_a_bad_request(base_url: str):
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    with client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="spec-sim",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            extra_body={"return_meta_info": True},
        )
    assert caught.value.status_code == 400
    assert caught.value.body == META_STREAM_REFUSED


@pytest.mark.parametrize("engine", SGLANG_SERVERS)
@pytest.mark.parametrize("usage", [True, False], ids=["usage", "no-usage"])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
@pytest.mark.parametrize("n", [1, 2])
def test_a_stream_carries_sglext_on_its_own_chunk(
    http: Any, engine: str, usage: bool, path: str, n: int
):
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    resp = post(http, engine, path, stream=True, n=n, return_spec_tokens_details=True, **extra)
    assert resp.status_code == 200
    chunks = sse_chunks(resp.text)
    carriers = [i for i, c in enumerate(chunks) if "sglext" in c]
    assert len(carriers) == 1
    at = carriers[0]
    assert chunks[at]["choices"] == [] and set(chunks[at]["sglext"]) == {"spec_tokens_details"}
    details = chunks[at]["sglext"]["spec_tokens_details"]
    assert isinstance(details, dict) if n == 1 else len(details) == n
    finishes = [i for i, c in enumerate(chunks) for ch in c["choices"] if ch["finish_reason"]]
    assert len(finishes) == n and max(finishes) < at
    assert at == len(chunks) - (2 if usage else 1), "then the usage chunk, if asked for"
    assert all("meta_info" not in ch for c in chunks for ch in c["choices"])


@pytest.mark.parametrize("engine", SGLANG_SERVERS)
def test_a_non_streamed_chat_still_has_meta_info(http: Any, engine: str):
    resp = post(http, engine, "/chat/completions", return_meta_info=True)
    assert resp.status_code == 200
    meta = resp.json()["choices"][0]["meta_info"]
    assert meta["spec_verify_ct"] > 0 and "spec_num_correct_drafts" in meta


@pytest.mark.parametrize("engine", SGLANG_SERVERS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_completions_ignore_return_meta_info(http: Any, engine: str, stream: bool):
    resp = post(http, engine, "/completions", stream=stream, return_meta_info=True)
    assert resp.status_code == 200
    objs = sse_chunks(resp.text) if stream else [resp.json()]
    assert all(set(o) <= {"id", "object", "created", "model", "choices", "usage",
                          "metadata"} for o in objs)  # fmt: skip
    assert all("meta_info" not in ch for o in objs for ch in o["choices"])


ROOT_KEYS = ["id", "object", "created", "model", "choices", "usage", "metadata"]
USAGE_KEYS = [
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "reasoning_tokens",
    "completion_tokens_details",
]
META_KEYS = [
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "e2e_latency",
]
SPEC_META_KEYS = [
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
]


@pytest.mark.parametrize("engine", SGLANG_SERVERS)
def test_a_chat_body_has_sglangs_fields_in_its_order(http: Any, engine: str):
    resp = post(http, engine, "/chat/completions", return_meta_info=True,
                return_spec_tokens_details=True)  # fmt: skip
    body = resp.json()
    assert list(body) == [*ROOT_KEYS, "sglext"]
    assert re.fullmatch(r"[0-9a-f]{32}", body["id"])
    assert body["metadata"] == {"weight_version": "default"}
    assert list(body["usage"]) == USAGE_KEYS
    usage = body["usage"]
    assert usage["prompt_tokens_details"] is None and usage["completion_tokens_details"] is None
    assert usage["reasoning_tokens"] == 0
    choice = body["choices"][0]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "matched_stop",
                            "meta_info"]  # fmt: skip
    assert choice["message"]["reasoning_content"] is None
    meta = choice["meta_info"]
    histogram = ["spec_correct_drafts_histogram"] if engine == "sglang" else []
    assert list(meta) == [*META_KEYS, *SPEC_META_KEYS, *histogram]
    assert meta["id"] == body["id"] and meta["weight_version"] == "default"
    assert list(body["sglext"]["spec_tokens_details"]) == [
        "spec_accept_rate",
        "spec_accept_length",
        "spec_cap_length",
        "spec_block_accept_length",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_verify_ct",
        "spec_correct_drafts_histogram",
        "spec_cap_lens_histogram",
    ]


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
@pytest.mark.parametrize(
    "extra,finish,matched",
    [
        ({"stop": " "}, "stop", " "),  # every word after the first starts with a space
        ({"max_tokens": 3}, "length", None),
        ({"max_tokens": None}, "stop", int),  # natural end: the EOS token id
    ],
    ids=["stop-string", "length", "eos"],
)
def test_matched_stop_says_what_ended_the_sequence(
    http: Any, path: str, extra: dict[str, Any], finish: str, matched: Any
):
    chat = path == "/chat/completions"
    meta = {"return_meta_info": True} if chat else {}
    body = post(http, "sglang", path, **extra, **meta).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == finish
    if matched is int:
        assert type(choice["matched_stop"]) is int
    else:
        assert choice["matched_stop"] == matched
    if chat:
        reason = choice["meta_info"]["finish_reason"]
        if finish == "length":
            assert reason == {"type": "length", "length": body["usage"]["completion_tokens"]}
        else:
            assert reason == {"type": "stop", "matched": choice["matched_stop"]}
    chunks = sse_chunks(post(http, "sglang", path, stream=True, **extra).text)
    last = [ch for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert [ch["matched_stop"] for ch in last] == [choice["matched_stop"]]


@pytest.mark.parametrize("n", [1, 2])
def test_a_chat_stream_has_sglangs_chunk_shapes(http: Any, n: int):
    usage_on = {"include_usage": True}
    resp = post(http, "sglang", "/chat/completions", stream=True, n=n,
                return_spec_tokens_details=True, stream_options=usage_on)  # fmt: skip
    chunks = sse_chunks(resp.text)
    *content, ext, usage = chunks
    for c in content:
        assert list(c) == ["id", "object", "created", "model", "choices"], "no usage key"
        (choice,) = c["choices"]
        assert list(choice) == ["index", "delta", "logprobs", "finish_reason", "matched_stop"]
        assert next(iter(choice["delta"])) == "reasoning_content"
        assert choice["delta"]["reasoning_content"] is None
        assert choice["finish_reason"] is not None or choice["matched_stop"] is None
    assert list(ext) == ["id", "object", "created", "model", "choices", "usage", "sglext"]
    assert ext["usage"] is None and ext["choices"] == []
    assert list(usage) == ["id", "object", "created", "model", "choices", "usage"]
    assert list(usage["usage"]) == USAGE_KEYS
    for i in range(n):
        mine = [c["choices"][0] for c in content if c["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"reasoning_content": None, "role": "assistant",
                                    "content": ""}  # fmt: skip
        assert mine[-1]["delta"] == {"reasoning_content": None}
        assert mine[-1]["finish_reason"] and not any(ch["finish_reason"] for ch in mine[:-1])
    finishes = [i for i, c in enumerate(content) if c["choices"][0]["finish_reason"]]
    assert finishes == list(range(len(content) - n, len(content))), "finish chunks last"
    if n > 1:
        first_of = {}
        for i, c in enumerate(content):
            first_of.setdefault(c["choices"][0]["index"], i)
        assert content[first_of[1] - 1]["choices"][0]["index"] == 0, "roles come with output"


@pytest.mark.parametrize("n", [1, 2])
def test_a_completions_stream_has_sglangs_chunk_shapes(http: Any, n: int):
    usage_on = {"include_usage": True}
    resp = post(http, "sglang", "/completions", stream=True, n=n, max_tokens=None,
                return_spec_tokens_details=True, stream_options=usage_on)  # fmt: skip
    chunks = sse_chunks(resp.text)
    *content, ext, usage = chunks
    for c in content:
        assert list(c) == ["id", "object", "created", "model", "choices", "usage"]
        assert c["usage"] is None
        (choice,) = c["choices"]
        assert list(choice) == ["index", "text", "logprobs", "finish_reason", "matched_stop"]
    assert ext["usage"] is None and ext["choices"] == [] and "sglext" in ext
    assert list(usage) == ["id", "object", "created", "model", "choices", "usage"]
    assert usage["usage"] == {k: v for k, v in usage["usage"].items() if v is not None}
    assert list(usage["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens",
                                    "reasoning_tokens"]  # fmt: skip
    body = post(http, "sglang", "/completions", n=n, max_tokens=None).json()
    for i in range(n):
        mine = [c["choices"][0] for c in content if c["choices"][0]["index"] == i]
        assert mine[-1]["finish_reason"] == "stop" and type(mine[-1]["matched_stop"]) is int
        assert not any(ch["finish_reason"] for ch in mine[:-1])
        assert mine[-1]["text"], "the finish rides on the last step's text"
        assert len(body["choices"][i]["text"]) > 0


@pytest.mark.parametrize("engine", SGLANG_SERVERS)
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_no_verify_step_means_no_spec_fields(http: Any, engine: str, path: str):
    """One generated token is the prefill's: no verify step, so no spec keys in
    ``meta_info`` and no ``sglext`` (body or stream)."""
    chat = path == "/chat/completions"
    meta = {"return_meta_info": True} if chat else {}
    body = post(http, engine, path, max_tokens=1, return_spec_tokens_details=True,
                **meta).json()  # fmt: skip
    assert body["usage"]["completion_tokens"] == 1 and "sglext" not in body
    if chat:
        assert list(body["choices"][0]["meta_info"]) == META_KEYS
    chunks = sse_chunks(post(http, engine, path, max_tokens=1, stream=True,
                             return_spec_tokens_details=True).text)  # fmt: skip
    assert chunks and not any("sglext" in c for c in chunks)
