"""The simulated mlx-vlm answers as mlx-vlm 0.7.10 does where a client or an adapter can
tell.

Read from the released wheel (``mlx-vlm==0.7.10``):

- ``server/schemas.py``: ``GenerationTimings`` (a body's and the usage chunk's
  ``timings``) has every llama.cpp field plus ``peak_memory`` and the four draft fields,
  null unless a verify round ran (``speculative_stats_since`` in
  ``speculative/common.py`` answers None for zero rounds); ``StreamingTimings`` holds
  ``predicted_per_second`` alone; ``ChatStreamChunk`` is dumped whole
  (``model_dump_json()``), so ``usage: null`` on every chunk but the usage chunk.
- ``server/openai.py`` ``chat_completions_endpoint`` / ``stream_generator``: every
  streamed chunk with text, and the finish chunk (``_final_chat_chunk``), carries
  ``StreamingTimings``; the draft counters ride only the ``include_usage`` chunk
  (``_chat_usage_chunk``, ``choices: []``). ``responses_endpoint``: no draft counts on
  any Responses event; ``response.output_text.done`` carries ``StreamingTimings``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from spec_decode_otel import record_from_json
from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer

#: ``GenerationTimings``' fields (``server/schemas.py``).
GENERATION_TIMINGS = {
    "prompt_n",
    "cache_n",
    "predicted_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
    "peak_memory",
    "draft_kind",
    "draft_rounds",
    "draft_n",
    "draft_n_accepted",
}
DRAFT_FIELDS = ("draft_kind", "draft_rounds", "draft_n", "draft_n_accepted")


@pytest.fixture(scope="module")
def http() -> Iterator[Any]:
    with (
        SimulatorServer(SimulatorConfig(engine="mlx-vlm", k=4, seed=13)) as sim,
        httpx.Client(base_url=sim.base_url, timeout=30.0) as client,
    ):
        yield client


def chat(http: Any, **body: Any) -> Any:
    body = {"model": "spec-sim", "messages": [{"role": "user", "content": "mlx"}], **body}
    return http.post("/chat/completions", json=body, headers={"x-sim-seed": "4"})


def sse_data(text: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_a_body_sends_every_generation_timings_field(http: Any) -> None:
    """With verify rounds the draft fields hold the counts; the record reads them."""
    body = chat(http, max_tokens=30).json()
    timings = body["timings"]
    assert set(timings) == GENERATION_TIMINGS
    assert timings["draft_rounds"] > 0 and timings["draft_kind"] == "mtp"
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert body["choices"][0]["message"]["tool_calls"] is None
    record = record_from_json(body)
    assert record is not None and record.engine == "mlx_vlm"
    assert record.num_spec_steps == timings["draft_rounds"]


def test_no_verify_round_sends_the_draft_fields_null(http: Any) -> None:
    """One token (prefill only): no round, so all four draft fields are null, and there
    is no record, as from an mlx-vlm without a drafter."""
    body = chat(http, max_tokens=1).json()
    timings = body["timings"]
    assert set(timings) == GENERATION_TIMINGS
    assert all(timings[k] is None for k in DRAFT_FIELDS)
    assert record_from_json(body) is None


@pytest.mark.parametrize("include_usage", [False, True])
def test_every_chunk_has_streaming_timings_and_only_the_usage_chunk_the_counters(
    http: Any, include_usage: bool
) -> None:
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = sse_data(chat(http, max_tokens=30, stream=True, **extra).text)
    with_choices = [c for c in chunks if c["choices"]]
    assert all(set(c["timings"]) == {"predicted_per_second"} for c in with_choices)
    assert all("usage" in c and c["usage"] is None for c in with_choices)
    assert with_choices[-1]["choices"][0]["finish_reason"] == "length"
    record = record_from_json(chunks)
    if include_usage:
        last = chunks[-1]
        assert last["choices"] == [] and set(last["timings"]) == GENERATION_TIMINGS
        assert record is not None and record.num_draft_tokens == last["timings"]["draft_n"]
        assert record.completion_tokens == last["usage"]["completion_tokens"] == 30
    else:
        assert chunks[-1] is with_choices[-1]
        assert record is None


def test_a_responses_stream_has_no_draft_counts(http: Any) -> None:
    """mlx-vlm's Responses API sends no draft counts (the simulator sent llama.cpp's
    ``timings`` on ``response.completed``): nothing to record, streamed or not."""
    body = {"model": "spec-sim", "input": "mlx", "max_output_tokens": 30}
    response = http.post("/responses", json={**body, "stream": True})
    events = sse_data(response.text)
    assert events[-1]["type"] == "response.completed" and "timings" not in events[-1]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert set(done["timings"]) == {"predicted_per_second"}
    assert record_from_json(events) is None
    plain = http.post("/responses", json=body).json()
    assert "timings" not in plain and record_from_json(plain) is None
