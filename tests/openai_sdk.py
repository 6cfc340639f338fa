"""The ``openai`` SDK as tests meet it, on every openai version the package supports.

- ``http``: the HTTP library the installed openai is built on (``httpx2`` from openai 3,
  ``httpx`` before), for its ``Request``, ``Response`` and ``MockTransport``.
- ``mock_client(handler)``: a real ``openai.OpenAI`` whose every request ``handler`` answers.
- ``chat_completion(...)``: a minimal chat completion body the SDK parses, to build on.

Tests that need SDK surface newer than the oldest declared openai (the Responses API types,
``openai.types.responses``, from 1.66) import it inside the test, and
scripts/test-matrix.sh deselects them by name on the oldest versions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import openai


def _transport_of_openai() -> ModuleType:
    for name in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if issubclass(openai.DefaultHttpxClient, module.Client):
            return module
    raise ImportError(f"openai {openai.__version__} is built on neither httpx2 nor httpx")


http = _transport_of_openai()


def mock_client(handler: Callable[[Any], Any]) -> openai.OpenAI:
    """A real client at ``http://engine.test/v1`` over ``http.MockTransport(handler)``."""
    return openai.OpenAI(
        api_key="test",
        base_url="http://engine.test/v1",
        http_client=http.Client(transport=http.MockTransport(handler)),
    )


def chat_completion(
    *, usage: dict[str, Any] | None = None, choice: dict[str, Any] | None = None, **root: Any
) -> dict[str, Any]:
    """A one-choice ``chat.completion`` body ("ok", stopped); ``choice`` adds to the
    choice, ``root`` to (or over) the body's own fields, ``usage`` is left out if None."""
    body: dict[str, Any] = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
                **(choice or {}),
            }
        ],
        **root,
    }
    if usage is not None:
        body["usage"] = usage
    return body
