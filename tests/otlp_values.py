"""Receiving real OTLP exports in tests, and decoding their attributes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oteltap import OtelTapHttpProtobufReceiver, OtelTapHttpProtobufReceiverSettings

from ports import free_port


def clean_env(*drop: str, **extra: str) -> dict[str, str]:
    """The test process's environment minus every OTEL_/SPEC_DECODE_OTEL_ setting and any
    variable starting with one of ``drop`` (``PYTHON`` for another venv's interpreter,
    another library's own prefix), plus ``extra``."""
    prefixes = ("OTEL_", "SPEC_DECODE_OTEL_", *drop)
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(extra)
    return env


def run_under_opentelemetry_instrument(
    app: Path, timeout: float = 90, **env: str
) -> subprocess.CompletedProcess[str]:
    """``opentelemetry-instrument python app`` (the distro's zero-code launcher, as a user
    runs it), in :func:`clean_env` plus ``env``; its output captured as text."""
    instrument = shutil.which("opentelemetry-instrument")
    assert instrument, "opentelemetry-distro's opentelemetry-instrument is not installed"
    return subprocess.run(
        [instrument, sys.executable, str(app)],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Received:
    """What an OTLP/HTTP receiver got: traces and metrics requests' items, as they arrive."""

    endpoint: str
    spans: list[Any] = field(default_factory=list)
    metrics: list[Any] = field(default_factory=list)


@contextlib.asynccontextmanager
async def receiving_otlp() -> AsyncIterator[Received]:
    """A real OTLP/HTTP (protobuf) receiver on a free loopback port, collecting until the
    block ends."""
    port = free_port()
    settings = OtelTapHttpProtobufReceiverSettings(http_port=port)
    async with OtelTapHttpProtobufReceiver(settings) as receiver:
        received = Received(f"http://127.0.0.1:{port}")

        async def collect(source: Any, into: list[Any]) -> None:
            async for item in source:
                into.append(item)

        tasks = [
            asyncio.create_task(collect(receiver.stream_traces(), received.spans)),
            asyncio.create_task(collect(receiver.stream_metrics(), received.metrics)),
        ]
        await asyncio.sleep(0.05)  # subscribed before anything can arrive
        try:
            yield received
        finally:
            for task in tasks:
                task.cancel()


def otlp_attributes(item: Any) -> dict[str, Any]:
    """An OTLP span's or data point's KeyValue list as a plain dict (arrays as lists)."""
    out: dict[str, Any] = {}
    for kv in item.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [getattr(v, v.WhichOneof("value")) for v in value.array_value.values]
        else:
            out[kv.key] = getattr(value, kind)
    return out
