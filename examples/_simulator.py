"""Shared by the examples: where the OpenAI-compatible server is.

With ``OPENAI_BASE_URL`` set, the examples talk to that server (your vLLM, SGLang,
TensorRT-LLM or llama.cpp deployment; ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` are read
too). Without it they start the project's simulator in-process on a free loopback port,
speaking vLLM's per-request spec-decode format, so every example runs with no GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer

API_KEY = os.environ.get("OPENAI_API_KEY", "sk-example")
MODEL = os.environ.get("OPENAI_MODEL", "llama-3.1-8b-eagle3")


@contextmanager
def openai_base_url(**config: object) -> Iterator[str]:
    """``OPENAI_BASE_URL``, else the base URL of a simulator started for the block.

    ``config`` goes to :class:`SimulatorConfig` (engine, k, alpha, model_alphas, ...).
    """
    configured = os.environ.get("OPENAI_BASE_URL")
    if configured:
        yield configured
        return
    settings = {"seed": 7, "min_length": 32, "max_length": 96, **config}
    with SimulatorServer(SimulatorConfig(**settings)) as simulator:
        yield simulator.base_url
