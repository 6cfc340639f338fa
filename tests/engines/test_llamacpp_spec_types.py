"""llama.cpp's other drafters: n-gram (no draft model) and synthetic acceptance.

Server: llama.cpp b11312 (commit 0c1e57098, the tree vendored in the llama-cpp-python
0.3.36 sdist), built by scripts/install-llama-server.sh; models from tiny_models.py.
What these tests rely on, from that source:

- ``--spec-type ngram-simple|ngram-map-k|ngram-map-k4v|ngram-mod|ngram-cache``
  (common/speculative.cpp) draft by looking the context's last tokens up in the
  context itself (ngram-mod: in a hash pool shared by all requests; ngram-cache: in a
  per-slot cache). They go through the same server loop as a draft model
  (tools/server/server-context.cpp: ``slot.stats.n_draft_tokens += draft.size()``,
  ``n_draft_accepted += n_accepted``), so ``timings`` is the same as with
  ``draft-simple``: ``draft_n`` and ``draft_n_accepted``, present only when
  ``draft_n > 0`` (server-common.cpp, ``server_slot_stats::to_json``), and no field
  naming the drafter. A response with nothing drafted has no ``draft_n`` at all.
- ``--spec-synth-rates P0,...`` (one per draft position, non-increasing) and
  ``--spec-synth-len L`` (geometric rates with ``1 + sum = L``) replace the target's
  verdict by a coin flip per position (``server_sample_and_accept_synth``), the coin
  seeded from the request's ``seed``. Rates of only 0 and 1 take no coin at all: every
  draft keeps exactly its first ``k`` tokens.

To make a random-weights target repeat itself (what n-gram drafting feeds on), every
request here puts a ``logit_bias`` of +100 on a few number words, so the target's
greedy output is a repetitive but irregular string of those words; the prompts repeat
them too. "three" is left out: with it the target settles into one word repeated,
and ngram-simple drafts nothing from a run of one token (its latest match has fewer
than size-n tokens after it). The n-gram sizes are small (3 looked up, 6 drafted)
so that 64-token replies draft. ``-np 1``: one slot, so ngram-cache's per-slot cache
(filled from the first prompt a slot sees) is the same for every request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import (
    A_ACCEPTED,
    A_DRAFTED,
    A_ENGINE,
    A_RATE,
    M_ACCEPTED_DRAFT_TOKENS,
    M_DRAFT_TOKENS,
    Exchanges,
    RawExchange,
    Telemetry,
    expected_attributes,
    spec_attributes,
    sync_client,
)
from llama_server import M_ACCEPTED_TOKENS as SERVER_ACCEPTED
from llama_server import M_DRAFT_TOKENS as SERVER_DRAFTED
from llama_server import M_DRAFTS as SERVER_STEPS
from llama_server import SPEC_ARGS, LlamaInstall, LlamaServer, StackError

from spec_decode_otel.instrumentation.hints import hints

pytestmark = pytest.mark.engine

A_OUTCOME = "spec_decode.outcome"
STEP_ATTRIBUTES = (
    "spec_decode.num_spec_steps",
    "spec_decode.mean_acceptance_length",
    "spec_decode.acceptance_histogram",
)
MAX_TOKENS = 64
#: draft-simple's draft length (llama_server.SPEC_ARGS), the synthetic tests' n_max.
DRAFT_N_MAX = int(SPEC_ARGS[SPEC_ARGS.index("--spec-draft-n-max") + 1])
ONE_SLOT = ("-np", "1")
WORDS = "one two four five six seven eight nine ten"
BODY = (
    "one nine one nine one nine seven ten eight seven ten eight six ten eight six ten "
    "eight one eight one eight one eight"
)
#: Each n-gram type's size flags (small, so that 64-token replies draft).
NGRAM_ARGS: dict[str, list[str]] = {
    name: flags.split()
    for name, flags in {
        "ngram-simple": "--spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 6",
        "ngram-map-k": "--spec-ngram-map-k-size-n 3 --spec-ngram-map-k-size-m 6",
        "ngram-map-k4v": "--spec-ngram-map-k4v-size-n 3 --spec-ngram-map-k4v-size-m 6",
        "ngram-mod": "--spec-ngram-mod-n-match 4 --spec-ngram-mod-n-min 2 --spec-ngram-mod-n-max 6",
        "ngram-cache": "",  # no size flags: it drafts up to 8 tokens from 1- to 4-grams
    }.items()
}
#: (endpoint, mode): every way a response carries ``timings``.
SHAPES = [
    ("chat", "raw"),
    ("completions", "raw"),
    ("chat", "stream"),
    ("chat", "stream_usage"),
    ("completions", "stream"),
]


@pytest.fixture
def start_server(
    llama_install: LlamaInstall,
    tiny_models: dict[str, Path],
    tmp_path: Path,
) -> Iterator[Callable[..., LlamaServer]]:
    """Factory: ``start_server(name, args, draft=None)`` -> a running one-slot server,
    stopped when the test ends."""
    running: list[LlamaServer] = []

    def start(name: str, args: Sequence[str], draft: str | None = None) -> LlamaServer:
        server = LlamaServer(
            llama_install,
            tiny_models["target"],
            None if draft is None else tiny_models[draft],
            tmp_path,
            name=name,
            args=[*args, *ONE_SLOT],
        )
        try:
            server.start()
        except StackError as exc:
            pytest.fail(f"{name} did not start: {exc}", pytrace=False)
        running.append(server)
        return server

    try:
        yield start
    finally:
        for server in running:
            server.stop()


def _ngram_server(start_server: Callable[..., LlamaServer], spec_type: str) -> LlamaServer:
    return start_server(spec_type, ["--spec-type", spec_type, *NGRAM_ARGS[spec_type]])


def _word_bias(server: LlamaServer) -> dict[str, int]:
    """+100 on each of WORDS' tokens (read from the server's own tokenizer)."""
    with httpx.Client(timeout=10.0) as http:
        r = http.post(f"{server.url}/tokenize", json={"content": WORDS})
        r.raise_for_status()
        tokens = r.json()["tokens"]
    assert len(tokens) == len(WORDS.split()), tokens  # one token per word
    return {str(token): 100 for token in tokens}


def _call(client: Any, endpoint: str, mode: str, prompt: str, **params: Any) -> None:
    """One request in the given shape, read to its end."""
    params = {"model": "tiny-target", "temperature": 0, **params}
    if endpoint == "chat":
        resource: Any = client.chat.completions
        params["messages"] = [{"role": "user", "content": prompt}]
    else:
        resource = client.completions
        params["prompt"] = prompt
    if mode == "raw":
        resource.create(**params)
        return
    if mode == "stream_usage":
        params["stream_options"] = {"include_usage": True}
    with resource.create(stream=True, **params) as stream:
        list(stream)


def _assert_spans_match(spans: Sequence[Any], raws: Sequence[RawExchange]) -> None:
    """Each span carries exactly its own response's ``timings`` counts, as a partial
    llamacpp record with nothing derived from a step count."""
    assert len(spans) == len(raws), [r.path for r in raws]
    for span, raw in zip(spans, raws, strict=True):
        got = spec_attributes(span)
        want = expected_attributes(raw.timings())
        assert {k: got.get(k) for k in want} == want, (got, raw.timings())
        assert got[A_OUTCOME] == "partial"
        assert not set(got) & set(STEP_ATTRIBUTES), got


def _assert_totals_reconcile(
    server: LlamaServer,
    before: dict[str, float],
    telemetry: Telemetry,
    raws: Sequence[RawExchange],
) -> tuple[int, int, int]:
    """The server's /metrics deltas == the sum of the raw timings == the OTel counters.
    Returns (drafted, accepted, verification steps from /metrics)."""
    after = server.metrics()
    drafted = sum(r.timings().get("draft_n", 0) for r in raws)
    accepted = sum(r.timings().get("draft_n_accepted", 0) for r in raws)
    assert after[SERVER_DRAFTED] - before.get(SERVER_DRAFTED, 0.0) == drafted
    assert after[SERVER_ACCEPTED] - before.get(SERVER_ACCEPTED, 0.0) == accepted
    assert telemetry.counter_total(M_DRAFT_TOKENS) == drafted
    assert telemetry.counter_total(M_ACCEPTED_DRAFT_TOKENS) == accepted
    steps = after[SERVER_STEPS] - before.get(SERVER_STEPS, 0.0)
    assert steps == int(steps)
    return drafted, accepted, int(steps)


# --------------------------------------------------------------------------- n-gram


@pytest.mark.parametrize("spec_type", list(NGRAM_ARGS))
def test_ngram_drafter_span_carries_each_responses_timings(
    spec_type: str, start_server: Callable[..., LlamaServer], telemetry: Telemetry
) -> None:
    """A server drafting by n-gram lookup alone (no ``-md``): chat and completions,
    streamed (with and without include_usage) and not. Every response drafts; each
    span is engine llamacpp with exactly that response's ``draft_n`` and
    ``draft_n_accepted``; the batch's totals equal the server's own /metrics deltas and
    the OTel counters, with some drafts rejected."""
    server = _ngram_server(start_server, spec_type)
    bias = _word_bias(server)
    sink = Exchanges()
    before = server.metrics()
    with sync_client(server.base_url, sink) as client:
        for i, (endpoint, mode) in enumerate(SHAPES):
            prompt = f"Request {i}: {BODY}"
            _call(client, endpoint, mode, prompt, max_tokens=MAX_TOKENS, logit_bias=bias)
    raws = sink.take()
    assert [r.is_sse for r in raws] == [mode != "raw" for _, mode in SHAPES]
    for raw in raws:
        timings = raw.timings()
        assert timings["predicted_n"] == MAX_TOKENS
        assert timings.get("draft_n", 0) > 0, f"{spec_type} drafted nothing: {timings}"
        assert not {"draft_rounds", "draft_kind"} & set(timings)  # not mlx-vlm's fields
    spans = telemetry.spans()
    _assert_spans_match(spans, raws)
    assert {spec_attributes(s)[A_ENGINE] for s in spans} == {"llamacpp"}
    drafted, accepted, steps = _assert_totals_reconcile(server, before, telemetry, raws)
    assert 0 < accepted < drafted, (accepted, drafted)
    assert steps > 0


@pytest.mark.parametrize(("endpoint", "mode"), [("chat", "raw"), ("completions", "stream")])
def test_ngram_response_that_drafted_nothing_has_no_counts(
    endpoint: str, mode: str, start_server: Callable[..., LlamaServer], telemetry: Telemetry
) -> None:
    """With an n-gram drafter many replies draft nothing. A 2-token reply never can
    (the server drafts at most ``n_remaining - 1`` tokens, and the first token comes
    from the prompt pass): its ``timings`` has no ``draft_n``, the server's counters do
    not move, and the span says ``no_stats`` with no counts rather than a made-up 0 of
    0."""
    server = _ngram_server(start_server, "ngram-mod")
    sink = Exchanges()
    before = server.metrics()
    bias = _word_bias(server)
    with sync_client(server.base_url, sink) as client:
        _call(client, endpoint, mode, f"Request 0: {BODY}", max_tokens=2, logit_bias=bias)
    (raw,) = sink.take()
    timings = raw.timings()
    assert timings["predicted_n"] == 2
    assert "draft_n" not in timings and "draft_n_accepted" not in timings, timings
    (span,) = telemetry.spans()
    attrs = spec_attributes(span)
    assert attrs[A_OUTCOME] == "no_stats"
    assert not {A_ENGINE, A_DRAFTED, A_ACCEPTED, A_RATE} & set(attrs), attrs
    drafted, accepted, steps = _assert_totals_reconcile(server, before, telemetry, [raw])
    assert (drafted, accepted, steps) == (0, 0, 0)


def test_an_ngram_stream_that_drafted_nothing_gets_no_include_usage_hint(
    start_server: Callable[..., LlamaServer],
    telemetry: Telemetry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The include-usage hint is for engines whose streams carry stats only on the usage
    chunk (vLLM). A llama.cpp stream carries its counts on the finish chunk without
    include_usage; one without counts drafted nothing, so after a call that drafted, a
    stream that did not is no reason to advise include_usage. Before the hint asked the
    adapters (``usage_chunk_engines``), this sequence logged it."""
    hints.reset()
    caplog.set_level(logging.WARNING, logger="spec_decode_otel")
    server = _ngram_server(start_server, "ngram-mod")
    bias = _word_bias(server)
    sink = Exchanges()
    with sync_client(server.base_url, sink) as client:
        _call(client, "chat", "raw", f"Request 0: {BODY}", max_tokens=MAX_TOKENS, logit_bias=bias)
        _call(client, "chat", "stream", f"Request 1: {BODY}", max_tokens=2, logit_bias=bias)
    drafted, undrafted = sink.take()
    assert drafted.timings()["draft_n"] > 0
    assert "draft_n" not in undrafted.timings()
    outcomes = [spec_attributes(s)[A_OUTCOME] for s in telemetry.spans()]
    assert outcomes == ["partial", "no_stats"]
    said = [r.getMessage() for r in caplog.records if r.name == "spec_decode_otel"]
    assert not [m for m in said if "include_usage" in m], said
    hints.reset()


# --------------------------------------------------------------------------- synthetic


def _all_or_nothing_counts(max_tokens: int, n_max: int, keep: int) -> tuple[int, int, int]:
    """(drafted, accepted, steps) of one request whose every draft keeps its first
    ``keep`` tokens, replaying server-context.cpp: the prompt pass gives the first
    token; each step drafts ``min(n_max, n_remaining - 1)`` tokens (none when that is
    0: a plain decode), keeps ``min(keep, draft)`` and adds one token of the target's."""
    generated, drafted, accepted, steps = 1, 0, 0, 0
    while generated < max_tokens:
        draft = min(n_max, max_tokens - generated - 1)
        if draft <= 0:
            generated += 1
            continue
        kept = min(keep, draft)
        drafted, accepted, steps = drafted + draft, accepted + kept, steps + 1
        generated += kept + 1
    return drafted, accepted, steps


@pytest.mark.parametrize("keep", [0, 2, 4])
def test_synthetic_rates_of_ones_and_zeros_give_exact_counts(
    keep: int, start_server: Callable[..., LlamaServer], telemetry: Telemetry
) -> None:
    """``--spec-synth-rates`` of ``keep`` ones then zeros (draft-simple, n_max 4): every
    draft keeps exactly its first ``keep`` tokens whatever the prompt, so each
    response's counts follow from max_tokens alone. Each ``timings``, each span, and
    the verification steps in /metrics equal that replay of the server loop, and each
    span's rate is exactly its kept / drafted: ``keep/4`` but for the shorter last
    drafts."""
    n_max = DRAFT_N_MAX
    rates = ",".join(["1"] * keep + ["0"] * (n_max - keep))
    server = start_server(f"synth-{keep}", ["--spec-synth-rates", rates], draft="noisy")
    lengths = [16, 33, MAX_TOKENS, 7]
    sink = Exchanges()
    before = server.metrics()
    with sync_client(server.base_url, sink) as client:
        for i, ((endpoint, mode), length) in enumerate(zip(SHAPES[:4], lengths, strict=True)):
            _call(client, endpoint, mode, f"Request {i}: tell me about {i * 7}.", max_tokens=length)
    raws = sink.take()
    expected = [_all_or_nothing_counts(length, n_max, keep) for length in lengths]
    got = [(r.timings()["draft_n"], r.timings()["draft_n_accepted"]) for r in raws]
    assert got == [(d, a) for d, a, _ in expected]
    spans = telemetry.spans()
    _assert_spans_match(spans, raws)
    _, _, steps = _assert_totals_reconcile(server, before, telemetry, raws)
    assert steps == sum(s for _, _, s in expected)
    for span, (drafted, accepted, _) in zip(spans, expected, strict=True):
        assert spec_attributes(span)[A_RATE] == accepted / drafted


def test_synthetic_rates_apply_to_ngram_drafts(
    start_server: Callable[..., LlamaServer], telemetry: Telemetry
) -> None:
    """Synthetic acceptance is not only for draft models: ngram-map-k (6 drafted per
    lookup, so 6 rates) with every rate 1 keeps every n-gram draft whole, so each
    span's rate is exactly 1.0 whatever the drafts' lengths."""
    ngram = ["--spec-type", "ngram-map-k", *NGRAM_ARGS["ngram-map-k"]]
    server = start_server("ngram-map-k-synth", [*ngram, "--spec-synth-rates", "1,1,1,1,1,1"])
    bias = _word_bias(server)
    sink = Exchanges()
    before = server.metrics()
    with sync_client(server.base_url, sink) as client:
        for i, (endpoint, mode) in enumerate(SHAPES[:3]):
            prompt = f"Request {i}: {BODY}"
            _call(client, endpoint, mode, prompt, max_tokens=MAX_TOKENS, logit_bias=bias)
    raws = sink.take()
    spans = telemetry.spans()
    _assert_spans_match(spans, raws)
    for span in spans:
        attrs = spec_attributes(span)
        assert attrs[A_DRAFTED] > 0
        assert attrs[A_ACCEPTED] == attrs[A_DRAFTED] and attrs[A_RATE] == 1.0
    _assert_totals_reconcile(server, before, telemetry, raws)


SYNTH_LEN = 3.0


def test_synthetic_length_sets_the_recorded_rate(
    start_server: Callable[..., LlamaServer], telemetry: Telemetry
) -> None:
    """``--spec-synth-len 3`` with n_max 4: positions are kept with probabilities p,
    p^2, p^3, p^4 (p solving p + ... + p^4 = L - 1 = 2), so a full draft keeps 2 of 4
    tokens on average and the recorded rate should be near (L - 1) / n_max = 0.5.

    Eight 64-token requests with seeds 1..8: about 170 verification steps, each keeping
    0 to 4 tokens. Replaying the server loop with those probabilities gives the
    batch's rate a standard deviation near 0.03, and the shorter last draft of each
    request (whose first positions are the likelier) raises its expectation by well
    under 0.01; 0.15 is over four standard deviations. The same bound holds the
    server's own mean acceptance length, 1 + accepted / steps from /metrics, within 0.5
    of L (standard deviation near 0.12). The coin is seeded by the request's ``seed``
    alone: a ninth request with seed 1 and another prompt and endpoint reports the
    same counts as the first."""
    n_max = DRAFT_N_MAX
    server = start_server("synth-len", ["--spec-synth-len", f"{SYNTH_LEN:g}"], draft="noisy")
    sink = Exchanges()
    before = server.metrics()
    with sync_client(server.base_url, sink) as client:
        for i, seed in enumerate(range(1, 9)):
            endpoint, mode = SHAPES[i % len(SHAPES)]
            prompt = f"Request {i}: tell me about {i * 7}."
            _call(client, endpoint, mode, prompt, max_tokens=MAX_TOKENS, seed=seed)
        # The first request's seed again, on the other endpoint with another prompt.
        _call(client, "completions", "stream", BODY, max_tokens=MAX_TOKENS, seed=1)
    raws = sink.take()
    spans = telemetry.spans()
    _assert_spans_match(spans, raws)
    drafted, accepted, steps = _assert_totals_reconcile(server, before, telemetry, raws)

    counts = [(r.timings()["draft_n"], r.timings()["draft_n_accepted"]) for r in raws]
    assert raws[0].path != raws[-1].path and counts[-1] == counts[0]
    batch = [spec_attributes(s) for s in spans[:8]]
    rate = sum(a[A_ACCEPTED] for a in batch) / sum(a[A_DRAFTED] for a in batch)
    assert abs(rate - (SYNTH_LEN - 1) / n_max) < 0.15, rate
    assert abs(1 + accepted / steps - SYNTH_LEN) < 0.5, (accepted, steps, drafted)
