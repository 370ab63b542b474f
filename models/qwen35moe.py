"""Qwen3.5-MoE: Qwen3.5's layers (gated delta net, every `full_attention_interval`-th
layer gated full attention) with a mixture-of-experts FFN in every layer.

ref: llama.cpp src/models/qwen35moe.cpp (build_layer_ffn): the routed experts as
build_moe_ffn computes them (softmax over all experts, top-k, the chosen weights
normalised to sum 1, scaled by expert_weights_scale, SwiGLU experts), plus a shared
expert (an ordinary SwiGLU FFN, `*_shexp`) multiplied by sigmoid(w . x) with its
own gate vector `ffn_gate_inp_shexp` [n_embd], added to the experts' sum.
"""
from __future__ import annotations

from ggserve.models import blocks, moe
from ggserve.models.hparams import HParams
from ggserve.models.qwen35 import Layer, Qwen35Model
from ggserve.models.registry import ModelError, register
from ggserve.models.weights import Weights


@register("qwen35moe")
class Qwen35MoeModel(Qwen35Model):
    def read_ffn_hparams(self, hp: HParams) -> None:
        n_expert, n_used = hp.get("expert_count", 0), hp.get("expert_used_count", 0)
        if not n_expert or not n_used:
            raise ModelError(f"{hp.path}: {hp.arch} needs {hp.arch}.expert_count and "
                             f"{hp.arch}.expert_used_count > 0")
        self.n_ff_exp = hp.get("expert_feed_forward_length", 0) or self.n_ff // n_used
        self.n_ff_shexp = hp.get("expert_shared_feed_forward_length", 0) or self.n_ff
        self.routing = moe.Routing(n_expert, n_used, gating=moe.SOFTMAX, norm_weights=True,
                                   weights_scale=hp.get("expert_weights_scale", 0.0))

    def load_ffn(self, L: Layer, w: Weights, i: int) -> None:
        L.experts = moe.Experts(w, i, self.n_embd, self.n_ff_exp, self.routing.n_expert)
        # the shared expert (optional in llama.cpp's graph, as it is here) and its gate
        L.ffn_up = w.get(f"blk.{i}.ffn_up_shexp.weight", (self.n_embd, self.n_ff_shexp), required=False)
        if L.ffn_up is not None:
            L.load(w, i, blocks.ffn_weights(self, self.n_ff_shexp, norm=None, suffix="_shexp"),
                   [("shexp_gate", "ffn_gate_inp_shexp.weight", (self.n_embd,), True)])

    def ffn(self, g, inp, il, L: Layer, h):
        out = moe.moe_ffn(g, inp, h, L.experts, self.routing)
        if L.ffn_up is None:
            return out
        shared = super().ffn(g, inp, il, L, h)                                  # [n_embd, n_tokens]
        gate = g.sigmoid(inp.mm(g, L.shexp_gate, h))                        # [1, n_tokens]
        return g.add(out, g.mul(shared, gate))
