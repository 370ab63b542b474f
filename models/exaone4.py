"""EXAONE 4.0: OLMo 2's post-norm layers with per-head q/k norms; the 32B model's
hybrid attention (three sliding-window layers with rope, then a global one without).

ref: llama.cpp src/models/exaone4.cpp and the EXAONE4 hparams in src/llama-model.cpp:
no pre-norms, RMS norms on the attention and FFN outputs before each residual add;
q and k RMS-normed per head, then NEOX rope with the `rope_freqs` factors (llama3
scaling) on the sliding layers only. llama.cpp turns the hybrid attention on only
for n_layer == 64 (pattern `attention.sliding_window_pattern`, default every 4th
layer global); otherwise every layer is global with rope. As llama.cpp's iSWA cache,
the sliding-window layers keep their K/V in a window + ubatch ring of their own
(`LayerKV.window_cache`): past the ring's size the cells wrap, and the order flash
attention visits them in changes this model's logits (server/engine/memory/swa_ring.py).
"""
from __future__ import annotations

import dataclasses
import math

from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.weights import Weights
from ggserve.native import ggml

HYBRID_N_LAYER = 64         # EXAONE-4.0-32B
SWA_PATTERN = 4


@register("exaone4")
class Exaone4Model(Decoder):
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        hp.read_linear_rope(self)
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)
        if self.n_layer == HYBRID_N_LAYER:
            self.window = hp.get("attention.sliding_window", 4096)
            pattern = hp.get("attention.sliding_window_pattern", SWA_PATTERN)    # a period, or a flag per layer
            self.swa_layers = blocks.swa_layers(list(pattern) if hasattr(pattern, "__len__") else pattern, self.n_layer)
        self.use_rope = self.swa_layers or [True] * self.n_layer

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.rope_freqs = w.get("rope_freqs.weight", (self.head_dim // 2,), required=False)
        self.layers = [blocks.Layer(w, i, blocks.attention_weights(self, qk_norm=True, norm=None),
                                    blocks.ffn_weights(self, norm=None), blocks.post_norm_weights(self))
                       for i in range(self.n_layer)]

    def memory_layers(self, device_of_layer):
        """The sliding-window layers in a window-sized ring of cells (llama.cpp's iSWA cache)."""
        return [dataclasses.replace(spec, window_cache=bool(spec.sliding_window))
                for spec in super().memory_layers(device_of_layer)]

    def rope(self, g, il, t, pos):
        if not self.use_rope[il]:
            return t
        return g.rope(t, pos, self.head_dim, self.rope_type, self.n_ctx_orig, self.rope_base, self.rope_scale,
                      0.0, 1.0, 32.0, 1.0, self.rope_freqs)

    def shift_k(self, g, il, k, shift):
        """llama.cpp's K-shift rotates the global layers' keys too, though their forward has no rope."""
        return g.rope(k, shift, self.head_dim, self.rope_type, self.n_ctx_orig, self.rope_base, self.rope_scale,
                      0.0, 1.0, 32.0, 1.0, self.rope_freqs)
