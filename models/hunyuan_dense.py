"""Tencent Hunyuan dense (hunyuan-dense: Hunyuan 0.5B/1.8B/4B/7B Instruct).

ref: llama.cpp src/models/hunyuan-vl.cpp (the graph and tensors hunyuan-dense reuses)
and llama-model.cpp's hunyuan hparams: llama-style pre-norm layers, NeoX RoPE (with
`rope_freqs` factors where the file has them), then per-head RMS norms on q and k
(after RoPE), attention scaled 1/sqrt(head_dim), SwiGLU FFN. Hunyuan's NTK-aware
scaling: with `rope.scaling.alpha` > 0 the RoPE base is freq_base x
alpha^(head_dim / (head_dim - 2)), in f32 as llama.cpp computes it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights
from ggserve.native import ggml


@register("hunyuan-dense")
class HunyuanDenseModel(Decoder):
    rope_type = ggml.ROPE_NEOX
    ntk_alpha = True            # hunyuan-moe's loader leaves the base as the file gives it

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        if self.n_rot != self.head_dim:                                   # llama.cpp asserts it too
            raise ModelError(f"{path}: hunyuan-dense needs rope.dimension_count == head dim ({self.head_dim})")
        if hp.get("rope.dimension_sections"):
            raise ModelError(f"{path}: hunyuan-dense with M-RoPE sections (Hunyuan-VL) is not supported")
        self.rope_scaling = RopeScaling.from_hparams(hp)
        alpha = hp.get("rope.scaling.alpha", 0.0) if self.ntk_alpha else 0.0
        if alpha > 0:
            f32, d = np.float32, self.head_dim
            base = f32(self.rope_scaling.freq_base) * np.power(f32(alpha), f32(d) / f32(d - 2), dtype=f32)
            self.rope_scaling = dataclasses.replace(self.rope_scaling, freq_base=float(f32(base)))
        self.kq_scale = float(np.float32(1) / np.sqrt(np.float32(self.head_dim)))

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.rope_freqs = w.get("rope_freqs.weight", (self.n_rot // 2,), required=False)
        self.layers = [self._layer(hp, w, i) for i in range(self.n_layer)]

    def _layer(self, hp: HParams, w: Weights, i: int) -> blocks.Layer:
        return blocks.Layer(w, i, blocks.attention_weights(self, qk_norm=True, qkv_bias=True), blocks.ffn_weights(self))

    def attention(self, g, inp, il, L, h, temp):
        """q/k normed after RoPE (the shared step norms them before)."""
        q, k, v = self.qkv(g, inp, il, L, h)
        q = blocks.norm(g, self.rope(g, il, q, inp.positions), L.q_norm, self.eps)
        k = blocks.norm(g, self.rope(g, il, k, inp.positions), L.k_norm, self.eps)
        a = inp.kv.attention(g, il, q, k, v, self.kq_scale)
        return blocks.linear(g, inp, L.wo, L.bo, a)

    def rope(self, g, il, t, pos):
        return self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type, self.rope_freqs)
