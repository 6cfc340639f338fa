"""Instrumentation settings: keyword arguments, else ``SPEC_DECODE_OTEL_*`` variables.

Every behaviour that changes what goes on the wire (request fields, headers) is opt-in,
because some OpenAI-compatible servers reject fields they do not know.

A bad keyword is an error in the caller's code. A bad variable value warns and falls
back instead: under ``opentelemetry-instrument`` an error would stop every
instrumentation of the process, not just this one.
"""

from __future__ import annotations

import difflib
import os
import warnings
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

Mode = Literal["auto", "span", "enrich"]
_MODES: tuple[str, ...] = get_args(Mode)

ENV_PREFIX = "SPEC_DECODE_OTEL_"


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(ENV_PREFIX + name, "").strip()
    if not raw:
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    why = f"not a boolean (1, true, yes, on / 0, false, no, off); {str(default).lower()} is used"
    _ignored(name, raw, why)
    return default


def _env_int(name: str, default: int) -> int:
    """A whole number, 0 or more (every integer setting is a count or a length)."""
    raw = os.environ.get(ENV_PREFIX + name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:  # also for more digits than int() reads (sys.get_int_max_str_digits)
        _ignored(name, raw, f"not an integer; {default} is used")
        return default
    if value < 0:
        _ignored(name, raw, f"negative; {default} is used")
        return default
    return value


def _env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    raw = os.environ.get(ENV_PREFIX + name, "").strip().lower()
    if raw and raw not in choices:
        _ignored(name, raw, f"not one of {', '.join(choices)}; {default} is used")
        return default
    return raw or default


def _ignored(name: str, value: str, why: str) -> None:
    shown = repr(value) if len(value) <= 100 else f"{value[:100]!r}... ({len(value)} characters)"
    warnings.warn(f"{ENV_PREFIX}{name}={shown}: {why}", RuntimeWarning, stacklevel=2)


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
        env: dict[str, Any] = {
            "mode": _env_choice("MODE", _MODES, "auto"),
            "inject_include_usage": _env_bool("INJECT_INCLUDE_USAGE", False),
            "inject_traceparent": _env_bool("INJECT_TRACEPARENT", False),
            "record_per_step": _env_bool("RECORD_PER_STEP", False),
            "per_step_max_length": _env_int("PER_STEP_MAX_LENGTH", 1024),
            "request_engine_stats": _known_engines(_env_list("REQUEST_ENGINE_STATS")),
            "metric_attributes": _env_list("METRIC_ATTRIBUTES"),
            "genai_metrics": _env_bool("GENAI_METRICS", False),
        }
        known = {f.name for f in fields(cls)}
        _warn_misspelt({name.upper() for name in known})
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown spec_decode_otel option(s): {', '.join(sorted(unknown))}")
        for f in fields(cls):
            # a bool, int or str setting takes only its own type: "false" would be true
            value = overrides.get(f.name)
            if value is None or isinstance(f.default, tuple) or type(value) is type(f.default):
                continue
            raise TypeError(f"{f.name} must be a {type(f.default).__name__}, not {value!r}")
        env.update({k: v for k, v in overrides.items() if v is not None})
        for name in ("request_engine_stats", "metric_attributes"):
            value = env[name]
            env[name] = (value,) if isinstance(value, str) else tuple(value)
        if env["mode"] not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}")
        if env["per_step_max_length"] < 0:
            length = env["per_step_max_length"]
            raise ValueError(f"per_step_max_length must be 0 or more, not {length}")
        _check_engines(env["request_engine_stats"])
        return cls(**env)


def _warn_misspelt(variables: set[str]) -> None:
    """A misspelt variable is never read, so its setting silently keeps the default: warn
    about a ``SPEC_DECODE_OTEL_*`` name close to one of ours. Names far from all of them
    pass in silence, since scripts and tests may give the prefix their own variables."""
    for name in sorted(os.environ):
        suffix = name[len(ENV_PREFIX) :] if name.startswith(ENV_PREFIX) else ""
        if not suffix or suffix in variables:
            continue
        close = difflib.get_close_matches(suffix, variables, n=1, cutoff=0.7)
        if close:
            meant = ENV_PREFIX + close[0]
            message = f"{name} is not a spec-decode-otel variable and is not read"
            warnings.warn(f"{message}; did you mean {meant}?", RuntimeWarning, stacklevel=3)


def _engines() -> set[str]:
    from spec_decode_otel.adapters.registry import registered_adapters

    return {adapter.engine for adapter in registered_adapters()}


def _check_engines(names: tuple[str, ...]) -> None:
    """An engine name nobody knows is a configuration error, like an unknown keyword:
    silently sending nothing would leave the user with an empty dashboard."""
    known = _engines()
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(
            f"request_engine_stats: unknown engine(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )


def _known_engines(names: tuple[str, ...]) -> tuple[str, ...]:
    """The variable's engine names that an adapter knows; the others are warned about."""
    known = _engines()
    unknown = [name for name in names if name not in known]
    if unknown:
        _ignored(
            "REQUEST_ENGINE_STATS",
            ",".join(names),
            f"unknown engine(s) {', '.join(unknown)} left out; known: {', '.join(sorted(known))}",
        )
    return tuple(name for name in names if name in known)
