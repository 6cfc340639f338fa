"""The simulated llama.cpp answers as llama.cpp's server b11312 does where a client or an
adapter can tell.

Read from that build's source (the tree vendored in the ``llama-cpp-python`` 0.3.36 sdist,
the one ``scripts/install-llama-server.sh`` builds) and checked against the built
``llama-server`` answering tests/engines/tiny_models.py's models:

- ``tools/server/server-schema.cpp``: ``n`` is an alias of ``n_cmpl``, allowed from 1 to
  the slot count (``--parallel``, 4 by default); above it the server answers HTTP 400,
  ``{"error": {"code": 400, "message": "Field 'n': ...", "type":
  "invalid_request_error"}}`` (``format_error_response``, ``server-common.cpp``: no
  ``param``). Several prompts give prompts x ``n`` sequences, each its own task.
- ``tools/server/server-context.cpp`` ``handle_completions_impl``: a non-streamed answer
  with several tasks is the FIRST task's body (results ordered by index) with the other
  tasks' choices appended: its ``usage`` and ``timings`` are the first sequence's own.
  A stream relays each task's chunks as they come: every sequence ends with its own
  final chunks.
- ``tools/server/server-task.cpp``: ``to_json_oaicompat_chat_stream`` ends a sequence
  with its finish chunk (empty delta), then with ``include_usage`` a ``choices: []``
  chunk with the usage, and puts ``timings`` on whichever is last;
  ``to_json_oaicompat`` (completions) ends it with ONE chunk carrying the finish
  reason, ``usage`` and ``timings``, whatever ``stream_options`` says, and sends no
  ``choices: []`` chunk. A chat sequence starts with a role chunk whose ``content`` is
  null. Every chunk has ``system_fingerprint``.
- ``tools/server/server-context.cpp``: a stop string's partial result carries
  ``timings`` too (``send_partial_response``); drafts stay within what ``max_tokens``
  and the context leave (``get_n_draft_max``); ``max_tokens`` 0 still gives one token
  (``process_token``); a prompt that fills the context is a 400
  ``exceed_context_size_error`` (``update_slots``). tests/engines/ compares these with
  the real server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from spec_decode_otel import record_from_json
from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer

PATHS = ["/chat/completions", "/completions"]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(engine="llamacpp", k=4, seed=11)) as server:
        yield server


@pytest.fixture(scope="module")
def http(sim: SimulatorServer) -> Iterator[Any]:
    with httpx.Client(base_url=sim.base_url, timeout=30.0) as client:
        yield client


def body_for(path: str, **body: Any) -> dict[str, Any]:
    body.setdefault("model", "spec-sim")
    body.setdefault("max_tokens", 40)
    if path == "/chat/completions":
        body.setdefault("messages", [{"role": "user", "content": "llama wire"}])
    else:
        body.setdefault("prompt", "llama wire")
    return body


def post(http: Any, path: str, seed: int = 3, **body: Any) -> Any:
    return http.post(path, json=body_for(path, **body), headers={"x-sim-seed": str(seed)})


def sse_chunks(text: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def stream(http: Any, path: str, include_usage: bool, **body: Any) -> list[dict[str, Any]]:
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    response = post(http, path, stream=True, **body)
    assert response.status_code == 200
    return sse_chunks(response.text)


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/chat/completions", {"n": 2}),
        ("/completions", {"n": 2}),
        ("/completions", {"prompt": ["one", "two more"]}),
    ],
)
def test_several_sequences_are_answered_with_the_first_ones_usage_and_timings(
    http: Any, path: str, extra: dict[str, Any]
) -> None:
    """``n`` = 2 (or two prompts) is answered, not refused; the body's root ``usage`` and
    ``timings`` are choice 0's own counts, as its stream shows them."""
    response = post(http, path, **extra)
    assert response.status_code == 200
    body = response.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    chunks = stream(http, path, include_usage=True, **extra)
    ends = {
        c["choices"][0]["index"]: chunks[i + 1] if path == "/chat/completions" else c
        for i, c in enumerate(chunks)
        if c["choices"] and c["choices"][0]["finish_reason"]
    }
    assert body["usage"] == ends[0]["usage"] and body["timings"] == ends[0]["timings"]
    assert body["timings"]["predicted_n"] == body["usage"]["completion_tokens"]
    assert ends[1]["timings"] != ends[0]["timings"]  # the second sequence's own counts


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("include_usage", [False, True])
def test_every_sequence_of_a_stream_ends_with_its_own_timings(
    http: Any, path: str, include_usage: bool
) -> None:
    """With ``n`` = 2 the stream holds two ``timings``, one per sequence, each on that
    sequence's last chunk: chat: its finish chunk, or its own ``choices: []`` usage chunk
    with ``include_usage``; completions: its finish chunk, which carries ``usage`` too."""
    chunks = stream(http, path, include_usage, n=2)
    carriers = [c for c in chunks if "timings" in c]
    assert len(carriers) == 2
    ends = []
    for i, chunk in enumerate(chunks):
        if chunk["choices"] and chunk["choices"][0]["finish_reason"]:
            index = chunk["choices"][0]["index"]
            last = chunks[i + 1] if path == "/chat/completions" and include_usage else chunk
            ends.append(index)
            assert "timings" in last and last["timings"]["predicted_n"] > 0
            if path == "/completions" or include_usage:
                assert last["usage"]["completion_tokens"] == last["timings"]["predicted_n"]
            else:
                assert "usage" not in last
    assert sorted(ends) == [0, 1]


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_completions_stream_ends_with_one_finish_chunk_carrying_usage_and_timings(
    http: Any, include_usage: bool
) -> None:
    """No ``choices: []`` chunk in a completions stream, with or without
    ``include_usage``: the finish chunk has ``usage`` and ``timings``, so a client gets
    ``completion_tokens`` without asking for usage, and the record has it."""
    chunks = stream(http, "/completions", include_usage)
    assert all(c["choices"] for c in chunks)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["choices"][0]["text"] == ""
    assert last["usage"]["completion_tokens"] == 40 == last["timings"]["predicted_n"]
    assert all("usage" not in c and "timings" not in c for c in chunks[:-1])
    record = record_from_json(chunks, body_for("/completions", stream=True))
    assert record is not None and record.engine == "llamacpp"
    assert record.completion_tokens == 40
    assert record.num_draft_tokens == last["timings"]["draft_n"]


def test_a_chat_stream_starts_with_a_null_content_role_chunk(http: Any) -> None:
    chunks = stream(http, "/chat/completions", include_usage=False)
    assert chunks[0]["choices"] == [
        {"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}
    ]
    assert all(c["system_fingerprint"] == "b11312-0c1e57098" for c in chunks)


@pytest.mark.parametrize("path", PATHS)
def test_n_above_the_slot_count_is_llamacpps_own_bad_request(http: Any, path: str) -> None:
    response = post(http, path, n=5)
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "code": 400,
            "message": "Field 'n': Value must be between 1 <= value <= 4, but got 5",
            "type": "invalid_request_error",
        }
    }


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("streaming", [False, True])
def test_an_instrumented_call_for_two_sequences_is_multi_sequence(
    sim: SimulatorServer, path: str, streaming: bool
) -> None:
    """The instrumented SDK, against llama.cpp's answer to ``n`` = 2 (one root
    ``timings`` for two choices; a stream with two): no record, outcome
    ``multi_sequence``, never the first sequence's counts as the request's."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from spec_decode_otel import SpecDecodeInstrumentor

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    instrumentor = SpecDecodeInstrumentor()
    instrumentor.uninstrument()
    instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        client = openai.OpenAI(base_url=sim.base_url, api_key="sk-test", max_retries=0)
        kwargs = {k: v for k, v in body_for(path, n=2).items()}
        if streaming:
            kwargs.update(stream=True, stream_options={"include_usage": True})
        create = client.chat.completions.create if "chat" in path else client.completions.create
        result = create(**kwargs)
        if streaming:
            assert sum(1 for _ in result) > 2
        client.close()
    finally:
        instrumentor.uninstrument()
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["spec_decode.outcome"] == "multi_sequence"
    assert "spec_decode.num_draft_tokens" not in span.attributes
    tracer_provider.shutdown()
    meter_provider.shutdown()


def _stop_inside(text: str) -> str:
    """Three characters from the middle of a word past the first: the token that
    completes them shows some text (its leading space) before the stop."""
    word = next(w for w in text.split()[2:] if len(w) >= 5)
    return word[1:4]


@pytest.mark.parametrize("path", PATHS)
def test_a_stop_string_hit_sends_timings_on_the_stop_chunk_and_the_last(
    http: Any, path: str
) -> None:
    """llama.cpp b11312 sends a stop-ended sequence's ``timings`` twice: on the partial
    result of the token that completed the stop (``send_partial_response``,
    ``server-context.cpp``: stats once ``slot.stop`` is set, which
    ``find_stopping_strings`` does before that partial goes out) and on the final
    chunk; tests/engines/test_llamacpp_server.py compares a completions stream with the
    real server's. Both say the same counts, and the record is the last one's."""
    text = post(http, path).json()["choices"][0]
    text = text["message"]["content"] if path == "/chat/completions" else text["text"]
    stop = _stop_inside(text)
    chunks = stream(http, path, include_usage=False, stop=[stop])
    carriers = [c for c in chunks if "timings" in c]
    assert len(carriers) == 2
    assert carriers[0]["timings"] == carriers[1]["timings"]
    assert carriers[0]["choices"][0]["finish_reason"] is None
    assert carriers[1] is chunks[-1] and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    piece = carriers[0]["choices"][0]
    assert (piece["delta"]["content"] if path == "/chat/completions" else piece["text"]) != ""
    record = record_from_json(chunks, body_for(path, stream=True, stop=[stop]))
    assert record is not None and record.num_draft_tokens == carriers[1]["timings"]["draft_n"]


def test_a_stop_hit_on_the_first_token_with_no_text_puts_timings_on_the_role_chunk(
    http: Any,
) -> None:
    """A chat stop that matches at the very start: the first token's partial result has
    no text, so its only delta is the role one (``to_json_oaicompat_chat`` in
    ``server-task.cpp`` sends a chunk only for a delta), and that carries ``timings``.
    A completions partial is sent even with no text."""
    text = post(http, "/chat/completions").json()["choices"][0]["message"]["content"]
    stop = text[:3]
    chat = stream(http, "/chat/completions", include_usage=False, stop=[stop])
    assert [c["choices"][0]["delta"] for c in chat if "timings" in c] == [
        {"role": "assistant", "content": None},
        {},
    ]
    completion = post(http, "/completions").json()["choices"][0]["text"]
    chunks = stream(http, "/completions", include_usage=False, stop=[completion[:3]])
    assert [(c["choices"][0]["text"], "timings" in c) for c in chunks] == [
        ("", True),
        ("", True),
    ]


@pytest.mark.parametrize("max_tokens", [1, 2])
@pytest.mark.parametrize("path", PATHS)
def test_a_reply_of_at_most_two_tokens_drafts_nothing(
    http: Any, sim: SimulatorServer, path: str, max_tokens: int
) -> None:
    """llama.cpp b11312 drafts at most the tokens left minus one (``get_n_draft_max`` in
    ``server-context.cpp``: ``n_remaining() - 1``): after the first token of a
    two-token reply there is no room, so ``timings`` has no ``draft_n`` and the
    server's draft counters do not move (the real server, tests/engines/)."""
    before = httpx.get(f"{sim.url}/metrics").text
    body = post(http, path, max_tokens=max_tokens).json()
    assert body["timings"]["predicted_n"] == max_tokens
    assert "draft_n" not in body["timings"]
    assert httpx.get(f"{sim.url}/metrics").text == before


@pytest.mark.parametrize("path", PATHS)
def test_every_draft_fits_in_what_max_tokens_leaves(http: Any, path: str) -> None:
    """Each draft is cut to the tokens left minus one, so with ``max_tokens`` = 3 the
    only draft is one token long, whatever ``k`` (4 here) and the acceptance."""
    for seed in range(8):
        timings = post(http, path, seed=seed, max_tokens=3).json()["timings"]
        assert timings["predicted_n"] == 3 and timings["draft_n"] == 1


@pytest.mark.parametrize("path", PATHS)
def test_max_tokens_zero_is_answered_with_one_token(http: Any, path: str) -> None:
    """llama.cpp b11312 takes ``max_tokens`` 0 (``n_predict``, hard limits -1 ..
    INT32_MAX in ``server-schema.cpp``) and still generates one token: ``process_token``
    (``server-context.cpp``) checks the budget only once a token is out. The answer is
    one token, finish ``length``, nothing drafted."""
    response = post(http, path, max_tokens=0)
    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 1 == body["timings"]["predicted_n"]
    assert "draft_n" not in body["timings"]


def test_max_tokens_minus_one_is_no_limit_and_below_is_llamacpps_own_bad_request(
    http: Any,
) -> None:
    """-1 is ``n_predict``'s "no limit"; below it llama.cpp b11312 answers its own 400
    naming the field the request used (``handle_with_catch`` in ``server-schema.cpp``;
    ``max_completion_tokens`` is read before ``max_tokens``; a Responses request's
    ``max_output_tokens`` is renamed ``max_tokens`` first, ``server-chat.cpp``: all
    three seen from the real server)."""
    unlimited = post(http, "/chat/completions", max_tokens=-1).json()
    assert unlimited["choices"][0]["finish_reason"] == "stop"
    responses = {"model": "spec-sim", "input": "llama wire", "max_output_tokens": -2}
    for field, response in (
        ("max_tokens", post(http, "/completions", max_tokens=-2)),
        ("max_completion_tokens", post(http, PATHS[0], max_tokens=5, max_completion_tokens=-2)),
        ("max_tokens", http.post("/responses", json=responses)),
    ):
        assert response.status_code == 400
        assert response.json() == {
            "error": {
                "code": 400,
                "message": f"Field '{field}': Value must be between -1 <= value <= "
                "2147483647, but got -2",
                "type": "invalid_request_error",
            }
        }


def test_other_engines_still_refuse_a_token_limit_below_one(sim: SimulatorServer) -> None:
    """Only the llama.cpp shape takes 0 and -1; the others answer as before, the request
    model's 400 naming the field."""
    body = {"model": "spec-sim", "prompt": "x", "max_tokens": 0}
    response = httpx.post(
        f"{sim.base_url}/completions", json=body, headers={"x-spec-decode-engine": "vllm"}
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "max_tokens: Input should be greater than or equal to 1",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": None,
        }
    }


def test_a_prompt_that_fills_the_context_is_llamacpps_own_400_and_a_reply_stops_at_its_end() -> (
    None
):
    """With ``llamacpp_n_ctx`` set, a prompt of at least that many tokens is refused as
    llama.cpp b11312 refuses it (``update_slots`` in ``server-context.cpp``: HTTP 400,
    type ``exceed_context_size_error``, the body's ``n_prompt_tokens`` and ``n_ctx``
    from ``server_task_result_error::to_json``), streamed or not. A shorter one is
    answered up to the context's end, finish ``length``: the step whose verified tokens
    reach it emits one token and ends the reply (``process_token`` checks the context
    with the whole step in the cache), and drafts stay within the room
    (``get_n_draft_max``). The real server with the tiny models' 256-token context and
    the identical draft (every draft accepted, 4 a step) answers a 242-token prompt with
    12 tokens of which 10 drafted, a 252-token one with 2 and 2 (tests/engines/ compares
    them)."""
    words = lambda n: " ".join(["word"] * n)  # noqa: E731 - one simulated token a word
    config = SimulatorConfig(engine="llamacpp", k=4, alpha=1.0, llamacpp_n_ctx=256)
    with SimulatorServer(config) as sim:
        for stream in (False, True):
            body = {"model": "spec-sim", "prompt": words(256), "max_tokens": 8, "stream": stream}
            response = httpx.post(f"{sim.base_url}/completions", json=body)
            assert response.status_code == 400
            assert response.json() == {
                "error": {
                    "code": 400,
                    "message": "request (256 tokens) exceeds the available context size "
                    "(256 tokens), try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 256,
                    "n_ctx": 256,
                }
            }
        for prompt_tokens, completion_tokens, drafted in ((242, 12, 10), (252, 2, 2)):
            body = {"model": "spec-sim", "prompt": words(prompt_tokens), "max_tokens": 16}
            answer = httpx.post(f"{sim.base_url}/completions", json=body).json()
            assert answer["choices"][0]["finish_reason"] == "length"
            assert answer["usage"]["completion_tokens"] == completion_tokens
            assert answer["timings"]["draft_n"] == drafted


@pytest.fixture(scope="module")
def exact() -> Iterator[SimulatorServer]:
    """Every draft accepted, 4 a step, in the tiny engine-test models' 256-token context."""
    config = SimulatorConfig(engine="llamacpp", k=4, alpha=1.0, llamacpp_n_ctx=256, seed=11)
    with SimulatorServer(config) as server:
        yield server


def _words(n: int) -> str:
    return " ".join(["word"] * n)  # one simulated token a word


def test_a_step_cut_short_by_a_stop_string_counts_all_its_drafts_accepted(
    exact: SimulatorServer,
) -> None:
    """llama.cpp b11312 adds a verify step's accepted drafts to ``n_draft_accepted``
    (``update_slots`` in ``server-context.cpp``) before ``process_token`` finds the stop
    string that ends the reply inside that step, so the tokens after the stop count
    accepted though never sent (the real server, tests/engines/). A stop completed by
    the third token ends the first step after two of its four accepted drafts."""
    body = {"model": "spec-sim", "prompt": "llama wire", "max_tokens": 16}
    headers = {"x-sim-seed": "3"}
    text = httpx.post(f"{exact.base_url}/completions", json=body, headers=headers).json()
    text = text["choices"][0]["text"]
    stop = text.split()[2][1:]  # the third token's word, from its second character
    assert text.find(stop) == len(" ".join(text.split()[:2])) + 2
    answer = httpx.post(
        f"{exact.base_url}/completions", json={**body, "stop": [stop]}, headers=headers
    ).json()
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == 3
    assert (answer["timings"]["draft_n"], answer["timings"]["draft_n_accepted"]) == (4, 4)


def test_a_step_cut_at_the_contexts_end_counts_all_its_drafts_accepted(
    exact: SimulatorServer,
) -> None:
    """The same for the context's end: a 251-token prompt leaves room for the first
    token and a step drafting three, which ends the reply at its first token; the
    real server answers 2 tokens, 3 drafted, 3 accepted."""
    body = {"model": "spec-sim", "prompt": _words(251), "max_tokens": 16}
    answer = httpx.post(f"{exact.base_url}/completions", json=body).json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 2
    assert (answer["timings"]["draft_n"], answer["timings"]["draft_n_accepted"]) == (3, 3)


def test_a_stop_string_on_the_contexts_last_token_ends_with_length(
    exact: SimulatorServer,
) -> None:
    """A stop string completed by the token that reaches the context's end: llama.cpp
    b11312's ``process_token`` (``server-context.cpp``) checks the context after the
    stop strings, and its ``STOP_TYPE_LIMIT`` replaces their ``STOP_TYPE_WORD``: finish
    ``length``, the text still cut at the stop (the real server, tests/engines/)."""
    headers = {"x-sim-seed": "3"}
    body = {"model": "spec-sim", "prompt": _words(251), "max_tokens": 16}
    reply = httpx.post(f"{exact.base_url}/completions", json=body, headers=headers).json()
    text = reply["choices"][0]["text"]
    assert (reply["choices"][0]["finish_reason"], reply["usage"]["completion_tokens"]) == (
        "length",
        2,
    )
    stop = text[-2:]
    assert text.find(stop) == len(text) - 2
    cut = httpx.post(
        f"{exact.base_url}/completions", json={**body, "stop": [stop]}, headers=headers
    ).json()
    assert (cut["choices"][0]["finish_reason"], cut["choices"][0]["text"]) == ("length", text[:-2])


def test_a_responses_stream_sends_a_stop_hits_timings_on_its_text_delta_too(
    http: Any,
) -> None:
    """A Responses stream ended by a stop string whose step has text before it: llama.cpp
    b11312 puts that partial result's ``timings`` (``send_partial_response`` in
    ``server-context.cpp``: stats once ``slot.stop`` is set) on its last event, the
    ``response.output_text.delta`` (``server_task_result_cmpl_partial::
    to_json_oaicompat_resp`` in ``server-task.cpp``), and again on
    ``response.completed`` (the real server, tests/engines/). The record is the
    completed event's: the adapter reads only an event that ends the response."""
    body = {"model": "spec-sim", "input": "llama wire", "max_output_tokens": 40}
    text = post_responses(http, body)
    stop = _stop_inside(text)
    response = http.post(
        "/responses", json={**body, "stream": True, "stop": [stop]}, headers={"x-sim-seed": "3"}
    )
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line[:6] == "data: "]
    carriers = [e for e in events if "timings" in e]
    assert [e["type"] for e in carriers] == ["response.output_text.delta", "response.completed"]
    assert carriers[0]["timings"] == carriers[1]["timings"]
    assert carriers[0]["delta"] == text[: text.find(stop)][-len(carriers[0]["delta"]) :]
    record = record_from_json(events, {**body, "stream": True, "stop": [stop]})
    assert record is not None
    assert record.num_accepted_draft_tokens == carriers[1]["timings"]["draft_n_accepted"]


def post_responses(http: Any, body: dict[str, Any]) -> str:
    response = http.post("/responses", json=body, headers={"x-sim-seed": "3"})
    return str(response.json()["output"][0]["content"][0]["text"])
