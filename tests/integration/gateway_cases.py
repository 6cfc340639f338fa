"""What the gateway tests send and compare: the engine shapes, the request bodies, and a
response minus what differs between two answers to one sample.

Shared by ``test_gateways.py`` (the Rust gateways) and ``test_gateway_portkey.py``, so
that both ask every gateway the same requests.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
from instrumentation_helpers import MESSAGES, MODEL, PROMPT

from spec_decode_otel.payloads import parse_payloads

#: The gateways venv (``scripts/install-gateways.sh``): smg, sglang-router, vllm-router.
ENV_GATEWAYS = "SPEC_DECODE_OTEL_GATEWAYS"
INSTALL_HINT = (
    f'export {ENV_GATEWAYS}="$(bash scripts/install-gateways.sh | tail -n 1)" '
    "(scripts/test.sh does this)"
)

#: shape -> (the simulator's engine, what the client adds to the request body)
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "vllm": ("vllm", {}),
    "vllm-premerge": ("vllm-premerge", {}),
    "sglang": ("sglang", {"return_spec_tokens_details": True}),
    "sglang-meta-info": ("sglang", {"return_meta_info": True}),
    "trtllm": ("trtllm", {}),
    "llamacpp": ("llamacpp", {}),
    "smg": ("smg", {}),  # the usage pair (completion_tokens_details)
}


def request_body(shape: str, api: str, stream: bool, extra: bool = True) -> dict[str, Any]:
    """The request body, the same through a gateway and straight to the simulator.
    ``extra`` False leaves out the shape's own fields (what a gateway that drops them
    sends on)."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "stream": stream}
    if extra:
        body.update(SHAPES[shape][1])
    if api == "chat":
        body["messages"] = MESSAGES
    else:
        body["prompt"] = PROMPT
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def api_path(api: str) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    """The decoded body, or the list of a stream's chunks (no instrumentation)."""
    response = httpx.post(url, json=body, headers=headers, timeout=30)
    response.raise_for_status()
    return parse_payloads(response.text) if body.get("stream") else response.json()


def sdk_call(
    base_url: str, shape: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[Any]:
    """One call of the (instrumented) ``openai`` SDK with ``body``, the shape's own
    fields sent as ``extra_body``; every chunk of a stream is read."""
    extra = SHAPES[shape][1]
    kwargs = {k: v for k, v in body.items() if k not in extra}
    with openai.OpenAI(
        base_url=base_url + "/v1", api_key="sk-test", max_retries=0, default_headers=headers
    ) as client:
        chat = "messages" in body
        create = client.chat.completions.create if chat else client.completions.create
        result = create(**kwargs, extra_body=extra)
        return list(result) if body.get("stream") else [result]


def comparable(payload: Any) -> Any:
    """A body or chunk list minus what differs between two answers to the same sample:
    ids, ``created`` and SGLang's ``meta_info.id``."""
    if isinstance(payload, list):
        return [comparable(c) for c in payload]
    out = {k: v for k, v in payload.items() if k not in ("id", "created")}
    choices = []
    for choice in out.get("choices") or ():
        if isinstance(choice.get("meta_info"), dict):
            choice = {**choice, "meta_info": {**choice["meta_info"], "id": None}}
        choices.append(choice)
    return {**out, "choices": choices} if "choices" in out else out
