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

#: (label, x-spec-decode-engine, extra body fields)
ENGINE_SHAPES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("vllm", "vllm", {}),
    ("vllm-premerge", "vllm-premerge", {}),
    ("sglang", "sglang", {"return_spec_tokens_details": True}),
    ("sglang-meta", "sglang", {"return_meta_info": True}),
    ("trtllm", "trtllm", {}),
    ("trtllm-released", "trtllm-released", {}),
    ("llamacpp", "llamacpp", {}),
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
        for label, engine, extra in ENGINE_SHAPES:
            request = {
                "model": "spec-sim",
                "messages": [{"role": "user", "content": "reliability fixture"}],
                "max_tokens": 24,
                **extra,
            }
            headers = {
                "authorization": f"Bearer {API_KEY}",
                "x-spec-decode-engine": engine,
                "x-sim-seed": "7",
            }
            body = http.post("/chat/completions", json=request, headers=headers)
            body.raise_for_status()
            streamed = http.post(
                "/chat/completions",
                json={**request, "stream": True, "stream_options": {"include_usage": True}},
                headers=headers,
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
