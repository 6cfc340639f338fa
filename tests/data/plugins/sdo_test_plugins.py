"""Third-party adapters for the registry tests, loaded through a real entry point.

tests/unit/test_registry.py writes a ``*.dist-info`` with an ``entry_points.txt`` naming
these classes under the group ``spec_decode_otel.adapters`` and puts this directory on
``sys.path``; nothing here is imported by the package itself.
"""

from __future__ import annotations

from collections.abc import Mapping


class AcmeAdapter:
    """A made-up engine: root ``acme_spec`` = {"steps", "accepted", "drafted"}."""

    engine = "acme"

    @classmethod
    def can_adapt(cls, responses):
        return any(isinstance(r.root.get("acme_spec"), Mapping) for r in responses)

    @classmethod
    def adapt(cls, responses):
        from spec_decode_otel import SpecDecodeAcceptanceRecord

        spec = next(r.root["acme_spec"] for r in reversed(responses) if "acme_spec" in r.root)
        steps, accepted, drafted = spec["steps"], spec["accepted"], spec["drafted"]
        return SpecDecodeAcceptanceRecord(
            engine=cls.engine,
            mean_acceptance_length=1 + accepted / steps,
            draft_acceptance_rate=accepted / drafted,
            num_spec_steps=steps,
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
        )


class AcmeTwinAdapter(AcmeAdapter):
    """Claims only ``acme_twin`` payloads; used to check plug-in ordering by name."""

    engine = "acme_twin"

    @classmethod
    def can_adapt(cls, responses):
        return any("acme_twin" in r.root for r in responses)


class GreedyVllmClaimer:
    """Wrongly claims vLLM's merged payload too: detection must refuse to guess."""

    engine = "greedy"

    @classmethod
    def can_adapt(cls, responses):
        return any("metrics" in r.root for r in responses)

    @classmethod
    def adapt(cls, responses):
        raise AssertionError("an ambiguous claim must never reach adapt()")


class RaisesInCanAdapt:
    engine = "raises_in_can_adapt"

    @classmethod
    def can_adapt(cls, responses):
        raise RuntimeError("can_adapt exploded")

    @classmethod
    def adapt(cls, responses):
        raise AssertionError("unreachable")


class RaisesInAdapt:
    """Claims root ``boom_spec`` payloads, then fails to map them."""

    engine = "raises_in_adapt"

    @classmethod
    def can_adapt(cls, responses):
        return any("boom_spec" in r.root for r in responses)

    @classmethod
    def adapt(cls, responses):
        raise KeyError("adapt exploded")


class ReturnsNotARecord:
    engine = "returns_dict"

    @classmethod
    def can_adapt(cls, responses):
        return any("dict_spec" in r.root for r in responses)

    @classmethod
    def adapt(cls, responses):
        return {"engine": "returns_dict", "mean_acceptance_length": 2.0}


class NotAnAdapter:
    """Has neither can_adapt nor adapt."""

    engine = "nothing"
