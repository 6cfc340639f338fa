"""The simulator's ``GET /metrics``: the server-side counters vLLM and llama.cpp export.

Names as the engines export them (vLLM's ``SpecDecodingProm``, labels ``model_name`` and
``engine``; llama.cpp b11312's ``--metrics``, read from its ``llama-server`` library
strings, no label but ``position``). The simulator under test runs as a subprocess; a
second simulator with the same configuration runs in-process as the reference: a seeded
request (``x-sim-seed``) gets the same sample from both, so the reference's pre-merge
vLLM body (per choice, with per-step arrays) says what the server under test generated,
including for answers that carry no stats at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from spec_decode_otel.simulator import ENGINES, SimulatorConfig, SimulatorServer
from spec_decode_otel.simulator.plan import choice_rng, plan_choice
from spec_decode_otel.simulator.server_metrics import PREFIXES

ARGS = ("--k", "4", "--alpha", "0.6", "--seed", "31", "--served-model", "sim-served")
CONFIG = {"k": 4, "alpha": 0.6, "seed": 31, "served_model": "sim-served"}
MESSAGES = [{"role": "user", "content": "Count the verify steps."}]
SAMPLE = re.compile(r"^([a-z_:]+)(\{[^}]*\})? (\d+)$")


def scrape(base_url: str) -> dict[str, int]:
    """``name{labels}`` -> value of every sample of ``/metrics`` (comments checked)."""
    response = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in response.text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_:]+ ", line), line
            continue
        match = SAMPLE.match(line)
        assert match, line
        samples[match.group(1) + (match.group(2) or "")] = int(match.group(3))
    return samples


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    """The in-process twin of the servers under test (their engine flag aside)."""
    with SimulatorServer(SimulatorConfig(**CONFIG)) as sim:
        yield sim.base_url


def generated(reference: str, body: dict[str, Any], seed: int) -> dict[str, Any]:
    """What a request generated: steps, drafted, accepted, per-position acceptance, summed
    over its sequences, read from the reference's pre-merge vLLM body."""
    response = httpx.post(
        reference + "/chat/completions",
        json={**body, "stream": False},
        headers={
            "x-sim-seed": str(seed),
            "x-spec-decode-engine": "vllm-premerge",
            "x-spec-decode-level": "detailed",
        },
        timeout=30,
    )
    response.raise_for_status()
    out: dict[str, Any] = {"steps": 0, "drafted": 0, "accepted": 0, "positions": {}}
    for choice in response.json()["choices"]:
        stats = choice["speculative_decoding_stats"]
        out["steps"] += stats["num_spec_steps"]
        out["drafted"] += stats["num_draft_tokens"]
        out["accepted"] += stats["num_accepted_draft_tokens"]
        for accepted in stats["per_step_accepted"]:
            for p in range(accepted):
                out["positions"][p] = out["positions"].get(p, 0) + 1
    return out


def generated_llamacpp(seed: int) -> dict[str, Any]:
    """What a llama.cpp-shaped request (one sequence, no limit) generated, from the
    simulator's own plan: llama.cpp b11312 counts the drafts of a step cut short by the
    end accepted (``n_draft_accepted`` grows before ``process_token`` ends the reply,
    ``server-context.cpp``), which no other shape's body says."""
    config = SimulatorConfig(**CONFIG)
    lengths = (config.min_length, config.max_length)
    profile = config.profile_for("m")
    rng = choice_rng(seed, 0, 0)
    gen = plan_choice(rng, profile, 0, None, [], lengths, cap_drafts=True, count_cut_drafts=True)
    steps = gen.generation
    out: dict[str, Any] = {
        "steps": sum(1 for d in steps.per_step_drafted if d),
        "drafted": steps.num_draft_tokens,
        "accepted": steps.num_accepted_draft_tokens,
        "positions": {},
    }
    for accepted in steps.per_step_accepted:
        for p in range(accepted):
            out["positions"][p] = out["positions"].get(p, 0) + 1
    return out


def send(base_url: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    # A stream is read to its end; nothing in it is looked at (what the server counts must
    # not depend on what a client reads).
    url = base_url + "/chat/completions"
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url, json=body, headers=headers) as r,
    ):
        r.read()
        return r


#: (request body extras, headers): requests whose stats reach the client in different
#: ways, or never. Each is seeded; the reference regenerates it.
REQUESTS: list[tuple[dict[str, Any], dict[str, str]]] = [
    ({}, {}),
    ({"stream": True}, {}),  # vLLM stream without include_usage: no stats on the wire
    ({"stream": True, "stream_options": {"include_usage": True}}, {}),
    ({"n": 2}, {}),  # vLLM sends metrics: null for n > 1; the server generated both
    ({}, {"x-spec-decode-engine": "none"}),
    ({}, {"x-spec-decode-level": "none"}),
    ({}, {"x-spec-decode-engine": "sglang"}),
    ({}, {"x-sim-fault": "inconsistent"}),  # a broken payload: the work was still done
]


@pytest.mark.parametrize(
    ("args", "prefix", "labels"),
    [
        (("--engine", "vllm", *ARGS), "vllm", 'engine="0",model_name="sim-served"'),
        (("--engine", "vllm-premerge", *ARGS), "vllm", 'engine="0",model_name="sim-served"'),
        (("--engine", "llamacpp", *ARGS), "llamacpp", ""),
    ],
    ids=["vllm", "vllm-premerge", "llamacpp"],
)
def test_metrics_count_every_answered_request(
    start_simulator: Callable[..., str],
    reference: str,
    args: tuple[str, ...],
    prefix: str,
    labels: str,
) -> None:
    base_url = start_simulator(*args)
    before = scrape(base_url)
    want = {"steps": 0, "drafted": 0, "accepted": 0, "positions": {}}
    requests = REQUESTS if prefix == "vllm" else [r for r in REQUESTS if "n" not in r[0]]
    for seed, (extra, headers) in enumerate(requests, start=100):
        body = {"model": "m", "messages": MESSAGES, **extra}
        response = send(base_url, body, {"x-sim-seed": str(seed), **headers})
        assert response.status_code == 200
        llamacpp = prefix == "llamacpp" and "x-spec-decode-engine" not in headers
        got = generated_llamacpp(seed) if llamacpp else generated(reference, body, seed)
        for key in ("steps", "drafted", "accepted"):
            want[key] += got[key]
        for p, count in got["positions"].items():
            want["positions"][p] = want["positions"].get(p, 0) + count
    # Refused requests generate nothing.
    for fault in ("http-500", "http-429"):
        refused = send(base_url, {"model": "m", "messages": MESSAGES}, {"x-sim-fault": fault})
        assert refused.status_code >= 400

    braces = f"{{{labels}}}" if labels else ""
    per_pos = f"{prefix}:spec_decode_num_accepted_tokens_per_pos_total"
    expected = {
        f"{prefix}:spec_decode_num_drafts_total{braces}": want["steps"],
        f"{prefix}:spec_decode_num_draft_tokens_total{braces}": want["drafted"],
        f"{prefix}:spec_decode_num_accepted_tokens_total{braces}": want["accepted"],
        **{
            f'{per_pos}{{{labels}{"," if labels else ""}position="{p}"}}': n
            for p, n in want["positions"].items()
        },
    }
    assert 0 < want["accepted"] < want["drafted"]
    assert delta(scrape(base_url), before) == expected


def test_counters_exist_at_zero_before_any_request(start_simulator: Callable[..., str]) -> None:
    """As vLLM's do: increase() over a window then sees the server's first requests."""
    samples = scrape(start_simulator("--engine", "llamacpp", "--k", "3", "--seed", "5"))
    assert samples == {
        "llamacpp:spec_decode_num_drafts_total": 0,
        "llamacpp:spec_decode_num_draft_tokens_total": 0,
        "llamacpp:spec_decode_num_accepted_tokens_total": 0,
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 0,
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"}': 0,
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"}': 0,
    }


@pytest.mark.parametrize("engine", [e for e in ENGINES if e not in PREFIXES])
def test_flavours_without_server_counters_export_none(engine: str) -> None:
    """SGLang, TensorRT-LLM and the others export no such counters (and a server without
    stats is not vLLM or llama.cpp): their /metrics is empty, requests or not."""
    with SimulatorServer(SimulatorConfig(engine=engine)) as sim:
        httpx.post(
            sim.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES}
        ).raise_for_status()
        assert scrape(sim.base_url) == {}
