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
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer  # noqa: E402

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
                          "system_fingerprint"} for o in objs)  # fmt: skip
    assert all("meta_info" not in ch for o in objs for ch in o["choices"])
