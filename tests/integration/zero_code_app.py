"""A plain ``openai`` application with no telemetry code at all.

``test_instrumentation_zero_code.py`` runs it as ``opentelemetry-instrument python
zero_code_app.py``; the simulator's URL comes from ``SIMULATOR_URL``. It makes one
non-streaming and one streaming chat call, prints what the server said (as JSON, for the
test to compare against what was exported) and exits normally, so the SDK flushes.
"""

from __future__ import annotations

import json
import os

import openai

MODEL = "spec-sim"
MESSAGES = [{"role": "user", "content": "Name three prime numbers."}]


def main() -> None:
    client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
    seed = os.environ.get("ZERO_CODE_SEED", "11")
    response = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, extra_headers={"x-sim-seed": seed}
    )
    stats = (response.model_extra or {}).get("metrics", {}).get("speculative_decoding")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-sim-seed": seed},
    )
    chunks = sum(1 for _ in stream)
    client.close()
    print(json.dumps({"id": response.id, "stats": stats, "chunks": chunks}))


if __name__ == "__main__":
    main()
