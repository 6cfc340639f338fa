"""Detection: which adapter, if any, owns a request's responses.

Order is deterministic and documented: the built-ins ``vllm``, ``sglang``,
``tensorrt_llm``, ``llamacpp``, then third-party adapters from the entry-point group
``spec_decode_otel.adapters`` sorted by entry-point name. Order matters only for
logging, because the rule is exclusive: exactly one adapter may claim a response;
two claims yield no record (and a rate-limited warning) rather than a guess.

An adapter that raises — from ``can_adapt``, ``adapt`` or at load time — is isolated:
it counts as not claiming for that call, the others still run, and it is logged once at
warning level (later failures at debug, rate-limited).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from importlib.metadata import entry_points

from spec_decode_otel._logging import logger, rate_limited
from spec_decode_otel.adapters.llamacpp import LlamaCppAdapter
from spec_decode_otel.adapters.protocol import SpecDecodeAdapter
from spec_decode_otel.adapters.sglang import SglangAdapter
from spec_decode_otel.adapters.trtllm import TensorRtLlmAdapter
from spec_decode_otel.adapters.vllm import VllmAdapter
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import SpecDecodeAcceptanceRecord

ENTRY_POINT_GROUP = "spec_decode_otel.adapters"

BUILTIN_ADAPTERS: tuple[type[SpecDecodeAdapter], ...] = (
    VllmAdapter,
    SglangAdapter,
    TensorRtLlmAdapter,
    LlamaCppAdapter,
)

_lock = threading.Lock()
_adapters: tuple[type[SpecDecodeAdapter], ...] | None = None
_failed_once: set[str] = set()


def _adapter_name(adapter: object) -> str:
    return getattr(adapter, "__qualname__", None) or repr(adapter)


def _report_failure(adapter: object, where: str) -> None:
    name = _adapter_name(adapter)
    if name not in _failed_once:
        _failed_once.add(name)
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
    """The adapters detection runs, in order (plug-ins are discovered once, lazily)."""
    global _adapters
    adapters = _adapters
    if adapters is None:
        with _lock:
            if _adapters is None:
                _adapters = BUILTIN_ADAPTERS + tuple(_load_plugins())
            adapters = _adapters
    return adapters


def reload_adapters() -> tuple[type[SpecDecodeAdapter], ...]:
    """Rediscover entry-point adapters (after installing a plug-in at run time)."""
    global _adapters
    with _lock:
        _adapters = None
        _failed_once.clear()
    return registered_adapters()


def detect(responses: Sequence[ParsedResponse]) -> SpecDecodeAcceptanceRecord | None:
    """The record for one request's responses, or None. Never raises."""
    if not responses:
        return None
    claimant = None
    for adapter in registered_adapters():
        try:
            claims = adapter.can_adapt(responses)
        except Exception:
            _report_failure(adapter, "can_adapt")
            continue
        if not claims:
            continue
        if claimant is not None:
            rate_limited.log(
                logging.WARNING,
                f"ambiguous:{_adapter_name(claimant)}:{_adapter_name(adapter)}",
                "spec-decode adapters %s and %s both claim one response; no record",
                _adapter_name(claimant),
                _adapter_name(adapter),
            )
            return None
        claimant = adapter
    if claimant is None:
        return None
    try:
        record = claimant.adapt(responses)
    except Exception:
        _report_failure(claimant, "adapt")
        return None
    if record is not None and not isinstance(record, SpecDecodeAcceptanceRecord):
        rate_limited.log(
            logging.DEBUG, "bad-return", "adapter %s returned a non-record", _adapter_name(claimant)
        )
        return None
    return record
