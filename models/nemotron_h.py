"""NVIDIA Nemotron-H: every layer is one block, a Mamba-2 mixer, attention, or an
MLP, chosen by the per-layer `attention.head_count_kv` and `feed_forward_length`
(both 0: Mamba-2; no FFN width: attention; else the MLP).

ref: llama.cpp src/models/nemotron-h.cpp, graph-context-mamba.cpp.

Each block is x + block(attn_norm(x)); there is no second sub-layer. Attention has
no rope at all; the MLP is ffn_down(relu(ffn_up x)^2) (no gate).
"""
from __future__ import annotations

import numpy as np

from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.mamba2 import Mamba2
from ggserve.models.memory import LayerKV
from ggserve.models.registry import register
from ggserve.models.weights import Weights

MAMBA2, ATTENTION, MLP = "mamba2", "attention", "mlp"


def _per_layer(v, n_layer: int) -> list[int]:
    return [int(x) for x in v] if np.ndim(v) else [int(v)] * n_layer


@register("nemotron_h")
class NemotronHModel(Decoder):

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.eps = hp.get("attention.layer_norm_epsilon", self.eps)
        self.kv_heads = _per_layer(self.n_head_kv, self.n_layer)
        self.ff = _per_layer(self.n_ff, self.n_layer)
        self.kinds = [MAMBA2 if kv == 0 and ff == 0 else ATTENTION if ff == 0 else MLP
                      for kv, ff in zip(self.kv_heads, self.ff)]
        self.is_recurrent = [k == MAMBA2 for k in self.kinds]
        self.n_head_kv = max(self.kv_heads)
        self.kq_scale = hp.get("attention.scale", 0.0) or float(np.float32(1) / np.sqrt(np.float32(self.head_dim)))
        self.mamba = Mamba2(hp, self.n_embd, self.eps, path)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.layers = [self._layer(w, i) for i in range(self.n_layer)]

    def _layer(self, w: Weights, i: int) -> blocks.Layer:
        e, kind = self.n_embd, self.kinds[i]
        norm = [("attn_norm", "attn_norm.weight", (e,), True)]
        if kind == MAMBA2:
            table = norm + self.mamba.weights()
        elif kind == ATTENTION:
            table = blocks.attention_weights(self, qkv_bias=True, out_bias=False, n_head_kv=self.kv_heads[i])
        else:
            table = norm + [("ffn_up", "ffn_up.weight", (e, self.ff[i]), True),
                            ("ffn_up_b", "ffn_up.bias", (self.ff[i],), False),
                            ("ffn_down", "ffn_down.weight", (self.ff[i], e), True),
                            ("ffn_down_b", "ffn_down.bias", (e,), False)]
        L = blocks.Layer(w, i, table)
        L.kind = kind
        return L

    def memory_layers(self, device_of_layer) -> list:
        """Attention layers keep K/V per token, Mamba-2 layers a conv and a scan state
        per sequence, MLP layers nothing (None)."""
        return [self.mamba.memory(device_of_layer(il)) if k == MAMBA2 else
                LayerKV(self.head_dim * n, self.head_dim * n, device_of_layer(il)) if k == ATTENTION else None
                for il, (k, n) in enumerate(zip(self.kinds, self.kv_heads))]

    def layer(self, g, inp, il, L, x, temp):
        h = blocks.norm(g, x, L.attn_norm, self.eps)
        if L.kind == MAMBA2:
            h = self.mamba.forward(g, inp, il, L, h)
        elif L.kind == ATTENTION:
            h = self.attention(g, inp, il, L, h, temp)
        else:
            h = self._mlp(g, inp, L, h)
        if il == self.n_layer - 1 and inp.out_ids is not None:
            h = g.get_rows(h, inp.out_ids)
            x = g.get_rows(x, inp.out_ids)
        return g.add(h, x)

    def _mlp(self, g, inp, L, h):
        up = blocks.linear(g, inp, L.ffn_up, L.ffn_up_b, h)
        return blocks.linear(g, inp, L.ffn_down, L.ffn_down_b, g.sqr(g.relu(up)))

    def qkv(self, g, inp, il, L, h):
        return blocks.qkv(g, inp, L, h, self.head_dim, self.n_head, self.kv_heads[il])

    def rope(self, g, il, t, pos):
        return t                                                            # Nemotron-H has no rope
