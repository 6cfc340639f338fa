"""The acceptance model: how many drafted tokens each verify step accepts.

Everything the simulator reports is *counted* from one sampled generation, never drawn
independently per field, so every engine's identities hold by construction: the
histogram sums to the step count, accepted == sum(j * h[j]), the per-step arrays sum to
the totals, and ``completion_tokens == 1 + num_spec_steps + num_accepted_draft_tokens``.

The model. A request's first token comes from prefill. Every later token comes from a
verify step: the drafter proposes ``d`` tokens (``d`` = k, or the next entry of a
draft-length schedule); the target accepts a prefix of them, position ``p`` (0-based)
being accepted with probability ``alpha_p`` given that every earlier position was, and
then emits one bonus token. A step therefore yields ``accepted + 1`` tokens and
``P(accepted >= p + 1) = prod(alpha_0 .. alpha_p)``; a scalar alpha gives ``alpha**(p+1)``
and a mean acceptance length of ``(1 - alpha**(k+1)) / (1 - alpha)``.

Truncation rule (max_tokens, a stop string, or the natural end of the text cutting
inside a step): the step keeps the draft length it was verified with, but only the
drafts that fit (``remaining - 1``) count as accepted; the rest are reported rejected.
So the last step yields exactly the tokens that remain and no identity ever breaks.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AcceptanceProfile:
    """Per-position conditional acceptance probabilities plus the draft lengths to use.

    ``alphas[p]`` is P(position p accepted | positions < p accepted); positions past the
    end of the list reuse its last value, so a scalar alpha is ``alphas=(alpha,)``.
    ``schedule`` is the draft length of each verify step, cycled; a single entry is a
    fixed k.
    """

    alphas: tuple[float, ...]
    schedule: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.alphas:
            raise ValueError("at least one acceptance probability is needed")
        if any(not 0.0 <= a <= 1.0 for a in self.alphas):
            raise ValueError(f"acceptance probabilities must be in [0, 1]: {self.alphas}")
        if not self.schedule or any(d < 1 for d in self.schedule):
            raise ValueError(f"draft lengths must be >= 1: {self.schedule}")

    @property
    def max_draft(self) -> int:
        """The largest draft length: histograms are sized ``max_draft + 1``."""
        return max(self.schedule)

    @property
    def fixed_k(self) -> int | None:
        """k when every step drafts the same number of tokens, else None."""
        return self.schedule[0] if len(set(self.schedule)) == 1 else None

    def alpha_at(self, position: int) -> float:
        return self.alphas[min(position, len(self.alphas) - 1)]


def sample_step(rng: random.Random, drafted: int, profile: AcceptanceProfile) -> int:
    """Accepted drafts of one verify step: the longest accepted prefix of ``drafted``."""
    accepted = 0
    while accepted < drafted and rng.random() < profile.alpha_at(accepted):
        accepted += 1
    return accepted


@dataclass
class Generation:
    """One sequence's sampled generation: the per-step counts and the token total.

    ``step_tokens[i]`` is how many tokens step i emitted (accepted + 1, but fewer for a
    last step cut short whose drafts a server counts accepted, see ``generate``); the
    prefill token is not a step. Totals are derived properties so they cannot drift from
    the steps.
    """

    per_step_drafted: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    #: The context's end stopped the sequence (``generate``'s ``context_room``).
    context_ended: bool = False

    @property
    def num_spec_steps(self) -> int:
        return len(self.per_step_accepted)

    @property
    def num_accepted_draft_tokens(self) -> int:
        return sum(self.per_step_accepted)

    @property
    def num_draft_tokens(self) -> int:
        return sum(self.per_step_drafted)

    def histogram(self, size: int) -> list[int]:
        """Dense histogram of length ``size``: index j = steps that accepted j drafts."""
        hist = [0] * size
        for a in self.per_step_accepted:
            hist[a] += 1
        return hist

    def histogram_by_draft_length(self) -> dict[int, list[int]]:
        """{draft length d: dense histogram of length d + 1} over the steps that drafted d."""
        out: dict[int, list[int]] = {}
        for d, a in zip(self.per_step_drafted, self.per_step_accepted, strict=True):
            out.setdefault(d, [0] * (d + 1))[a] += 1
        return dict(sorted(out.items()))

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's definition: 1 + accepted/steps, 1.0 for a request with no step."""
        steps = self.num_spec_steps
        return 1.0 + self.num_accepted_draft_tokens / steps if steps else 1.0

    @property
    def draft_acceptance_rate(self) -> float:
        drafted = self.num_draft_tokens
        return self.num_accepted_draft_tokens / drafted if drafted else 0.0

    def step_tokens(self) -> list[int]:
        tokens = [a + 1 for a in self.per_step_accepted]
        if tokens:  # the last step emits what is left, its counted drafts maybe more
            tokens[-1] = self.completion_tokens - 1 - sum(tokens[:-1])
        return tokens


def generate(
    rng: random.Random,
    profile: AcceptanceProfile,
    limit: int,
    *,
    draft_budget: int | None = None,
    context_room: int | None = None,
    count_cut_drafts: bool = False,
) -> Generation:
    """Sample steps until ``limit`` tokens exist, applying the truncation rule at the end.

    ``limit`` is the number of completion tokens the sequence ends with (already the
    minimum of max_tokens, a stop-string cut and the natural length); it must be >= 1.

    ``draft_budget``: the tokens the server knows it may still generate in all (its
    ``max_tokens``), for a server that drafts no more than fits in it: each draft is
    cut to the tokens left minus the one the step itself adds, and a step with no room
    for a draft drafts nothing (0 drafted, 0 accepted, one token).

    ``context_room``: the tokens the context has left after the prompt, for a server
    that drafts within it as within ``draft_budget`` and stops where it ends (llama.cpp):
    it checks the context against the whole verified step before emitting the step's
    first token, so the step that reaches the end emits that one token and the sequence
    ends there (``Generation.context_ended``; at most ``limit`` tokens).

    ``count_cut_drafts``: the drafts a step verified count accepted even when the
    sequence ends inside the step (a stop string, EOS, the context's end) and the tokens
    after that end are never emitted, as llama.cpp b11312 counts them (``update_slots``
    in ``server-context.cpp`` adds the step's ``n_accepted`` to ``n_draft_accepted``
    before ``process_token`` ends the reply). Without it the truncation rule counts
    only the drafts that were emitted.
    """
    if limit < 1:
        raise ValueError("a completion has at least one token")
    gen = Generation(completion_tokens=1)  # the prefill token
    schedule = itertools.cycle(profile.schedule)
    budgets = [b for b in (draft_budget, context_room) if b is not None]
    while gen.completion_tokens < limit:
        drafted = next(schedule)
        for budget in budgets:
            drafted = max(0, min(drafted, budget - gen.completion_tokens - 1))
        sampled = sample_step(rng, drafted, profile)
        room = limit - gen.completion_tokens - 1  # tokens the step may add after its first
        if context_room is not None and gen.completion_tokens + sampled + 1 >= context_room:
            room, gen.context_ended = 0, True
        emitted = min(sampled, room)
        gen.per_step_drafted.append(drafted)
        gen.per_step_accepted.append(sampled if count_cut_drafts else emitted)
        gen.completion_tokens += emitted + 1
        if gen.context_ended:
            break
    return gen


def parse_floats(text: str) -> tuple[float, ...]:
    """'0.9,0.8,0.6' -> (0.9, 0.8, 0.6)."""
    return tuple(float(x) for x in text.split(",") if x.strip())


def parse_ints(text: str) -> tuple[int, ...]:
    """'2,4,4,6' -> (2, 4, 4, 6)."""
    return tuple(int(x) for x in text.split(",") if x.strip())
