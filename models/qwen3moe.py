"""Qwen3 mixture-of-experts text models (Qwen3-30B-A3B, Qwen3-235B-A22B).

ref: llama.cpp src/models/qwen3moe.cpp: Qwen3's attention (q and k RMS-normed per
head before NEOX rope, no biases) and in every layer a MoE FFN: softmax over
all experts, top-k, the chosen weights normalised to sum 1, SwiGLU experts.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models import moe
from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerKV, global_attention_layers
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights


class Layer:
    def __init__(self, w: Weights, i: int, m: "Qwen3MoeModel"):
        p = f"blk.{i}."
        n_q, n_kv = m.head_dim * m.n_head, m.head_dim * m.n_head_kv
        self.attn_norm = w.get(p + "attn_norm.weight", (m.n_embd,))
        self.wq = w.get(p + "attn_q.weight", (m.n_embd, n_q))
        self.wk = w.get(p + "attn_k.weight", (m.n_embd, n_kv))
        self.wv = w.get(p + "attn_v.weight", (m.n_embd, n_kv))
        self.q_norm = w.get(p + "attn_q_norm.weight", (m.head_dim,))
        self.k_norm = w.get(p + "attn_k_norm.weight", (m.head_dim,))
        self.wo = w.get(p + "attn_output.weight", (n_q, m.n_embd))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (m.n_embd,))
        self.experts = moe.Experts(w, i, m.n_embd, m.n_ff_exp, m.routing.n_expert)


@register("qwen3moe")
class Qwen3MoeModel:
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        n_expert, n_used = hp.get("expert_count", 0), hp.get("expert_used_count", 0)
        if not n_expert or not n_used:
            raise ModelError(f"{path}: qwen3moe needs qwen3moe.expert_count and qwen3moe.expert_used_count > 0")
        self.n_ff_exp = hp.get("expert_feed_forward_length", 0) or self.n_ff // n_used
        self.routing = moe.Routing(n_expert, n_used, gating=moe.SOFTMAX, norm_weights=True)
        self.rope = RopeScaling.from_hparams(hp)
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.layers = [Layer(w, i, self) for i in range(self.n_layer)]

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        return global_attention_layers(self, device_of_layer)

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]."""
        n_tokens = inp.n_tokens
        x = inp.embed(g, self.tok_embd)                                  # [n_embd, n_tokens]
        for il, L in enumerate(self.layers):
            h = g.mul(g.rms_norm(x, self.eps), L.attn_norm)
            q = g.reshape(inp.mm(g, L.wq, h), self.head_dim, self.n_head, n_tokens)
            k = g.reshape(inp.mm(g, L.wk, h), self.head_dim, self.n_head_kv, n_tokens)
            v = g.reshape(inp.mm(g, L.wv, h), self.head_dim, self.n_head_kv, n_tokens)
            q = self.rope.apply(g, g.mul(g.rms_norm(q, self.eps), L.q_norm), inp.positions, self.head_dim,
                                self.rope_type)
            k = self.rope.apply(g, g.mul(g.rms_norm(k, self.eps), L.k_norm), inp.positions, self.head_dim,
                                self.rope_type)
            a = inp.mm(g, L.wo, inp.kv.attention(g, il, q, k, v, self.kq_scale))
            if il == self.n_layer - 1 and inp.out_ids is not None:
                a = g.get_rows(a, inp.out_ids)
                x = g.get_rows(x, inp.out_ids)
            x = g.add(a, x)
            h = g.mul(g.rms_norm(x, self.eps), L.ffn_norm)
            x = g.add(moe.moe_ffn(g, inp, h, L.experts, self.routing), x)
        x = g.mul(g.rms_norm(x, self.eps), self.output_norm)
        return inp.head(g, self.output, x)
