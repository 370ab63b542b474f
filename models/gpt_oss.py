"""gpt-oss (GGUF arch `gpt-oss`; llama.cpp's openai-moe): alternating sliding-window
and global attention with attention sinks, and a mixture of experts in every layer.

ref: llama.cpp src/models/openai-moe.cpp. Layers il % 2 == 0 attend over a
window (`attention.sliding_window`, standard: the last n_swa positions), the
others over everything; each head has a learned sink logit in its softmax
(`attn_sinks`); q/k/v/o carry biases; NEOX RoPE with YaRN on every layer;
queries scaled by 1/sqrt(n_rot). The FFN is a MoE with router and expert
biases: top-k on the raw router scores, softmax over the chosen, gpt-oss's
clamped SwiGLU. The last layer runs on every row; rows are picked after it.
"""
from __future__ import annotations

import math

from ggserve.models import blocks, moe
from ggserve.models.decoder import BEFORE_NORM, Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights
from ggserve.native import ggml

SWA_PATTERN = 2           # llama.cpp's default for this arch: il % 2 == 0 is sliding-window


@register("gpt-oss")
class GptOssModel(Decoder):
    rope_type = ggml.ROPE_NEOX
    pick_rows = BEFORE_NORM
    window_cache = True

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.n_ff_exp = hp.get("expert_feed_forward_length", required=True)
        self.window = hp.get("attention.sliding_window", required=True)
        self.swa_layers = blocks.swa_layers(hp.get("attention.sliding_window_pattern", SWA_PATTERN), self.n_layer)
        self.rope_scaling = RopeScaling.from_hparams(hp)
        self.rope_base_swa = hp.get("rope.freq_base_swa", self.rope_scaling.freq_base)
        self.kq_scale = 1.0 / math.sqrt(self.n_rot)
        self.routing = moe.Routing(hp.get("expert_count", required=True), hp.get("expert_used_count", required=True),
                                   gating=moe.SOFTMAX_WEIGHT, act=moe.SWIGLU_OAI)

        w = Weights(tensors, path)
        w.embeddings_and_output(self, tied_output=False)
        self.layers = []
        for i in range(self.n_layer):
            L = blocks.Layer(w, i, blocks.attention_weights(self, qkv_bias=True, out_bias=True),
                             [("sinks", "attn_sinks.weight", (self.n_head,), True),
                              ("ffn_norm", "post_attention_norm.weight", (self.n_embd,), True)])
            L.experts = moe.Experts(w, i, self.n_embd, self.n_ff_exp, self.routing.n_expert, biases=True)
            self.layers.append(L)

    def rope(self, g, il, t, pos):
        base = self.rope_base_swa if self.swa_layers[il] else self.rope_scaling.freq_base
        return self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type, freq_base=base)

    def ffn(self, g, inp, il, L, h):
        return moe.moe_ffn(g, inp, h, L.experts, self.routing)
