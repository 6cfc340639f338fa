"""An ``openai`` application whose only OpenTelemetry set-up is Langfuse's, for
``test_beside_sentry_and_langfuse.py``: run in the ``langfuse`` coexistence venv.

``Langfuse(...)`` with no TracerProvider set makes one and sets it globally (langfuse
5.2.0, ``_client/resource_manager.py`` ``_init_tracer_provider``); nothing sets a
MeterProvider. spec-decode-otel is instrumented with the global providers, as
``opentelemetry-instrument`` or a bare ``instrument()`` does. One chat call, one stream.

Environment: ``SIMULATOR_URL``; ``THEIR_ENDPOINT``, Langfuse's base URL (a receiver on
loopback). Prints one JSON line: the results' content, and what was logged at WARNING or
above.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import openai
from app_probes import Logged
from langfuse import Langfuse

from spec_decode_otel import SpecDecodeInstrumentor


def main() -> None:
    logged = Logged()
    logging.getLogger().addHandler(logged)
    langfuse = Langfuse(
        public_key="pk-lf-test", secret_key="sk-lf-test", base_url=os.environ["THEIR_ENDPOINT"]
    )
    SpecDecodeInstrumentor().instrument()
    client = openai.OpenAI(base_url=os.environ["SIMULATOR_URL"], api_key="sk-test", max_retries=0)
    kwargs: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "Name three prime numbers."}],
        "max_tokens": 48,
        "extra_headers": {"x-spec-decode-engine": "vllm", "x-sim-seed": "8300"},
    }
    response = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    chunks = sum(1 for _ in stream)
    client.close()
    langfuse.flush()
    content = response.choices[0].message.content
    print(json.dumps({"content": bool(content), "chunks": chunks, "logged": logged.records}))


if __name__ == "__main__":
    main()
