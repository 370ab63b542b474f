"""gpt-oss (GGUF arch `gpt-oss`; llama.cpp's openai-moe): alternating sliding-window
and global attention with attention sinks, and a mixture of experts in every layer.

ref: llama.cpp src/models/openai-moe.cpp. Layers il % 2 == 0 attend over a
window (`attention.sliding_window`, standard: the last n_swa positions), the
others over everything; each head has a learned sink logit in its softmax
(`attn_sinks`); q/k/v/o carry biases; NEOX RoPE with YaRN on every layer;
queries scaled by 1/sqrt(n_rot). The FFN is a MoE with router and expert
biases: top-k on the raw router scores, softmax over the chosen, gpt-oss's
clamped SwiGLU. The last layer runs on every row; rows are picked after it.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models import moe
from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerKV
from ggserve.models.registry import register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights

SWA_PATTERN = 2           # llama.cpp's default for this arch: il % 2 == 0 is sliding-window


class Layer:
    def __init__(self, w: Weights, i: int, m: "GptOssModel"):
        p = f"blk.{i}."
        n_q, n_kv = m.head_dim * m.n_head, m.head_dim * m.n_head_kv
        self.attn_norm = w.get(p + "attn_norm.weight", (m.n_embd,))
        self.wq = w.get(p + "attn_q.weight", (m.n_embd, n_q))
        self.wk = w.get(p + "attn_k.weight", (m.n_embd, n_kv))
        self.wv = w.get(p + "attn_v.weight", (m.n_embd, n_kv))
        self.bq = w.get(p + "attn_q.bias", (n_q,), required=False)
        self.bk = w.get(p + "attn_k.bias", (n_kv,), required=False)
        self.bv = w.get(p + "attn_v.bias", (n_kv,), required=False)
        self.wo = w.get(p + "attn_output.weight", (n_q, m.n_embd))
        self.bo = w.get(p + "attn_output.bias", (m.n_embd,))
        self.sinks = w.get(p + "attn_sinks.weight", (m.n_head,))
        self.ffn_norm = w.get(p + "post_attention_norm.weight", (m.n_embd,))
        self.experts = moe.Experts(w, i, m.n_embd, m.n_ff_exp, m.routing.n_expert, biases=True)


@register("gpt-oss")
class GptOssModel:
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.n_ff_exp = hp.get("expert_feed_forward_length", required=True)
        self.window = hp.get("attention.sliding_window", required=True)
        pattern = hp.get("attention.sliding_window_pattern", SWA_PATTERN)
        if isinstance(pattern, (list, tuple)):
            self.swa_layers = [bool(x) for x in pattern]
        else:
            self.swa_layers = [pattern == 0 or il % pattern < pattern - 1 for il in range(self.n_layer)]
        self.rope = RopeScaling.from_hparams(hp)
        self.rope_base_swa = hp.get("rope.freq_base_swa", self.rope.freq_base)
        self.kq_scale = 1.0 / math.sqrt(self.n_rot)
        self.routing = moe.Routing(hp.get("expert_count", required=True), hp.get("expert_used_count", required=True),
                                   gating=moe.SOFTMAX_WEIGHT, act=moe.SWIGLU_OAI)

        w = Weights(tensors, path)
        w.embeddings_and_output(self, tied_output=False)
        self.layers = [Layer(w, i, self) for i in range(self.n_layer)]

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        n = self.head_dim * self.n_head_kv
        return [LayerKV(n, n, device_of_layer(i), self.window if self.swa_layers[i] else 0)
                for i in range(self.n_layer)]

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]."""
        n_tokens = inp.n_tokens
        x = inp.embed(g, self.tok_embd)                                  # [n_embd, n_tokens]
        for il, L in enumerate(self.layers):
            base = self.rope_base_swa if self.swa_layers[il] else self.rope.freq_base
            h = g.mul(g.rms_norm(x, self.eps), L.attn_norm)
            q, k, v = (_linear(g, inp, wt, b, h) for wt, b in ((L.wq, L.bq), (L.wk, L.bk), (L.wv, L.bv)))
            q = g.reshape(q, self.head_dim, self.n_head, n_tokens)
            k = g.reshape(k, self.head_dim, self.n_head_kv, n_tokens)
            v = g.reshape(v, self.head_dim, self.n_head_kv, n_tokens)
            q = self.rope.apply(g, q, inp.positions, self.n_rot, self.rope_type, freq_base=base)
            k = self.rope.apply(g, k, inp.positions, self.n_rot, self.rope_type, freq_base=base)
            a = inp.kv.attention(g, il, q, k, v, self.kq_scale, sinks=L.sinks)   # [n_embd_q, n_tokens]
            x = g.add(g.add(inp.mm(g, L.wo, a), L.bo), x)
            h = g.mul(g.rms_norm(x, self.eps), L.ffn_norm)
            x = g.add(moe.moe_ffn(g, inp, h, L.experts, self.routing), x)
        if inp.out_ids is not None:
            x = g.get_rows(x, inp.out_ids)
        x = g.mul(g.rms_norm(x, self.eps), self.output_norm)
        return inp.head(g, self.output, x)


def _linear(g, inp, w, b, x):
    y = inp.mm(g, w, x)
    return y if b is None else g.add(y, b)
