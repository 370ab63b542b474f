"""Gemma 3 text model: interleaved sliding-window and global attention layers.

ref: llama.cpp src/models/gemma3.cpp and the GEMMA3 hparams in src/llama-model.cpp:
every 6th layer is global, the others attend over a 512-token window with their
own rope base (10000); q/k RMS norms; pre and post norms around attention and FFN;
embeddings scaled by sqrt(n_embd); queries scaled by 1/sqrt(head_dim).
"""
from __future__ import annotations

import math

from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.weights import Weights
from ggserve.native import ggml

SWA_PATTERN = 6                 # layer il is global when il % 6 == 5
SWA_ROPE_BASE = 10000.0


@register("gemma3")
class Gemma3Model(Decoder):
    rope_type = ggml.ROPE_NEOX
    kq_scale = 1.0
    window_cache = True

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        self.n_ctx_train = hp.get("context_length", 32768)
        self.rope_base = hp.get("rope.freq_base", 1000000.0)
        factor = hp.get("rope.scaling.factor", 0.0)
        self.rope_scale = 1.0 / factor if factor else 1.0
        self.window = hp.get("attention.sliding_window", 0)
        self.swa_layers = [self.is_swa(il) for il in range(self.n_layer)]
        self.embd_scale = math.sqrt(self.n_embd)
        # 27B scales by n_embd/n_head, the others by head_dim (llama-model.cpp)
        self.q_scale = 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.layers = [blocks.Layer(w, i, blocks.attention_weights(self, qk_norm=True), blocks.ffn_weights(self),
                                    blocks.post_norm_weights(self)) for i in range(self.n_layer)]

    def is_swa(self, il: int) -> bool:
        return bool(self.window) and il % SWA_PATTERN < SWA_PATTERN - 1

    def shift_k(self, g, il, k, shift):
        """Cached keys [head_dim, n_head_kv, n] moved by `shift` positions: llama.cpp's
        K-shift after a context shift, each layer's own rope."""
        return self.rope(g, il, k, shift)

    def rope(self, g, il, t, pos):
        swa = self.swa_layers[il]
        base = SWA_ROPE_BASE if swa else self.rope_base
        scale = 1.0 if swa else self.rope_scale
        return g.rope(t, pos, self.head_dim, self.rope_type, self.n_ctx_train, base, scale)

    def ffn(self, g, inp, il, L, h):
        return blocks.geglu_ffn(g, inp, L, h)
