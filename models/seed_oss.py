"""ByteDance Seed-OSS: Llama-style blocks with q/k/v biases.

ref: llama.cpp src/models/seed-oss.cpp: NEOX rope; optional q/k/v and output biases;
the FFN's pre-norm is stored as `post_attention_norm`; SwiGLU FFN; output tied to
the token embeddings when absent.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.weights import Weights


@register("seed_oss")
class SeedOssModel(Decoder):
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        hp.read_linear_rope(self)
        self.kq_scale = hp.get("attention.scale", 0.0) or 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.layers = [blocks.Layer(w, i, blocks.attention_weights(self, qkv_bias=True, out_bias=False),
                                    blocks.ffn_weights(self, norm="post_attention_norm"))
                       for i in range(self.n_layer)]

    def rope(self, g, il, t, pos):
        return g.rope(t, pos, self.head_dim, self.rope_type, self.n_ctx_orig, self.rope_base, self.rope_scale)
