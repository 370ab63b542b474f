"""Phi-3 / Phi-3.5 text models: fused QKV and fused gate|up projections, LongRoPE.

ref: llama.cpp src/models/phi3.cpp: `attn_qkv` gives q, k, v as views of one
matmul; `ffn_up` is [n_embd, 2 * n_ff], the first half the SiLU gate of the second;
NEOX rope with per-dimension frequency factors (`rope_factors_short`, or
`rope_factors_long` when a sequence's context exceeds the original context, as
llama.cpp's get_rope_factors chooses) and `rope.scaling.attn_factor`; queries are
scaled by 1/sqrt(head_dim) before attention. llama.cpp ignores Phi's sliding
window (disabled there), and so do we.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerKV
from ggserve.models.registry import register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights


class Layer:
    def __init__(self, w: Weights, i: int, n_embd: int, n_qkv: int, n_q: int, n_ff: int):
        p = f"blk.{i}."
        self.attn_norm = w.get(p + "attn_norm.weight", (n_embd,))
        self.wqkv = w.get(p + "attn_qkv.weight", (n_embd, n_qkv))
        self.wo = w.get(p + "attn_output.weight", (n_q, n_embd))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (n_embd,))
        self.ffn_up = w.get(p + "ffn_up.weight", (n_embd, 2 * n_ff))
        self.ffn_down = w.get(p + "ffn_down.weight", (n_ff, n_embd))


@register("phi3")
class Phi3Model:
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = "", n_ctx_seq: int = 0):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.rope = RopeScaling.from_hparams(hp)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        # llama.cpp: the long factors only when the per-sequence context exceeds the original one
        long = n_ctx_seq > self.rope.n_ctx_orig
        self.rope_factors = w.get(f"rope_factors_{'long' if long else 'short'}.weight", (self.n_rot // 2,),
                                  required=False)
        self.n_q, self.n_kv = self.head_dim * self.n_head, self.head_dim * self.n_head_kv
        self.layers = [Layer(w, i, self.n_embd, self.n_q + 2 * self.n_kv, self.n_q, self.n_ff)
                       for i in range(self.n_layer)]

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        return [LayerKV(self.n_kv, self.n_kv, device_of_layer(i)) for i in range(self.n_layer)]

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]."""
        n_tokens, d = inp.n_tokens, self.head_dim
        x = inp.embed(g, self.tok_embd)                                          # [n_embd, n_tokens]
        for il, L in enumerate(self.layers):
            h = g.mul(g.rms_norm(x, self.eps), L.attn_norm)
            qkv = inp.mm(g, L.wqkv, h)                                           # [n_q + 2 n_kv, n_tokens]
            row, f = qkv.nb[1], qkv.nb[0]
            q = g.view(qkv, (d, self.n_head, n_tokens), (d * f, row), 0)
            k = g.view(qkv, (d, self.n_head_kv, n_tokens), (d * f, row), self.n_q * f)
            # contiguous for the cache's row copy (llama.cpp's cpy_v takes the strided view: same values)
            v = g.cont(g.view(qkv, (d, self.n_head_kv, n_tokens), (d * f, row), (self.n_q + self.n_kv) * f))
            q = self.rope.apply(g, q, inp.positions, self.n_rot, self.rope_type, self.rope_factors)
            k = self.rope.apply(g, k, inp.positions, self.n_rot, self.rope_type, self.rope_factors)
            q = g.scale(q, 1.0 / math.sqrt(d))
            a = inp.mm(g, L.wo, inp.kv.attention(g, il, q, k, v, 1.0))
            if il == self.n_layer - 1 and inp.out_ids is not None:
                a = g.get_rows(a, inp.out_ids)
                x = g.get_rows(x, inp.out_ids)
            x = g.add(a, x)
            h = g.mul(g.rms_norm(x, self.eps), L.ffn_norm)
            up = inp.mm(g, L.ffn_up, h)                                          # [2 n_ff, n_tokens]: gate | up
            m = up.ne[1]
            h = g.swiglu(g.view(up, (self.n_ff, m), (up.nb[1],), 0),
                         g.view(up, (self.n_ff, m), (up.nb[1],), self.n_ff * up.nb[0]))
            x = g.add(x, inp.mm(g, L.ffn_down, h))
        x = g.mul(g.rms_norm(x, self.eps), self.output_norm)
        return inp.head(g, self.output, x)
