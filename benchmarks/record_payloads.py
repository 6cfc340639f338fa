"""Record the response bodies ``overhead.py`` replays, from the project's own simulator.

    python benchmarks/record_payloads.py

The simulator (vLLM merged shape, level ``detailed``, k=4, a fixed seed per request: a
new recording differs only in ids and timestamps) answers on a loopback port; written as
sent to ``benchmarks/data/``: ``chat_nonstream.json``; ``chat_stream.sse``, a stream of
``STREAM_CONTENT_CHUNKS`` content chunks (one per verify step) plus the role,
finish_reason and usage chunks (the last carries the stats) and ``[DONE]``;
``chat_stream_short.sse``, the same with ``STREAM_SHORT_CONTENT_CHUNKS``; and
``manifest.json``, how they were made and their chunk counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer
from spec_decode_otel.sse import SseSplitter

DATA = Path(__file__).resolve().parent / "data"
MODEL = "spec-sim"
K = 4
ALPHA = 0.7
SEED = 7
STREAM_CONTENT_CHUNKS = 100
STREAM_SHORT_CONTENT_CHUNKS = 5
NONSTREAM_MAX_TOKENS = 256
MESSAGES = [{"role": "user", "content": "Summarise speculative decoding in two paragraphs."}]


def _post(base_url: str, body: dict[str, Any], seed: int) -> tuple[bytes, dict[str, str]]:
    request = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-sim-seed": str(seed)},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # loopback only
        return response.read(), {k.lower(): v for k, v in response.headers.items()}


def sse_chunks(body: bytes) -> list[dict[str, Any]]:
    """The JSON chunks of an SSE body (``[DONE]`` excluded)."""
    return [json.loads(e) for e in SseSplitter().feed(body.decode()) if e != "[DONE]"]


def content_chunks(chunks: list[dict[str, Any]]) -> int:
    deltas = [(c.get("choices") or [{}])[0].get("delta") or {} for c in chunks]
    return sum(1 for delta in deltas if delta.get("content"))


def _record_stream(base: str, out: Path, name: str, content: int) -> dict[str, Any]:
    """Record a streaming chat completion with exactly ``content`` content chunks.

    One content chunk per verify step, and tokens per step vary: search ``max_tokens``
    upward until the stream has that many.
    """
    for max_tokens in range(content, content * (K + 1) + 1):
        request = {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True}
        body, headers = _post(base, request | {"stream_options": {"include_usage": True}}, SEED)
        chunks = sse_chunks(body)
        if content_chunks(chunks) == content:
            break
    else:  # pragma: no cover - the simulator's lengths make this unreachable
        raise SystemExit(f"no max_tokens gave {content} content chunks")
    (out / name).write_bytes(body)
    usage_chunk = chunks[-1]
    return {
        "file": name,
        "content_type": headers.get("content-type", "text/event-stream"),
        "bytes": len(body),
        "max_tokens": max_tokens,
        "chunks": len(chunks),
        "content_chunks": content,
        "completion_tokens": usage_chunk["usage"]["completion_tokens"],
        "num_spec_steps": usage_chunk["metrics"]["speculative_decoding"]["num_spec_steps"],
    }


def record(out: Path) -> dict[str, Any]:
    config = SimulatorConfig(
        engine="vllm", level="detailed", k=K, alpha=ALPHA, seed=SEED, max_length=4096
    )
    out.mkdir(parents=True, exist_ok=True)
    with SimulatorServer(config) as sim:
        base = sim.base_url
        body, headers = _post(
            base,
            {"model": MODEL, "messages": MESSAGES, "max_tokens": NONSTREAM_MAX_TOKENS},
            SEED,
        )
        nonstream = json.loads(body)
        stats = nonstream["metrics"]["speculative_decoding"]
        (out / "chat_nonstream.json").write_bytes(body)
        nonstream_meta = {
            "file": "chat_nonstream.json",
            "content_type": headers.get("content-type", "application/json"),
            "bytes": len(body),
            "max_tokens": NONSTREAM_MAX_TOKENS,
            "completion_tokens": nonstream["usage"]["completion_tokens"],
            "num_spec_steps": stats["num_spec_steps"],
        }

        stream_meta = _record_stream(base, out, "chat_stream.sse", STREAM_CONTENT_CHUNKS)
        short_meta = _record_stream(base, out, "chat_stream_short.sse", STREAM_SHORT_CONTENT_CHUNKS)
    manifest = {
        "recorded_with": "benchmarks/record_payloads.py",
        "simulator": {"engine": "vllm", "level": "detailed", "k": K, "alpha": ALPHA, "seed": SEED},
        "model": MODEL,
        "nonstream": nonstream_meta,
        "stream": stream_meta,
        "stream_short": short_meta,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DATA, help="output directory")
    args = parser.parse_args(argv)
    manifest = record(args.out)
    json.dump(manifest, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
