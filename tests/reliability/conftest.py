"""Fixtures of the reliability tests: real engine payloads, fresh OTel providers.

``engine_payloads`` asks the simulator SUBPROCESS (``simulator_url``) once per engine
shape for a JSON body and a raw SSE stream, so the fuzzers and the in-process replays
start from what a server really sends, not from hand-written dicts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from reliability_helpers import API_KEY, Otel

#: The SGLang request field that asks for stats in a stream. SGLang 0.5.23 refuses
#: ``return_meta_info`` with ``stream: true`` (HTTP 400, ``serving_chat.py``
#: ``_convert_to_internal_request``), so the ``sglang-meta`` shape's stream is the one
#: SGLang does send: ``sglext`` on its own chunk.
_SGLANG_STREAM = {"return_spec_tokens_details": True}

#: (label, x-spec-decode-engine, extra body fields, extra fields of the streamed request)
ENGINE_SHAPES: tuple[tuple[str, str, dict[str, Any], dict[str, Any]], ...] = (
    ("vllm", "vllm", {}, {}),
    ("vllm-premerge", "vllm-premerge", {}, {}),
    ("sglang", "sglang", _SGLANG_STREAM, _SGLANG_STREAM),
    ("sglang-meta", "sglang", {"return_meta_info": True}, _SGLANG_STREAM),
    ("trtllm", "trtllm", {}, {}),
    ("trtllm-released", "trtllm-released", {}, {}),
    ("llamacpp", "llamacpp", {}, {}),
)


@dataclass(frozen=True)
class EnginePayload:
    label: str
    engine: str
    body: dict[str, Any]  # non-streaming response body
    sse: str  # raw SSE text of the streamed response (include_usage on)

    @property
    def chunks(self) -> list[dict[str, Any]]:
        out = []
        for line in self.sse.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
        return out


@pytest.fixture(scope="session")
def engine_payloads(simulator_url: str) -> dict[str, EnginePayload]:
    out: dict[str, EnginePayload] = {}
    with httpx.Client(base_url=simulator_url, timeout=30.0) as http:
        for label, engine, extra, stream_extra in ENGINE_SHAPES:
            request = {
                "model": "spec-sim",
                "messages": [{"role": "user", "content": "reliability fixture"}],
                "max_tokens": 24,
            }
            headers = {
                "authorization": f"Bearer {API_KEY}",
                "x-spec-decode-engine": engine,
                "x-sim-seed": "7",
            }
            body = http.post("/chat/completions", json={**request, **extra}, headers=headers)
            body.raise_for_status()
            stream = {"stream": True, "stream_options": {"include_usage": True}}
            streamed = http.post(
                "/chat/completions", json={**request, **stream_extra, **stream}, headers=headers
            )
            streamed.raise_for_status()
            out[label] = EnginePayload(label, engine, body.json(), streamed.text)
    return out


@pytest.fixture
def otel() -> Iterator[Otel]:
    """Fresh providers (in-memory spans, metric reader, start/end counter)."""
    providers = Otel()
    yield providers
    providers.shutdown()
