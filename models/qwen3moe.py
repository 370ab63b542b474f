"""Qwen3 mixture-of-experts text models (Qwen3-30B-A3B, Qwen3-235B-A22B).

ref: llama.cpp src/models/qwen3moe.cpp: Qwen3's attention (q and k RMS-normed per
head before NEOX rope, no biases) and in every layer a MoE FFN: softmax over
all experts, top-k, the chosen weights normalised to sum 1, SwiGLU experts.
"""
from __future__ import annotations

import math

from ggserve.native import ggml
from ggserve.models import blocks, moe
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights


@register("qwen3moe")
class Qwen3MoeModel(Decoder):
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        n_expert, n_used = hp.get("expert_count", 0), hp.get("expert_used_count", 0)
        if not n_expert or not n_used:
            raise ModelError(f"{path}: qwen3moe needs qwen3moe.expert_count and qwen3moe.expert_used_count > 0")
        self.n_ff_exp = hp.get("expert_feed_forward_length", 0) or self.n_ff // n_used
        self.routing = moe.Routing(n_expert, n_used, gating=moe.SOFTMAX, norm_weights=True)
        self.rope_scaling = RopeScaling.from_hparams(hp)
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.layers = []
        for i in range(self.n_layer):
            L = blocks.Layer(w, i, blocks.attention_weights(self, qk_norm=True),
                             [("ffn_norm", "ffn_norm.weight", (self.n_embd,), True)])
            L.experts = moe.Experts(w, i, self.n_embd, self.n_ff_exp, n_expert)
            self.layers.append(L)

    def rope(self, g, il, t, pos):
        return self.rope_scaling.apply(g, t, pos, self.head_dim, self.rope_type)

    def ffn(self, g, inp, il, L, h):
        return moe.moe_ffn(g, inp, h, L.experts, self.routing)
