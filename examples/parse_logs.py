"""Records from saved responses and stream captures, with no client and no server.

Shows: ``spec_decode_otel.record_from_text`` turns a saved response body, a JSON array
of chunks, JSON lines, or a raw SSE capture into the engine-neutral record (or None when
the payload carries no spec-decode stats); ``record_from_json`` does the same for a body
you already decoded, e.g. from a structured log line. Useful for replaying gateway logs
or checking a server's output by hand. The samples in ``examples/captures/`` cover vLLM
(a body and an SSE stream), SGLang, llama.cpp, a released TensorRT-LLM server (partial
records: the engine reports only part of the picture) and a server without spec-decode
stats. The CLI does the same for one file: ``spec-decode-otel parse FILE``.

Run:  python examples/parse_logs.py
(every file in examples/captures/; or name files: python examples/parse_logs.py FILE ...)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import spec_decode_otel

CAPTURES = Path(__file__).resolve().parent / "captures"


def describe(record: spec_decode_otel.SpecDecodeAcceptanceRecord | None) -> str:
    if record is None:
        return "no spec-decode stats"
    shown = {
        "engine": record.engine,
        "mean_acceptance_length": record.mean_acceptance_length,
        "draft_acceptance_rate": record.draft_acceptance_rate,
        "steps": record.num_spec_steps,
        "accepted": record.num_accepted_draft_tokens,
        "drafted": record.num_draft_tokens,
        "histogram": record.acceptance_histogram,
        "partial": record.is_partial,
    }
    return " ".join(
        f"{key}={round(value, 3) if isinstance(value, float) else value}"
        for key, value in shown.items()
        if value is not None
    )


def main(paths: list[str]) -> None:
    files = [Path(p) for p in paths] or sorted(p for p in CAPTURES.iterdir() if p.is_file())
    for path in files:
        try:
            record = spec_decode_otel.record_from_text(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # not JSON, JSON lines or SSE
            print(f"{path.name}: unreadable ({exc})")
            continue
        print(f"{path.name}: {describe(record)}")

    # A body that is already decoded (a log line's JSON, say) needs no text round trip.
    body = json.loads((CAPTURES / "vllm_response.json").read_text(encoding="utf-8"))
    record = spec_decode_otel.record_from_json(body)
    print(f"record_from_json(vllm body) as JSON: {record.model_dump_json() if record else None}")


if __name__ == "__main__":
    main(sys.argv[1:])
