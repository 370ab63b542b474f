"""Llama-family text models: Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5.

ref: llama.cpp src/models/llama.cpp. Qwen2 differs only in NEOX rope and q/k/v biases.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.weights import Weights


@register("llama", "qwen2", "mistral")
class LlamaModel(Decoder):
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
        self.layers = [blocks.Layer(w, i, blocks.attention_weights(self, qkv_bias=True, out_bias=False),
                                    blocks.ffn_weights(self)) for i in range(self.n_layer)]

    def shift_k(self, g, il, k, shift):
        """Cached keys [head_dim, n_head_kv, n] moved by `shift` positions (i32 [n]):
        llama.cpp's K-shift after a context shift, the forward pass's own rope."""
        return self._rope(g, k, shift)

    def rope(self, g, il, t, pos):
        return self._rope(g, t, pos)

    def _rope(self, g, t, pos):
        return g.rope(t, pos, self.n_rot, self.rope_type, self.n_ctx_orig, self.rope_base,
                      self.rope_scale, 0.0, 1.0, 32.0, 1.0, self.rope_freqs)
