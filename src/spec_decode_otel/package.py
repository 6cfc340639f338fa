"""The instrumented library's supported releases (opentelemetry-instrumentation's
convention: checked by ``BaseInstrumentor`` and by ``opentelemetry-bootstrap``)."""

_instruments = ("openai >= 1.40, < 4",)
