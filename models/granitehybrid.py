"""IBM Granite 4 (granitehybrid): Mamba-2 layers, and attention layers where
`attention.head_count_kv` is non-zero, each followed by a SwiGLU FFN (or Granite
MoE's experts and shared expert).

ref: llama.cpp src/models/granite-hybrid.cpp, graph-context-mamba.cpp.

Granite's scales: token embeddings times `embedding_scale`, attention scaled by
`attention.scale`, every sub-layer's output times `residual_scale` before its
residual add, logits divided by `logit_scale`. Rope only where
`rope.scaling.finetuned` says so (Granite 4 has none).
"""
from __future__ import annotations

import numpy as np

from ggserve.models import blocks, moe
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.mamba2 import Mamba2
from ggserve.models.memory import LayerKV
from ggserve.models.registry import register
from ggserve.models.weights import Weights


@register("granitehybrid")
class GraniteHybridModel(Decoder):

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        kv = self.n_head_kv                                                 # per layer: 0 = Mamba-2
        self.kv_heads = [int(x) for x in kv] if np.ndim(kv) else [int(kv)] * self.n_layer
        self.is_recurrent = [n == 0 for n in self.kv_heads]
        self.n_head_kv = max(self.kv_heads)
        self.use_rope = bool(hp.get("rope.scaling.finetuned", False))
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.rope_base = hp.get("rope.freq_base", 10000.0)
        self.n_ctx_orig = hp.get("context_length", 0)
        self.kq_scale = hp.get("attention.scale", 0.0) or float(np.float32(1) / np.sqrt(np.float32(self.head_dim)))
        self.embd_scale = hp.get("embedding_scale", 0.0) or None
        self.residual_scale = hp.get("residual_scale", 0.0) or None
        self.logit_scale = hp.get("logit_scale", 0.0) or None
        self.mamba = Mamba2(hp, self.n_embd, self.eps, path)
        self.routing = None
        if hp.get("expert_count", 0):
            self.routing = moe.Routing(hp.get("expert_count"), hp.get("expert_used_count", 0), norm_weights=True)
            self.n_ff_exp = hp.get("expert_feed_forward_length", 0) or self.n_ff
            self.n_ff_shexp = hp.get("expert_shared_feed_forward_length", 0)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.layers = [self._layer(w, i) for i in range(self.n_layer)]

    def _layer(self, w: Weights, i: int) -> blocks.Layer:
        if self.is_recurrent[i]:
            mixer = [("attn_norm", "attn_norm.weight", (self.n_embd,), True)] + self.mamba.weights()
        else:
            mixer = blocks.attention_weights(self, qkv_bias=True, out_bias=False, n_head_kv=self.kv_heads[i])
        if f"blk.{i}.ffn_gate_inp.weight" in w and self.routing is not None:
            L = blocks.Layer(w, i, mixer, [("ffn_norm", "ffn_norm.weight", (self.n_embd,), True)])
            L.experts = moe.Experts(w, i, self.n_embd, self.n_ff_exp, self.routing.n_expert)
            L.shexp = blocks.Layer(w, i, blocks.ffn_weights(self, self.n_ff_shexp, norm=None, suffix="_shexp")) \
                if self.n_ff_shexp else None
        else:
            L = blocks.Layer(w, i, mixer, blocks.ffn_weights(self))
        L.recurrent = self.is_recurrent[i]
        return L

    def memory_layers(self, device_of_layer) -> list:
        """Attention layers keep K/V per token; Mamba-2 layers a conv and a scan state
        per sequence."""
        return [self.mamba.memory(device_of_layer(il)) if r else
                LayerKV(self.head_dim * n, self.head_dim * n, device_of_layer(il))
                for il, (r, n) in enumerate(zip(self.is_recurrent, self.kv_heads))]

    def layer(self, g, inp, il, L, x, temp):
        h = blocks.norm(g, x, L.attn_norm, self.eps)
        if L.recurrent:
            h = self.mamba.forward(g, inp, il, L, h)
        else:
            h = self.attention(g, inp, il, L, h, temp)
        if il == self.n_layer - 1 and inp.out_ids is not None:
            h = g.get_rows(h, inp.out_ids)
            x = g.get_rows(x, inp.out_ids)
        x = g.add(self._residual(g, h), x)                                 # ffn_inp
        h = self.ffn(g, inp, il, L, blocks.norm(g, x, L.ffn_norm, self.eps))
        return g.add(self._residual(g, h), x)

    def _residual(self, g, h):
        return h if self.residual_scale is None else g.scale(h, self.residual_scale)

    def qkv(self, g, inp, il, L, h):
        return blocks.qkv(g, inp, L, h, self.head_dim, self.n_head, self.kv_heads[il])

    def rope(self, g, il, t, pos):
        if not self.use_rope:
            return t
        return g.rope(t, pos, self.n_rot, self.rope_type, self.n_ctx_orig, self.rope_base)

    def ffn(self, g, inp, il, L, h):
        if L.experts is None:
            return blocks.swiglu_ffn(g, inp, L, h)
        out = moe.moe_ffn(g, inp, h, L.experts, self.routing)
        return out if L.shexp is None else g.add(out, blocks.swiglu_ffn(g, inp, L.shexp, h))

    def head(self, g, inp, x):
        logits = super().head(g, inp, x)
        return logits if self.logit_scale is None else g.scale(logits, float(np.float32(1) / np.float32(self.logit_scale)))
