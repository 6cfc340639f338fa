"""The instrumentation against a real llama.cpp server doing speculative decoding on CPU.

Server: llama.cpp b11312 (commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f, the tree
vendored in the llama-cpp-python 0.3.36 sdist), built by scripts/install-llama-server.sh;
models from tests/engines/tiny_models.py. What these tests pin, from that source:

- tools/server/server-common.cpp, ``server_slot_stats::to_json``: ``timings`` carries
  ``draft_n`` and ``draft_n_accepted`` only when ``draft_n > 0``; no verify-step count.
- tools/server/server-task.cpp: non-streaming chat and completion bodies carry
  ``timings`` at the root; a chat stream puts it on its LAST delta
  (``deltas.back()["timings"]``): the ``finish_reason`` chunk, or the usage chunk
  (``choices: []``) when ``stream_options.include_usage`` is set; a completion stream's
  final chunk carries ``finish_reason``, ``usage`` and ``timings`` together.
- ``--metrics``: ``llamacpp:spec_decode_num_draft_tokens_total`` and
  ``llamacpp:spec_decode_num_accepted_tokens_total`` count the same tokens.

Every expected value is read from the response's own raw body or SSE text (kept by the
capture transport of tests/engines/harness.py), never from a constant.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import (
    A_ACCEPTED,
    A_DRAFTED,
    A_RATE,
    M_ACCEPTED_DRAFT_TOKENS,
    M_DRAFT_TOKENS,
    Exchanges,
    RawExchange,
    Telemetry,
    async_client,
    expected_attributes,
    instrumented,
    spec_attributes,
    sync_client,
)
from llama_server import M_ACCEPTED_TOKENS as SERVER_ACCEPTED
from llama_server import M_DRAFT_TOKENS as SERVER_DRAFTED
from llama_server import M_DRAFTS, SPEC_ARGS, LlamaInstall, LlamaServer, parse_prometheus_text

from check_command import PROBES, run_check
from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer

pytestmark = pytest.mark.engine

MAX_TOKENS = 16
STEP_ATTRIBUTES = (
    "spec_decode.num_spec_steps",
    "spec_decode.mean_acceptance_length",
    "spec_decode.acceptance_histogram",
)
PROMPTS = [f"Request {i}: tell me about the number {i * 7}." for i in range(8)]


def _params(endpoint: str, prompt: str, **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "model": "tiny-target",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        **extra,
    }
    if endpoint == "chat":
        params["messages"] = [{"role": "user", "content": prompt}]
    else:
        params["prompt"] = prompt
    return params


def _resource(client: Any, endpoint: str) -> Any:
    return client.chat.completions if endpoint == "chat" else client.completions


def _cli_record(raw: RawExchange, tmp_path: Path) -> dict[str, Any]:
    """``spec-decode-otel parse FILE`` on the raw body or SSE text."""
    path = tmp_path / f"capture-{len(list(tmp_path.iterdir()))}.{'sse' if raw.is_sse else 'json'}"
    path.write_text(raw.text)
    script = Path(sys.executable).with_name("spec-decode-otel")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "spec_decode_otel"]
    proc = subprocess.run(
        [*command, "parse", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record is not None, f"parse found no record in {path}: {raw.text[:500]}"
    return record


def _assert_spans_match(spans: list[Any], raws: list[RawExchange], *, ordered: bool) -> None:
    """Each span's spec_decode.* attributes are exactly what its response's timings say."""
    assert len(spans) == len(raws), (len(spans), [r.path for r in raws])
    got = [spec_attributes(s) for s in spans]
    want = [expected_attributes(r.timings()) for r in raws]
    if not ordered:  # concurrent: compare as multisets
        key = lambda a: (a[A_DRAFTED], a[A_ACCEPTED])  # noqa: E731
        got, want = sorted(got, key=key), sorted(want, key=key)
    for g, w in zip(got, want, strict=True):
        assert {k: g.get(k) for k in w} == {**w, A_RATE: pytest.approx(w[A_RATE], rel=1e-12)}
        # No verify-step count from llama.cpp: nothing derived from one may appear.
        assert not set(g) & set(STEP_ATTRIBUTES), g


def _assert_totals_reconcile(
    server: LlamaServer, before: dict[str, float], telemetry: Telemetry, raws: list[RawExchange]
) -> tuple[int, int]:
    """Server /metrics deltas == sum of the raw timings == the OTel counters' totals."""
    after = server.metrics()
    drafted = sum(r.timings()["draft_n"] for r in raws)
    accepted = sum(r.timings()["draft_n_accepted"] for r in raws)
    assert drafted > 0
    assert after[SERVER_DRAFTED] - before.get(SERVER_DRAFTED, 0.0) == drafted
    assert after[SERVER_ACCEPTED] - before.get(SERVER_ACCEPTED, 0.0) == accepted
    assert telemetry.counter_total(M_DRAFT_TOKENS) == drafted
    assert telemetry.counter_total(M_ACCEPTED_DRAFT_TOKENS) == accepted
    return drafted, accepted


def _extra(obj: Any) -> dict[str, Any]:
    return obj.model_extra or {}


# --------------------------------------------------------------------------- the matrix

MODES = [
    ("chat", "raw"),
    ("completions", "raw"),
    ("chat", "stream"),
    ("chat", "stream_usage"),
    ("completions", "stream"),
    ("completions", "stream_usage"),
]


@pytest.mark.parametrize(("endpoint", "mode"), MODES, ids=[f"{e}-{m}" for e, m in MODES])
def test_span_carries_the_responses_own_timings(
    endpoint: str,
    mode: str,
    llama_server: Any,
    telemetry: Telemetry,
    tmp_path: Path,
) -> None:
    """Sync client, noisy draft (partial acceptance): for each call shape, the span's
    spec_decode.* attributes equal that response's raw ``timings``, the caller still sees
    ``timings`` where llama.cpp put them, the CLI parses the same record from the raw
    capture, and the batch reconciles with the server's /metrics and the OTel counters."""
    server = llama_server("noisy")
    sink = Exchanges()
    before = server.metrics()
    seen_timings: list[dict[str, Any]] = []
    with sync_client(server.base_url, sink) as client:
        for prompt in PROMPTS[:2]:
            resource = _resource(client, endpoint)
            if mode == "raw":
                raw = resource.with_raw_response.create(**_params(endpoint, prompt))
                parsed = raw.parse()
                assert json.loads(raw.text)["timings"] == _extra(parsed)["timings"]
                assert parsed.usage.completion_tokens == MAX_TOKENS
                seen_timings.append(_extra(parsed)["timings"])
                continue
            extra = {"stream_options": {"include_usage": True}} if mode == "stream_usage" else {}
            with resource.create(**_params(endpoint, prompt, stream=True, **extra)) as stream:
                chunks = list(stream)
            carriers = [c for c in chunks if "timings" in _extra(c)]
            assert len(carriers) == 1, "exactly one chunk carries timings"
            (carrier,) = carriers
            if endpoint == "chat" and mode == "stream_usage":
                # With include_usage llama.cpp moves timings to the usage chunk.
                assert carrier.choices == [] and carrier.usage is not None
            elif endpoint == "chat":
                assert carrier.choices[0].finish_reason == "length"
                assert carrier.usage is None
            else:  # completion streams: one final chunk with everything
                assert carrier.choices[0].finish_reason == "length"
                assert carrier.usage is not None
            assert carrier is chunks[-1]
            seen_timings.append(_extra(carrier)["timings"])

    raws = sink.take()
    spans = telemetry.spans()
    assert [r.is_sse for r in raws] == [mode != "raw"] * 2
    assert [r.timings() for r in raws] == seen_timings  # the caller saw the raw values
    assert all(r.timings()["predicted_n"] == MAX_TOKENS for r in raws)
    _assert_spans_match(spans, raws, ordered=True)
    drafted, accepted = _assert_totals_reconcile(server, before, telemetry, raws)
    assert 0 < accepted < drafted, "the noisy draft should be partly accepted"

    for raw, span in zip(raws, spans, strict=True):
        record = _cli_record(raw, tmp_path)
        attrs = spec_attributes(span)
        assert record["engine"] == attrs["spec_decode.engine"] == "llamacpp"
        assert record["num_draft_tokens"] == attrs[A_DRAFTED]
        assert record["num_accepted_draft_tokens"] == attrs[A_ACCEPTED]
        assert record["draft_acceptance_rate"] == pytest.approx(attrs[A_RATE], rel=1e-12)
        # llama.cpp sends no verify-step count: no steps, mean or histogram.
        assert record["num_spec_steps"] is None
        assert record["mean_acceptance_length"] is None
        assert record["acceptance_histogram"] is None


RAW_READS = [("chat", "iter_lines"), ("chat", "iter_text"), ("completions", "iter_bytes")]


@pytest.mark.parametrize(("endpoint", "how"), RAW_READS, ids=[f"{e}-{h}" for e, h in RAW_READS])
def test_a_stream_read_raw_records_the_streams_own_timings(
    endpoint: str, how: str, llama_server: Any, telemetry: Telemetry
) -> None:
    """A gateway's way of reading a stream: ``with_streaming_response`` and the raw SSE
    through ``iter_lines``/``iter_text``/``iter_bytes``. The caller reads exactly the bytes
    llama.cpp sent, each span's spec_decode.* equal the ``timings`` in that raw SSE, and the
    batch reconciles with the server's /metrics: the raw-read path
    (instrumentation/responses.py, spec_decode_otel/sse.py) against llama.cpp's own SSE
    framing, not the simulator's."""
    server = llama_server("noisy")
    sink = Exchanges()
    before = server.metrics()
    read: list[list[Any]] = []
    with sync_client(server.base_url, sink) as client:
        for prompt in PROMPTS[:2]:
            params = _params(endpoint, prompt, stream=True)
            with _resource(client, endpoint).with_streaming_response.create(**params) as response:
                read.append(list(getattr(response, how)()))

    raws = sink.take()
    assert [r.is_sse for r in raws] == [True, True]
    for pieces, raw in zip(read, raws, strict=True):
        if how == "iter_lines":
            assert [line for line in pieces if line] == [
                line for line in raw.text.splitlines() if line
            ]
        else:
            assert (b"".join(pieces).decode() if how == "iter_bytes" else "".join(pieces)) == (
                raw.text
            )
    _assert_spans_match(telemetry.spans(), raws, ordered=True)
    drafted, accepted = _assert_totals_reconcile(server, before, telemetry, raws)
    assert 0 < accepted < drafted, "the noisy draft should be partly accepted"


async def test_async_client_spans_carry_each_responses_timings(
    llama_server: Any, telemetry: Telemetry
) -> None:
    """AsyncOpenAI: non-streaming chat, streaming completions and a streaming chat with
    include_usage, one after another; spans equal the raw timings, totals reconcile."""
    server = llama_server("noisy")
    sink = Exchanges()
    before = server.metrics()
    async with async_client(server.base_url, sink) as client:
        await client.chat.completions.create(**_params("chat", PROMPTS[2]))
        stream = await client.completions.create(**_params("completions", PROMPTS[3], stream=True))
        async with stream:
            [c async for c in stream]
        stream = await client.chat.completions.create(
            **_params("chat", PROMPTS[4], stream=True, stream_options={"include_usage": True})
        )
        async with stream:
            [c async for c in stream]
    raws = sink.take()
    chat, completions = "/v1/chat/completions", "/v1/completions"
    assert [r.path for r in raws] == [chat, completions, chat]
    assert [r.is_sse for r in raws] == [False, True, True]
    _assert_spans_match(telemetry.spans(), raws, ordered=True)
    _assert_totals_reconcile(server, before, telemetry, raws)


async def test_eight_concurrent_requests_reconcile_with_server_metrics(
    llama_server: Any, telemetry: Telemetry
) -> None:
    """8 requests at once (chat and completions, streaming and not) through one async
    client: one span per request with its own response's counts, and the batch's OTel
    counter totals equal the server's /metrics deltas exactly."""
    server = llama_server("noisy")
    sink = Exchanges()
    before = server.metrics()

    async def one(client: Any, i: int) -> None:
        endpoint = "chat" if i % 2 else "completions"
        if i % 4 < 2:
            await _resource(client, endpoint).create(**_params(endpoint, PROMPTS[i]))
            return
        stream = await _resource(client, endpoint).create(
            **_params(endpoint, PROMPTS[i], stream=True)
        )
        async with stream:
            [c async for c in stream]

    async with async_client(server.base_url, sink) as client:
        await asyncio.gather(*(one(client, i) for i in range(8)))
    raws = sink.take()
    assert len(raws) == 8
    _assert_spans_match(telemetry.spans(), raws, ordered=False)
    _assert_totals_reconcile(server, before, telemetry, raws)


# --------------------------------------------------------------------------- drafts


def _run_batch(server: LlamaServer, telemetry: Telemetry, n: int) -> tuple[list[Any], list[Any]]:
    sink = Exchanges()
    before = server.metrics()
    with sync_client(server.base_url, sink) as client:
        for i in range(n):
            client.chat.completions.create(**_params("chat", PROMPTS[i]))
    raws = sink.take()
    spans = telemetry.spans()
    _assert_spans_match(spans, raws, ordered=True)
    _assert_totals_reconcile(server, before, telemetry, raws)
    return spans, raws


def test_identical_draft_is_always_accepted(llama_server: Any, telemetry: Telemetry) -> None:
    """Draft = a byte-identical copy of the target: greedy drafts always match, so every
    span reports rate 1.0 with accepted == drafted > 0."""
    spans, _ = _run_batch(llama_server("identical"), telemetry, 3)
    for span in spans:
        attrs = spec_attributes(span)
        assert attrs[A_DRAFTED] > 0
        assert attrs[A_ACCEPTED] == attrs[A_DRAFTED]
        assert attrs[A_RATE] == 1.0


def test_independent_draft_is_almost_never_accepted(
    llama_server: Any, telemetry: Telemetry
) -> None:
    """Draft = a model of another seed: its guesses are unrelated to the target's, so
    the rate stays near 0 (below 0.2 per request)."""
    spans, _ = _run_batch(llama_server("independent"), telemetry, 3)
    for span in spans:
        attrs = spec_attributes(span)
        assert attrs[A_DRAFTED] > 0
        assert attrs[A_RATE] < 0.2


def test_timings_per_token_stream_records_the_final_counts(
    llama_server: Any, telemetry: Telemetry
) -> None:
    """llama.cpp's ``timings_per_token: true`` puts a running ``timings`` on (almost)
    every chunk (server-task.cpp, partial results); the span must carry the final
    counts, those of the last chunk, not an earlier running value."""
    server = llama_server("noisy")
    sink = Exchanges()
    before = server.metrics()
    with (
        sync_client(server.base_url, sink) as client,
        client.chat.completions.create(
            **_params("chat", PROMPTS[6], stream=True, extra_body={"timings_per_token": True})
        ) as stream,
    ):
        list(stream)
    (raw,) = sink.take()
    running = [m["timings"] for m in raw.messages() if "draft_n" in m.get("timings", {})]
    assert len(running) > 2 and running[0]["draft_n"] < running[-1]["draft_n"]
    (span,) = telemetry.spans()
    want = expected_attributes(running[-1])
    assert {k: spec_attributes(span).get(k) for k in want} == want
    after = server.metrics()
    assert after[SERVER_DRAFTED] - before.get(SERVER_DRAFTED, 0.0) == running[-1]["draft_n"]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_timings_per_token_stream_left_early_has_no_record(
    llama_server: Any, telemetry: Telemetry, endpoint: str
) -> None:
    """A ``timings_per_token`` stream left before its last chunk: the running counts it
    carried so far are not the request's (the server goes on drafting), so the call is
    ``not_read_to_end`` with no record and no counts, as without ``timings_per_token``.
    llama.cpp b11312 (tools/server/server-task.cpp) puts the running ``timings`` on
    partial results (``server_task_result_cmpl_partial``); the final ones come with the
    ``finish_reason``."""
    server = llama_server("noisy")
    params = _params(endpoint, PROMPTS[5], stream=True, extra_body={"timings_per_token": True})
    running = None
    with (
        sync_client(server.base_url, Exchanges()) as client,
        _resource(client, endpoint).create(**params) as stream,
    ):
        for chunk in stream:
            timings = (chunk.model_extra or {}).get("timings") or {}
            if timings.get("draft_n") and chunk.choices[0].finish_reason is None:
                running = timings
                break
    assert running is not None and running["draft_n"] > 0  # the stream was left mid-way
    (span,) = telemetry.spans()
    assert span.attributes["spec_decode.outcome"] == "not_read_to_end"
    assert A_DRAFTED not in spec_attributes(span)
    assert telemetry.counter_total(M_DRAFT_TOKENS) == 0


async def test_stream_of_several_prompts_names_its_model_despite_a_null_first_event(
    llama_server: Any, telemetry: Telemetry
) -> None:
    """A completions stream for a list of prompts starts with ``data: null`` (llama.cpp
    b11312; one prompt, or ``n`` > 1, sends none). The SDK yields that ``None`` to the
    caller as it is; the span still names the model the later chunks carry, as the same
    stream read raw does, and the call is ``multi_sequence``. Sync and async clients."""
    server = llama_server("noisy")
    params = _params("completions", PROMPTS[1], stream=True)
    params["prompt"] = [PROMPTS[1], PROMPTS[2]]
    with (
        sync_client(server.base_url, Exchanges()) as client,
        client.completions.create(**params) as stream,
    ):
        sync_chunks = list(stream)
    async with async_client(server.base_url, Exchanges()) as client:
        stream = await client.completions.create(**params)
        async with stream:
            async_chunks = [c async for c in stream]
    for chunks in (sync_chunks, async_chunks):
        assert chunks[0] is None  # what the caller sees, with or without us
        models = {c.model for c in chunks[1:]}
        assert len(models) == 1 and models != {None}
    spans = telemetry.spans()
    assert [s.attributes["spec_decode.outcome"] for s in spans] == ["multi_sequence"] * 2
    assert [s.attributes.get("gen_ai.response.model") for s in spans] == [*models] * 2


def test_a_stop_string_hit_sends_timings_twice_and_the_span_records_the_last(
    llama_server: Any, telemetry: Telemetry
) -> None:
    """A completions stream ended by a ``stop`` string: llama.cpp b11312 sends ``timings``
    on two chunks, the partial chunk of the token that completed the stop (its text the
    part before the stop, maybe empty) and the final chunk (``send_partial_response`` in
    ``tools/server/server-context.cpp`` fills ``stats`` once ``slot.stop`` is set, and
    ``find_stopping_strings`` sets it before that partial is sent). Both say the same
    counts; the span records the last, and it reconciles with the server's /metrics.
    The stop string is cut from the middle of the same prompt's greedy reply."""
    server = llama_server("noisy")
    sink = Exchanges()
    with sync_client(server.base_url, sink) as client:
        text = client.completions.create(**_params("completions", PROMPTS[1])).choices[0].text
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        telemetry.take_spans()
        sink.take()
        before = server.metrics()
        params = _params("completions", PROMPTS[1], stream=True, stop=[stop])
        with client.completions.create(**params) as stream:
            chunks = list(stream)
    (raw,) = sink.take()
    carriers = [m for m in raw.messages() if "timings" in m]
    assert len(carriers) == 2, raw.text
    assert carriers[0]["timings"] == carriers[1]["timings"]
    assert carriers[0]["choices"][0]["finish_reason"] is None
    assert carriers[1]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c.choices[0].text for c in chunks) == text[: text.find(stop)]
    assert raw.timings() == carriers[-1]["timings"]
    (span,) = telemetry.spans()
    want = expected_attributes(raw.timings())
    assert {k: spec_attributes(span).get(k) for k in want} == want
    after = server.metrics()
    assert after[SERVER_DRAFTED] - before.get(SERVER_DRAFTED, 0.0) == raw.timings()["draft_n"]


# --------------------------------------------------------------------------- the simulator


@pytest.fixture(scope="module")
def simulated_llamacpp() -> Iterator[SimulatorServer]:
    """The simulator's llama.cpp shape drafting as the server with the identical draft
    does: the server's draft length (``--spec-draft-n-max``), every draft accepted, the
    tiny models' context, and replies that never end by themselves within it (the tiny
    target's greedy replies run to a limit)."""
    from tiny_models import N_CTX

    k = int(SPEC_ARGS[SPEC_ARGS.index("--spec-draft-n-max") + 1])
    config = SimulatorConfig(
        engine="llamacpp",
        k=k,
        alpha=1.0,
        llamacpp_n_ctx=N_CTX,
        min_length=2 * N_CTX,
        max_length=2 * N_CTX,
    )
    with SimulatorServer(config) as sim:
        yield sim


def _metrics(url: str) -> dict[str, float]:
    return parse_prometheus_text(httpx.get(f"{url}/metrics", timeout=10.0).text)


def _answer(base_url: str, **body: Any) -> tuple[int, Any]:
    """Status and what a client can tell of one completions answer: the error body, or
    the finish reason, the token count and the draft counts."""
    body = {"model": "tiny-target", "prompt": PROMPTS[1], "temperature": 0, **body}
    response = httpx.post(f"{base_url}/completions", json=body, timeout=120.0)
    answer = response.json()
    if response.status_code != 200:
        return response.status_code, answer
    timings = answer["timings"]
    counts = (timings.get("draft_n"), timings.get("draft_n_accepted"))
    choice = answer["choices"][0]
    return 200, (choice["finish_reason"], answer["usage"]["completion_tokens"], *counts)


@pytest.mark.parametrize("max_tokens", [0, 1, 2, 3, 4, 5, 8, 16, -2])
def test_the_simulator_drafts_and_limits_as_llamacpp_does_for_max_tokens(
    max_tokens: int, llama_server: Any, simulated_llamacpp: SimulatorServer
) -> None:
    """llama.cpp b11312 against the simulator, ``max_tokens`` at and near its edges.

    - 0 is answered, with one token (finish ``length``): ``process_token``
      (``tools/server/server-context.cpp``) checks the budget only once a token is out;
      below -1 it is llama.cpp's own 400 (``server-schema.cpp``: ``n_predict`` hard
      limits -1 .. INT32_MAX).
    - A draft is cut to the tokens left minus one (``get_n_draft_max``: ``n_remaining()
      - 1``), so a reply of at most two tokens drafts nothing (no ``draft_n``), and with
      every draft accepted ``draft_n`` is exactly what that rule leaves."""
    server = llama_server("identical")
    real_before, sim_before = server.metrics(), _metrics(simulated_llamacpp.url)
    real = _answer(server.base_url, max_tokens=max_tokens)
    simulated = _answer(simulated_llamacpp.base_url, max_tokens=max_tokens)
    assert simulated == real
    # Verify steps: only a step that drafted counts (``n_draft_verif_steps``).
    real_steps = server.metrics().get(M_DRAFTS, 0.0) - real_before.get(M_DRAFTS, 0.0)
    sim_steps = _metrics(simulated_llamacpp.url)[M_DRAFTS] - sim_before[M_DRAFTS]
    assert sim_steps == real_steps


@pytest.mark.parametrize(("words", "max_tokens"), [(0, -1), (240, 16), (250, 16), (254, 16)])
def test_the_simulator_ends_and_refuses_at_the_context_as_llamacpp_does(
    words: int, max_tokens: int, llama_server: Any, simulated_llamacpp: SimulatorServer
) -> None:
    """llama.cpp b11312 against the simulator given the same context (the tiny models'
    256 tokens) and a prompt of the same token count (the simulator counts a word a
    token; the real count is read from the real answer). A prompt that fills the
    context is the same 400 (``exceed_context_size_error``, ``update_slots`` in
    ``tools/server/server-context.cpp``); a shorter one ends at the context's end with
    the same token and draft counts (``process_token``, ``get_n_draft_max``), the
    drafts of the step cut at the end counted accepted (``n_draft_accepted`` grows
    before ``process_token`` ends the reply, in ``update_slots``)."""
    prompt = " ".join(["word"] * words) if words else PROMPTS[1]
    real_status, real = _answer(
        llama_server("identical").base_url, prompt=prompt, max_tokens=max_tokens
    )
    if real_status == 400:
        count = real["error"]["n_prompt_tokens"]
    else:
        count = httpx.post(
            f"{llama_server('identical').base_url}/completions",
            json={"prompt": prompt, "max_tokens": 1},
            timeout=120.0,
        ).json()["usage"]["prompt_tokens"]
    simulated_status, simulated = _answer(
        simulated_llamacpp.base_url, prompt=" ".join(["word"] * count), max_tokens=max_tokens
    )
    assert (simulated_status, simulated) == (real_status, real)


def test_the_simulator_sends_a_stop_hits_timings_twice_as_llamacpp_does(
    llama_server: Any, simulated_llamacpp: SimulatorServer
) -> None:
    """A completions stream ended by a ``stop`` string, on both servers: ``timings`` on
    the stop token's chunk (no finish reason yet) and again on the final chunk, the
    same counts on both. Each server's stop string is cut from its own reply (the
    simulator's made the same by a fixed ``x-sim-seed``)."""
    seed = {"extra_headers": {"x-sim-seed": "5"}}

    def carriers(base_url: str) -> list[tuple[str | None, bool]]:
        sink = Exchanges()
        with sync_client(base_url, sink) as client:
            reply = client.completions.create(**_params("completions", PROMPTS[1], **seed))
            text = reply.choices[0].text
            stop = text[len(text) // 2 : len(text) // 2 + 3]
            params = _params("completions", PROMPTS[1], stream=True, stop=[stop], **seed)
            with client.completions.create(**params) as stream:
                list(stream)
        raw = sink.take()[-1]
        found = [m for m in raw.messages() if "timings" in m]
        return [(m["choices"][0]["finish_reason"], m["timings"] == raw.timings()) for m in found]

    real = carriers(llama_server("identical").base_url)
    assert real == [(None, True), ("stop", True)]
    assert carriers(simulated_llamacpp.base_url) == real


#: The simulator's reply fixed (the real server's greedy one is fixed anyway).
SIM_SEED = {"x-sim-seed": "5"}


def _completion(base_url: str, **body: Any) -> dict[str, Any]:
    body = {"model": "tiny-target", "prompt": PROMPTS[1], "temperature": 0, **body}
    response = httpx.post(f"{base_url}/completions", json=body, headers=SIM_SEED, timeout=120.0)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _counts(answer: dict[str, Any]) -> tuple[Any, ...]:
    """What the draft accounting of one completions answer comes to."""
    timings = answer["timings"]
    finish = answer["choices"][0]["finish_reason"]
    return (
        finish,
        answer["usage"]["completion_tokens"],
        timings["draft_n"],
        timings["draft_n_accepted"],
    )


def _stop_ending_at(text: str, end: int) -> str:
    """The shortest stop string (two characters or more) whose first match ends at
    ``end`` of ``text``."""
    for size in range(2, end + 1):
        if text.find(text[end - size : end]) == end - size:
            return text[end - size : end]
    raise AssertionError(f"no stop string ends first at {end} of {text!r}")


@pytest.mark.parametrize("token", [2, 3, 5, 8])
def test_the_simulator_counts_the_drafts_of_a_step_cut_by_a_stop_string_accepted_as_llamacpp(
    token: int, llama_server: Any, simulated_llamacpp: SimulatorServer
) -> None:
    """A stop string completed by the ``token``-th token (from 0) of a verify step: both
    servers end the reply there, and llama.cpp b11312 counts every draft the step
    verified as accepted, the ones after the stop too (``update_slots`` in
    ``tools/server/server-context.cpp`` adds ``n_accepted`` to ``n_draft_accepted``
    before ``process_token`` finds the stop). With the identical draft (every draft
    accepted, 4 a step, the first step from token 1) only token 5 ends its step; the
    others cut one. Each server's stop string ends at that token of its own reply."""

    def counts(base_url: str, stream_tokens: bool) -> tuple[Any, ...]:
        reply = _completion(base_url, max_tokens=MAX_TOKENS)["choices"][0]["text"]
        if stream_tokens:  # the real server streams one token a chunk
            body = {"model": "tiny-target", "prompt": PROMPTS[1], "temperature": 0}
            params = {**body, "max_tokens": MAX_TOKENS, "stream": True}
            with httpx.stream("POST", f"{base_url}/completions", json=params) as response:
                data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
            pieces = [json.loads(d)["choices"][0]["text"] for d in data[:-1]][:MAX_TOKENS]
        else:  # the simulator's token is a word
            pieces = re.findall(r"\s?\S+", reply)
        assert "".join(pieces) == reply and len(pieces) == MAX_TOKENS
        stop = _stop_ending_at(reply, len("".join(pieces[: token + 1])))
        return _counts(_completion(base_url, max_tokens=MAX_TOKENS, stop=[stop]))

    real = counts(llama_server("identical").base_url, stream_tokens=True)
    assert real[:2] == ("stop", token + 1) and real[2] == real[3]
    assert counts(simulated_llamacpp.base_url, stream_tokens=False) == real


def test_the_simulator_ends_a_stop_string_hit_at_the_contexts_end_with_length_as_llamacpp(
    llama_server: Any, simulated_llamacpp: SimulatorServer
) -> None:
    """A stop string completed by the token that also reaches the context's end:
    llama.cpp b11312's ``process_token`` (``tools/server/server-context.cpp``) finds the
    stop first (``STOP_TYPE_WORD``, the stop cut from the text), then the context check
    sets ``STOP_TYPE_LIMIT``: finish ``length``, the text still cut at the stop. A
    250-word prompt leaves room for two tokens; each server's stop string ends at the
    end of its own two-token reply."""

    def answer(base_url: str, prompt: str) -> tuple[Any, ...]:
        reply = _completion(base_url, prompt=prompt, max_tokens=MAX_TOKENS)
        text = reply["choices"][0]["text"]
        stop = _stop_ending_at(text, len(text))
        cut = _completion(base_url, prompt=prompt, max_tokens=MAX_TOKENS, stop=[stop])
        kept = cut["choices"][0]["text"] == text[: text.find(stop)]
        return (*_counts(reply), *_counts(cut), kept)

    server = llama_server("identical")
    words = " ".join(["word"] * 250)
    count = _completion(server.base_url, prompt=words, max_tokens=1)["usage"]["prompt_tokens"]
    real = answer(server.base_url, words)
    assert real[4:] == ("length", 2, real[6], real[6], True)
    assert answer(simulated_llamacpp.base_url, " ".join(["word"] * count)) == real


def test_the_simulator_puts_a_stop_hits_timings_on_its_responses_delta_as_llamacpp_does(
    llama_server: Any, simulated_llamacpp: SimulatorServer
) -> None:
    """A Responses stream (``/v1/responses``) ended by a stop string that begins inside
    a token: llama.cpp b11312 sends the text before the stop in the partial result of
    the token that completes it, and that partial carries ``timings``
    (``send_partial_response`` in ``tools/server/server-context.cpp``: stats once
    ``slot.stop`` is set), which
    ``server_task_result_cmpl_partial::to_json_oaicompat_resp`` (``server-task.cpp``)
    puts on its last event, the ``response.output_text.delta``. The final
    ``response.completed`` carries them again, the same counts. Each server's stop is
    three characters from the second character of the third word of its own reply."""

    def carriers(base_url: str) -> list[tuple[str, bool]]:
        body = {"model": "tiny-target", "input": PROMPTS[1], "temperature": 0}
        body["max_output_tokens"] = MAX_TOKENS
        reply = httpx.post(f"{base_url}/responses", json=body, headers=SIM_SEED, timeout=120.0)
        text = reply.json()["output"][0]["content"][0]["text"]
        word = re.findall(r"\s?\S+", text)[2]
        start = text.find(word) + 1
        stop = text[start : start + 3]
        assert len(word) > 3 and text.find(stop) == start
        params = {**body, "stream": True, "stop": [stop]}
        url = f"{base_url}/responses"
        with httpx.stream("POST", url, json=params, headers=SIM_SEED, timeout=120.0) as response:
            data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        events = [json.loads(d) for d in data]
        last = events[-1]["timings"]
        return [(e["type"], e["timings"] == last) for e in events if "timings" in e]

    real = carriers(llama_server("identical").base_url)
    assert real == [("response.output_text.delta", True), ("response.completed", True)]
    assert carriers(simulated_llamacpp.base_url) == real


def test_two_choices_give_no_record(llama_server: Any, telemetry: Telemetry) -> None:
    """``n=2``: llama.cpp answers with two choices and ONE root ``timings``, which cannot
    be split per sequence, so there is no record (README, "No record at all"), and the
    OTel counters stay at 0 while the server's own counter moves."""
    server = llama_server("noisy")
    sink = Exchanges()
    before = server.metrics()
    with sync_client(server.base_url, sink) as client:
        raw = client.chat.completions.with_raw_response.create(**_params("chat", PROMPTS[7], n=2))
        assert len(raw.parse().choices) == 2
    (exchange,) = sink.take()
    assert exchange.timings()["draft_n"] > 0
    (span,) = telemetry.spans()
    assert A_DRAFTED not in spec_attributes(span)
    assert telemetry.counter_total(M_DRAFT_TOKENS) == 0
    assert server.metrics()[SERVER_DRAFTED] > before.get(SERVER_DRAFTED, 0.0)


# --------------------------------------------------------------------------- switches


def test_draft_model_without_spec_type_sends_no_stats(
    llama_server: Any, telemetry: Telemetry
) -> None:
    """``-md draft.gguf`` alone loads the draft but never drafts in llama.cpp b11312
    (``--spec-type`` defaults to none; common/arg.cpp infers a type only for DFlash,
    DSpark and MTP drafts): no ``draft_n`` in ``timings``, so the span carries no
    record attributes and the server's draft counter does not move."""
    server = llama_server("identical", spec=False)
    sink = Exchanges()
    before = server.metrics()
    with sync_client(server.base_url, sink) as client:
        client.chat.completions.create(**_params("chat", PROMPTS[0]))
    (raw,) = sink.take()
    timings = raw.timings()
    assert timings["predicted_n"] == MAX_TOKENS
    assert "draft_n" not in timings
    (span,) = telemetry.spans()
    record_keys = set(expected_attributes({"draft_n": 1, "draft_n_accepted": 0}))
    assert not set(spec_attributes(span)) & (record_keys | set(STEP_ATTRIBUTES))
    assert server.metrics().get(SERVER_DRAFTED, 0.0) == before.get(SERVER_DRAFTED, 0.0)


def test_injected_include_usage_moves_timings_out_of_the_callers_view(
    llama_server: Any,
) -> None:
    """With ``inject_include_usage=True`` the request goes out with include_usage, so
    llama.cpp puts ``timings`` on the usage chunk instead of the finish_reason chunk; the
    instrumentation hides that injected chunk, so the caller sees no ``timings`` at all,
    while the span still has the record."""
    server = llama_server("noisy")
    sink = Exchanges()
    with instrumented(inject_include_usage=True) as telemetry:
        with (
            sync_client(server.base_url, sink) as client,
            client.chat.completions.create(**_params("chat", PROMPTS[5], stream=True)) as stream,
        ):
            chunks = list(stream)
        spans = telemetry.spans()
    (raw,) = sink.take()
    assert raw.request["stream_options"] == {"include_usage": True}  # injected
    carrier = raw.timings_message()
    assert carrier["choices"] == [] and "usage" in carrier  # on the (hidden) usage chunk
    assert chunks and all(c.choices for c in chunks)  # the caller never sees it
    assert not [c for c in chunks if "timings" in _extra(c)]
    assert chunks[-1].choices[0].finish_reason == "length"
    _assert_spans_match(spans, [raw], ordered=True)


def test_injected_include_usage_leaves_completion_streams_whole(llama_server: Any) -> None:
    """A llama.cpp completion stream has no separate usage chunk: its final chunk carries
    text, ``finish_reason``, ``usage`` and ``timings`` together. With
    ``inject_include_usage=True`` the caller must still get every chunk, that final
    one included (nothing to hide), and the span the record."""
    server = llama_server("noisy")
    sink = Exchanges()
    with instrumented(inject_include_usage=True) as telemetry:
        with (
            sync_client(server.base_url, sink) as client,
            client.completions.create(**_params("completions", PROMPTS[6], stream=True)) as stream,
        ):
            chunks = list(stream)
        spans = telemetry.spans()
    (raw,) = sink.take()
    events = raw.messages()
    assert raw.request["stream_options"] == {"include_usage": True}  # injected
    assert len(chunks) == len(events)
    text = "".join(c.choices[0].text for c in chunks)
    assert text == "".join(e["choices"][0]["text"] for e in events)
    assert _extra(chunks[-1])["timings"] == raw.timings()
    assert chunks[-1].usage is not None and chunks[-1].choices[0].finish_reason == "length"
    _assert_spans_match(spans, [raw], ordered=True)


def test_server_reports_the_pinned_llamacpp_build(
    llama_server: Any, llama_install: LlamaInstall
) -> None:
    """The binary under test is the pinned llama.cpp build: its responses' system
    fingerprint (``llama_build_info()``) names build 11312, commit 0c1e57098."""
    server = llama_server("noisy")
    sink = Exchanges()
    with sync_client(server.base_url, sink) as client:
        client.chat.completions.create(**_params("chat", PROMPTS[0]))
    (raw,) = sink.take()
    assert raw.messages()[0]["system_fingerprint"] == "b11312-0c1e57098"
    assert "build b11312, commit 0c1e57098" in llama_install.build_info


def test_tiny_models_are_byte_for_byte_reproducible(
    llama_install: LlamaInstall, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """The generator is deterministic: the identical draft is the target's bytes, and
    writing the target again gives the same file."""
    from tiny_models import MODELS, write_model

    target = tiny_models["target"].read_bytes()
    assert tiny_models["identical"].read_bytes() == target
    assert tiny_models["noisy"].read_bytes() != target
    seed, noise = MODELS["target"]
    again = write_model(tmp_path / "again.gguf", llama_install.vocab, seed=seed, noise=noise)
    assert again.read_bytes() == target


# --------------------------------------------------------------------------- the check command


def test_check_reads_the_real_server_with_and_without_drafting(llama_server: Any) -> None:
    """``spec-decode-otel check`` against llama.cpp b11312 itself. Drafting (``-md`` with
    ``--spec-type``): the plain call and both streams are partial records of engine
    llamacpp (it sends ``timings`` on a stream's final chunk whether or not the request
    asks for usage) and the command exits 0. The draft loaded without a spec type: no
    call has stats, and it exits 1 naming llama.cpp's switch, told by the ``timings``
    without draft counts that the server sends."""
    for spec, status, outcome in ((True, 0, "partial"), (False, 1, "no_stats")):
        server = llama_server("identical", spec=spec)
        exit_status, lines, out = run_check(
            server.base_url, "--model", "tiny-target", "--max-tokens", str(MAX_TOKENS)
        )
        assert exit_status == status, out
        for probe in PROBES:
            assert lines[probe].split()[0] == outcome
            if spec:
                assert "engine llamacpp  acceptance rate" in lines[probe]
        if not spec:
            assert "sends timings (llama.cpp, mlx-vlm) without draft counts" in out
            assert "--spec-type (draft-simple with -md, or an n-gram type" in out
            assert "too short to draft for" not in out
    # A reply of one token leaves nothing to draft, on a server that drafts: the switch
    # it already has was all the command named; now it says the reply may be too short.
    server = llama_server("identical", spec=True)
    exit_status, lines, out = run_check(
        server.base_url, "--model", "tiny-target", "--max-tokens", "1"
    )
    assert exit_status == 1, out
    assert [lines[probe].split()[0] for probe in PROBES] == ["no_stats"] * 3
    assert "or the reply was too short to draft for (--max-tokens 1)" in " ".join(out.split())
