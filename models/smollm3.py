"""SmolLM3: Llama blocks with no rope on every 4th layer (NoPE).

ref: llama.cpp src/models/smollm3.cpp: a layer il ropes q and k unless
(il + 1) % n_no_rope_layer_step == 0, the step hard-coded to 4 for this
architecture (llama-model.cpp); NORM rope, optional q/k/v/output biases, SwiGLU
FFN, output tied to the token embeddings when absent. A context shift ropes the
keys of every layer (LlamaModel.shift_k): llama.cpp's K-shift has no notion of NoPE
layers (not checked against a golden).
"""
from __future__ import annotations

from ggserve.models.llama import LlamaModel
from ggserve.models.registry import register

NO_ROPE_LAYER_STEP = 4


@register("smollm3")
class SmolLM3Model(LlamaModel):
    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        super().__init__(meta, tensors, path)
        self.rope_freqs = None          # smollm3.cpp ropes without frequency factors
        self.use_rope = [(il + 1) % NO_ROPE_LAYER_STEP != 0 for il in range(self.n_layer)]

    def rope(self, g, il, t, pos):
        return self._rope(g, t, pos) if self.use_rope[il] else t
