"""Llama-family text models: Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5.

ref: llama.cpp src/models/llama.cpp. Qwen2 differs only in NEOX rope and q/k/v biases.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.weights import Weights
from ggserve.models.memory import LayerKV, global_attention_layers


class Layer:
    def __init__(self, w: Weights, i: int, n_embd: int, n_q: int, n_kv: int, n_ff: int):
        p = f"blk.{i}."
        self.attn_norm = w.get(p + "attn_norm.weight", (n_embd,))
        self.wq = w.get(p + "attn_q.weight", (n_embd, n_q))
        self.wk = w.get(p + "attn_k.weight", (n_embd, n_kv))
        self.wv = w.get(p + "attn_v.weight", (n_embd, n_kv))
        self.wo = w.get(p + "attn_output.weight", (n_q, n_embd))
        self.bq = w.get(p + "attn_q.bias", (n_q,), required=False)
        self.bk = w.get(p + "attn_k.bias", (n_kv,), required=False)
        self.bv = w.get(p + "attn_v.bias", (n_kv,), required=False)
        self.bo = w.get(p + "attn_output.bias", (n_embd,), required=False)
        self.ffn_norm = w.get(p + "ffn_norm.weight", (n_embd,))
        self.ffn_gate = w.get(p + "ffn_gate.weight", (n_embd, n_ff))
        self.ffn_up = w.get(p + "ffn_up.weight", (n_embd, n_ff))
        self.ffn_down = w.get(p + "ffn_down.weight", (n_ff, n_embd))


@register("llama", "qwen2", "mistral")
class LlamaModel:
    rope_type = ggml.ROPE_NORMAL

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        if self.arch == "qwen2":
            self.rope_type = ggml.ROPE_NEOX
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.rope_base = hp.get("rope.freq_base", 10000.0)
        self.n_ctx_train = hp.get("context_length", 4096)
        scaling = hp.get("rope.scaling.type", "none")
        factor = hp.get("rope.scaling.factor", 0.0)
        self.rope_scale = 1.0 / factor if scaling == "linear" and factor else 1.0
        self.n_ctx_orig = hp.get("rope.scaling.original_context_length", self.n_ctx_train)
        self.kq_scale = hp.get("attention.scale", 0.0) or 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.rope_freqs = w.get("rope_freqs.weight", required=False)
        n_q = self.head_dim * self.n_head
        n_kv = self.head_dim * self.n_head_kv
        self.layers = [Layer(w, i, self.n_embd, n_q, n_kv, self.n_ff) for i in range(self.n_layer)]

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        return global_attention_layers(self, device_of_layer)

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]."""
        n_tokens = inp.n_tokens
        x = inp.embed(g, self.tok_embd)                                  # [n_embd, n_tokens]
        for il, L in enumerate(self.layers):
            h = g.mul(g.rms_norm(x, self.eps), L.attn_norm)
            q = inp.mm(g, L.wq, h)
            k = inp.mm(g, L.wk, h)
            v = inp.mm(g, L.wv, h)
            if L.bq is not None:
                q = g.add(q, L.bq)
            if L.bk is not None:
                k = g.add(k, L.bk)
            if L.bv is not None:
                v = g.add(v, L.bv)
            q = g.reshape(q, self.head_dim, self.n_head, n_tokens)
            k = g.reshape(k, self.head_dim, self.n_head_kv, n_tokens)
            v = g.reshape(v, self.head_dim, self.n_head_kv, n_tokens)
            q = self._rope(g, q, inp.positions)
            k = self._rope(g, k, inp.positions)
            a = inp.kv.attention(g, il, q, k, v, self.kq_scale)          # [n_embd, n_tokens]
            a = inp.mm(g, L.wo, a)
            if L.bo is not None:
                a = g.add(a, L.bo)
            if il == self.n_layer - 1 and inp.out_ids is not None:
                a = g.get_rows(a, inp.out_ids)
                x = g.get_rows(x, inp.out_ids)
            x = g.add(a, x)
            h = g.mul(g.rms_norm(x, self.eps), L.ffn_norm)
            h = g.swiglu(inp.mm(g, L.ffn_gate, h), inp.mm(g, L.ffn_up, h))
            x = g.add(inp.mm(g, L.ffn_down, h), x)
        x = g.mul(g.rms_norm(x, self.eps), self.output_norm)
        return inp.head(g, self.output, x)

    def shift_k(self, g, il, k, shift):
        """Cached keys [head_dim, n_head_kv, n] moved by `shift` positions (i32 [n]):
        llama.cpp's K-shift after a context shift, the forward pass's own rope."""
        return self._rope(g, k, shift)

    def _rope(self, g, t, pos):
        return g.rope(t, pos, self.n_rot, self.rope_type, self.n_ctx_orig, self.rope_base,
                      self.rope_scale, 0.0, 1.0, 32.0, 1.0, self.rope_freqs)
