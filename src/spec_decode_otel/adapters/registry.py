"""Detection: which adapter, if any, owns a request's responses, and the outcome.

Order is deterministic and documented: the built-ins ``vllm``, ``sglang``,
``tensorrt_llm``, ``llamacpp``, ``usage_details``, then third-party adapters from the
entry-point group ``spec_decode_otel.adapters`` sorted by entry-point name. Order
matters only for logging, because the rule is exclusive: exactly one adapter may claim
a response; two claims yield no record (outcome ``ambiguous``) rather than a guess.

Fallback adapters (an optional class attribute ``fallback = True``, e.g. the built-in
``usage_details``, which reads counts a gateway put in ``usage``) are asked only when
no other adapter claims the response, so a body that carries an engine's own stats is
read from those.

An adapter that raises anything but :class:`InvalidPayload` — from ``can_adapt``,
``adapt`` or at load time — is isolated: it counts as not claiming for that call, the
others still run, and it is logged once at warning level (later failures at debug,
rate-limited).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points

from spec_decode_otel._fork import fork_safe_lock
from spec_decode_otel._logging import logger, rate_limited
from spec_decode_otel.adapters.llamacpp import LlamaCppAdapter
from spec_decode_otel.adapters.protocol import InvalidPayload, SpecDecodeAdapter
from spec_decode_otel.adapters.sglang import SglangAdapter
from spec_decode_otel.adapters.trtllm import TensorRtLlmAdapter
from spec_decode_otel.adapters.usage_details import UsageDetailsAdapter
from spec_decode_otel.adapters.vllm import VllmAdapter
from spec_decode_otel.capture import ParsedResponse, is_multi_sequence
from spec_decode_otel.outcome import Outcome
from spec_decode_otel.record import SpecDecodeAcceptanceRecord

ENTRY_POINT_GROUP = "spec_decode_otel.adapters"

BUILTIN_ADAPTERS: tuple[type[SpecDecodeAdapter], ...] = (
    VllmAdapter,
    SglangAdapter,
    TensorRtLlmAdapter,
    LlamaCppAdapter,
    UsageDetailsAdapter,
)

#: Held while plug-ins load. Reentrant: a plug-in's import may itself run detection.
_lock = threading.RLock()
_adapters: tuple[type[SpecDecodeAdapter], ...] | None = None
#: True while ``_lock``'s holder imports plug-ins.
_loading = False
_failed_once: set[str] = set()
_failed_lock = fork_safe_lock()  # not _lock: plug-ins fail while _lock loads them


def _after_fork_in_child() -> None:
    """A child forked while another thread loaded plug-ins would wait for that thread's
    lock for good: it gets a new one, and loads the plug-ins itself."""
    global _lock, _loading
    _lock = threading.RLock()
    _loading = False


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class Detection:
    """What detection found for one request: the record (or None), and why."""

    record: SpecDecodeAcceptanceRecord | None
    outcome: Outcome
    #: For ``invalid``: the first rule the payload broke; for ``ambiguous``: who claimed.
    reason: str | None = None


def _adapter_name(adapter: object) -> str:
    return getattr(adapter, "__qualname__", None) or repr(adapter)


def _report_failure(adapter: object, where: str) -> None:
    name = _adapter_name(adapter)
    with _failed_lock:
        first = name not in _failed_once
        _failed_once.add(name)
    if first:
        logger.warning("spec-decode adapter %s raised in %s; isolated", name, where, exc_info=True)
    else:
        rate_limited.log(logging.DEBUG, f"adapter-fail:{name}", "adapter %s raised again", name)


def _load_plugins() -> list[type[SpecDecodeAdapter]]:
    plugins: list[type[SpecDecodeAdapter]] = []
    try:
        found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    except Exception:
        logger.warning("could not list %s entry points", ENTRY_POINT_GROUP, exc_info=True)
        return plugins
    for ep in found:
        try:
            adapter = ep.load()
        except Exception:
            _report_failure(ep.value, "load")
            continue
        if not (
            callable(getattr(adapter, "can_adapt", None))
            and callable(getattr(adapter, "adapt", None))
        ):
            logger.warning("entry point %s is not a spec-decode adapter; ignored", ep.value)
            continue
        if adapter not in BUILTIN_ADAPTERS and adapter not in plugins:
            plugins.append(adapter)
    return plugins


def registered_adapters() -> tuple[type[SpecDecodeAdapter], ...]:
    """The adapters detection runs, in order (plug-ins are discovered once, lazily).

    Once they are loaded, every call reads them without a lock. Other threads' first
    calls wait for the load; a plug-in whose import runs detection (a self-check, an
    instrumented call) re-enters on the loading thread and gets the built-ins.
    """
    global _adapters, _loading
    adapters = _adapters
    if adapters is not None:
        return adapters
    with _lock:
        if _adapters is None:
            if _loading:
                return BUILTIN_ADAPTERS
            _loading = True
            try:
                _adapters = BUILTIN_ADAPTERS + tuple(_load_plugins())
            finally:
                _loading = False
        return _adapters


def reload_adapters() -> tuple[type[SpecDecodeAdapter], ...]:
    """Rediscover entry-point adapters (after installing a plug-in at run time)."""
    global _adapters
    with _lock:
        _adapters = None
    with _failed_lock:
        _failed_once.clear()
    return registered_adapters()


def is_fallback(adapter: object) -> bool:
    """True for an adapter asked only when no other claims the response."""
    return getattr(adapter, "fallback", False) is True


def stats_need_usage_chunk(engine: str) -> bool:
    """True when an adapter lists ``engine`` in ``usage_chunk_engines``: its streams
    carry no stats without ``stream_options.include_usage``. A llama.cpp stream, by
    contrast, carries its counts on the finish chunk, and lacks them only when nothing
    was drafted."""
    return any(engine in getattr(a, "usage_chunk_engines", ()) for a in registered_adapters())


def _claimants(
    adapters: Sequence[type[SpecDecodeAdapter]], responses: Sequence[ParsedResponse]
) -> list[type[SpecDecodeAdapter]]:
    claimants = []
    for adapter in adapters:
        try:
            if adapter.can_adapt(responses):
                claimants.append(adapter)
        except Exception:
            _report_failure(adapter, "can_adapt")
    return claimants


def detect_outcome(responses: Sequence[ParsedResponse]) -> Detection:
    """The record for one request's responses and the outcome. Never raises."""
    if not responses:
        return Detection(None, Outcome.NO_STATS)
    if is_multi_sequence(responses):
        return Detection(None, Outcome.MULTI_SEQUENCE)
    adapters = registered_adapters()
    claimants = _claimants([a for a in adapters if not is_fallback(a)], responses)
    if not claimants:
        claimants = _claimants([a for a in adapters if is_fallback(a)], responses)
    if not claimants:
        return Detection(None, Outcome.NO_STATS)
    if len(claimants) > 1:
        names = " and ".join(_adapter_name(a) for a in claimants[:2])
        rate_limited.log(
            logging.WARNING,
            f"ambiguous:{names}",
            "spec-decode adapters %s both claim one response; no record",
            names,
        )
        return Detection(None, Outcome.AMBIGUOUS, names)
    claimant = claimants[0]
    try:
        record = claimant.adapt(responses)
        if not isinstance(record, SpecDecodeAcceptanceRecord):
            engine = getattr(claimant, "engine", _adapter_name(claimant))
            raise InvalidPayload(f"{engine} payload is malformed")
    except InvalidPayload as exc:
        rate_limited.log(logging.DEBUG, "invalid", "spec-decode payload rejected: %s", exc)
        return Detection(None, Outcome.INVALID, str(exc))
    except Exception:
        _report_failure(claimant, "adapt")
        return Detection(None, Outcome.INVALID, f"{_adapter_name(claimant)} raised")
    return Detection(record, Outcome.PARTIAL if record.is_partial else Outcome.RECORDED)


def detect(responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
    """The record for one request's responses, or None. Never raises."""
    return detect_outcome(responses).record
