"""CPU cost of turning a decoded response into a record (``record_from_json``).

Two payloads, both decoded JSON dicts as the client wrapper sees them after the SDK
parsed the body:

- ``parse_us_10k_steps``: a vLLM ``detailed`` response (merged format, k=4) of a request
  that ran 10,000 verify steps, so ``per_step_accepted`` / ``per_step_drafted`` hold
  10,000 ints each and the record validates both (length, sums, per-step accepted <=
  drafted <= k). Target: < 1,000 µs per parse.
- ``parse_us_small``: a typical ``summary`` response (k=3, 43 steps, no per-step arrays).

Each figure is the median over ``--repeat`` timeit batches of the per-call time, in µs.

    python benchmarks/parse_bench.py [--repeat 31] [--json out.json]

``measure_parse_us_10k_steps()`` is imported by benchmarks/overhead.py.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import timeit
from pathlib import Path
from typing import Any

from spec_decode_otel import record_from_json

TARGET_US_10K_STEPS = 1_000.0


def build_detailed_vllm_payload(steps: int = 10_000, k: int = 4, seed: int = 0) -> dict[str, Any]:
    """A vLLM merged-format body at the ``detailed`` level, internally consistent.

    Each step drafts k tokens and accepts a prefix of them (each position accepted with
    probability 0.7 while the previous one was), as a real draft model would.
    """
    rng = random.Random(seed)
    per_acc = []
    for _ in range(steps):
        accepted = 0
        while accepted < k and rng.random() < 0.7:
            accepted += 1
        per_acc.append(accepted)
    per_drf = [k] * steps
    hist = [0] * (k + 1)
    for accepted in per_acc:
        hist[accepted] += 1
    total_acc, total_drf = sum(per_acc), sum(per_drf)
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1796000000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x" * 64},
                "finish_reason": "length",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": 21,
            "completion_tokens": steps + total_acc + 1,
            "total_tokens": 21 + steps + total_acc + 1,
        },
        "metrics": {
            "time_to_first_token_ms": 41.2,
            "generation_time_ms": 81250.0,
            "queue_time_ms": 0.4,
            "mean_itl_ms": 7.9,
            "tokens_per_second": 120.3,
            "speculative_decoding": {
                "mean_acceptance_length": 1 + total_acc / steps,
                "draft_acceptance_rate": total_acc / total_drf,
                "acceptance_histogram": hist,
                "num_spec_steps": steps,
                "num_accepted_draft_tokens": total_acc,
                "num_draft_tokens": total_drf,
                "num_spec_tokens": k,
                "per_step_accepted": per_acc,
                "per_step_drafted": per_drf,
            },
        },
    }


def build_small_payload() -> dict[str, Any]:
    """A typical ``summary``-level vLLM body (the upstream doc example: ngram, k=3)."""
    return {
        "id": "chatcmpl-small",
        "object": "chat.completion",
        "created": 1796000000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x" * 64},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 21, "completion_tokens": 54, "total_tokens": 75},
        "metrics": {
            "time_to_first_token_ms": 41.2,
            "generation_time_ms": 812.5,
            "speculative_decoding": {
                "mean_acceptance_length": 1.2325581395348837,
                "draft_acceptance_rate": 0.07751937984496124,
                "acceptance_histogram": [39, 1, 0, 3],
                "num_spec_steps": 43,
                "num_accepted_draft_tokens": 10,
                "num_draft_tokens": 129,
                "num_spec_tokens": 3,
            },
        },
    }


def _median_us_per_call(payload: dict[str, Any], repeat: int, min_batch_s: float) -> float:
    record = record_from_json(payload)
    if record is None:  # a benchmark of the rejection path would be meaningless
        raise RuntimeError("benchmark payload did not produce a record")
    timer = timeit.Timer(lambda: record_from_json(payload))
    number = 1
    while timer.timeit(number) < min_batch_s:  # size batches well above timer resolution
        number *= 2
    batches = timer.repeat(repeat=repeat, number=number)
    return statistics.median(batches) / number * 1e6


def measure_parse_us_10k_steps(repeat: int = 31, min_batch_s: float = 0.02) -> float:
    """Median µs for one ``record_from_json`` of the 10,000-step detailed vLLM body."""
    return _median_us_per_call(build_detailed_vllm_payload(), repeat, min_batch_s)


def measure_parse_us_small(repeat: int = 31, min_batch_s: float = 0.02) -> float:
    """Median µs for one ``record_from_json`` of a typical summary-level body."""
    return _median_us_per_call(build_small_payload(), repeat, min_batch_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=31, help="timeit batches (median taken)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    figures = {
        "parse_us_10k_steps": measure_parse_us_10k_steps(args.repeat),
        "parse_us_small": measure_parse_us_small(args.repeat),
    }
    print(f"parse_us_10k_steps: {figures['parse_us_10k_steps']:.1f}")
    print(f"parse_us_small: {figures['parse_us_small']:.1f}")
    met = figures["parse_us_10k_steps"] < TARGET_US_10K_STEPS
    print(f"target parse_us_10k_steps < {TARGET_US_10K_STEPS:g}: {'met' if met else 'MISSED'}")
    if args.json:
        result = {
            **figures,
            "target_us_10k_steps": TARGET_US_10K_STEPS,
            "repeat": args.repeat,
            "python": sys.version.split()[0],
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
