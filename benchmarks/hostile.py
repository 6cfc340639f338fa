"""Hostile response bodies, for the worst-case cost of the instrumentation.

``build(name)`` makes the body ``BUILDERS`` names: chat completions whose
speculative-decoding stats are built to be expensive, padded with message content to at
least 1 MiB so that a per-MiB figure is not a call's fixed cost. A body starting with
``data:`` is a server-sent-event stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

MIB = 1 << 20
BIG = 30_000_000


def _premerge(hist: Any, steps: Any, accepted: Any, drafted: Any) -> dict[str, Any]:
    """Stats in the vLLM pre-merge shape (``choices[i].speculative_decoding_stats``)."""
    return {
        "acceptance_histogram": hist,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
    }


def _merged(k: Any, hist: Any, steps: Any, accepted: Any, drafted: Any) -> dict[str, Any]:
    """Stats in the merged vLLM shape (``metrics.speculative_decoding``)."""
    return _premerge(hist, steps, accepted, drafted) | {"num_spec_tokens": k}


def _choice(index: int = 0, stats: Any = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": ""}
    choice = {"index": index, "message": message, "finish_reason": "length", "logprobs": None}
    return choice if stats is None else choice | {"speculative_decoding_stats": stats}


def _chat(choices: list[dict[str, Any]], merged: Any = None, size: int = MIB) -> bytes:
    body: dict[str, Any] = {"id": "chatcmpl-hostile", "object": "chat.completion", "model": "m"}
    body["choices"] = choices
    body["usage"] = {"prompt_tokens": 5, "completion_tokens": 256, "total_tokens": 261}
    if merged is not None:
        body["metrics"] = {"speculative_decoding": merged}
    return _pad(json.dumps(body), size)


def _pad(text: str, size: int = MIB) -> bytes:
    """The first empty message content filled up so that the body is ``size`` bytes."""
    padding = "x" * max(0, size - len(text))
    return text.replace('"content": ""', f'"content": "{padding}"', 1).encode()


def _deep(depth: int = 900) -> Any:  # the JSON decoder's recursion limit is not far above
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _per_step(steps: int) -> bytes:
    accepted = [i % 5 for i in range(steps)]
    merged = _merged(4, [accepted.count(j) for j in range(5)], steps, sum(accepted), 4 * steps)
    merged |= {"per_step_accepted": accepted, "per_step_drafted": [4] * steps}
    return _chat([_choice()], merged)


def _wrong_types() -> bytes:
    nan, inf = float("nan"), float("inf")
    merged = _merged(-inf, [True, "3", 1e308, -1, nan, None, {}], True, "10", inf)
    merged |= {"mean_acceptance_length": nan, "draft_acceptance_rate": inf}
    merged |= {"per_step_accepted": [nan] * 100_000, "per_step_drafted": ["4"] * 100_000}
    stats = _premerge({"NaN": inf, "1e400": True, "-0": "x", "": None}, nan, 1e308, False)
    return _chat([_choice(0, stats | {"num_spec_tokens": "4"})], merged)


def _duplicate_keys() -> bytes:
    """Stats objects and histogram keys repeated: the JSON decoder keeps the last of each."""
    hist = ", ".join(f'"{j % 5}": {j}' for j in range(5_000))
    stats = f'"speculative_decoding_stats": {{"acceptance_histogram": {{{hist}}}}}, '
    text = _chat([_choice()], size=0).decode()
    text = text.replace('"finish_reason"', stats * 20 + '"finish_reason"', 1)
    merged = f'"speculative_decoding": {json.dumps(_merged(4, [1] * 5, 5, 10, 20))}'
    return _pad(text[:-1] + f', "metrics": {{{", ".join([merged] * 3_000)}}}}}')


def _unicode_keys() -> bytes:
    """Histogram keys ``int()`` accepts though they are no ASCII number (full-width and
    Arabic-Indic digits, underscores, spaces), and 50,000 keys it does not accept."""
    hist = {"\uff13": 1, "\u0663": 1, " 2 ": 1, "1_0": 1, "\uff19" * 20: 1}
    hist["\uff11_000_000_000"] = 1
    hist |= {f"\u043a\u043b\u044e\u0447-{j}-\U0001f642": 1 for j in range(50_000)}
    return _chat([_choice(0, _premerge(hist, len(hist), BIG, BIG))])


def _many_keys(n: int) -> bytes:
    """A consistent pre-merge histogram of ``n`` buckets, one step each."""
    return _chat([_choice(0, _premerge({str(j): 1 for j in range(n)}, n, n * (n - 1) // 2, n * n))])


def _stream(chunks: int = 2_000) -> bytes:
    """A stream whose every chunk carries the huge-key stats on its choice."""
    base = {"id": "chatcmpl-hostile", "object": "chat.completion.chunk", "model": "m"}
    events = []
    for i in range(chunks):
        finish = "length" if i == chunks - 1 else None
        choice = {"index": 0, "delta": {"content": "x" * 400}, "finish_reason": finish}
        choice["speculative_decoding_stats"] = _premerge({str(BIG): 1}, 1, BIG, BIG)
        events.append(base | {"choices": [choice]})
    usage = {"prompt_tokens": 5, "completion_tokens": chunks, "total_tokens": chunks + 5}
    events.append(base | {"choices": [], "usage": usage})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"


BUILDERS: dict[str, Callable[[], bytes]] = {
    "premerge_hist_key_3e7": lambda: _chat([_choice(0, _premerge({str(BIG): 1}, 1, BIG, BIG))]),
    "premerge_hist_key_1e12": lambda: _chat(
        [_choice(0, _premerge({str(10**12): 1}, 1, 10**12, 10**12))]
    ),
    "merged_k_1e8_empty_hist": lambda: _chat([_choice()], _merged(10**8, [], 0, 0, 0)),
    "merged_k_1e8_hist_1e6": lambda: _chat(
        [_choice()], _merged(10**8, [0] * (10**6 - 1) + [1], 1, 10**6 - 1, 10**8)
    ),
    "merged_per_step_1e6": lambda: _per_step(10**6),
    "deep_nesting": lambda: _chat(
        [_choice(0, _premerge({"1": _deep()}, _deep(), 1, 1))],
        _merged(4, _deep(), 1, 1, 1) | {"per_step_accepted": _deep(), "num_spec_tokens": _deep()},
    ),
    "choices_1e4": lambda: _chat(
        [_choice(i, _premerge({"0": 3, "2": 1}, 4, 2, 16)) for i in range(10_000)]
    ),
    "wrong_types": _wrong_types,
    "duplicate_keys": _duplicate_keys,
    "unicode_keys": _unicode_keys,
    "content_16mib": lambda: _chat(
        [_choice()], _merged(4, [25, 18, 14, 12, 21], 90, 166, 360), 16 * MIB
    ),
    "premerge_histogram_3e5_keys": lambda: _many_keys(300_000),
    "stream_hist_key_3e7_every_chunk": _stream,
}


def build(name: str) -> bytes:
    return BUILDERS[name]()
