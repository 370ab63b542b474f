"""Qwen2-VL / Qwen2.5-VL text models: Qwen2 blocks (q/k/v biases) with M-RoPE.

ref: llama.cpp src/models/qwen2vl.cpp. Each token has 4 positions (t, h, w, -);
`rope.dimension_sections` says how many rotated pairs of a head each one drives
(ggml_rope_multi, GGML_ROPE_TYPE_MROPE: NEOX pairs, sections in blocks). Text
tokens get (p, p, p, 0); image tokens their grid cell (models/vision/arrange.py).

llama.cpp's qwen2vl loader never reads `attention.layer_norm_rms_epsilon`, so its RMS
norms run with eps 0 (the hparams default); so do ours, or every norm is ~1e-6 off,
which the random synthetic model turns into logprob differences of 0.1.
"""
from __future__ import annotations

from ggserve.models.hparams import HParams
from ggserve.models.llama import LlamaModel
from ggserve.models.registry import register

ROPE_MROPE = 8          # GGML_ROPE_TYPE_MROPE


@register("qwen2vl")
class Qwen2VLModel(LlamaModel):
    n_pos = 4

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        super().__init__(meta, tensors, path)
        hp = HParams(meta, path)
        self.sections = tuple(int(s) for s in hp.get("rope.dimension_sections", required=True))[:4]
        self.eps = 0.0          # ref: llama.cpp src/models/qwen2vl.cpp load_arch_hparams (no RMS eps key)

    def _rope(self, g, t, pos):
        return g.rope_multi(t, pos, self.n_rot, self.sections, ROPE_MROPE, self.n_ctx_orig, self.rope_base,
                            self.rope_scale)
