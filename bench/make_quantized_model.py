"""Write a random-weight F16 GGUF with a real model's shape and quantize it with
llama.cpp's `llama-quantize`, so the file has the mix of types users download
(Q4_K_M: Q4_K with Q6_K for the embeddings/output and half of attn_v/ffn_down;
Q5_K_M, Q6_K, Q8_0, IQ4_XS; MXFP4_MOE, gpt-oss's: MXFP4 experts, Q8_0 elsewhere).
Not committed: written to a temporary folder.

- `llama3.2-1b` (default): Llama-3.2-1B (n_embd 2048, 16 layers, 32 q / 8 kv heads
  x 64, n_ff 8192, vocab 128256, output tied to the embeddings, llama3 rope freqs).
- `llama3.1-8b`: Llama-3.1-8B (n_embd 4096, 32 layers, 32 q / 8 kv heads x 128,
  n_ff 14336, its own output matrix); `--layers` cuts it.
- the MoE shapes of bench/make_bench_model.py (`qwen3-30b-a3b`, `glm4.5-air`), 4 layers
  unless `--layers` says; their F16 file is written there (`write(..., "f16")`).

The tokenizer comes from `--vocab`, a GGUF with Llama 3's vocabulary (llama.cpp's
models/ggml-vocab-llama-bpe.gguf), or for the MoE shapes the one make_bench_model.py
names. Weights are normal with std 1/sqrt(row length), norms 1: the numbers mean
nothing, the speed does.

    python bench/make_quantized_model.py --vocab ggml-vocab-llama-bpe.gguf \\
        --llama-quantize /tmp/llama-cpu/build/bin/llama-quantize --types Q4_K_M,Q8_0
    python bench/engine.py -m /tmp/llama3.2-1b-Q4_K_M.gguf --llama-bench PATH/llama-bench

(bench/make_bench_model.py writes the MoE shapes straight in one quantized type.)
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_bench_model
from make_bench_model import add_shape_and_vocab

SHAPES = {
    "llama3.2-1b": dict(n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192,
                        n_vocab=128256, n_ctx=131072, rope_base=500_000.0, eps=1e-5, tied=True),
    "llama3.1-8b": dict(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336,
                        n_vocab=128256, n_ctx=131072, rope_base=500_000.0, eps=1e-5, tied=False),
}
TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS", "MXFP4_MOE")
MOE_SHAPES = {name: s for name, s in make_bench_model.SHAPES.items() if s["n_expert"]}


def llama3_rope_freqs(head_dim: int, base: float, factor=32.0, low=1.0, high=4.0, orig_ctx=8192) -> np.ndarray:
    """Llama 3.1/3.2's rope_freqs.weight: the divisors of each rotary frequency
    (as convert_hf_to_gguf.py writes them from rope_scaling)."""
    freqs = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    low_wl, high_wl = orig_ctx / low, orig_ctx / high
    smooth = (orig_ctx / wavelen - low) / (high - low)
    out = np.where(wavelen < high_wl, 1.0, np.where(wavelen > low_wl, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


def tensors(s: dict, n_layer: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor; 1-D ones are float32, the rest F16."""
    e, q, kv, ff = s["n_embd"], s["n_head"] * s["head_dim"], s["n_head_kv"] * s["head_dim"], s["n_ff"]
    out = [("token_embd.weight", (s["n_vocab"], e)), ("output_norm.weight", (e,)),
           ("rope_freqs.weight", (s["head_dim"] // 2,))]
    if not s["tied"]:
        out.append(("output.weight", (s["n_vocab"], e)))
    for i in range(n_layer):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (e,)), (p + "ffn_norm.weight", (e,)),
                (p + "attn_q.weight", (q, e)), (p + "attn_k.weight", (kv, e)), (p + "attn_v.weight", (kv, e)),
                (p + "attn_output.weight", (e, q)), (p + "ffn_gate.weight", (ff, e)),
                (p + "ffn_up.weight", (ff, e)), (p + "ffn_down.weight", (e, ff))]
    return out


def write_f16(path: str, shape: str, n_layer: int, src: gguf.GGUFReader, seed: int = 0) -> None:
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"{shape}-bench-{n_layer}l")
    add_shape_and_vocab(w, s, n_layer, src)
    w.add_rope_dimension_count(s["head_dim"])
    w.add_vocab_size(s["n_vocab"])
    w.add_file_type(1)                       # MOSTLY_F16
    specs = tensors(s, n_layer)
    for name, dims in specs:
        dtype = np.float32 if len(dims) == 1 else np.float16
        w.add_tensor_info(name, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, dims in specs:
        if name == "rope_freqs.weight":
            data = llama3_rope_freqs(s["head_dim"], s["rope_base"])
        elif len(dims) == 1:
            data = np.ones(dims, np.float32)
        else:
            data = (rng.standard_normal(dims, dtype=np.float32) / np.sqrt(dims[1])).astype(np.float16)
        w.write_tensor_data(data)
    w.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES) + sorted(MOE_SHAPES), default="llama3.2-1b")
    p.add_argument("--layers", type=int, default=None,
                   help="transformer blocks (default: the real count; 4 for the MoE shapes)")
    p.add_argument("--vocab", type=pathlib.Path, default=None,
                   help="GGUF with the shape's vocabulary: Llama 3's (llama.cpp's models/ggml-vocab-llama-bpe.gguf) "
                        "for the llama shapes; the MoE shapes have a default")
    p.add_argument("--llama-quantize", required=True, help="llama.cpp's llama-quantize binary")
    p.add_argument("--types", default="Q4_K_M", help=f"comma-separated llama-quantize types ({', '.join(TYPES)})")
    p.add_argument("--out-dir", default=tempfile.gettempdir())
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--keep-f16", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    moe = a.shape in MOE_SHAPES
    s = MOE_SHAPES[a.shape] if moe else SHAPES[a.shape]
    layers = a.layers or (4 if moe else s["n_layer"])
    vocab = a.vocab or (make_bench_model.VOCAB_SOURCES[a.shape] if moe else None)
    if vocab is None or not vocab.is_file():
        print(f"vocabulary source missing: {vocab or 'give --vocab'}", file=sys.stderr)
        return 1
    src = gguf.GGUFReader(str(vocab))
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    if n_vocab != s["n_vocab"]:
        print(f"{vocab}: {n_vocab} tokens, {a.shape} has {s['n_vocab']}", file=sys.stderr)
        return 1
    stem = os.path.join(a.out_dir, a.shape + (f"-{layers}l" if layers != s["n_layer"] else ""))
    f16 = stem + "-F16.gguf"
    if moe:
        make_bench_model.write(f16, a.shape, layers, "f16", src, a.seed)
    else:
        write_f16(f16, a.shape, layers, src, a.seed)
    for qtype in a.types.split(","):
        out = f"{stem}-{qtype}.gguf"
        r = subprocess.run([a.llama_quantize, f16, out, qtype, str(a.threads)], capture_output=True, text=True, check=False)
        if r.returncode:
            print(r.stdout[-2000:] + r.stderr[-2000:], file=sys.stderr)
            return r.returncode
        print(f"{out}: {os.path.getsize(out) / 2**20:.0f} MiB")
    if not a.keep_f16:
        os.remove(f16)
    return 0


if __name__ == "__main__":
    sys.exit(main())
