"""Instrumentation settings: keyword arguments, else ``SPEC_DECODE_OTEL_*`` variables.

Every behaviour that changes what goes on the wire (request fields, headers) is opt-in,
because some OpenAI-compatible servers reject fields they do not know.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Literal

Mode = Literal["auto", "span", "enrich"]
_MODES = ("auto", "span", "enrich")

ENV_PREFIX = "SPEC_DECODE_OTEL_"


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(ENV_PREFIX + name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(ENV_PREFIX + name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        return default


def _env_list(name: str) -> tuple[str, ...]:
    raw = os.environ.get(ENV_PREFIX + name, "")
    return tuple(part.strip() for part in raw.split(",") if part.strip())


@dataclass(frozen=True)
class Settings:
    """What the instrumentation does. See README's configuration table."""

    #: ``auto``: add our attributes to another GenAI instrumentation's span when one is
    #: current for the call, else make our own span; ``span``/``enrich`` force either.
    mode: Mode = "auto"
    #: Add ``stream_options.include_usage=true`` to streaming requests that did not set
    #: it (vLLM sends streaming stats only on the usage chunk), and hide that extra chunk.
    inject_include_usage: bool = False
    #: Add a W3C ``traceparent`` header so the server's own spans join the trace.
    inject_traceparent: bool = False
    #: Record ``per_step_accepted``/``per_step_drafted`` as span attributes.
    record_per_step: bool = False
    #: Longest per-step array recorded as a span attribute.
    per_step_max_length: int = 1024
    #: Engines whose stats need a request field (``sglang``): the fields their adapter
    #: declares are merged into the body, never overwriting a value the user set.
    request_engine_stats: tuple[str, ...] = ()
    #: User attribute keys (from ``spec_decode_otel.attributes``) also put on metrics.
    metric_attributes: tuple[str, ...] = ()
    #: Also record the GenAI semconv client metrics (duration, token usage, time to
    #: first chunk). Off by default: they are not spec-decode data, and a GenAI
    #: instrumentation (openai-v2) records them already.
    genai_metrics: bool = False

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Environment first, keyword arguments win; unknown keywords are an error."""
        mode = os.environ.get(ENV_PREFIX + "MODE", "auto").strip().lower() or "auto"
        env: dict[str, Any] = {
            "mode": mode if mode in _MODES else "auto",
            "inject_include_usage": _env_bool("INJECT_INCLUDE_USAGE", False),
            "inject_traceparent": _env_bool("INJECT_TRACEPARENT", False),
            "record_per_step": _env_bool("RECORD_PER_STEP", False),
            "per_step_max_length": _env_int("PER_STEP_MAX_LENGTH", 1024),
            "request_engine_stats": _env_list("REQUEST_ENGINE_STATS"),
            "metric_attributes": _env_list("METRIC_ATTRIBUTES"),
            "genai_metrics": _env_bool("GENAI_METRICS", False),
        }
        known = {f.name for f in fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown spec_decode_otel option(s): {', '.join(sorted(unknown))}")
        env.update({k: v for k, v in overrides.items() if v is not None})
        for name in ("request_engine_stats", "metric_attributes"):
            value = env[name]
            env[name] = (value,) if isinstance(value, str) else tuple(value)
        if env["mode"] not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}")
        _check_engines(env["request_engine_stats"])
        return cls(**env)


def _check_engines(names: tuple[str, ...]) -> None:
    """An engine name nobody knows is a configuration error, like an unknown keyword:
    silently sending nothing would leave the user with an empty dashboard."""
    from spec_decode_otel.adapters.registry import registered_adapters

    known = {adapter.engine for adapter in registered_adapters()}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(
            f"request_engine_stats: unknown engine(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
