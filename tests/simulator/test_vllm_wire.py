"""The simulated vLLM answers as vLLM 0.34.0 does where a client or an adapter can tell.

Read from the released wheel's own source (``vllm==0.34.0``):

- ``entrypoints/openai/chat_completion/api_router.py`` (and ``completion/``): a body is
  ``JSONResponse(content=generator.model_dump())``, every field dumped, so
  ``metrics.speculative_decoding`` (``entrypoints/generate/base/protocol.py``
  ``SpeculativeDecodingMetrics``) says ``per_step_accepted: null`` and
  ``per_step_drafted: null`` below the detailed level.
- ``chat_completion/serving.py`` ``chat_completion_stream_generator``: chunks are dumped
  with ``exclude_unset=True`` (and ``exclude_none`` when ``choices`` is empty), and
  ``v1/metrics/stats.py`` ``RequestSpecDecodeMetrics.to_dict`` sets the per-step keys only
  when populated: the usage chunk's stats have no per-step keys at summary level.
- ``stop_reason`` (``ChatCompletionResponseChoice``, ``CompletionResponseChoice``): the
  stop string that matched, null for EOS or the length limit; on every body choice, on a
  chat stream's finish chunk only (the only choice built with it), on every completions
  chunk (``completion/serving.py`` sets it on each).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer  # noqa: E402


@pytest.fixture(scope="module")
def http() -> Iterator[Any]:
    with (
        SimulatorServer(SimulatorConfig(engine="vllm", k=4, seed=5)) as sim,
        httpx.Client(base_url=sim.base_url, timeout=30.0) as client,
    ):
        yield client


def post(http: Any, path: str, level: str = "summary", **body: Any) -> Any:
    body.setdefault("model", "spec-sim")
    if path == "/chat/completions":
        body.setdefault("messages", [{"role": "user", "content": "vllm wire"}])
    else:
        body.setdefault("prompt", "vllm wire")
    return http.post(path, json=body, headers={"x-spec-decode-level": level})


def sse_chunks(text: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
@pytest.mark.parametrize("level", ["summary", "detailed"])
def test_per_step_keys_are_null_in_a_body_and_absent_from_a_stream(
    http: Any, path: str, level: str
):
    stats = post(http, path, level).json()["metrics"]["speculative_decoding"]
    assert "per_step_accepted" in stats and "per_step_drafted" in stats
    if level == "summary":
        assert stats["per_step_accepted"] is None and stats["per_step_drafted"] is None
    else:
        assert len(stats["per_step_accepted"]) == stats["num_spec_steps"]
    chunks = sse_chunks(
        post(http, path, level, stream=True, stream_options={"include_usage": True}).text
    )
    streamed = chunks[-1]["metrics"]["speculative_decoding"]
    assert ("per_step_accepted" in streamed) == (level == "detailed")
    assert None not in streamed.values()


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
@pytest.mark.parametrize(
    "extra,stop_reason",
    [({"stop": " "}, " "), ({"max_tokens": 3}, None), ({}, None)],
    ids=["stop-string", "length", "eos"],
)
def test_stop_reason_names_the_stop_string_only(
    http: Any, path: str, extra: dict[str, Any], stop_reason: str | None
):
    (choice,) = post(http, path, **extra).json()["choices"]
    assert "stop_reason" in choice and choice["stop_reason"] == stop_reason
    chunks = sse_chunks(post(http, path, stream=True, **extra).text)
    choices = [ch for c in chunks for ch in c["choices"]]
    finish = [ch for ch in choices if ch["finish_reason"]]
    assert [ch["stop_reason"] for ch in finish] == [stop_reason]
    others = [ch for ch in choices if not ch["finish_reason"]]
    if path == "/completions":
        assert all("stop_reason" in ch and ch["stop_reason"] is None for ch in others)
    else:
        assert all("stop_reason" not in ch for ch in others)
