"""The simulator's acceptance model: statistics match the closed forms, counts stay honest.

The statistical tests are seeded, so they are deterministic; the tolerances are four
standard errors, so a correct model would fail them only for a vanishingly unlucky seed.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_decode_otel.simulator.acceptance import (
    AcceptanceProfile,
    generate,
    sample_step,
)
from spec_decode_otel.simulator.plan import choice_rng, plan_choice

STEPS = 2_000


def _sample(profile: AcceptanceProfile, k: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [sample_step(rng, k, profile) for _ in range(STEPS)]


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
def test_per_position_acceptance_matches_alpha_power(alpha: float) -> None:
    k = 4
    accepted = _sample(AcceptanceProfile(alphas=(alpha,), schedule=(k,)), k, seed=20261203)
    for p in range(k):
        expected = alpha ** (p + 1)
        observed = sum(a >= p + 1 for a in accepted) / STEPS
        tolerance = 4 * math.sqrt(expected * (1 - expected) / STEPS)
        assert observed == pytest.approx(expected, abs=tolerance), f"position {p}"


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
def test_mean_acceptance_length_matches_closed_form(alpha: float) -> None:
    k = 4
    accepted = _sample(AcceptanceProfile(alphas=(alpha,), schedule=(k,)), k, seed=7)
    lengths = [a + 1 for a in accepted]
    mean = sum(lengths) / STEPS
    var = sum((x - mean) ** 2 for x in lengths) / (STEPS - 1)
    closed = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert mean == pytest.approx(closed, abs=4 * math.sqrt(var / STEPS))


def test_alpha_vector_is_conditional_per_position() -> None:
    vector = (0.9, 0.8, 0.6, 0.4)
    profile = AcceptanceProfile(alphas=vector, schedule=(4,))
    accepted = _sample(profile, 4, seed=99)
    # P(accepted >= p + 1): the product of the alphas up to p (each is conditional)
    cumulative = [0.9, 0.9 * 0.8, 0.9 * 0.8 * 0.6, 0.9 * 0.8 * 0.6 * 0.4]
    for p, expected in enumerate(cumulative):
        observed = sum(a >= p + 1 for a in accepted) / STEPS
        assert observed == pytest.approx(expected, abs=4 * math.sqrt(expected / STEPS))


def test_positions_past_the_vector_reuse_its_last_value() -> None:
    profile = AcceptanceProfile(alphas=(1.0, 0.0), schedule=(6,))
    assert {sample_step(random.Random(s), 6, profile) for s in range(50)} == {1}


def test_extreme_alphas() -> None:
    rng = random.Random(0)
    assert {sample_step(rng, 5, AcceptanceProfile((0.0,), (5,))) for _ in range(100)} == {0}
    assert {sample_step(rng, 5, AcceptanceProfile((1.0,), (5,))) for _ in range(100)} == {5}


def test_profile_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        AcceptanceProfile(alphas=(1.5,), schedule=(4,))
    with pytest.raises(ValueError):
        AcceptanceProfile(alphas=(0.5,), schedule=(0,))
    with pytest.raises(ValueError):
        AcceptanceProfile(alphas=(), schedule=(4,))


def _assert_identities(gen, limit: int, schedule: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    steps = gen.num_spec_steps
    assert gen.completion_tokens == limit
    assert gen.completion_tokens == 1 + steps + gen.num_accepted_draft_tokens
    assert len(gen.per_step_drafted) == len(gen.per_step_accepted) == steps
    assert gen.per_step_drafted == [schedule[i % len(schedule)] for i in range(steps)]
    pairs = zip(gen.per_step_accepted, gen.per_step_drafted, strict=True)
    assert all(0 <= a <= d for a, d in pairs)
    hist = gen.histogram(max(schedule) + 1)
    assert sum(hist) == steps
    assert sum(j * c for j, c in enumerate(hist)) == gen.num_accepted_draft_tokens
    by_length = gen.histogram_by_draft_length()
    assert all(len(h) == d + 1 for d, h in by_length.items())
    flat = [0] * (max(schedule) + 1)
    for h in by_length.values():
        for j, c in enumerate(h):
            flat[j] += c
    assert flat == hist
    if steps:
        assert gen.mean_acceptance_length == 1 + gen.num_accepted_draft_tokens / steps
        assert gen.draft_acceptance_rate == gen.num_accepted_draft_tokens / gen.num_draft_tokens
    else:
        assert (gen.mean_acceptance_length, gen.draft_acceptance_rate) == (1.0, 0.0)


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 400),
    alpha=st.floats(0.0, 1.0),
    schedule=st.lists(st.integers(1, 8), min_size=1, max_size=5).map(tuple),
    seed=st.integers(0, 2**32),
)
def test_truncation_keeps_every_identity(
    limit: int, alpha: float, schedule: tuple[int, ...], seed: int
) -> None:
    """Whatever cuts the sequence, the last step yields exactly the remaining tokens."""
    gen = generate(random.Random(seed), AcceptanceProfile((alpha,), schedule), limit)
    _assert_identities(gen, limit, schedule)


def test_a_one_token_completion_has_no_step() -> None:
    gen = generate(random.Random(1), AcceptanceProfile((0.7,), (4,)), 1)
    assert gen.num_spec_steps == 0 and gen.completion_tokens == 1
    assert gen.histogram(5) == [0, 0, 0, 0, 0]


def test_a_cut_step_counts_the_drafts_that_did_not_fit_as_rejected() -> None:
    # alpha 1 would accept all 4 drafts; with 3 tokens left only 2 can be accepted
    gen = generate(random.Random(1), AcceptanceProfile((1.0,), (4,)), 9)
    assert gen.per_step_accepted == [4, 2]
    assert gen.per_step_drafted == [4, 4]
    assert gen.completion_tokens == 9


def test_same_seed_same_generation() -> None:
    profile = AcceptanceProfile((0.7,), (4,))
    a = plan_choice(choice_rng(1234, 5, 0), profile, 0, None, [], (64, 256))
    b = plan_choice(choice_rng(1234, 5, 0), profile, 0, None, [], (64, 256))
    c = plan_choice(choice_rng(1234, 6, 0), profile, 0, None, [], (64, 256))
    assert a == b
    assert a != c


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    max_tokens=st.one_of(st.none(), st.integers(1, 300)),
    stop=st.sampled_from([[], ["token"], [" step", "cache"], ["zzz-never"]]),
)
def test_plan_text_tokens_and_finish_reason_agree(
    seed: int, max_tokens: int | None, stop: list[str]
) -> None:
    profile = AcceptanceProfile((0.7,), (4,))
    plan = plan_choice(choice_rng(seed, 0, 0), profile, 0, max_tokens, stop, (64, 256))
    gen = plan.generation
    _assert_identities(gen, gen.completion_tokens, (4,))
    assert len(plan.pieces) == gen.num_spec_steps + 1
    assert gen.completion_tokens <= (max_tokens or 256)
    for s in stop:
        assert s not in plan.text
    if plan.finish_reason == "length":
        assert max_tokens is not None and gen.completion_tokens == max_tokens
    if max_tokens is not None and gen.completion_tokens < max_tokens:
        assert plan.finish_reason == "stop"
    if not stop and plan.finish_reason == "stop":
        assert 64 <= gen.completion_tokens <= 256
        assert len(plan.text.split()) == gen.completion_tokens  # one word per token
