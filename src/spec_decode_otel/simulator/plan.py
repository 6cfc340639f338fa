"""From one request to its sampled sequences: text pieces, finish reasons, step counts.

A plan is computed once, before anything is sent, so the streamed and the non-streamed
rendering of a request say exactly the same thing and every engine's payload is cut from
the same counts. Content is filler words from a fixed vocabulary, one word per token;
the prompt is never echoed.
"""

from __future__ import annotations

import bisect
import itertools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from spec_decode_otel.simulator.acceptance import AcceptanceProfile, Generation, generate

FILLER: tuple[str, ...] = (
    "draft", "verify", "accept", "token", "step", "target", "model", "bonus", "prefix",
    "speculative", "decoding", "latency", "throughput", "batch", "kernel", "cache", "tensor",
    "layer", "head", "window", "stream", "chunk", "sample", "logit", "probability", "rollout",
    "greedy", "beam", "prompt", "context", "memory", "block", "page", "queue", "scheduler",
    "worker", "engine", "request", "response", "server", "client", "trace", "span", "metric",
    "signal",
)  # fmt: skip

_WORDISH = re.compile(r"\w+|[^\w\s]")

#: The token id a natural stop matched (the simulated model's EOS).
EOS_TOKEN_ID = 2


@dataclass
class ChoicePlan:
    """One output sequence. ``pieces[0]`` is the prefill token's text, ``pieces[i]`` the
    text emitted by verify step i (empty where a stop string already ended the text)."""

    index: int
    generation: Generation
    pieces: list[str]
    finish_reason: str
    #: What ended the sequence, as SGLang's ``matched_stop`` says it: the stop string, the
    #: EOS token id for a natural stop, None when the token limit did.
    matched_stop: str | int | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def completion_tokens(self) -> int:
        return self.generation.completion_tokens


def count_prompt_tokens(value: object) -> int:
    """A deterministic stand-in for a tokenizer: words and punctuation, or token ids."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(_WORDISH.findall(value))
    if isinstance(value, int):
        return 1
    if isinstance(value, dict):
        # chat message: content may be a string or a list of typed parts
        return (
            4 + count_prompt_tokens(value.get("content")) + count_prompt_tokens(value.get("text"))
        )
    if isinstance(value, Sequence):
        return sum(count_prompt_tokens(v) for v in value)
    return 0


def _stop_cut(
    tokens: list[str], offsets: list[int], stops: Sequence[str]
) -> tuple[int, int, str] | None:
    """Earliest stop-string match as (tokens kept, visible chars, the stop), or None.

    Kept tokens run up to and including the one that completed the match (an engine
    generates that token before it can see the match); the visible text ends where the
    stop string starts, as OpenAI-compatible servers return it. ``offsets[i]`` is where
    token i starts in the text.
    """
    text = "".join(tokens)
    best: tuple[int, int, str] | None = None  # (match end, match start, stop)
    for stop in stops:
        if not stop:
            continue
        pos = text.find(stop)
        if pos >= 0 and (best is None or pos + len(stop) < best[0]):
            best = (pos + len(stop), pos, stop)
    if best is None:
        return None
    end, start, stop = best
    return bisect.bisect_left(offsets, end, lo=1), start, stop


def plan_choice(
    rng: random.Random,
    profile: AcceptanceProfile,
    index: int,
    max_tokens: int | None,
    stops: Sequence[str],
    length_range: tuple[int, int],
    *,
    cap_drafts: bool = False,
    context_room: int | None = None,
    count_cut_drafts: bool = False,
) -> ChoicePlan:
    """Sample one sequence: natural length, words, stop cut, then the verify steps.

    ``cap_drafts``: the server drafts only what ``max_tokens`` leaves room for
    (llama.cpp; see ``acceptance.generate``'s ``draft_budget``). ``context_room``: the
    tokens the server's context has left after the prompt; a sequence that reaches its
    end stops there, finish ``length`` (``acceptance.generate``), even on the token
    that completes a stop string: llama.cpp b11312's ``process_token``
    (``server-context.cpp``) checks the context after the stop strings and overwrites
    their ``STOP_TYPE_WORD`` with ``STOP_TYPE_LIMIT``, the text still cut at the stop.
    Only EOS, checked last, keeps ``stop``. ``count_cut_drafts``: see
    ``acceptance.generate``."""
    natural = rng.randint(*length_range)
    caps = [c for c in (max_tokens, context_room) if c is not None]
    cap = min(caps) if caps else None
    limit = natural if cap is None else min(natural, cap)
    finish = "length" if cap is not None and cap < natural else "stop"
    words = [rng.choice(FILLER) for _ in range(limit)]
    tokens = [w.capitalize() if i == 0 else " " + w for i, w in enumerate(words)]
    offsets = list(itertools.accumulate(map(len, tokens), initial=0))
    visible = None
    matched: str | int | None = EOS_TOKEN_ID if finish == "stop" else None
    cut = _stop_cut(tokens, offsets, stops)
    if cut is not None:
        limit, visible, matched = cut
        finish = "stop"
    budget = max_tokens if cap_drafts else None
    gen = generate(
        rng,
        profile,
        limit,
        draft_budget=budget,
        context_room=context_room,
        count_cut_drafts=count_cut_drafts,
    )
    if gen.completion_tokens < limit:  # the context ended it first
        limit, visible, matched, finish = gen.completion_tokens, None, None, "length"
    elif gen.context_ended and isinstance(matched, str):  # with the stop string's token
        finish = "length"
    text = "".join(tokens[:limit])[:visible]
    # split the visible text at the step boundaries
    ends = [min(len(text), offsets[t]) for t in itertools.accumulate(gen.step_tokens(), initial=1)]
    pieces = [text[a:b] for a, b in itertools.pairwise([0, *ends])]
    return ChoicePlan(
        index=index, generation=gen, pieces=pieces, finish_reason=finish, matched_stop=matched
    )


def choice_rng(seed: int, request_no: int, index: int) -> random.Random:
    """Per-sequence RNG: reproducible from (seed, request counter, choice index) alone."""
    return random.Random(f"spec-sim:{seed}:{request_no}:{index}")
