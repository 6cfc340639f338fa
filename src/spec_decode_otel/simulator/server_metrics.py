"""The simulator's own ``/metrics``: the server-side spec-decode counters a real engine
exports, so a client's counts can be reconciled with the server's.

vLLM exports (``prometheus_client``, labels ``model_name`` and ``engine``)::

    vllm:spec_decode_num_drafts_total                  verify steps
    vllm:spec_decode_num_draft_tokens_total            draft tokens proposed
    vllm:spec_decode_num_accepted_tokens_total         draft tokens accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position}

and llama.cpp (``--metrics``; read from the strings of the b11312 ``llama-server``
library) the same four under ``llamacpp:``, with no label but ``position``. The flavour
follows the server's ``engine``: ``vllm`` and ``vllm-premerge`` serve vLLM's names,
``llamacpp`` llama.cpp's; every other flavour (SGLang, TensorRT-LLM, mlx-vlm, ``none``,
...) exports no such counters, so its ``/metrics`` has none.

What is counted: every sequence of every request the server answered, in full, when the
answer starts, whatever shape the request asked for (``x-spec-decode-engine``,
``x-spec-decode-level``) and whether or not the client ever reads the stats, just as an
engine counts its work whether or not the per-request stats reach anyone. Requests
refused with an error (``http-429``, ``http-500``, invalid requests) generate nothing and
count nothing. All counters exist at 0 from the start (positions up to the configured
draft length), as vLLM's do, so ``increase()`` sees a server's first requests.
"""

from __future__ import annotations

from collections.abc import Iterable

from spec_decode_otel.simulator.acceptance import Generation
from spec_decode_otel.simulator.config import SimulatorConfig

#: Server flavour -> metric name prefix; flavours not listed export no counters.
PREFIXES = {"vllm": "vllm", "vllm-premerge": "vllm", "llamacpp": "llamacpp"}
#: Draft positions exported at most: the per-position series of a request header that
#: asks for deeper drafts (``x-sim-draft-schedule``) stop here.
MAX_POSITIONS = 256

DRAFTS = "spec_decode_num_drafts_total"
DRAFT_TOKENS = "spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"
_HELP = {
    DRAFTS: "Number of spec decoding drafts (verify steps).",
    DRAFT_TOKENS: "Number of draft tokens.",
    ACCEPTED_TOKENS: "Number of accepted tokens.",
    ACCEPTED_PER_POS: "Accepted tokens per draft position.",
}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    """Cumulative spec-decode counters of one simulator, rendered as Prometheus text."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.prefix = PREFIXES.get(config.engine)
        # vLLM labels every series with the served model and the engine index.
        self._labels = (
            f'engine="0",model_name="{_escape(config.served_model)}"'
            if self.prefix == "vllm"
            else ""
        )
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        k = max(config.draft_schedule or (config.k,))
        self.accepted_per_position = [0] * min(k, MAX_POSITIONS)

    def count(self, generations: Iterable[Generation]) -> None:
        """Add the verify steps of one answered request (one generation per sequence)."""
        for gen in generations:
            # A step that drafted nothing (llama.cpp near ``max_tokens``) is no draft:
            # llama.cpp counts ``n_draft_verif_steps`` only for a verified draft.
            self.drafts += sum(1 for d in gen.per_step_drafted if d)
            self.draft_tokens += gen.num_draft_tokens
            self.accepted_tokens += gen.num_accepted_draft_tokens
            positions = self.accepted_per_position
            for accepted in gen.per_step_accepted:
                # A step that accepted j drafts accepted positions 0..j-1 (a prefix).
                depth = min(accepted, MAX_POSITIONS)
                if depth > len(positions):
                    positions.extend([0] * (depth - len(positions)))
                for p in range(depth):
                    positions[p] += 1

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4); empty for flavours without
        server-side spec-decode counters."""
        if self.prefix is None:
            return ""
        lines: list[str] = []
        for name, value in (
            (DRAFTS, self.drafts),
            (DRAFT_TOKENS, self.draft_tokens),
            (ACCEPTED_TOKENS, self.accepted_tokens),
        ):
            lines += self._family(name)
            lines.append(self._sample(name, value))
        lines += self._family(ACCEPTED_PER_POS)
        for position, value in enumerate(self.accepted_per_position):
            lines.append(self._sample(ACCEPTED_PER_POS, value, f'position="{position}"'))
        return "\n".join(lines) + "\n"

    def _family(self, name: str) -> list[str]:
        full = f"{self.prefix}:{name}"
        return [f"# HELP {full} {_HELP[name]}", f"# TYPE {full} counter"]

    def _sample(self, name: str, value: int, label: str = "") -> str:
        labels = ",".join(x for x in (self._labels, label) if x)
        braces = f"{{{labels}}}" if labels else ""
        return f"{self.prefix}:{name}{braces} {value}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
