"""Gemma 2 text model: alternating sliding-window and global attention, softcapped
attention and output logits.

ref: llama.cpp src/models/gemma2.cpp (hparams, tensors, graph): every even layer
attends over a window (`attention.sliding_window`, default 4096; a pattern of 2 unless
`attention.sliding_window_pattern` says otherwise), the odd ones globally; NeoX RoPE
(`rope.freq_base_swa` on the sliding layers where given); queries scaled by
1/sqrt(head_dim) (the 27B, 46 layers: 1/sqrt(n_embd / n_head)) before attention;
attention logits softcapped at `attn_logit_softcapping` (default 50), the output
logits at `final_logit_softcapping` (default 30); RMS pre and post norms around
attention and the GeGLU FFN; embeddings times sqrt(n_embd); the output matrix is
always the token embeddings.
"""
from __future__ import annotations

import numpy as np

from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights
from ggserve.native import ggml

SWA_PATTERN, N_SWA = 2, 4096            # llama.cpp's defaults for Gemma 2
N_LAYER_27B = 46                        # llama.cpp's LLM_TYPE_27B: its query scale differs


def _f32(x) -> float:
    return float(np.float32(x))


@register("gemma2")
class Gemma2Model(Decoder):
    rope_type = ggml.ROPE_NEOX
    kq_scale = 1.0
    window_cache = True

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        self.rope_scaling = RopeScaling.from_hparams(hp)
        self.rope_base_swa = hp.get("rope.freq_base_swa", self.rope_scaling.freq_base)
        self.window = hp.get("attention.sliding_window", N_SWA)
        self.swa_layers = blocks.swa_layers(hp.get("attention.sliding_window_pattern", SWA_PATTERN), self.n_layer)
        self.attn_softcap = hp.get("attn_logit_softcapping", 50.0)
        self.final_softcap = hp.get("final_logit_softcapping", 30.0)
        self.embd_scale = _f32(np.sqrt(np.float32(self.n_embd)))
        d = self.n_embd // self.n_head if self.n_layer == N_LAYER_27B else self.head_dim
        self.q_scale = _f32(np.float32(1) / np.sqrt(np.float32(d)))

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.output = self.tok_embd                                       # llama.cpp never reads output.weight
        self.layers = [blocks.Layer(w, i, blocks.attention_weights(self), blocks.ffn_weights(self),
                                    blocks.post_norm_weights(self)) for i in range(self.n_layer)]

    def rope(self, g, il, t, pos):
        base = self.rope_base_swa if self.swa_layers[il] else None
        return self.rope_scaling.apply(g, t, pos, self.head_dim, self.rope_type, freq_base=base)

    def ffn(self, g, inp, il, L, h):
        return blocks.geglu_ffn(g, inp, L, h)

    def head(self, g, inp, x):
        logits = super().head(g, inp, x)
        return g.scale(g.tanh(g.scale(logits, _f32(np.float32(1) / np.float32(self.final_softcap)))), self.final_softcap)
