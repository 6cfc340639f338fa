"""Tiny deterministic llama-architecture GGUF models for a real llama.cpp server.

Nothing is downloaded: the weights come from a seeded NumPy generator and the tokenizer
from the vocabulary-only model llama.cpp ships for its own tokenizer tests
(``models/ggml-vocab-llama-spm.gguf``: 32,000 SentencePiece tokens, no tensors). The
files are written with llama.cpp's own ``gguf`` package from the same source tree as the
server binary (scripts/install-llama-server.sh keeps both under ``share/``).

Shape (every model): llama architecture, 2 layers, n_embd 64, 4 heads (4 KV heads),
n_ff 256, context 256, f16 matrices and f32 norms, about 9 MB. The output rows of the
unknown and control tokens (``<unk>``, ``<s>``, ``</s>``) are zero, so their logit is 0
while the largest of the other 31,997 random logits is well above 0: greedy decoding
never ends a reply early and every request produces exactly ``max_tokens`` tokens.

Drafts of known relationship to the target (seed ``TARGET_SEED``):

- ``identical``: the target's weights exactly (greedy drafts always match: rate 1.0);
- ``noisy``: the target plus Gaussian noise of 5 % of each matrix's standard deviation
  (partial acceptance: 259 of 397 drafts, 65 %, over one run of tests/engines with
  llama.cpp b11312, 16-token replies, ``--spec-draft-n-max 4``);
- ``independent``: another seed (0 of 150 in that run; the identical draft: 36 of 36).

Deterministic: the same arguments give byte-identical files. Run by hand with
``python tests/engines/tiny_models.py OUT_DIR --vocab PATH`` (``gguf`` importable).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_FF = 256
N_CTX = 256
RMS_EPS = 1e-5

TARGET_SEED = 1234
INDEPENDENT_SEED = 98765
NOISE_SEED = 4321
NOISE_FRACTION = 0.05

#: model name -> (weights seed, noise fraction); "target" is the model the server serves.
MODELS: Mapping[str, tuple[int, float]] = {
    "target": (TARGET_SEED, 0.0),
    "identical": (TARGET_SEED, 0.0),
    "noisy": (TARGET_SEED, NOISE_FRACTION),
    "independent": (INDEPENDENT_SEED, 0.0),
}


@functools.lru_cache(maxsize=4)  # reading the 32,000-token vocabulary takes seconds
def _tokenizer_fields(vocab_path: Path) -> tuple[list[tuple[str, Any, Any, Any]], np.ndarray]:
    """Every ``tokenizer.*`` key of the vocabulary model as (key, value, type, subtype),
    and the token types (to find the control tokens)."""
    import gguf

    reader = gguf.GGUFReader(vocab_path)
    fields = []
    token_types = None
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        fields.append((name, value, main_type, sub_type))
        if name == "tokenizer.ggml.token_type":
            token_types = np.asarray(value, dtype=np.int32)
    if token_types is None:
        raise ValueError(f"{vocab_path}: no tokenizer.ggml.token_type")
    return fields, token_types


def _weights(seed: int, n_vocab: int) -> dict[str, np.ndarray]:
    """float32 weights in GGUF order, NumPy shapes (rows = ggml's second dimension)."""
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        # Scaled by fan-in (cols), so activations stay O(1) through the layers.
        return rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols))

    w: dict[str, np.ndarray] = {
        "token_embd.weight": rng.standard_normal((n_vocab, N_EMBD), dtype=np.float32),
    }
    for i in range(N_LAYER):
        w[f"blk.{i}.attn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        w[f"blk.{i}.attn_q.weight"] = matrix(N_EMBD, N_EMBD)
        w[f"blk.{i}.attn_k.weight"] = matrix(N_EMBD, N_EMBD)
        w[f"blk.{i}.attn_v.weight"] = matrix(N_EMBD, N_EMBD)
        w[f"blk.{i}.attn_output.weight"] = matrix(N_EMBD, N_EMBD)
        w[f"blk.{i}.ffn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        w[f"blk.{i}.ffn_gate.weight"] = matrix(N_FF, N_EMBD)
        w[f"blk.{i}.ffn_up.weight"] = matrix(N_FF, N_EMBD)
        w[f"blk.{i}.ffn_down.weight"] = matrix(N_EMBD, N_FF)
    w["output_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
    w["output.weight"] = matrix(n_vocab, N_EMBD)
    return w


def _add_noise(weights: dict[str, np.ndarray], fraction: float) -> None:
    rng = np.random.default_rng(NOISE_SEED)
    for name, w in weights.items():
        if w.ndim == 2:  # matrices only: the norms stay exactly 1
            noise = rng.standard_normal(w.shape, dtype=np.float32)
            weights[name] = w + np.float32(fraction * float(w.std())) * noise


def write_model(path: Path, vocab_path: Path, *, seed: int, noise: float = 0.0) -> Path:
    """Write one tiny model to ``path`` and return it."""
    import gguf

    fields, token_types = _tokenizer_fields(vocab_path)
    n_vocab = len(token_types)
    weights = _weights(seed, n_vocab)
    if noise:
        _add_noise(weights, noise)
    # Never end early: zero the output rows of <unk>, <s>, </s> (and any other
    # unknown/control token), so they never win a greedy pick.
    silent = np.isin(
        token_types, [gguf.TokenType.UNKNOWN.value, gguf.TokenType.CONTROL.value]
    ).nonzero()[0]
    weights["output.weight"][silent, :] = 0.0

    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_name(f"tiny-llama-seed{seed}-noise{noise:g}")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value, vtype, sub_type in fields:
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, w in weights.items():
        writer.add_tensor(name, w.astype(np.float16) if w.ndim == 2 else w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_models(dest: Path, vocab_path: Path) -> dict[str, Path]:
    """Every model of ``MODELS`` into ``dest`` as ``<name>.gguf``."""
    dest.mkdir(parents=True, exist_ok=True)
    return {
        name: write_model(dest / f"{name}.gguf", vocab_path, seed=seed, noise=noise)
        for name, (seed, noise) in MODELS.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--vocab", type=Path, required=True)
    args = parser.parse_args()
    for name, path in write_models(args.dest, args.vocab).items():
        print(name, path, path.stat().st_size)


if __name__ == "__main__":
    main()
