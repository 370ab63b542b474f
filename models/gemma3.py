"""Gemma 3 text model: interleaved sliding-window and global attention layers.

ref: llama.cpp src/models/gemma3.cpp and the GEMMA3 hparams in src/llama-model.cpp:
every 6th layer is global, the others attend over a 512-token window with their
own rope base (10000); q/k RMS norms; pre and post norms around attention and FFN;
embeddings scaled by sqrt(n_embd); queries scaled by 1/sqrt(head_dim).
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.weights import Weights
from ggserve.models.memory import LayerKV

SWA_PATTERN = 6                 # layer il is global when il % 6 == 5
SWA_ROPE_BASE = 10000.0


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
        self.attn_post_norm = w.get(p + "post_attention_norm.weight", (n_embd,))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (n_embd,))
        self.ffn_gate = w.get(p + "ffn_gate.weight", (n_embd, n_ff))
        self.ffn_up = w.get(p + "ffn_up.weight", (n_embd, n_ff))
        self.ffn_down = w.get(p + "ffn_down.weight", (n_ff, n_embd))
        self.ffn_post_norm = w.get(p + "post_ffw_norm.weight", (n_embd,))


@register("gemma3")
class Gemma3Model:
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        self.n_ctx_train = hp.get("context_length", 32768)
        self.rope_base = hp.get("rope.freq_base", 1000000.0)
        factor = hp.get("rope.scaling.factor", 0.0)
        self.rope_scale = 1.0 / factor if factor else 1.0
        self.window = hp.get("attention.sliding_window", 0)
        # 27B scales by n_embd/n_head, the others by head_dim (llama-model.cpp)
        self.q_scale = 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        n_q, n_kv = self.head_dim * self.n_head, self.head_dim * self.n_head_kv
        self.layers = [Layer(w, i, self.n_embd, self.head_dim, n_q, n_kv, self.n_ff)
                       for i in range(self.n_layer)]

    def is_swa(self, il: int) -> bool:
        return bool(self.window) and il % SWA_PATTERN < SWA_PATTERN - 1

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        n = self.head_dim * self.n_head_kv
        return [LayerKV(n, n, device_of_layer(i), self.window if self.is_swa(i) else 0)
                for i in range(self.n_layer)]

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]."""
        n_tokens = inp.n_tokens
        x = inp.embed(g, self.tok_embd, math.sqrt(self.n_embd))
        for il, L in enumerate(self.layers):
            swa = self.is_swa(il)
            base = SWA_ROPE_BASE if swa else self.rope_base
            scale = 1.0 if swa else self.rope_scale
            h = g.mul(g.rms_norm(x, self.eps), L.attn_norm)
            q = g.reshape(inp.mm(g, L.wq, h), self.head_dim, self.n_head, n_tokens)
            k = g.reshape(inp.mm(g, L.wk, h), self.head_dim, self.n_head_kv, n_tokens)
            v = g.reshape(inp.mm(g, L.wv, h), self.head_dim, self.n_head_kv, n_tokens)
            q = g.mul(g.rms_norm(q, self.eps), L.q_norm)
            q = g.rope(q, inp.positions, self.head_dim, self.rope_type, self.n_ctx_train, base, scale)
            k = g.mul(g.rms_norm(k, self.eps), L.k_norm)
            k = g.rope(k, inp.positions, self.head_dim, self.rope_type, self.n_ctx_train, base, scale)
            q = g.scale(q, self.q_scale)
            a = inp.mm(g, L.wo, inp.kv.attention(g, il, q, k, v, 1.0))
            if il == self.n_layer - 1 and inp.out_ids is not None:
                a = g.get_rows(a, inp.out_ids)
                x = g.get_rows(x, inp.out_ids)
            x = g.add(g.mul(g.rms_norm(a, self.eps), L.attn_post_norm), x)
            h = g.mul(g.rms_norm(x, self.eps), L.ffn_norm)
            h = inp.mm(g, L.ffn_down, g.geglu(inp.mm(g, L.ffn_gate, h), inp.mm(g, L.ffn_up, h)))
            x = g.add(g.mul(g.rms_norm(h, self.eps), L.ffn_post_norm), x)
        x = g.mul(g.rms_norm(x, self.eps), self.output_norm)
        return inp.head(g, self.output, x)
