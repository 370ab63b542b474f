"""StarCoder 2 (starcoder2: BigCode's StarCoder2 3B/7B/15B and the code models built on it).

ref: llama.cpp src/models/starcoder2.cpp: pre-norm layers with LayerNorm (mean and
variance, then weight and bias; `attention.layer_norm_epsilon`) in place of RMS norm,
including the final norm; q/k/v (optional) and output biases; NeoX RoPE over the whole
head, attention scaled 1/sqrt(head_dim); a plain GELU MLP (ffn_up + bias, GELU with
tanh, ffn_down + bias), no gate.
"""
from __future__ import annotations

import numpy as np

from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights
from ggserve.native import ggml


def layer_norm(g, x, w, b, eps: float):
    """llama.cpp's LLM_NORM: ggml_norm, times the weight, plus the bias."""
    return g.add(g.mul(g.norm(x, eps), w), b)


@register("starcoder2")
class StarCoder2Model(Decoder):
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.eps = hp.get("attention.layer_norm_epsilon", required=True)
        self.rope_scaling = RopeScaling.from_hparams(hp)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        if self.n_rot != self.head_dim:                                   # llama.cpp asserts it too
            raise ModelError(f"{path}: starcoder2 needs rope.dimension_count == head dim ({self.head_dim})")
        self.kq_scale = float(np.float32(1) / np.sqrt(np.float32(self.head_dim)))

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.output_norm_b = w.get("output_norm.bias", (self.n_embd,))
        e, f = self.n_embd, self.n_ff
        self.layers = [blocks.Layer(w, i, blocks.attention_weights(self, qkv_bias=True, out_bias=True),
                                    [("attn_norm_b", "attn_norm.bias", (e,), True),
                                     ("ffn_norm", "ffn_norm.weight", (e,), True), ("ffn_norm_b", "ffn_norm.bias", (e,), True),
                                     ("ffn_up", "ffn_up.weight", (e, f), True), ("ffn_up_b", "ffn_up.bias", (f,), True),
                                     ("ffn_down", "ffn_down.weight", (f, e), True),
                                     ("ffn_down_b", "ffn_down.bias", (e,), True)])
                       for i in range(self.n_layer)]

    def layer(self, g, inp, il, L, x, temp):
        h = self.attention(g, inp, il, L, layer_norm(g, x, L.attn_norm, L.attn_norm_b, self.eps), temp)
        if il == self.n_layer - 1 and inp.out_ids is not None:
            h = g.get_rows(h, inp.out_ids)
            x = g.get_rows(x, inp.out_ids)
        x = g.add(h, x)                                                     # ffn_inp
        h = layer_norm(g, x, L.ffn_norm, L.ffn_norm_b, self.eps)
        h = blocks.linear(g, inp, L.ffn_down, L.ffn_down_b, g.gelu(blocks.linear(g, inp, L.ffn_up, L.ffn_up_b, h)))
        return g.add(h, x)

    def rope(self, g, il, t, pos):
        return self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type)

    def head(self, g, inp, x):
        return inp.head(g, self.output, layer_norm(g, x, self.output_norm, self.output_norm_b, self.eps))
