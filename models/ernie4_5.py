"""Baidu ERNIE 4.5 (ernie4_5: the dense 0.3B; ernie4_5-moe: 21B-A3B, 300B-A47B).

ref: llama.cpp src/models/ernie4-5.cpp (hparams, tensors, the dense graph) and
ernie4-5-moe.cpp: llama-style pre-norm layers, NORM RoPE on every layer, attention
scaled 1/sqrt(head_dim), SwiGLU FFN. An `attn_output.bias` in the file is loaded by
llama.cpp but never used by its graph, so it is not read here.

The MoE variant: the first `leading_dense_block_count` layers dense, every later one
a softmax top-k MoE over experts of `expert_feed_forward_length`, the top-k chosen
on the probabilities plus `exp_probs_b` (where the file has it; the weights are the
unbiased probabilities), normalised to sum 1, plus the shared expert's SwiGLU where
`expert_shared_feed_forward_length` is set.
"""
from __future__ import annotations

import numpy as np

from ggserve.models import blocks, moe
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights


@register("ernie4_5", "ernie4_5-moe")
class Ernie45Model(Decoder):

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.rope_scaling = RopeScaling.from_hparams(hp)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        if self.n_rot != self.head_dim:                                   # llama.cpp asserts it too
            raise ModelError(f"{path}: {self.arch} needs rope.dimension_count == head dim ({self.head_dim})")
        self.kq_scale = float(np.float32(1) / np.sqrt(np.float32(self.head_dim)))
        self.routing, self.n_dense_lead = None, self.n_layer
        if self.arch == "ernie4_5-moe":
            self._read_moe(hp, path)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.layers = [self._layer(w, i) for i in range(self.n_layer)]

    def _read_moe(self, hp: HParams, path: str) -> None:
        self.routing = moe.Routing(hp.get("expert_count", 0), hp.get("expert_used_count", 0), gating=moe.SOFTMAX,
                                   norm_weights=True)
        if not self.routing.n_expert or not self.routing.n_used:
            raise ModelError(f"{path}: ernie4_5-moe needs expert_count and expert_used_count > 0")
        n_ff_exp = hp.get("expert_feed_forward_length", required=True)
        self.n_ff_exp = n_ff_exp if isinstance(n_ff_exp, int) else int(n_ff_exp[0])
        self.n_ff_shexp = hp.get("expert_shared_feed_forward_length", 0)
        self.n_dense_lead = hp.get("leading_dense_block_count", 0)
        # llama.cpp loads experts on every layer after the dense lead but runs them only on each step-th:
        # a step other than 1 (no released ERNIE 4.5 has one) cannot run there either
        if hp.get("interleave_moe_layer_step", required=True) != 1:
            raise ModelError(f"{path}: ernie4_5-moe with interleave_moe_layer_step != 1 is not supported")

    def _layer(self, w: Weights, i: int) -> blocks.Layer:
        attn = blocks.attention_weights(self, qkv_bias=True)
        if i < self.n_dense_lead:
            return blocks.Layer(w, i, attn, blocks.ffn_weights(self))
        L = blocks.Layer(w, i, attn, [("ffn_norm", "ffn_norm.weight", (self.n_embd,), True)])
        L.experts = moe.Experts(w, i, self.n_embd, self.n_ff_exp, self.routing.n_expert,
                                probs_bias=f"blk.{i}.exp_probs_b.bias" in w)
        L.shexp = blocks.Layer(w, i, blocks.ffn_weights(self, self.n_ff_shexp, norm=None, suffix="_shexp")) \
            if self.n_ff_shexp else None
        return L

    def rope(self, g, il, t, pos):
        return self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type)

    def ffn(self, g, inp, il, L, h):
        if L.experts is None:
            return blocks.swiglu_ffn(g, inp, L, h)
        out = moe.moe_ffn(g, inp, h, L.experts, self.routing)
        return out if L.shexp is None else g.add(out, blocks.swiglu_ffn(g, inp, L.shexp, h))
