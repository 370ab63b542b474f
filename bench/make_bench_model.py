"""Write a random-weight GGUF with a real model's shapes, for benchmarks. Not
committed: written to a temporary path.

- `qwen3-30b-a3b` (default): Qwen3-30B-A3B's layers (n_embd 2048, 32 q / 4 kv heads
  x 128, q/k norms, 128 experts of 768, top-8, vocab 151936), `qwen3moe`. The
  tokenizer (the real Qwen2/3 vocabulary) comes from the synthetic qwen3moe golden
  model in ../shared/golden.
- `llama3.1-8b`: Llama-3.1-8B's (n_embd 4096, 32 q / 8 kv heads x 128, n_ff 14336,
  32 layers, vocab 128256), `llama`. Its tokenizer comes from `--vocab`: a GGUF with
  Llama 3's vocabulary, such as llama.cpp's models/ggml-vocab-llama-bpe.gguf.

    python bench/make_bench_model.py [--layers 4] [--type q4_K] [--out /tmp/moe-bench.gguf]
    python bench/make_bench_model.py --shape llama3.1-8b --vocab ggml-vocab-llama-bpe.gguf
    python bench/engine.py -m /tmp/moe-bench.gguf --llama-bench PATH/llama-bench

The weights are random quantized blocks (random quants, block scales chosen so a
product's outputs have about unit variance), generated block by block without a
float copy, so the file is written in seconds. Every matrix has one type (q4_K is
the bulk of a Q4_K_M file). llama.cpp loads the file as the real architecture;
the numbers mean nothing, the speed does. `--type f16` writes normal weights (std
1/sqrt(row length)) for llama-quantize: bench/make_quantized_model.py makes the mixes
users download (Q4_K_M, MXFP4_MOE, ...) from it.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

import numpy as np
import gguf

# the real models' shapes; n_layer is the real count (--layers writes fewer)
SHAPES = {
    "qwen3-30b-a3b": dict(arch="qwen3moe", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
                          n_ff=6144, n_expert=128, n_used=8, n_ff_exp=768, n_vocab=151936, n_ctx=40960,
                          rope_base=1_000_000.0, eps=1e-6, qk_norm=True),
    # GLM-4.5-Air: a dense first layer, then 128 routed experts (sigmoid routing, bias for
    # selection) beside a shared one; half the head rotated; q/k/v biases. The vocabulary is
    # Qwen3's 151936 tokens (GLM's has 151552): the synthetic GLM file's is far smaller.
    "glm4.5-air": dict(arch="glm4moe", n_layer=46, n_embd=4096, n_head=96, n_head_kv=8, head_dim=128,
                       n_ff=10944, n_expert=128, n_used=8, n_ff_exp=1408, n_vocab=151936, n_ctx=131072,
                       rope_base=1_000_000.0, eps=1e-5, qk_norm=False, n_rot=64, qkv_bias=True,
                       n_dense=1, n_shared=1, ffn_norm="post_attention_norm",
                       extra={"leading_dense_block_count": 1, "expert_shared_count": 1, "expert_gating_func": 2,
                              "expert_weights_scale": 1.0, "expert_weights_norm": True, "expert_group_count": 1,
                              "expert_group_used_count": 1, "nextn_predict_layers": 0}),
    "llama3.1-8b": dict(arch="llama", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128,
                        n_ff=14336, n_expert=0, n_vocab=128256, n_ctx=131072, rope_base=500_000.0, eps=1e-5,
                        qk_norm=False),
}
# bytes per block, values per block
_BLOCKS = {"q4_0": (18, 32), "q5_0": (22, 32), "q8_0": (34, 32), "q4_K": (144, 256)}
_TYPES = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q5_0": gguf.GGMLQuantizationType.Q5_0,
          "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_K": gguf.GGMLQuantizationType.Q4_K}
_GOLDEN_SYNTH = pathlib.Path(__file__).resolve().parents[2] / "shared" / "golden" / "synth" / "models"
# where each shape's tokenizer comes from by default (its vocabulary size must match)
VOCAB_SOURCES = {"qwen3-30b-a3b": _GOLDEN_SYNTH / "synth-qwen3moe-q8_0.gguf",
                 "glm4.5-air": _GOLDEN_SYNTH / "synth-qwen3moe-q8_0.gguf", "llama3.1-8b": None}


def random_blocks(rng, qtype: str, n_rows: int, row_len: int) -> np.ndarray:
    """uint8 [n_rows, bytes per row] of random blocks whose values have std ~ 1/sqrt(row_len)."""
    nbytes, nvals = _BLOCKS[qtype]
    n_blocks = n_rows * row_len // nvals
    b = np.frombuffer(bytearray(rng.bytes(n_blocks * nbytes)), np.uint8).reshape(n_blocks, nbytes)
    target = 1.0 / np.sqrt(row_len)
    if qtype == "q4_0":          # d * (q - 8), q uniform 0..15: std ~ 4.6 d
        d = target / 4.6
        b[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    elif qtype == "q5_0":        # d * (q - 16), q uniform 0..31: std ~ 9.2 d
        d = target / 9.2
        b[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    elif qtype == "q8_0":        # d * q, q uniform -128..127: std ~ 74 d
        d = target / 74
        b[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    else:                        # q4_K: d * sc * q - dmin * m, q in 0..15, 6-bit sc and m
        # dmin = 7.5 d centres the weights (E[sc q] = 7.5 E[m]): biased weights grow the
        # activations layer by layer until half-precision GPU kernels overflow; std ~ 257 d
        d = target / 257
        b[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        b[:, 2:4] = np.frombuffer(np.float16(d * 7.5).tobytes(), np.uint8)
    return b.reshape(n_rows, -1)


def write(path: str, shape: str, n_layer: int, qtype: str, src: gguf.GGUFReader, seed: int = 0) -> None:
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, s["arch"])
    w.add_name(f"{shape}-bench-{n_layer}l-{qtype}")
    add_shape_and_vocab(w, s, n_layer, src)
    if s["n_expert"]:
        w.add_expert_count(s["n_expert"])
        w.add_expert_used_count(s["n_used"])
        w.add_expert_feed_forward_length(s["n_ff_exp"])
    if s.get("n_rot") or not s["n_expert"]:
        w.add_rope_dimension_count(s.get("n_rot", s["head_dim"]))
    for key, value in s.get("extra", {}).items():      # the architecture's own keys
        adder = w.add_bool if isinstance(value, bool) else w.add_uint32 if isinstance(value, int) else w.add_float32
        adder(f"{s['arch']}.{key}", value)
    w.add_file_type({"f16": 1, "q4_0": 2, "q8_0": 7, "q4_K": 15}[qtype])

    tensors = _tensors(s, n_layer, qtype)
    for name, t, outer, row_len in tensors:       # outer: numpy-order dims before the row
        if t == "f32":
            w.add_tensor_info(name, outer, np.dtype(np.float32), 4 * int(np.prod(outer)))
        elif t == "f16":
            w.add_tensor_info(name, (*outer, row_len), np.dtype(np.float16), 2 * int(np.prod(outer)) * row_len)
        else:
            nbytes = row_len // _BLOCKS[t][1] * _BLOCKS[t][0]
            w.add_tensor_info(name, (*outer, nbytes), np.dtype(np.uint8), int(np.prod(outer)) * nbytes, _TYPES[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, t, outer, row_len in tensors:
        if t == "f32":
            if "gate_inp" in name:
                data = (rng.standard_normal(outer) / np.sqrt(outer[-1])).astype(np.float32)
            else:
                data = np.ones(outer, dtype=np.float32)
        elif t == "f16":
            data = (rng.standard_normal((*outer, row_len), dtype=np.float32) / np.sqrt(row_len)).astype(np.float16)
        else:
            rows = int(np.prod(outer))
            data = random_blocks(rng, t, rows, row_len).reshape(*outer, -1)
        w.write_tensor_data(data)
    w.close()


def add_shape_and_vocab(w: gguf.GGUFWriter, s: dict, n_layer: int, src: gguf.GGUFReader) -> None:
    """The hyperparameters every shape has, and src's tokenizer (tokenizer.* keys copied)."""
    w.add_context_length(s["n_ctx"])
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(n_layer)
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["eps"])
    for key, field in src.fields.items():
        if key.startswith("tokenizer."):
            _copy_field(w, key, field)


def _tensors(s: dict, n_layer: int, qtype: str) -> list:
    """(name, type, numpy-order dims before the row, row length) of every tensor; a row that
    k-quant blocks do not tile takes q5_0, as llama-quantize falls back for Q4_K."""
    return [(n, "q5_0" if t == "q4_K" and r % 256 else t, o, r) for n, t, o, r in _all_tensors(s, n_layer, qtype)]


def _all_tensors(s: dict, n_layer: int, qtype: str) -> list:
    e, q, kv = s["n_embd"], s["n_head"] * s["head_dim"], s["n_head_kv"] * s["head_dim"]
    tensors = [("token_embd.weight", qtype, (s["n_vocab"],), e), ("output_norm.weight", "f32", (e,), None),
               ("output.weight", qtype, (s["n_vocab"],), e)]
    for i in range(n_layer):
        p = f"blk.{i}."
        ffn_norm = s.get("ffn_norm", "ffn_norm")
        tensors += [(p + "attn_norm.weight", "f32", (e,), None), (p + f"{ffn_norm}.weight", "f32", (e,), None),
                    (p + "attn_q.weight", qtype, (q,), e), (p + "attn_k.weight", qtype, (kv,), e),
                    (p + "attn_v.weight", qtype, (kv,), e), (p + "attn_output.weight", qtype, (e,), q)]
        if s.get("qkv_bias"):
            tensors += [(p + "attn_q.bias", "f32", (q,), None), (p + "attn_k.bias", "f32", (kv,), None),
                        (p + "attn_v.bias", "f32", (kv,), None)]
        if s["qk_norm"]:
            tensors += [(p + "attn_q_norm.weight", "f32", (s["head_dim"],), None),
                        (p + "attn_k_norm.weight", "f32", (s["head_dim"],), None)]
        if s["n_expert"] and i >= s.get("n_dense", 0):
            nx, ff = s["n_expert"], s["n_ff_exp"]
            if s.get("n_shared"):
                sh = s["n_shared"] * ff
                tensors += [(p + "exp_probs_b.bias", "f32", (nx,), None),
                            (p + "ffn_gate_shexp.weight", qtype, (sh,), e), (p + "ffn_up_shexp.weight", qtype, (sh,), e),
                            (p + "ffn_down_shexp.weight", qtype, (e,), sh)]
            tensors += [(p + "ffn_gate_inp.weight", "f32", (nx, e), None),
                        (p + "ffn_gate_exps.weight", qtype, (nx, ff), e),
                        (p + "ffn_up_exps.weight", qtype, (nx, ff), e),
                        (p + "ffn_down_exps.weight", qtype, (nx, e), ff)]
        else:
            ff = s["n_ff"]
            tensors += [(p + "ffn_gate.weight", qtype, (ff,), e), (p + "ffn_up.weight", qtype, (ff,), e),
                        (p + "ffn_down.weight", qtype, (e,), ff)]
    return tensors


def _copy_field(w: gguf.GGUFWriter, key: str, field) -> None:
    v = field.contents()
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        w.add_array(key, v)
    elif vtype == gguf.GGUFValueType.STRING:
        w.add_string(key, v)
    elif vtype == gguf.GGUFValueType.BOOL:
        w.add_bool(key, v)
    else:
        w.add_uint32(key, int(v))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    p.add_argument("--layers", type=int, default=None,
                   help="transformer blocks (default: 4 for qwen3-30b-a3b, whose real count is 48; all for the others)")
    p.add_argument("--type", choices=sorted(_BLOCKS) + ["f16"], default="q4_K",
                   help="type of every matrix (q4_K: the bulk of a Q4_K_M file; f16: for llama-quantize)")
    p.add_argument("--vocab", type=pathlib.Path, default=None,
                   help="GGUF whose tokenizer.* fields are copied (its vocabulary size must match the shape's)")
    p.add_argument("--out", default=None, help="default: <tempdir>/<shape>-bench.gguf")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    shape = SHAPES[a.shape]
    layers = a.layers or (4 if shape["n_expert"] else shape["n_layer"])
    vocab = a.vocab or VOCAB_SOURCES[a.shape]
    if vocab is None or not vocab.is_file():
        print(f"vocabulary source missing: {vocab or 'give --vocab'}", file=sys.stderr)
        return 1
    src = gguf.GGUFReader(str(vocab))            # slow for large vocabularies: read once
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    if n_vocab != shape["n_vocab"]:
        print(f"{vocab}: {n_vocab} tokens, {a.shape} has {shape['n_vocab']}", file=sys.stderr)
        return 1
    out = a.out or os.path.join(tempfile.gettempdir(), f"{a.shape}-bench.gguf")
    write(out, a.shape, layers, a.type, src, a.seed)
    print(f"{out}: {os.path.getsize(out) / 2**20:.0f} MiB, {layers} layers, {a.type}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
