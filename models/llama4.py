"""Llama 4 text model: chunked-attention RoPE layers with L2-normed q/k, a global
no-RoPE layer every 4th, and mixture-of-experts FFNs with a shared expert.

ref: llama.cpp src/models/llama4.cpp (hparams and graph) and build_moe_ffn. Unless
`attention.sliding_window` is 0, layers il % 4 < 3 attend within 8192-position
chunks (llama.cpp hard-codes the size; the key only switches chunking on) and
rotate q/k, then RMS-normalise them without weights (use_kq_norm, off for the
128-expert model); every 4th layer (n_no_rope_layer_step) attends globally with
no rotation and queries scaled by the attention temperature
log(floor((pos + 1) / 8192) + 1) * 0.1 + 1. Every `interleave_moe_layer_step`-th
layer's FFN is a MoE: top-k on the raw router scores, the input scaled by the
sigmoid of its score before the expert FFN, plus a shared expert.
"""
from __future__ import annotations

import math

from ggserve.models import blocks, moe
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights

CHUNK = 8192                          # ref: llama4.cpp load_arch_hparams (n_swa = 8192)
SWA_PATTERN = 4                       # 3 chunked layers, then 1 global
NO_ROPE_STEP = 4                      # hparams.n_no_rope_layer_step default
TEMP_FLOOR, TEMP_SCALE, TEMP_OFFSET = 8192, 0.1, 1.0


@register("llama4")
class Llama4Model(Decoder):
    chunk = CHUNK

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        n_expert = hp.get("expert_count", 0)
        if not n_expert:
            raise ModelError(f"{path}: llama4 model cannot have zero experts (llama4.expert_count)")
        self.n_ff_exp = hp.get("expert_feed_forward_length", required=True)
        moe_step = hp.get("interleave_moe_layer_step", required=True)
        self.routing = moe.Routing(n_expert, hp.get("expert_used_count", required=True), gating=moe.SIGMOID,
                                   weight_before_ffn=True)
        window = hp.get("attention.sliding_window", None)
        if window == 0:                       # no chunking, RoPE everywhere
            self.swa_layers = [False] * self.n_layer
            no_rope_step = self.n_layer
        else:
            self.swa_layers = blocks.swa_layers(hp.get("attention.sliding_window_pattern", SWA_PATTERN), self.n_layer)
            no_rope_step = NO_ROPE_STEP
        self.use_rope = [no_rope_step > 0 and (il + 1) % no_rope_step != 0 for il in range(self.n_layer)]
        self.use_kq_norm = n_expert != 128
        if not all(self.use_rope):
            self.temperature = (TEMP_SCALE, TEMP_FLOOR, TEMP_OFFSET)
        self.rope_scaling = RopeScaling.from_hparams(hp)
        self.rope_base_swa = hp.get("rope.freq_base_swa", self.rope_scaling.freq_base)
        self.kq_scale = hp.get("attention.scale", 0.0) or 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.rope_freqs = w.get("rope_freqs.weight", (self.n_rot // 2,), required=False)
        self.layers = []
        for i in range(self.n_layer):
            if moe_step > 0 and (i + 1) % moe_step == 0:
                L = blocks.Layer(w, i, blocks.attention_weights(self),
                                 blocks.ffn_weights(self, self.n_ff_exp, suffix="_shexp"))      # the shared expert
                L.experts = moe.Experts(w, i, self.n_embd, self.n_ff_exp, n_expert)
            else:
                L = blocks.Layer(w, i, blocks.attention_weights(self), blocks.ffn_weights(self))
            self.layers.append(L)

    def rope(self, g, il, t, pos):
        """Chunked layers: rope (the chunked base), then an L2 norm without weights
        (Llama4TextL2Norm) unless use_kq_norm is off; the global layers: no rotation."""
        if not self.use_rope[il]:
            return t
        base = self.rope_base_swa if self.swa_layers[il] else self.rope_scaling.freq_base
        t = self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type, self.rope_freqs, freq_base=base)
        return g.rms_norm(t, self.eps) if self.use_kq_norm else t

    def shift_k(self, g, il, k, shift):
        """llama.cpp's K-shift: the rope alone (no L2 norm), the global layers' keys rotated too."""
        base = self.rope_base_swa if self.swa_layers[il] else self.rope_scaling.freq_base
        return self.rope_scaling.apply(g, k, shift, self.n_rot, self.rope_type, self.rope_freqs, freq_base=base)

    def scale_q(self, g, il, q, temp):
        return q if self.use_rope[il] else g.mul(q, temp)

    def ffn(self, g, inp, il, L, h):
        ffn = blocks.swiglu_ffn(g, inp, L, h)
        if L.experts is not None:
            ffn = g.add(moe.moe_ffn(g, inp, h, L.experts, self.routing), ffn)
        return ffn
