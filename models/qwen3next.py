"""Qwen3-Next: Qwen3.5-MoE's layers (gated delta net, every `full_attention_interval`-th
layer gated full attention, a MoE FFN with a sigmoid-gated shared expert in every
layer) as the earlier Qwen3-Next checkpoints lay them out.

ref: llama.cpp src/models/qwen3next.cpp. What differs from Qwen3.5-MoE:
- full attention rotates by NeoX rope over the first `rope.dimension_count` dims of
  each head (one position per token, no M-RoPE sections);
- the delta net's write strength and decay come from one fused projection `ssm_ba`
  [n_embd, 2 * n_v_heads], laid out per k-head group as [beta x r | alpha x r]
  (r = n_v_heads / n_k_heads value heads per k-head);
- the value heads of a k-head group are consecutive: q and k are repeated
  head by head (repeat-interleave) to n_v_heads before the delta rule;
- the rows whose outputs are wanted are picked in the last layer, before its
  residual add.
"""
from __future__ import annotations

from ggserve.models.decoder import LAST_LAYER
from ggserve.models.hparams import HParams
from ggserve.models.qwen35 import Layer
from ggserve.models.qwen35moe import Qwen35MoeModel
from ggserve.models.registry import register
from ggserve.models.weights import Weights
from ggserve.native import ggml

F32 = 4     # bytes


@register("qwen3next")
class Qwen3NextModel(Qwen35MoeModel):
    n_pos = 1
    pick_rows = LAST_LAYER

    def read_rope_sections(self, hp: HParams) -> None:
        self.sections = None

    def _rope(self, g, t, pos):
        return g.rope(t, pos, self.n_rot, ggml.ROPE_NEOX, self.n_ctx_orig, self.rope_base)

    def load_gates(self, L: Layer, w: Weights, p: str) -> None:
        L.w_ba = w.get(p + "ssm_ba.weight", (self.n_embd, 2 * self.n_v_heads))

    def gates(self, g, inp, L: Layer, h):
        n, n_k = inp.n_tokens, self.n_k_heads
        r = self.n_v_heads // n_k
        ba = inp.mm(g, L.w_ba, h)                                          # [2 * n_v_heads, n]
        beta = g.view(ba, (r, n_k, n), (2 * r * F32, ba.nb[1]), 0)          # [r, n_k, n] of each group
        alpha = g.view(ba, (r, n_k, n), (2 * r * F32, ba.nb[1]), r * F32)
        return (g.reshape(g.cont(beta), self.n_v_heads, n),
                g.reshape(g.cont(alpha), self.n_v_heads, n))

    def qk_heads(self, g, q, k):
        S, n_k, nt, ns = q.ne[0], q.ne[1], q.ne[2], q.ne[3]
        r = self.n_v_heads // n_k
        if r == 1:
            return q, k

        def repeat(t):                                                     # k-head j -> heads j*r .. j*r+r-1
            t = g.repeat_4d(g.reshape(t, S, 1, n_k, nt * ns), S, r, n_k, nt * ns)
            return g.reshape(t, S, n_k * r, nt, ns)
        return repeat(q), repeat(k)
