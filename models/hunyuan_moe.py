"""Tencent Hunyuan MoE (hunyuan-moe: Hunyuan-A13B).

ref: llama.cpp src/models/hunyuan-moe.cpp: hunyuan-dense's attention (NeoX RoPE, q/k
RMS norms after it; the RoPE base as the file gives it: its loader applies no NTK
alpha), and in every layer a shared SwiGLU expert (`expert_shared_feed_forward_length`,
else `feed_forward_length`) plus softmax top-k routed experts of
`feed_forward_length`, their weights normalised to sum 1.
"""
from __future__ import annotations

from ggserve.models import blocks, moe
from ggserve.models.hparams import HParams
from ggserve.models.hunyuan_dense import HunyuanDenseModel
from ggserve.models.registry import ModelError, register
from ggserve.models.weights import Weights


@register("hunyuan-moe")
class HunyuanMoeModel(HunyuanDenseModel):
    ntk_alpha = False

    def _layer(self, hp: HParams, w: Weights, i: int) -> blocks.Layer:
        if i == 0:
            self.routing = moe.Routing(hp.get("expert_count", 0), hp.get("expert_used_count", 0), gating=moe.SOFTMAX,
                                       norm_weights=True)
            if not self.routing.n_expert or not self.routing.n_used:
                raise ModelError(f"{hp.path}: hunyuan-moe needs expert_count and expert_used_count > 0")
            self.n_ff_shexp = hp.get("expert_shared_feed_forward_length", 0) or self.n_ff
            hp.get("expert_feed_forward_length", required=True)           # llama.cpp's loader requires it (unused)
        L = blocks.Layer(w, i, blocks.attention_weights(self, qk_norm=True, qkv_bias=True),
                         [("ffn_norm", "ffn_norm.weight", (self.n_embd,), True)])
        L.experts = moe.Experts(w, i, self.n_embd, self.n_ff, self.routing.n_expert)
        L.shexp = blocks.Layer(w, i, blocks.ffn_weights(self, self.n_ff_shexp, norm=None, suffix="_shexp"))
        return L

    def ffn(self, g, inp, il, L, h):
        return g.add(moe.moe_ffn(g, inp, h, L.experts, self.routing), blocks.swiglu_ffn(g, inp, L.shexp, h))
