"""A tiny random-weight granite GGUF (IBM Granite 3.x dense: RoPE attention with
rope_freqs frequency factors, SwiGLU FFN, Granite's scales), written with the `gguf`
package, deterministically.

Vocabulary: that of the synthetic granitehybrid model of ../shared/golden/synth
(the real Granite-3 vocabulary: starcoder with `<|end_of_text|>` and the three role
tokens, as make_synth_text.py's `granite_roles` patch writes it). Chat template:
Granite 3.3's, tests/data/templates/ibm-granite-granite-3.3-2B-Instruct.jinja
(llama.cpp's models/templates, unchanged). Shapes: n_embd 64, 4 layers, 4 q / 2 kv
heads x 16 with NORM RoPE over all 16 dims (`rope.scaling.finetuned` left out: on,
as llama.cpp defaults it for Granite) divided by the 8 factors of `rope_freqs.weight`,
SwiGLU FFN of 128. Granite's scales as in the synthetic granitehybrid: input x12,
attention scale 1/128, sub-layer outputs x0.22 before each residual add, logits /8.
Weights as make_synth_text.py makes them: matrices ~ N(0, 1/fan_in) (q/k x4,
attention output and FFN down x3 to outweigh the residual scale), per-tensor seeds
crc32("granite/" + name); a tiny tied embedding (heavy-tailed row norms) and a
final-norm gain giving the logits a std of ~10, so that greedy steps are rarely near
ties. Norms and rope_freqs F32, token_embd Q4_0, the other matrices Q8_0
(gguf.quants, as llama-quantize would quantize them).

    python tests/data/granite/make_model.py OUT.gguf [--no-rope]
"""
from __future__ import annotations

import pathlib
import sys

import gguf
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/data: the shared writer
import synth_gguf

ARCH = "granite"
VOCAB_SOURCE = "/work/shared/golden/synth/models/synth-granitehybrid-q8_0.gguf"
TEMPLATE = pathlib.Path(__file__).resolve().parents[1] / "templates" / "ibm-granite-granite-3.3-2B-Instruct.jinja"

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 64, 4, 4, 2, 16
N_FF = 128
ROPE_FREQS = [1.0, 1.0, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0]    # per rotated pair: frequency divided by it
N_CTX_TRAIN, ROPE_BASE, RMS_EPS = 131072, 10000.0, 1e-5
EMBEDDING_SCALE, ATTENTION_SCALE, RESIDUAL_SCALE, LOGIT_SCALE = 12.0, 0.0078125, 0.22, 8.0
LOGIT_STD, EMBD_STD, ROW_TAIL, QK_SCALE, OUT_SCALE = 10.0, 0.05, 0.2, 4.0, 3.0


def _copy_vocab(w: gguf.GGUFWriter) -> int:
    n_vocab = synth_gguf.copy_bpe_vocab(w, VOCAB_SOURCE)
    w.add_chat_template(TEMPLATE.read_text(encoding="utf-8"))
    return n_vocab


def _hparams(w: gguf.GGUFWriter, n_vocab: int) -> None:
    A = ARCH
    for key, value in (("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
                       ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("rope.dimension_count", HEAD_DIM),
                       ("vocab_size", n_vocab)):
        w.add_uint32(f"{A}.{key}", value)
    for key, value in (("attention.layer_norm_rms_epsilon", RMS_EPS), ("rope.freq_base", ROPE_BASE),
                       ("attention.scale", ATTENTION_SCALE), ("embedding_scale", EMBEDDING_SCALE),
                       ("residual_scale", RESIDUAL_SCALE), ("logit_scale", LOGIT_SCALE)):
        w.add_float32(f"{A}.{key}", value)


def _tensors(n_vocab: int) -> synth_gguf.Tensors:
    E, H, KV, D = N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM
    ts = synth_gguf.Tensors(ARCH)
    # tied embedding, small after the x12 input scale; the final-norm gain sets the logits' scale (x logit_scale,
    # which the graph divides out)
    gain = ts.tied_embedding(n_vocab, E, EMBD_STD / EMBEDDING_SCALE, ROW_TAIL, LOGIT_STD * LOGIT_SCALE)
    ts.norm("output_norm.weight", E, center=gain, spread=0.1 * gain)
    ts.add("rope_freqs.weight", np.array(ROPE_FREQS))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        ts.norm(p + "attn_norm.weight", E)
        ts.mat(p + "attn_q.weight", [E, H * D], scale=QK_SCALE)
        ts.mat(p + "attn_k.weight", [E, KV * D], scale=QK_SCALE)
        ts.mat(p + "attn_v.weight", [E, KV * D])
        ts.mat(p + "attn_output.weight", [H * D, E], scale=OUT_SCALE)
        ts.norm(p + "ffn_norm.weight", E)
        ts.mat(p + "ffn_gate.weight", [E, N_FF])
        ts.mat(p + "ffn_up.weight", [E, N_FF])
        ts.mat(p + "ffn_down.weight", [N_FF, E], scale=OUT_SCALE)
    return ts


def build(path: str, rope: bool = True) -> None:
    """rope False: the same weights with `rope.scaling.finetuned` false (Granite's switch: no RoPE)."""
    w = synth_gguf.writer(path, ARCH, "synth-granite")
    n_vocab = _copy_vocab(w)
    _hparams(w, n_vocab)
    if not rope:
        w.add_bool(f"{ARCH}.rope.scaling.finetuned", False)
    synth_gguf.write(w, _tensors(n_vocab))


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/synth-granite-q8_0.gguf", rope="--no-rope" not in sys.argv[2:])
