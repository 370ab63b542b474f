"""A tiny random-weight granitemoe GGUF (IBM Granite 3.x MoE / Granite MoE Shared:
RoPE attention, and in every layer softmax top-k experts plus a shared expert,
with Granite's scales), written with the `gguf` package, deterministically.

Vocabulary: that of the synthetic granitehybrid model of ../shared/golden/synth
(the real Granite-3 vocabulary: starcoder with `<|end_of_text|>` and the three role
tokens, as make_synth_text.py's `granite_roles` patch writes it). Chat template:
Granite 3.3's, tests/data/templates/ibm-granite-granite-3.3-2B-Instruct.jinja
(llama.cpp's models/templates, unchanged). Shapes: n_embd 64, 4 layers, 4 q / 2 kv
heads x 16 with NORM RoPE over all 16 dims, per layer 8 experts top-2 (ff 64) and a
shared expert (ff 64). Granite's scales as in the synthetic granitehybrid: input
x12, attention scale 1/128, sub-layer outputs x0.22 before each residual add,
logits /8. Weights as make_synth_text.py makes them: matrices ~ N(0, 1/fan_in)
(q/k x4, attention output and FFN down x3 to outweigh the residual scale, router
x3), per-tensor seeds crc32("granitemoe/" + name); a tiny tied embedding
(heavy-tailed row norms) and a final-norm gain giving the logits a std of ~10, so
that greedy steps are rarely near ties. Norms and the router F32, token_embd Q4_0,
the other matrices Q8_0 (gguf.quants, as llama-quantize would quantize them).

    python tests/data/granitemoe/make_model.py OUT.gguf
"""
from __future__ import annotations

import pathlib
import sys

import gguf
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/data: the shared writer
import synth_gguf

ARCH = "granitemoe"
VOCAB_SOURCE = "/work/shared/golden/synth/models/synth-granitehybrid-q8_0.gguf"
TEMPLATE = pathlib.Path(__file__).resolve().parents[1] / "templates" / "ibm-granite-granite-3.3-2B-Instruct.jinja"

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 64, 4, 4, 2, 16
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_FF_SHEXP = 8, 2, 64, 64
N_CTX_TRAIN, ROPE_BASE, RMS_EPS = 131072, 10000.0, 1e-6
EMBEDDING_SCALE, ATTENTION_SCALE, RESIDUAL_SCALE, LOGIT_SCALE = 12.0, 0.0078125, 0.22, 8.0
LOGIT_STD, EMBD_STD, ROW_TAIL, ROUTER_SCALE, QK_SCALE, OUT_SCALE = 10.0, 0.05, 0.2, 3.0, 4.0, 3.0


def _copy_vocab(w: gguf.GGUFWriter) -> int:
    n_vocab = synth_gguf.copy_bpe_vocab(w, VOCAB_SOURCE)
    w.add_chat_template(TEMPLATE.read_text(encoding="utf-8"))
    return n_vocab


def _hparams(w: gguf.GGUFWriter, n_vocab: int) -> None:
    A = ARCH
    for key, value in (("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
                       ("feed_forward_length", N_FF_EXP), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("rope.dimension_count", HEAD_DIM),
                       ("vocab_size", n_vocab), ("expert_count", N_EXPERT), ("expert_used_count", N_EXPERT_USED),
                       ("expert_shared_feed_forward_length", N_FF_SHEXP)):
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
    for i in range(N_LAYER):
        p = f"blk.{i}."
        ts.norm(p + "attn_norm.weight", E)
        ts.mat(p + "attn_q.weight", [E, H * D], scale=QK_SCALE)
        ts.mat(p + "attn_k.weight", [E, KV * D], scale=QK_SCALE)
        ts.mat(p + "attn_v.weight", [E, KV * D])
        ts.mat(p + "attn_output.weight", [H * D, E], scale=OUT_SCALE)
        ts.norm(p + "ffn_norm.weight", E)
        ts.mat(p + "ffn_gate_inp.weight", [E, N_EXPERT], scale=ROUTER_SCALE, qtype=Q.F32)
        ts.mat(p + "ffn_gate_exps.weight", [E, N_FF_EXP, N_EXPERT], fan_in=E)
        ts.mat(p + "ffn_up_exps.weight", [E, N_FF_EXP, N_EXPERT], fan_in=E)
        ts.mat(p + "ffn_down_exps.weight", [N_FF_EXP, E, N_EXPERT], fan_in=N_FF_EXP, scale=OUT_SCALE)
        ts.mat(p + "ffn_gate_shexp.weight", [E, N_FF_SHEXP])
        ts.mat(p + "ffn_up_shexp.weight", [E, N_FF_SHEXP])
        ts.mat(p + "ffn_down_shexp.weight", [N_FF_SHEXP, E], scale=OUT_SCALE)
    return ts


def build(path: str) -> None:
    w = synth_gguf.writer(path, ARCH, "synth-granitemoe")
    n_vocab = _copy_vocab(w)
    _hparams(w, n_vocab)
    synth_gguf.write(w, _tensors(n_vocab))


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/synth-granitemoe-q8_0.gguf")
