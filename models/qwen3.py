"""Qwen3 dense text models: Llama-style blocks with RMS norms on q and k per head.

ref: llama.cpp src/models/qwen3.cpp: q and k are RMS-normed per head (weights
[head_dim]) before NEOX rope; no q/k/v biases; SwiGLU FFN; output tied to the
token embeddings when `output.weight` is absent.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.weights import Weights


@register("qwen3")
class Qwen3Model(Decoder):
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        self.rope_base = hp.get("rope.freq_base", 10000.0)
        self.n_ctx_orig = hp.get("context_length", 0)
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.layers = [blocks.Layer(w, i, blocks.attention_weights(self, qk_norm=True), blocks.ffn_weights(self))
                       for i in range(self.n_layer)]

    def rope(self, g, il, t, pos):
        return self._rope(g, t, pos)

    def _rope(self, g, t, pos):
        return g.rope(t, pos, self.head_dim, self.rope_type, self.n_ctx_orig, self.rope_base)
