"""Fault injection: what a broken or hostile server can send, switched per request.

Header ``x-sim-fault`` takes one name or a comma-separated list. Payload faults corrupt
every stats object of the response in an engine-appropriate place; transport faults act
on the HTTP exchange itself (errors, delays, a connection dropped mid-body).
"""

from __future__ import annotations

import math
from typing import Any

PAYLOAD_FAULTS = frozenset({"malformed-types", "inconsistent", "bools", "nan", "huge-array"})
TRANSPORT_FAULTS = frozenset({"drop-mid-stream", "slow", "http-429", "http-500"})
FAULTS = PAYLOAD_FAULTS | TRANSPORT_FAULTS

HUGE = 150_001  # > 100,000 entries, the size consumers are expected to refuse
DROP_AFTER_CHUNKS = 3
DEFAULT_DELAY_MS = 50.0


class SimulatedDisconnect(Exception):
    """Raised inside a response body generator: uvicorn then aborts the connection
    without the terminating chunk, which is what a crashed or cut-off server looks like."""


# engine -> (histogram key, step-count key, float keys, per-step array keys)
_LAYOUT: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {
    "vllm": (
        "acceptance_histogram",
        "num_spec_steps",
        ("mean_acceptance_length", "draft_acceptance_rate"),
        ("per_step_accepted", "per_step_drafted"),
    ),
    "sglang": (
        "spec_correct_drafts_histogram",
        "spec_verify_ct",
        ("spec_accept_length", "spec_accept_rate"),
        (),
    ),
    "trtllm": ("acceptance_histogram", "num_spec_steps", ("acceptance_rate",), ()),
}
_LAYOUT["vllm-premerge"] = _LAYOUT["vllm"]


def parse_faults(header: str | None) -> frozenset[str]:
    """Names from the header; unknown names raise ValueError (the app answers 400)."""
    if not header:
        return frozenset()
    names = frozenset(n.strip().lower() for n in header.split(",") if n.strip())
    unknown = names - FAULTS
    if unknown:
        raise ValueError(f"unknown x-sim-fault value(s): {', '.join(sorted(unknown))}")
    return names


def corrupt_stats(stats: dict[str, Any], engine: str, faults: frozenset[str]) -> None:
    """Corrupt one stats object in place (vLLM, pre-merge vLLM, SGLang, TRT-LLM shapes)."""
    layout = _LAYOUT.get(engine)
    if layout is None or not faults & PAYLOAD_FAULTS:
        return
    hist_key, steps_key, float_keys, array_keys = layout
    hist = stats.get(hist_key)
    if "malformed-types" in faults:
        if isinstance(hist, dict):
            key = next(iter(hist), "0")
            hist[key] = str(hist.get(key, 0))
        elif isinstance(hist, list) and hist:
            j = next((i for i, c in enumerate(hist) if c), 0)
            hist[j] = str(hist[j])
    if "inconsistent" in faults:
        stats[steps_key] = int(stats.get(steps_key) or 0) + 7
    if "bools" in faults:
        _to_bools(hist)
    if "nan" in faults:
        for i, key in enumerate(float_keys):
            stats[key] = math.nan if i % 2 == 0 else math.inf
    if "huge-array" in faults:
        if isinstance(hist, list):
            hist.extend([0] * (HUGE - len(hist)))
        elif isinstance(hist, dict):
            hist.update({str(j): 0 for j in range(len(hist), HUGE)})
        for key in array_keys:
            if isinstance(stats.get(key), list):
                stats[key].extend([0] * (HUGE - len(stats[key])))


def _to_bools(hist: Any) -> None:
    """0/1 counts become false/true (numerically equal, so only a type check sees it);
    when no count is 0 or 1 the first becomes true, which also breaks the sums."""
    items = list(hist.items()) if isinstance(hist, dict) else list(enumerate(hist or []))
    changed = False
    for key, value in items:
        if value in (0, 1) and not isinstance(value, bool):
            hist[key] = bool(value)
            changed = True
    if not changed and items:
        hist[items[0][0]] = True


def corrupt_llamacpp(timings: dict[str, Any], faults: frozenset[str]) -> None:
    """llama.cpp ``timings``: there is no histogram, so the counts themselves go bad."""
    if timings.get("draft_n") is None:  # nothing drafted (mlx-vlm: sent as null)
        return
    if "malformed-types" in faults:
        timings["draft_n"] = str(timings["draft_n"])
    if "inconsistent" in faults:
        timings["draft_n_accepted"] = int(timings["draft_n_accepted"]) + int(timings["draft_n"]) + 1
    if "bools" in faults:
        timings["draft_n_accepted"] = True
    if "nan" in faults:
        timings["draft_n_accepted"] = math.nan
        timings["predicted_per_second"] = math.inf
    if "huge-array" in faults and "draft_rounds" in timings:
        timings["draft_rounds"] = [1] * HUGE


def corrupt_avg_decoded(value: float, faults: frozenset[str]) -> object:
    """TRT-LLM's ``avg_decoded_tokens_per_iter`` under a payload fault."""
    if "malformed-types" in faults:
        return str(value)
    if "bools" in faults:
        return True
    if "nan" in faults:
        return math.nan
    if "inconsistent" in faults:
        return 0.5  # below one token per iteration: impossible
    return value
