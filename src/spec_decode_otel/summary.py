"""The records file, and the per-model summary of one (what ``spec-decode-otel summarize``
and ``spec-decode-otel demo`` print).

The records file is JSON Lines: one object per instrumented call, whatever its outcome,
written by :class:`spec_decode_otel.records.RecordsFileProcessor` (``demo --records-out``
uses it) or by anything else that follows this format:

``model``
    the requested model (``gen_ai.request.model``, else ``gen_ai.response.model``), or null
``server``
    ``host:port`` of the server called, or null
``outcome``
    one of :class:`spec_decode_otel.Outcome`'s values (``recorded``, ``partial``,
    ``no_stats``, ``multi_sequence``, ``invalid``, ``ambiguous``, ``not_read_to_end``,
    ``error``)
``engine``
    the record's engine, or null when the call has no record
``trace_id``, ``span_id``
    the call's span, lower-case hex (32 and 16 digits), or null
``record``
    the :class:`~spec_decode_otel.SpecDecodeAcceptanceRecord` as JSON
    (``record.model_dump(mode="json")``: the histogram's keys are strings), or null

Both directions of the format live here, so a row written is a row read. This module needs
only the core: summarizing a file needs no OpenTelemetry SDK.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from spec_decode_otel import telemetry as names
from spec_decode_otel._terminal import printable
from spec_decode_otel.outcome import Outcome
from spec_decode_otel.record import SpecDecodeAcceptanceRecord

OUTCOMES = tuple(o.value for o in Outcome)


# -- writing: one row per span -------------------------------------------------------------


def row_for_span(
    attributes: Mapping[str, Any], trace_id: int | None = None, span_id: int | None = None
) -> dict[str, Any] | None:
    """The records-file row of a span the instrumentation ended (or enriched); None for
    any other span. The record is rebuilt from the ``spec_decode.*`` attributes and
    validated again."""
    outcome = attributes.get(names.SD_OUTCOME)
    if outcome not in OUTCOMES:
        return None
    record = _record_from_attributes(attributes)
    model = attributes.get(names.GEN_AI_REQUEST_MODEL) or attributes.get(
        names.GEN_AI_RESPONSE_MODEL
    )
    host, port = attributes.get(names.SERVER_ADDRESS), attributes.get(names.SERVER_PORT)
    return {
        "model": model if isinstance(model, str) else None,
        "server": f"{host}:{port}" if host and port is not None else None,
        "outcome": outcome,
        "engine": record.engine if record is not None else None,
        "trace_id": format(trace_id, "032x") if trace_id else None,
        "span_id": format(span_id, "016x") if span_id else None,
        "record": record.model_dump(mode="json") if record is not None else None,
    }


def _record_from_attributes(attributes: Mapping[str, Any]) -> SpecDecodeAcceptanceRecord | None:
    """The record :func:`spec_decode_otel.telemetry.record_attributes` put on the span, or
    None. Validated again, so a row never holds a record that would not read back."""
    if names.SD_ENGINE not in attributes:
        return None
    dense = attributes.get(names.SD_ACCEPTANCE_HISTOGRAM)
    try:
        return SpecDecodeAcceptanceRecord(
            engine=attributes[names.SD_ENGINE],
            draft_method=attributes.get(names.SD_DRAFT_METHOD),
            mean_acceptance_length=attributes.get(names.SD_MEAN_ACCEPTANCE_LENGTH),
            draft_acceptance_rate=attributes.get(names.SD_DRAFT_ACCEPTANCE_RATE),
            acceptance_histogram=None if dense is None else dict(enumerate(dense)),
            num_accepted_draft_tokens=attributes.get(names.SD_NUM_ACCEPTED_DRAFT_TOKENS),
            num_draft_tokens=attributes.get(names.SD_NUM_DRAFT_TOKENS),
            num_spec_steps=attributes.get(names.SD_NUM_SPEC_STEPS),
            num_spec_tokens=attributes.get(names.SD_NUM_SPEC_TOKENS),
            completion_tokens=attributes.get(names.GEN_AI_USAGE_OUTPUT_TOKENS),
            # The SDK keeps array attributes as tuples; the record takes any sequence.
            per_step_accepted=attributes.get(names.SD_PER_STEP_ACCEPTED),
            per_step_drafted=attributes.get(names.SD_PER_STEP_DRAFTED),
        )
    except ValidationError:
        return None


# -- reading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One call of a records file."""

    model: str | None
    outcome: str
    record: SpecDecodeAcceptanceRecord | None


#: A records-file line longer than this is skipped unread: a record's line, its per-step
#: arrays at their bound (100,000 entries of at most k = 256), is well under it.
MAX_LINE_CHARS = 4 * 1024 * 1024

#: How many skipped lines :class:`Skipped` keeps the reason of; the rest are counted.
SHOWN_SKIPPED = 20


@dataclass
class Skipped:
    """The lines of a records file that are not rows: how many, and why, for the first
    :data:`SHOWN_SKIPPED` (a file that is no records file must not cost a message a line)."""

    count: int = 0
    reasons: list[str] = field(default_factory=list)

    def add(self, reason: str) -> None:
        self.count += 1
        if len(self.reasons) < SHOWN_SKIPPED:
            self.reasons.append(reason)


def read_rows(lines: Iterable[str], skipped: Skipped) -> Iterator[Row]:
    """The rows of a records file, read as they come; each line that is not a row is
    added to ``skipped`` with its number and why."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            skipped.add(f"line {number}: longer than {MAX_LINE_CHARS} characters")
            continue
        try:
            row = _row(json.loads(line))
        except ValidationError as exc:  # which field broke which rule, without its value
            skipped.add(f"line {number}: {_broken_rules(exc)}")
            continue
        except (ValueError, RecursionError) as exc:  # json's errors; a line nested too deep
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            skipped.add(f"line {number}: {reason}")
            continue
        yield row


def _broken_rules(exc: ValidationError) -> str:
    """A rejected record's errors, field and rule each (the first three)."""
    said = [
        ".".join(map(str, error["loc"])) + (": " if error["loc"] else "") + error["msg"]
        for error in exc.errors(include_url=False, include_input=False)[:3]
    ]
    return "record rejected: " + "; ".join(said)


def _row(data: Any) -> Row:
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    outcome = data.get("outcome")
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError("model is not a string")
    record = data.get("record")
    return Row(
        model=model,
        outcome=outcome,
        record=None if record is None else SpecDecodeAcceptanceRecord.model_validate(record),
    )


# -- summarizing ------------------------------------------------------------------------


@dataclass
class EngineSummary:
    """The records of one model from one engine, pooled.

    Each figure uses the records that report what it needs (a llama.cpp record has no
    steps, a released TensorRT-LLM one only a mean), and is None when none does.
    """

    engine: str
    requests: int = 0
    num_spec_tokens: set[int] = field(default_factory=set)
    mean_sum: float = 0.0
    mean_count: int = 0
    #: (accepted, steps) of records reporting both; (accepted, drafted) likewise; and
    #: (accepted + steps, drafted + steps) of records reporting all three.
    weighted: list[int] = field(default_factory=lambda: [0, 0])
    rate: list[int] = field(default_factory=lambda: [0, 0])
    verified: list[int] = field(default_factory=lambda: [0, 0])
    #: Pooled {accepted drafts: steps} of records with a histogram.
    histogram: Counter[int] = field(default_factory=Counter)

    def add(self, record: SpecDecodeAcceptanceRecord) -> None:
        self.requests += 1
        if record.num_spec_tokens is not None:
            self.num_spec_tokens.add(record.num_spec_tokens)
        if record.mean_acceptance_length is not None:
            self.mean_sum += record.mean_acceptance_length
            self.mean_count += 1
        accepted, drafted = record.num_accepted_draft_tokens, record.num_draft_tokens
        steps = record.num_spec_steps
        if accepted is not None and steps is not None:
            self.weighted[0] += accepted
            self.weighted[1] += steps
        if accepted is not None and drafted is not None:
            self.rate[0] += accepted
            self.rate[1] += drafted
        if accepted is not None and drafted is not None and steps is not None:
            self.verified[0] += accepted + steps
            self.verified[1] += drafted + steps
        self.histogram.update(record.acceptance_histogram or {})

    @property
    def mean_acceptance_length(self) -> float | None:
        """Per-request mean: every request counts once."""
        return self.mean_sum / self.mean_count if self.mean_count else None

    @property
    def token_weighted_acceptance_length(self) -> float | None:
        """1 + accepted / steps over all requests: every verify step counts once (what
        the server's own counters give)."""
        accepted, steps = self.weighted
        return 1.0 + accepted / steps if steps else None

    @property
    def draft_acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens over all requests."""
        accepted, drafted = self.rate
        return accepted / drafted if drafted else None

    @property
    def accepted_per_verified(self) -> float | None:
        """Tokens kept / tokens the target verified (drafts plus one bonus per step)."""
        kept, verified = self.verified
        return kept / verified if verified else None

    def acceptance_at_position(self) -> dict[int, float]:
        """Share of verify steps that accepted draft position p (0-based)."""
        steps = sum(self.histogram.values())
        return {
            p: sum(c for j, c in self.histogram.items() if j > p) / steps
            for p in range(max(self.histogram, default=0))
        }


@dataclass
class ModelSummary:
    """Every call to one model: the outcome breakdown and, per engine, the records."""

    model: str | None
    outcomes: Counter[str] = field(default_factory=Counter)
    engines: dict[str, EngineSummary] = field(default_factory=dict)

    @property
    def calls(self) -> int:
        return sum(self.outcomes.values())


def summarize(rows: Iterable[Row]) -> list[ModelSummary]:
    """Per model (sorted by name; calls without one last), per engine (sorted by name)."""
    models: dict[str | None, ModelSummary] = {}
    for row in rows:
        summary = models.setdefault(row.model, ModelSummary(row.model))
        summary.outcomes[row.outcome] += 1
        if row.record is not None:
            engine = row.record.engine
            summary.engines.setdefault(engine, EngineSummary(engine)).add(row.record)
    for summary in models.values():
        summary.engines = dict(sorted(summary.engines.items()))
    return sorted(models.values(), key=lambda m: (m.model is None, m.model or ""))


# -- output ---------------------------------------------------------------------------


def to_json(summaries: Sequence[ModelSummary]) -> dict[str, Any]:
    """The summary as plain JSON types (histogram and positions keyed by strings)."""
    return {
        "calls": sum(m.calls for m in summaries),
        "models": [
            {
                "model": m.model,
                "calls": m.calls,
                "outcomes": dict(sorted(m.outcomes.items())),
                "engines": [
                    {
                        "engine": e.engine,
                        "requests": e.requests,
                        "num_spec_tokens": sorted(e.num_spec_tokens),
                        "mean_acceptance_length": e.mean_acceptance_length,
                        "token_weighted_acceptance_length": e.token_weighted_acceptance_length,
                        "draft_acceptance_rate": e.draft_acceptance_rate,
                        "accepted_per_verified": e.accepted_per_verified,
                        "acceptance_histogram": {str(j): c for j, c in sorted(e.histogram.items())},
                        "acceptance_at_position": {
                            str(p): v for p, v in e.acceptance_at_position().items()
                        },
                    }
                    for e in m.engines.values()
                ],
            }
            for m in summaries
        ],
    }


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def render(summaries: Sequence[ModelSummary], source: str) -> str:
    """The terminal summary: per model and engine the acceptance figures with a text
    histogram, then the model's outcome breakdown."""
    lines = ["", f"Speculative decoding — per-request acceptance (from {source})", ""]
    if not summaries:
        lines += ["no calls", ""]
    for m in summaries:
        model = printable(m.model or "?")  # what a server or a file named it
        for e in m.engines.values():
            k = ",".join(str(k) for k in sorted(e.num_spec_tokens)) or "?"
            positions = e.acceptance_at_position().items()
            shown = "  ".join(f"p{p}={v:.2f}" for p, v in positions) or "n/a"
            figures = {
                "requests": str(e.requests),
                "mean acceptance length (per req)": _figure(e.mean_acceptance_length),
                "token-weighted acceptance length": _figure(e.token_weighted_acceptance_length),
                "draft acceptance rate": _figure(e.draft_acceptance_rate),
                "accepted per verified": _figure(e.accepted_per_verified),
                "per-position acceptance": shown,
            }
            lines.append(f"model {model}   engine {printable(e.engine)}   k={k}")
            lines += [f"  {label:<34}{value}" for label, value in figures.items()]
            if e.histogram:
                lines.append("  steps by drafts accepted:")
                top = max(e.histogram.values())
                for j in range(max(e.histogram) + 1):
                    count = e.histogram.get(j, 0)
                    bar = "#" * round(30 * count / top)
                    lines.append(f"    {j:>2} | {bar:<30} {count}")
            lines.append("")
        breakdown = ", ".join(
            f"{outcome} {n} ({n / m.calls:.0%})"
            for outcome, n in sorted(m.outcomes.items(), key=lambda item: (-item[1], item[0]))
        )
        lines.append(f"calls to {model}: {m.calls}   {breakdown}")
        lines.append("")
    return "\n".join(lines)
