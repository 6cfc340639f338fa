"""A plain ``openai`` application: no OpenTelemetry, no spec_decode_otel, nothing to change.

``zero_code.sh`` runs this file under ``opentelemetry-instrument``, which finds
spec-decode-otel through its ``opentelemetry_instrumentor`` entry point and records every
call's acceptance. Run on its own it is just an app (it needs ``OPENAI_BASE_URL``).

Run:  bash examples/zero_code.sh     (or: OPENAI_BASE_URL=... python examples/plain_app.py)
"""

from __future__ import annotations

import os

import openai

MODEL = os.environ.get("OPENAI_MODEL", "llama-3.1-8b-eagle3")
MESSAGES = [{"role": "user", "content": "Summarise speculative decoding in one line."}]


def main() -> None:
    client = openai.OpenAI(api_key=os.environ.get("OPENAI_API_KEY", "sk-example"))
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=48)
    print(f"reply: {len(reply.choices[0].message.content or '')} characters")

    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=48, stream=True
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    print(f"streamed reply: {len(streamed)} characters")
    client.close()


if __name__ == "__main__":
    main()
