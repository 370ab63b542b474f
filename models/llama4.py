"""Llama 4 text model: chunked-attention RoPE layers with L2-normed q/k, a global
no-RoPE layer every 4th, and mixture-of-experts FFNs with a shared expert.

ref: llama.cpp src/models/llama4.cpp (hparams and graph) and build_moe_ffn. Unless
`attention.sliding_window` is 0, layers il % 4 < 3 attend within 8192-position
chunks (llama.cpp hard-codes the size; the key only switches chunking on) and
rotate q/k, then RMS-normalise them without weights (use_kq_norm, off for the
128-expert model); every 4th layer (n_no_rope_layer_step) attends globally with
no rotation and queries scaled by the attention temperature
log(floor((pos + 1) / 8192) + 1) * 0.1 + 1. Every `interleave_moe_layer_step`-th
layer's FFN is a MoE: top-k on the raw router scores, the input scaled by the
sigmoid of its score before the expert FFN, plus a shared expert.
"""
from __future__ import annotations

import math

import numpy as np

from ggserve.native import ggml
from ggserve.models import moe
from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerKV
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights

CHUNK = 8192                          # ref: llama4.cpp load_arch_hparams (n_swa = 8192)
SWA_PATTERN = 4                       # 3 chunked layers, then 1 global
NO_ROPE_STEP = 4                      # hparams.n_no_rope_layer_step default
TEMP_FLOOR, TEMP_SCALE, TEMP_OFFSET = 8192, 0.1, 1.0


class Layer:
    def __init__(self, w: Weights, i: int, m: "Llama4Model", is_moe: bool):
        p = f"blk.{i}."
        n_q, n_kv = m.head_dim * m.n_head, m.head_dim * m.n_head_kv
        self.attn_norm = w.get(p + "attn_norm.weight", (m.n_embd,))
        self.wq = w.get(p + "attn_q.weight", (m.n_embd, n_q))
        self.wk = w.get(p + "attn_k.weight", (m.n_embd, n_kv))
        self.wv = w.get(p + "attn_v.weight", (m.n_embd, n_kv))
        self.wo = w.get(p + "attn_output.weight", (n_q, m.n_embd))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (m.n_embd,))
        self.experts = None
        if is_moe:
            self.experts = moe.Experts(w, i, m.n_embd, m.n_ff_exp, m.routing.n_expert)
            self.ffn_gate = w.get(p + "ffn_gate_shexp.weight", (m.n_embd, m.n_ff_exp))
            self.ffn_up = w.get(p + "ffn_up_shexp.weight", (m.n_embd, m.n_ff_exp))
            self.ffn_down = w.get(p + "ffn_down_shexp.weight", (m.n_ff_exp, m.n_embd))
        else:
            self.ffn_gate = w.get(p + "ffn_gate.weight", (m.n_embd, m.n_ff))
            self.ffn_up = w.get(p + "ffn_up.weight", (m.n_embd, m.n_ff))
            self.ffn_down = w.get(p + "ffn_down.weight", (m.n_ff, m.n_embd))


@register("llama4")
class Llama4Model:
    rope_type = ggml.ROPE_NORMAL

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        n_expert = hp.get("expert_count", 0)
        if not n_expert:
            raise ModelError(f"{path}: llama4 model cannot have zero experts (llama4.expert_count)")
        self.n_ff_exp = hp.get("expert_feed_forward_length", required=True)
        moe_step = hp.get("interleave_moe_layer_step", required=True)
        self.routing = moe.Routing(n_expert, hp.get("expert_used_count", required=True), gating=moe.SIGMOID,
                                   weight_before_ffn=True)
        window = hp.get("attention.sliding_window", None)
        if window == 0:                       # no chunking, RoPE everywhere
            self.chunked = [False] * self.n_layer
            no_rope_step = self.n_layer
        else:
            pattern = hp.get("attention.sliding_window_pattern", SWA_PATTERN)
            self.chunked = ([bool(x) for x in pattern] if isinstance(pattern, (list, tuple)) else
                            [pattern == 0 or il % pattern < pattern - 1 for il in range(self.n_layer)])
            no_rope_step = NO_ROPE_STEP
        self.use_rope = [no_rope_step > 0 and (il + 1) % no_rope_step != 0 for il in range(self.n_layer)]
        self.use_kq_norm = n_expert != 128
        self.rope = RopeScaling.from_hparams(hp)
        self.rope_base_swa = hp.get("rope.freq_base_swa", self.rope.freq_base)
        self.kq_scale = hp.get("attention.scale", 0.0) or 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.rope_freqs = w.get("rope_freqs.weight", (self.n_rot // 2,), required=False)
        self.layers = [Layer(w, i, self, moe_step > 0 and (i + 1) % moe_step == 0) for i in range(self.n_layer)]

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        n = self.head_dim * self.n_head_kv
        return [LayerKV(n, n, device_of_layer(i), chunk=CHUNK if self.chunked[i] else 0)
                for i in range(self.n_layer)]

    def step_values(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        """Per-step inputs beside the tokens: the attention temperature of each row
        (f32; computed as llama.cpp's llm_graph_input_attn_temp does, in double)."""
        pos = positions[0].astype(np.float32)
        scale = np.log(np.floor((pos + np.float32(TEMP_OFFSET)) / np.float32(TEMP_FLOOR)).astype(np.float64) + 1.0)
        return {"attn_temp": (scale * np.float64(np.float32(TEMP_SCALE)) + 1.0).astype(np.float32)}

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]."""
        n_tokens = inp.n_tokens
        x = inp.embed(g, self.tok_embd)                                  # [n_embd, n_tokens]
        temp = g.input("attn_temp", ggml.F32, (1, 1, n_tokens)) if not all(self.use_rope) else None
        for il, L in enumerate(self.layers):
            h = g.mul(g.rms_norm(x, self.eps), L.attn_norm)
            q = g.reshape(inp.mm(g, L.wq, h), self.head_dim, self.n_head, n_tokens)
            k = g.reshape(inp.mm(g, L.wk, h), self.head_dim, self.n_head_kv, n_tokens)
            v = g.reshape(inp.mm(g, L.wv, h), self.head_dim, self.n_head_kv, n_tokens)
            if self.use_rope[il]:
                base = self.rope_base_swa if self.chunked[il] else self.rope.freq_base
                q = self.rope.apply(g, q, inp.positions, self.n_rot, self.rope_type, self.rope_freqs, freq_base=base)
                k = self.rope.apply(g, k, inp.positions, self.n_rot, self.rope_type, self.rope_freqs, freq_base=base)
                if self.use_kq_norm:                                     # Llama4TextL2Norm
                    q = g.rms_norm(q, self.eps)
                    k = g.rms_norm(k, self.eps)
            else:
                q = g.mul(q, temp)
            a = inp.mm(g, L.wo, inp.kv.attention(g, il, q, k, v, self.kq_scale))
            if il == self.n_layer - 1 and inp.out_ids is not None:
                a = g.get_rows(a, inp.out_ids)
                x = g.get_rows(x, inp.out_ids)
            x = g.add(a, x)
            h = g.mul(g.rms_norm(x, self.eps), L.ffn_norm)
            ffn = inp.mm(g, L.ffn_down, g.swiglu(inp.mm(g, L.ffn_gate, h), inp.mm(g, L.ffn_up, h)))
            if L.experts is not None:
                ffn = g.add(moe.moe_ffn(g, inp, h, L.experts, self.routing), ffn)
            x = g.add(ffn, x)
        x = g.mul(g.rms_norm(x, self.eps), self.output_norm)
        return inp.head(g, self.output, x)
