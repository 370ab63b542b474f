"""Qwen3 dense text models: Llama-style blocks with RMS norms on q and k per head.

ref: llama.cpp src/models/qwen3.cpp: q and k are RMS-normed per head (weights
[head_dim]) before NEOX rope; no q/k/v biases; SwiGLU FFN; output tied to the
token embeddings when `output.weight` is absent.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerKV, global_attention_layers
from ggserve.models.registry import register
from ggserve.models.weights import Weights


class Layer:
    def __init__(self, w: Weights, i: int, n_embd: int, head_dim: int, n_q: int, n_kv: int, n_ff: int):
        p = f"blk.{i}."
        self.attn_norm = w.get(p + "attn_norm.weight", (n_embd,))
        self.wq = w.get(p + "attn_q.weight", (n_embd, n_q))
        self.wk = w.get(p + "attn_k.weight", (n_embd, n_kv))
        self.wv = w.get(p + "attn_v.weight", (n_embd, n_kv))
        self.q_norm = w.get(p + "attn_q_norm.weight", (head_dim,))
        self.k_norm = w.get(p + "attn_k_norm.weight", (head_dim,))
        self.wo = w.get(p + "attn_output.weight", (n_q, n_embd))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (n_embd,))
        self.ffn_gate = w.get(p + "ffn_gate.weight", (n_embd, n_ff))
        self.ffn_up = w.get(p + "ffn_up.weight", (n_embd, n_ff))
        self.ffn_down = w.get(p + "ffn_down.weight", (n_ff, n_embd))


@register("qwen3")
class Qwen3Model:
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        self.rope_base = hp.get("rope.freq_base", 10000.0)
        self.n_ctx_orig = hp.get("context_length", 0)
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        n_q, n_kv = self.head_dim * self.n_head, self.head_dim * self.n_head_kv
        self.layers = [Layer(w, i, self.n_embd, self.head_dim, n_q, n_kv, self.n_ff) for i in range(self.n_layer)]

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        return global_attention_layers(self, device_of_layer)

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]."""
        n_tokens = inp.n_tokens
        x = inp.embed(g, self.tok_embd)                                          # [n_embd, n_tokens]
        for il, L in enumerate(self.layers):
            h = g.mul(g.rms_norm(x, self.eps), L.attn_norm)
            q = g.reshape(inp.mm(g, L.wq, h), self.head_dim, self.n_head, n_tokens)
            k = g.reshape(inp.mm(g, L.wk, h), self.head_dim, self.n_head_kv, n_tokens)
            v = g.reshape(inp.mm(g, L.wv, h), self.head_dim, self.n_head_kv, n_tokens)
            q = self._rope(g, g.mul(g.rms_norm(q, self.eps), L.q_norm), inp.positions)
            k = self._rope(g, g.mul(g.rms_norm(k, self.eps), L.k_norm), inp.positions)
            a = inp.mm(g, L.wo, inp.kv.attention(g, il, q, k, v, self.kq_scale))
            if il == self.n_layer - 1 and inp.out_ids is not None:
                a = g.get_rows(a, inp.out_ids)
                x = g.get_rows(x, inp.out_ids)
            x = g.add(a, x)
            h = g.mul(g.rms_norm(x, self.eps), L.ffn_norm)
            h = g.swiglu(inp.mm(g, L.ffn_gate, h), inp.mm(g, L.ffn_up, h))
            x = g.add(inp.mm(g, L.ffn_down, h), x)
        x = g.mul(g.rms_norm(x, self.eps), self.output_norm)
        return inp.head(g, self.output, x)

    def _rope(self, g, t, pos):
        return g.rope(t, pos, self.head_dim, self.rope_type, self.n_ctx_orig, self.rope_base)
