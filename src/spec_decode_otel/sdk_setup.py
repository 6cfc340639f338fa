"""``setup()``: one call from nothing to exported spans and metrics (the ``otlp`` extra).

Builds a TracerProvider and a MeterProvider from the standard ``OTEL_*`` variables
(service name and resource attributes, ``OTEL_EXPORTER_OTLP_ENDPOINT``/``_PROTOCOL``,
headers, timeouts, metric export interval), installs them globally, and instruments.
``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` name each signal's exporters as for
the SDK's auto-configuration (``otlp``, ``console``, ``none``, any installed exporter's
name, a comma-separated list); unset, a signal goes over OTLP when an endpoint is set for
it. A value the SDK refuses (a protocol other than ``grpc`` or ``http/protobuf``, an
interval of 0, an exporter name nothing provides) warns and leaves that exporter out.
With no endpoint and no exporter variable nothing is exported and nothing fails: the
application keeps running, the instrumentation's data is simply kept in-process (readable
with a reader passed in ``metric_readers``). Exporters use batching and export timeouts,
so a stopped collector never blocks the application; providers are flushed and shut down
at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.util
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import metrics, trace

from spec_decode_otel.instrumentation import SpecDecodeInstrumentor, caller_stacklevel

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

_MISSING_EXTRA = (
    "spec_decode_otel.setup() needs the OpenTelemetry SDK and OTLP exporters: "
    "pip install 'spec-decode-otel[otlp]' (or configure your own SDK and call "
    "SpecDecodeInstrumentor().instrument())"
)

#: How long exit may wait for a final flush (seconds): bounded so a dead collector
#: cannot hold the process, long enough for one export round trip. Both providers are
#: flushed at once within this bound; what is not exported by then is dropped.
SHUTDOWN_TIMEOUT_S = 5.0

_T = TypeVar("_T")
#: A provider setup() built (the SDK's) or borrowed (whatever the application installed).
_AnyProvider = trace.TracerProvider | metrics.MeterProvider


def _flush_and_stop(provider: _AnyProvider, stop: bool = True) -> None:
    # A dead or hung collector must not fail the application's exit (nor a borrowed
    # provider that has no force_flush: the API's do not).
    with contextlib.suppress(Exception):
        provider.force_flush(int(SHUTDOWN_TIMEOUT_S * 1000))  # type: ignore[union-attr]
    if stop:
        with contextlib.suppress(Exception):
            provider.shutdown()  # type: ignore[union-attr]


@dataclass
class Providers:
    """The providers :func:`setup` records into, for tests and for flushing by hand.

    ``exporting``: whether ``setup()`` built an exporter. ``exports``: where each signal
    (``spans``, ``metrics``) goes, in words, one entry per exporter ``setup()`` built ("to
    the console (stdout)", "over OTLP/gRPC to http://localhost:4317 (the default
    endpoint)"), or "by the exporters of the TracerProvider installed before setup()" for
    a provider the application (or ``opentelemetry-instrument``) had installed already; a
    signal that goes nowhere is left out. Such a provider is flushed but not stopped; it
    may be another SDK's (logfire's proxies hand on to theirs), hence the API types.
    """

    tracer_provider: trace.TracerProvider
    meter_provider: metrics.MeterProvider
    exporting: bool
    exports: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _borrowed: tuple[_AnyProvider, ...] = field(default=(), repr=False)
    _stopped: bool = field(default=False, init=False, repr=False)

    def _is_borrowed(self, provider: object) -> bool:
        """Whether ``provider`` was installed before ``setup()``: not ours to stop."""
        return any(provider is borrowed for borrowed in self._borrowed)

    def shutdown(self) -> None:
        """Flush and stop both providers (also at exit, for the live one); idempotent.

        Returns within ``SHUTDOWN_TIMEOUT_S`` whatever the collector does. The OTLP
        exporters' own deadline (``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s by default) applies
        per export, with retries inside it, and a flush followed by a shutdown exports
        more than once per signal: run in sequence, a dead collector held the exit for
        half a minute and a hung one (accepting, never answering) for longer. So both
        providers are flushed in parallel on daemon threads, and exit stops waiting at
        the bound (except at exit on CPython 3.12.0 and 3.12.1, which start no thread
        there: the providers are flushed in turn, bounded only by the exporters' own
        timeouts).
        """
        if self._stopped:
            return
        self._stopped = True
        _live.pop(id(self), None)
        providers: dict[str, _AnyProvider] = {
            "traces": self.tracer_provider,
            "metrics": self.meter_provider,
        }
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        started: list[threading.Thread] = []
        for name, provider in providers.items():
            stop = not self._is_borrowed(provider)
            worker = threading.Thread(
                target=_flush_and_stop,
                args=(provider, stop),
                name=f"spec-decode-otel-{name}-flush",
                daemon=True,
            )
            try:
                worker.start()
            except RuntimeError:
                # CPython 3.12.0 and 3.12.1 start no thread from an atexit handler
                # ("can't create new thread at interpreter shutdown", gh-113964): flush
                # here, in turn and without the bound, rather than not at all.
                _flush_and_stop(provider, stop)
                continue
            started.append(worker)
        for worker in started:
            worker.join(max(0.0, deadline - time.monotonic()))


def _otlp_variable(signal: str, name: str) -> tuple[str, str]:
    """``OTEL_EXPORTER_OTLP_<SIGNAL>_<NAME>`` if set and not empty, else
    ``OTEL_EXPORTER_OTLP_<NAME>``: the precedence the OTLP exporters themselves apply. The
    variable's name and value ("" when unset)."""
    variable = f"OTEL_EXPORTER_OTLP_{signal}_{name}"
    if not os.environ.get(variable):
        variable = f"OTEL_EXPORTER_OTLP_{name}"
    return variable, os.environ.get(variable, "")


#: The OTLP transports the Python exporters implement: the SDK's auto-configuration
#: (``_EXPORTER_BY_OTLP_PROTOCOL``) knows these two and refuses any other value,
#: ``http/json`` included.
_PROTOCOLS = ("grpc", "http/protobuf")


def _exporter_names(signal: str) -> list[str]:
    """The exporters ``signal`` (``TRACES``, ``METRICS``) goes to.

    ``OTEL_<SIGNAL>_EXPORTER`` lists them, comma-separated, as for the SDK's
    auto-configuration: ``otlp``, ``console``, or any other name an installed package
    provides; ``none`` is none (as a deployment whose endpoint takes traces only, such as
    Jaeger's, says it). Unset, the signal goes over OTLP when an endpoint is set for it,
    and nowhere otherwise. Nothing is exported under ``OTEL_SDK_DISABLED=true``.

    Not the SDK's own ``_get_exporter_names`` (private, ``opentelemetry.sdk._configuration``,
    alike in 1.31 and 1.45): unset, it names no exporter; it takes ``none`` only alone and
    does not lower-case; it resolves ``otlp`` for the whole list, so a refused protocol
    would fail ``console`` beside it.
    """
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    listed = os.environ.get(f"OTEL_{signal}_EXPORTER", "").strip().lower()
    if not listed:
        return ["otlp"] if _otlp_variable(signal, "ENDPOINT")[1] else []
    names = (name.strip() for name in listed.split(","))
    return [name for name in dict.fromkeys(names) if name and name != "none"]


#: Where the SDK's auto-configuration finds the exporters ``OTEL_<SIGNAL>_EXPORTER`` names
#: (the SDK registers ``console`` there, the OTLP packages ``otlp_proto_grpc`` and
#: ``otlp_proto_http``, other packages their own).
_ENTRY_POINTS = {
    "TRACES": "opentelemetry_traces_exporter",
    "METRICS": "opentelemetry_metrics_exporter",
}


class _NotInstalled(ValueError):
    """No installed package provides the exporter a name asks for."""


def _exporter_class(signal: str, name: str) -> Any:
    """The class the ``name`` entry point of ``signal``'s group loads; ``ValueError``
    naming the variable when no installed package provides it.

    ``otlp`` is the OTLP package's entry point for the protocol, ``otlp_proto_grpc`` or
    ``otlp_proto_http``, as the SDK's auto-configuration resolves it
    (``_get_exporter_entry_point``, opentelemetry-sdk 1.31 to 1.45). Loading imports the
    exporter on use (gRPC is heavy); built without arguments, each reads every other
    ``OTEL_EXPORTER_OTLP_*`` variable (endpoint, headers, timeout, certificate) itself.
    Not the SDK's private ``_import_exporters``: its error names the entry-point group,
    not the variable the user set.
    """
    from importlib.metadata import entry_points

    wanted = name
    if name == "otlp":
        wanted = "otlp_proto_grpc" if _grpc(signal) else "otlp_proto_http"
    found = entry_points(group=_ENTRY_POINTS[signal])
    if wanted in found.names:
        return found[wanted].load()
    known = ", ".join(sorted(found.names))
    if name == "otlp":  # the default: the user may have named no exporter at all
        raise _NotInstalled(
            f"no installed package provides the OTLP exporter ({wanted}; known: {known}): "
            "pip install 'spec-decode-otel[otlp]'"
        )
    raise _NotInstalled(
        f"OTEL_{signal}_EXPORTER names {name!r}, which no installed package provides "
        f"(known: {known})"
    )


def _span_processor(name: str) -> SpanProcessor:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter as SdkSpanExporter

    exporter = _exporter_class("TRACES", name)
    if not (isinstance(exporter, type) and issubclass(exporter, SdkSpanExporter)):
        raise ValueError(f"OTEL_TRACES_EXPORTER names {name!r}, which is not a span exporter")
    return BatchSpanProcessor(exporter())


def _metric_reader(name: str) -> MetricReader:
    from opentelemetry.sdk.metrics.export import MetricExporter as SdkMetricExporter
    from opentelemetry.sdk.metrics.export import MetricReader as SdkMetricReader
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    exporter = _exporter_class("METRICS", name)
    if isinstance(exporter, type) and issubclass(exporter, SdkMetricReader):
        return exporter()  # a pull exporter (Prometheus's) is a reader itself
    if isinstance(exporter, type) and issubclass(exporter, SdkMetricExporter):
        return PeriodicExportingMetricReader(exporter())
    raise ValueError(f"OTEL_METRICS_EXPORTER names {name!r}, which is not a metric exporter")


#: The OTLP exporters' endpoints when no variable names one (opentelemetry-exporter-otlp
#: 1.45: the gRPC exporter's ``http://localhost:4317``, the HTTP one's
#: ``http://localhost:4318/``, with the signal's path appended).
_DEFAULT_ENDPOINTS = {True: "http://localhost:4317", False: "http://localhost:4318"}


def _destination(signal: str, name: str) -> str:
    """Where the exporter ``name`` sends ``signal`` (``TRACES``, ``METRICS``), in words."""
    if name == "otlp":
        grpc = _grpc(signal)
        endpoint = _otlp_variable(signal, "ENDPOINT")[1].strip()
        if not endpoint:
            endpoint = f"{_DEFAULT_ENDPOINTS[grpc]} (the default endpoint)"
        return f"over OTLP/{'gRPC' if grpc else 'HTTP'} to {endpoint}"
    if name == "console":
        return "to the console (stdout)"
    return f"through the {name!r} exporter"


def _grpc(signal: str) -> bool:
    """gRPC unless the protocol variable says ``http/protobuf`` (OTLP's default transport).

    Raises ``ValueError`` naming the variable for any other value, as the SDK's own
    auto-configuration refuses it ("Unsupported OTLP protocol"): a typo (``grcp``) or
    ``http/json`` would otherwise export over a transport nobody asked for.
    """
    name, value = _otlp_variable(signal, "PROTOCOL")
    protocol = value.strip() if value else "grpc"  # as the SDK: set but blank is refused
    if protocol not in _PROTOCOLS:
        raise ValueError(
            f"{name}={value!r} is not an OTLP protocol the Python exporters speak "
            f"({', '.join(_PROTOCOLS)})"
        )
    return protocol == "grpc"


def _flush_at_child_exit(built: Providers) -> None:
    multiprocessing.util.Finalize(None, built.shutdown, exitpriority=0)


def _refused(what: str, exc: Exception, fallback: str = "") -> None:
    """A RuntimeWarning, at the application's line that called ``setup()``, that
    ``what`` could not be had from the environment (the OTEL_* variables, or the
    exporters installed). An exception without a message is named by its class (the SDK
    meets ``OTEL_PYTHON_METER_PROVIDER=bogus`` with a bare ``StopIteration``)."""
    warnings.warn(
        f"spec_decode_otel.setup(): {what}: {str(exc) or type(exc).__name__}{fallback}",
        RuntimeWarning,
        stacklevel=caller_stacklevel(),
    )


def _exporters(signal: str, kind: str, build: Callable[[str], _T]) -> list[tuple[_T, str]]:
    """Each exporter ``OTEL_<SIGNAL>_EXPORTER`` names (:func:`_exporter_names`) that could
    be built, with where it sends ``kind`` (``spans``, ``metrics``), in words.

    One the SDK refuses to build from its variables (``OTEL_METRIC_EXPORT_INTERVAL=0``,
    ``OTEL_EXPORTER_OTLP_TIMEOUT=abc``, ``OTEL_EXPORTER_OTLP_PROTOCOL=grcp``,
    ``OTEL_EXPORTER_OTLP_COMPRESSION=zstd`` over gRPC), or a name nothing provides, is
    left out with a RuntimeWarning: as under ``opentelemetry-instrument``, the
    application runs on, without that exporter.
    """
    built = []
    for name in _exporter_names(signal):
        try:
            exporter = build(name)
        except Exception as exc:  # whatever an exporter raises, the application starts
            what = kind if name == "otlp" else f"{kind} (exporter {name!r})"
            # The SDK's own messages do not all name the variable ("could not convert
            # string to float: 'abc'" for OTEL_EXPORTER_OTLP_TIMEOUT=abc).
            tail = " (an OTEL_* value the OpenTelemetry SDK refuses)"
            if isinstance(exc, ImportError):  # grpcio or protobuf broken, say
                tail = " (the exporter's package is installed but does not import)"
            elif isinstance(exc, _NotInstalled):
                tail = ""
            _refused(f"{what} are not exported", exc, tail)
            continue
        built.append((exporter, _destination(signal, name)))
    return built


def _tracer_provider(resource: Resource) -> TracerProvider:
    """The SDK's TracerProvider, with the SDK's default span limits when the
    environment's are refused (``OTEL_ATTRIBUTE_COUNT_LIMIT=abc``: ``SpanLimits`` raises)."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    # Our atexit handler (bounded) stops it: the SDK's own would wait without a bound.
    try:
        return TracerProvider(resource=resource, shutdown_on_exit=False)
    except ValueError as exc:
        _refused("span limits the OTEL_* variables set", exc, "; the SDK's defaults are used")
    # The specification's defaults: 128 of each, attribute values of any length.
    limits = SpanLimits(
        max_attributes=128,
        max_events=128,
        max_links=128,
        max_span_attributes=128,
        max_event_attributes=128,
        max_link_attributes=128,
        max_attribute_length=SpanLimits.UNSET,
        max_span_attribute_length=SpanLimits.UNSET,
    )
    return TracerProvider(resource=resource, shutdown_on_exit=False, span_limits=limits)


def _meter_provider(resource: Resource, readers: list[MetricReader]) -> MeterProvider:
    """The SDK's MeterProvider, with the SDK's default exemplar filter (``trace_based``)
    when the environment's is refused (``OTEL_METRICS_EXEMPLAR_FILTER``, which the SDK
    reads before it takes the readers)."""
    from opentelemetry.sdk.metrics import MeterProvider, TraceBasedExemplarFilter

    try:
        return MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
    except ValueError as exc:
        _refused(
            "the exemplar filter the OTEL_* variables set",
            exc,
            "; the SDK's default, trace_based, is used",
        )
    return MeterProvider(
        resource=resource,
        metric_readers=readers,
        shutdown_on_exit=False,
        exemplar_filter=TraceBasedExemplarFilter(),
    )


def _resource(service_name: str | None) -> Resource:
    """The SDK's resource from the environment, named ``service_name`` only when the
    environment names no service.

    ``Resource.create`` reads ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (the
    first wins) and the configured detectors, and falls back to ``unknown_service:<python>``;
    attributes passed to it would win over all of them.
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create({})
    named = resource.attributes.get(SERVICE_NAME)
    unnamed = ("unknown_service", f"unknown_service:{os.path.basename(sys.executable)}")
    if service_name and (not named or named in unnamed):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    return resource


def _warn_borrowed(
    tracer_provider: trace.TracerProvider | None,
    meter_provider: metrics.MeterProvider | None,
    lost: list[str],
) -> None:
    kinds = (("TracerProvider", tracer_provider), ("MeterProvider", meter_provider))
    installed = " and ".join(kind for kind, provider in kinds if provider is not None)
    both = tracer_provider is not None and meter_provider is not None
    is_, it, its = ("are", "them", "their") if both else ("is", "it", "its")
    unused = "".join(
        f"; the {what} passed to setup() cannot be added to it and get nothing" for what in lost
    )
    warnings.warn(
        f"spec_decode_otel.setup(): an OpenTelemetry {installed} {is_} already "
        f"installed (by the application or opentelemetry-instrument); setup() records into "
        f"{it}, and {its} exporters, sampler and resource apply, not setup()'s{unused}",
        RuntimeWarning,
        stacklevel=caller_stacklevel(),
    )


def _installed() -> tuple[trace.TracerProvider | None, metrics.MeterProvider | None]:
    """The providers already installed as the global ones (by the application, or by
    ``opentelemetry-instrument``), other than those of an earlier ``setup()``: the API
    keeps the first provider set, so ``setup()`` records into these instead.

    Whatever was installed counts, not only the SDK's: logfire installs proxies of its
    own (``logfire._internal.tracer.ProxyTracerProvider``, an API ``TracerProvider``) that
    hand on to its SDK providers. What the API returns while none is set is its own
    proxy (the metrics API's is private, alike in opentelemetry-api 1.31 to 1.45)."""
    from opentelemetry.metrics._internal import _ProxyMeterProvider

    found: list[Any] = []
    for get, unset in (
        (trace.get_tracer_provider, trace.ProxyTracerProvider),
        (metrics.get_meter_provider, _ProxyMeterProvider),
    ):
        try:  # it loads OTEL_PYTHON_TRACER_PROVIDER's provider, if one is named
            provider: Any = get()
        except Exception:
            provider = None
        usable = provider is not None and not isinstance(provider, unset)
        found.append(provider if usable and not any(provider is p for p in _made) else None)
    return found[0], found[1]


#: What ``Providers.exports`` says of a signal whose provider was installed already.
_INSTALLED = "by the exporters of the {kind} installed before setup()"

_lock = threading.Lock()
_built: Providers | None = None
#: The providers setup() made that are still alive: a stopped one may still be the global
#: one (the API keeps the first set), which the API holds. Held weakly, so that an app that
#: runs setup() and shutdown() again and again keeps no stopped provider but those.
_made: weakref.WeakSet[_AnyProvider] = weakref.WeakSet()


#: What setup() built and is not shut down yet, for the exit hook. Held here, not by one
#: atexit hook per setup(), which kept every stopped ``Providers``, its exporters and
#: their buffers alive until exit. By id: adding and removing are then each one step, safe
#: between a shutdown() and a setup() on two threads, without the lock.
_live: dict[int, Providers] = {}
_hooked = False


def _shutdown_at_exit() -> None:
    """Flush and stop what is still live. No lock: a thread stopped inside ``setup()``
    could hold one for good at exit."""
    for built in list(_live.values()):
        built.shutdown()


def setup(
    service_name: str | None = None,
    *,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
    set_global: bool = True,
    **instrument_options: Any,
) -> Providers:
    """Build providers from ``OTEL_*`` variables, optionally install them, instrument.

    ``service_name`` is used when the environment names no service (``OTEL_SERVICE_NAME``,
    or ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``). Extra processors and
    readers (e.g. in-memory ones for tests or a terminal summary) are added beside the
    OTLP exporters. Remaining keywords go to ``SpecDecodeInstrumentor().instrument()``.
    A second call warns and returns what the first built (instrumenting with them again
    if ``uninstrument()`` came between); after that one's ``shutdown()``, it builds new
    providers and instruments with them.
    """
    global _built, _hooked
    _import_sdk()
    from opentelemetry.sdk.resources import Resource

    with _lock:
        instrumentor = SpecDecodeInstrumentor()
        if _built is not None and not _built._stopped:
            again = not instrumentor.is_instrumented_by_opentelemetry
            warnings.warn(
                "spec_decode_otel.setup() was already called; returning the providers it built"
                + (
                    ", instrumenting again with them (uninstrument() came between)"
                    if again
                    else " (its settings stay)"
                ),
                RuntimeWarning,
                stacklevel=caller_stacklevel(),
            )
            if again:
                _instrument(instrumentor, _built, instrument_options)
            return _built
        if _built is not None and instrumentor.is_instrumented_by_opentelemetry:
            # Still instrumented with the providers since stopped: the new ones replace them.
            instrumentor.uninstrument()
        installed_tracer, installed_meter = _installed() if set_global else (None, None)
        resource = getattr(installed_tracer, "resource", None)
        if not isinstance(resource, Resource):  # none installed, or not the SDK's
            resource = _resource(service_name)

        exporting = False
        exports: dict[str, list[str]] = {"spans": [], "metrics": []}
        lost: list[str] = []
        tracer_provider: trace.TracerProvider
        if installed_tracer is None:
            built_tracer = _tracer_provider(resource)
            for processor, where in _exporters("TRACES", "spans", _span_processor):
                built_tracer.add_span_processor(processor)
                exports["spans"].append(where)
                exporting = True
            tracer_provider = built_tracer
        else:
            tracer_provider = installed_tracer
            exports["spans"].append(_INSTALLED.format(kind="TracerProvider"))
        add_processor = getattr(tracer_provider, "add_span_processor", None)
        if add_processor is not None:
            for processor in span_processors:
                add_processor(processor)
        elif span_processors:
            lost.append("span_processors")
        if installed_meter and metric_readers:
            lost.append("metric_readers")
        meter_provider: metrics.MeterProvider
        if installed_meter is None:
            readers = list(metric_readers)
            for reader, where in _exporters("METRICS", "metrics", _metric_reader):
                readers.append(reader)
                exports["metrics"].append(where)
                exporting = True
            meter_provider = _meter_provider(resource, readers)
        else:
            meter_provider = installed_meter
            exports["metrics"].append(_INSTALLED.format(kind="MeterProvider"))
        borrowed = tuple(p for p in (installed_tracer, installed_meter) if p is not None)
        if borrowed:
            _warn_borrowed(installed_tracer, installed_meter, lost)

        if set_global:
            if installed_tracer is None:
                trace.set_tracer_provider(tracer_provider)
            if installed_meter is None:
                metrics.set_meter_provider(meter_provider)
        built = Providers(
            tracer_provider,
            meter_provider,
            exporting,
            exports={signal: tuple(where) for signal, where in exports.items() if where},
            _borrowed=borrowed,
        )
        _made.update(p for p in (tracer_provider, meter_provider) if p not in borrowed)
        _live[id(built)] = built
        if not _hooked:
            # Once: atexit.unregister empties a slot but keeps it (CPython 3.10 to 3.13),
            # so moving the hook to the end on each setup() would grow atexit's list too.
            atexit.register(_shutdown_at_exit)
            _hooked = True
        # A multiprocessing child (fork) ends with os._exit, where atexit never runs:
        # flush there at multiprocessing's own exit.
        multiprocessing.util.register_after_fork(built, _flush_at_child_exit)
        _instrument(instrumentor, built, instrument_options)
        _built = built
        return built


def _instrument(
    instrumentor: SpecDecodeInstrumentor, built: Providers, options: dict[str, Any]
) -> None:
    # An installed provider is the global one: passed as None, as the instrumentation
    # opentelemetry-instrument made has it, so that one is not told of other settings.
    tracer_provider, meter_provider = built.tracer_provider, built.meter_provider
    instrumentor.instrument(
        tracer_provider=None if built._is_borrowed(tracer_provider) else tracer_provider,
        meter_provider=None if built._is_borrowed(meter_provider) else meter_provider,
        **options,
    )


def _import_sdk() -> None:
    """Import the SDK (the ``otlp`` extra), or raise the ImportError that names the extra.

    The SDK reads ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` as it is imported (a module-level
    ``SpanLimits._from_env_if_absent``, opentelemetry-sdk 1.31 to 1.45), so a value it
    refuses fails the import itself, and with it the application's start. Imported with
    the variable hidden for that moment, the SDK refuses the value again where it refuses
    the other limits, building the TracerProvider, and ``setup()`` warns and uses the
    defaults (:func:`_tracer_provider`).
    """
    try:
        import opentelemetry.sdk.metrics

        try:
            import opentelemetry.sdk.trace
        except ValueError:
            hidden = os.environ.pop("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", None)
            try:
                import opentelemetry.sdk.trace  # noqa: F401
            finally:
                if hidden is not None:
                    os.environ["OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"] = hidden
    except ImportError as exc:
        raise ImportError(_MISSING_EXTRA) from exc
