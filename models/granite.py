"""IBM Granite dense (granite: Granite 3.x dense, e.g. granite-3.3-2b-instruct).

ref: llama.cpp src/models/granite.cpp, the graph Granite MoE shares: llama.cpp
builds both from one class, and dense Granite is granitemoe without experts. What
dense Granite adds: `rope.scaling.finetuned` (default true) switches RoPE on or off
for every layer (false: no positions at all), `rope_freqs` frequency factors where
the file has them, and the optional attention-output and FFN biases its loader
reads.
"""
from __future__ import annotations

from ggserve.models import blocks
from ggserve.models.granitemoe import GraniteMoeModel
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.weights import Weights


@register("granite")
class GraniteModel(GraniteMoeModel):

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        super().__init__(meta, tensors, path)
        self.use_rope = bool(HParams(meta, path).get("rope.scaling.finetuned", True))
        self.rope_freqs = Weights(tensors, path).get("rope_freqs.weight", (self.n_rot // 2,), required=False)

    def _layer(self, w: Weights, i: int) -> blocks.Layer:
        if self.routing is not None:                                      # MoE tensors in a granite file
            return super()._layer(w, i)
        e, f = self.n_embd, self.n_ff
        return blocks.Layer(w, i, blocks.attention_weights(self, qkv_bias=True, out_bias=False),
                            blocks.ffn_weights(self),
                            [("ffn_gate_b", "ffn_gate.bias", (f,), False), ("ffn_up_b", "ffn_up.bias", (f,), False),
                             ("ffn_down_b", "ffn_down.bias", (e,), False)])

    def rope(self, g, il, t, pos):
        if not self.use_rope:                                             # rope.scaling.finetuned = false: NoPE
            return t
        return self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type, self.rope_freqs)

    def ffn(self, g, inp, il, L, h):
        if L.experts is not None:
            return super().ffn(g, inp, il, L, h)
        gate = blocks.linear(g, inp, L.ffn_gate, L.ffn_gate_b, h)
        up = blocks.linear(g, inp, L.ffn_up, L.ffn_up_b, h)
        return blocks.linear(g, inp, L.ffn_down, L.ffn_down_b, g.swiglu(gate, up))
