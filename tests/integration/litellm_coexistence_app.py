"""A LiteLLM application next to another OpenAI instrumentation (genai-openai or
OpenLLMetry), for ``test_litellm_beside_other_instrumentations.py``, which runs it in a
fresh process of the coexistence venv holding that instrumentation and LiteLLM.

Environment:
  SIMULATOR_URL  the simulator's base URL
  COEX_WAY       ``zero-code``: runs under ``opentelemetry-instrument``, which loaded the
                 instrumentors its entry points name and set up the SDK; ``plain``:
                 nothing instruments it (the user's results without any telemetry)

Every call runs under a root span of its own named ``call <label>``: LiteLLM chat and text
completions on the ``openai/`` and ``hosted_vllm/`` routes, sync and async, streamed and
not, then one chat call made with the openai SDK directly (``sdk-chat``, which both other
instrumentations wrap). The script prints one JSON line: the entry points seen, each call's
content and usage (or the error it raised), the spans still open at the end, what was
logged at WARNING or above, and how many spans carrying ``spec_decode.*`` ended.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm
import openai
from app_probes import Logged, OpenSpans, content_and_usage, finish
from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients
from opentelemetry import trace

URL = os.environ["SIMULATOR_URL"]
WAY = os.environ["COEX_WAY"]
MESSAGES = [{"role": "user", "content": "Name three prime numbers."}]
PROMPT = "Name three prime numbers."
#: label -> (api, LiteLLM route, async, streamed)
CALLS: dict[str, tuple[str, str, bool, bool]] = {
    f"{route_label}-{prefix}{api}{suffix}": (api, route, is_async, stream)
    for route_label, route in (("openai", "openai"), ("hosted", "hosted_vllm"))
    for api in ("chat", "text")
    for prefix, is_async in (("", False), ("a", True))
    for suffix, stream in (("", False), ("-stream", True))
}
SDK_CALL = "sdk-chat"
#: Every label, in the order the calls are made (their seeds follow it).
LABELS = (*CALLS, SDK_CALL)
#: Spans that stay open past this many seconds after the last call count as left open.
SETTLE = 20.0


def kwargs_for(label: str, seed: int) -> dict[str, Any]:
    api, route, _, stream = CALLS[label]
    out: dict[str, Any] = {
        "model": f"{route}/m",
        "api_base": URL,
        "api_key": "sk-test",
        "max_tokens": 48,
        "extra_headers": {"x-spec-decode-engine": "vllm", "x-sim-seed": str(seed)},
    }
    out |= {"messages": MESSAGES} if api == "chat" else {"prompt": PROMPT}
    if stream:
        out |= {"stream": True, "stream_options": {"include_usage": True}}
    return out


async def litellm_call(label: str, seed: int) -> list[Any]:
    api, _, is_async, stream = CALLS[label]
    kwargs = kwargs_for(label, seed)
    if is_async:
        run = litellm.acompletion if api == "chat" else litellm.atext_completion
        answer = await run(**kwargs)
        return [c async for c in answer] if stream else [answer]
    run = litellm.completion if api == "chat" else litellm.text_completion
    answer = run(**kwargs)
    return list(answer) if stream else [answer]


def sdk_call(seed: int) -> list[Any]:
    with openai.OpenAI(base_url=URL, api_key="sk-test", max_retries=0) as client:
        answer = client.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=48,
            extra_headers={"x-spec-decode-engine": "vllm", "x-sim-seed": str(seed)},
        )
    return [answer]


async def main() -> None:
    from importlib.metadata import entry_points

    loaders = entry_points(group="opentelemetry_instrumentor")
    report: dict[str, Any] = {"entry_points": [ep.name for ep in loaders]}
    logged = Logged()
    for name in ("", "LiteLLM"):  # LiteLLM's logger does not propagate
        logging.getLogger(name).addHandler(logged)
    spans = OpenSpans()
    provider = trace.get_tracer_provider()
    if WAY == "zero-code":
        provider.add_span_processor(spans)  # type: ignore[attr-defined]

    tracer = trace.get_tracer("coexistence-app")
    results: dict[str, Any] = {}
    for seed, label in enumerate(LABELS, start=7300):
        with tracer.start_as_current_span(f"call {label}"):
            try:
                if label == SDK_CALL:
                    results[label] = content_and_usage("chat", False, sdk_call(seed))
                else:
                    api, _, _, stream = CALLS[label]
                    results[label] = content_and_usage(api, stream, await litellm_call(label, seed))
            except Exception as error:  # the test says which call raised what
                results[label] = {"error": f"{type(error).__name__}: {error}"}
    report["results"] = results

    if WAY == "zero-code":
        # LiteLLM reports a call's end from a logging thread or task, after the answer.
        disabled = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
        expected = 0 if "spec_decode" in disabled else len(LABELS)
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline and (spans.open or spans.recorded < expected):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # anything late (a second record) shows too
        finish()
        report["open_spans"] = sorted(spans.open.values())
        report["recorded"] = spans.recorded
    await close_litellm_async_clients()
    report["logged"] = logged.records
    print(json.dumps(report))


asyncio.run(main())
