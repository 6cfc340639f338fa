"""An OpenAI-compatible speculative-decoding server that speaks every engine's wire shape.

It exists so the instrumentation can be tested (and demonstrated) end to end over real
HTTP without a GPU: the numbers it reports come from a seeded acceptance model and obey
each engine's identities, and faults can be switched on per request.

    from spec_decode_otel.simulator import SimulatorConfig, SimulatorServer
    with SimulatorServer(SimulatorConfig(engine="vllm", k=4, alpha=0.7)) as sim:
        client = openai.OpenAI(base_url=sim.base_url, api_key="x")

FastAPI and uvicorn come with the ``simulator`` extra.
"""

from __future__ import annotations

from typing import Any

from spec_decode_otel.simulator.acceptance import (
    AcceptanceProfile,
    Generation,
    generate,
    sample_step,
)
from spec_decode_otel.simulator.config import ENGINES, LEVELS, SimulatorConfig
from spec_decode_otel.simulator.faults import FAULTS


def __getattr__(name: str) -> Any:
    # The server parts need FastAPI and uvicorn (the extra): loaded on first use, so the
    # CLI can list the simulator's flags and say how to install it without them.
    if name == "create_app":
        from spec_decode_otel.simulator.app import create_app

        return create_app
    if name == "SimulatorServer":
        from spec_decode_otel.simulator.server import SimulatorServer

        return SimulatorServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ENGINES",
    "FAULTS",
    "LEVELS",
    "AcceptanceProfile",
    "Generation",
    "SimulatorConfig",
    "SimulatorServer",
    "create_app",
    "generate",
    "sample_step",
]
