"""A tiny random-weight qwen35moe GGUF (Qwen3.5-MoE: Qwen3.5's gated-delta-net and
gated full-attention layers, each followed by a MoE FFN with a shared expert
gated by sigmoid(w . x)), written with the `gguf` package, deterministically.

Vocabulary, tokenizer metadata and chat template: those of the synthetic qwen35
model of ../shared/golden/synth (real Qwen vocabulary, Qwen3.5 template). Shapes
as that model's: n_embd 32, 4 layers (3 gated delta net with 2 k / 4 v heads x 32
and conv 4, then 1 gated full attention with 4 / 2 heads x 64, IMROPE sections
3,3,2,0 over 16 dims), and per layer 8 experts, top-2 (ff 64) + a shared expert
(ff 64). Weights as the other synthetic models': matrices ~ N(0, 1/fan_in)
(router x 3), per-tensor seeds crc32("qwen35moe/" + name); a tiny tied embedding
(std 0.05, heavy-tailed row norms) and a final-norm gain giving the logits a std
of ~10, so that greedy steps are rarely near ties. Norms, router, shared-expert
gate, conv and the delta net's vectors F32; token_embd Q4_0; other matrices Q8_0
(quantized by gguf.quants, as llama-quantize would keep or quantize them).

    python tests/data/qwen35moe/make_model.py OUT.gguf
"""
from __future__ import annotations

import pathlib
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/data: the shared writer
import synth_gguf

ARCH = "qwen35moe"
VOCAB_SOURCE = "/work/shared/golden/synth/models/synth-qwen35-q8_0.gguf"

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_ROT = 32, 4, 4, 2, 64, 16
ROPE_SECTIONS = [3, 3, 2, 0]
D_CONV, D_STATE, N_GROUP, DT_RANK = 4, 32, 2, 4
FULL_ATTENTION_INTERVAL = 4
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_FF_SHEXP = 8, 2, 64, 64
N_CTX_TRAIN, ROPE_BASE, RMS_EPS = 262144, 1e7, 1e-6
LOGIT_STD, EMBD_STD, ROW_TAIL, ROUTER_SCALE = 10.0, 0.05, 0.2, 3.0


def _copy_vocab(w: gguf.GGUFWriter) -> int:
    from ggserve.native.gguf_file import GGUFFile  # fast reader (gguf.GGUFReader takes ~20 s on the vocab)
    m = GGUFFile(VOCAB_SOURCE).metadata
    w.add_tokenizer_model(m["tokenizer.ggml.model"])
    w.add_tokenizer_pre(m["tokenizer.ggml.pre"])
    w.add_token_list(m["tokenizer.ggml.tokens"])
    w.add_token_types([int(t) for t in m["tokenizer.ggml.token_type"]])
    w.add_token_merges(m["tokenizer.ggml.merges"])
    w.add_eos_token_id(m["tokenizer.ggml.eos_token_id"])
    w.add_pad_token_id(m["tokenizer.ggml.padding_token_id"])
    w.add_bos_token_id(m["tokenizer.ggml.bos_token_id"])
    w.add_add_bos_token(m["tokenizer.ggml.add_bos_token"])
    w.add_chat_template(m["tokenizer.chat_template"])
    return len(m["tokenizer.ggml.tokens"])


def build(path: str) -> None:
    A, E, H, KV, D = ARCH, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM
    key_dim, value_dim = D_STATE * N_GROUP, D_STATE * DT_RANK
    conv_dim = 2 * key_dim + value_dim
    w = synth_gguf.writer(path, ARCH, "synth-qwen35moe")
    n_vocab = _copy_vocab(w)
    for key, value in (("context_length", N_CTX_TRAIN), ("embedding_length", E), ("block_count", N_LAYER),
                       ("attention.head_count", H), ("attention.head_count_kv", KV),
                       ("attention.key_length", D), ("attention.value_length", D),
                       ("feed_forward_length", N_FF_SHEXP), ("rope.dimension_count", N_ROT),
                       ("ssm.conv_kernel", D_CONV), ("ssm.state_size", D_STATE), ("ssm.group_count", N_GROUP),
                       ("ssm.time_step_rank", DT_RANK), ("ssm.inner_size", value_dim),
                       ("full_attention_interval", FULL_ATTENTION_INTERVAL),
                       ("expert_count", N_EXPERT), ("expert_used_count", N_EXPERT_USED),
                       ("expert_feed_forward_length", N_FF_EXP),
                       ("expert_shared_feed_forward_length", N_FF_SHEXP)):
        w.add_uint32(f"{A}.{key}", value)
    w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", RMS_EPS)
    w.add_float32(f"{A}.rope.freq_base", ROPE_BASE)
    w.add_array(f"{A}.rope.dimension_sections", ROPE_SECTIONS)

    ts = synth_gguf.Tensors(ARCH)
    # tied embedding: small, heavy-tailed row norms; the final-norm gain sets the logits' scale
    gain = ts.tied_embedding(n_vocab, E, EMBD_STD, ROW_TAIL, LOGIT_STD)
    ts.norm("output_norm.weight", E, center=gain, spread=0.1 * gain)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        ts.norm(p + "attn_norm.weight", E)
        ts.norm(p + "post_attention_norm.weight", E)
        if (i + 1) % FULL_ATTENTION_INTERVAL == 0:
            ts.mat(p + "attn_q.weight", [E, H * D * 2])          # query | output gate, per head
            ts.mat(p + "attn_k.weight", [E, KV * D])
            ts.mat(p + "attn_v.weight", [E, KV * D])
            ts.mat(p + "attn_output.weight", [H * D, E])
            ts.norm(p + "attn_q_norm.weight", D, center=2.0, spread=0.3)
            ts.norm(p + "attn_k_norm.weight", D, center=2.0, spread=0.3)
        else:
            r = ts.rng(p + "ssm")
            ts.mat(p + "attn_qkv.weight", [E, conv_dim])
            ts.mat(p + "attn_gate.weight", [E, value_dim])
            ts.mat(p + "ssm_conv1d.weight", [D_CONV, conv_dim], qtype=Q.F32)
            ts.add(p + "ssm_dt.bias", 0.5 * r.standard_normal(DT_RANK))
            ts.add(p + "ssm_a", -np.exp(r.uniform(-1.0, 1.0, DT_RANK)))     # -exp(A_log), as converted
            ts.mat(p + "ssm_beta.weight", [E, DT_RANK])
            ts.mat(p + "ssm_alpha.weight", [E, DT_RANK])
            ts.norm(p + "ssm_norm.weight", value_dim // DT_RANK)
            ts.mat(p + "ssm_out.weight", [value_dim, E])
        ts.mat(p + "ffn_gate_inp.weight", [E, N_EXPERT], scale=ROUTER_SCALE, qtype=Q.F32)
        ts.mat(p + "ffn_gate_exps.weight", [E, N_FF_EXP, N_EXPERT], fan_in=E)
        ts.mat(p + "ffn_up_exps.weight", [E, N_FF_EXP, N_EXPERT], fan_in=E)
        ts.mat(p + "ffn_down_exps.weight", [N_FF_EXP, E, N_EXPERT], fan_in=N_FF_EXP)
        ts.mat(p + "ffn_gate_inp_shexp.weight", [E], scale=2.0, qtype=Q.F32)
        ts.mat(p + "ffn_gate_shexp.weight", [E, N_FF_SHEXP])
        ts.mat(p + "ffn_up_shexp.weight", [E, N_FF_SHEXP])
        ts.mat(p + "ffn_down_shexp.weight", [N_FF_SHEXP, E])

    synth_gguf.write(w, ts)


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/synth-qwen35moe-q8_0.gguf")
