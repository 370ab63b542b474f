"""RoPE frequency scaling from GGUF metadata, as llama.cpp's context sets it up.

ref: llama.cpp src/llama-model.cpp (rope keys) and src/llama-context.cpp
(llama_context's cparams: yarn_ext_factor, yarn_attn_factor). With YaRN the
rotation is interpolated (freq_scale = 1/factor) and extrapolated between
beta_fast and beta_slow (ext_factor 1); ggml's rope multiplies by
0.1 * ln(1/freq_scale) + 1 itself when ext_factor != 0, so attn_factor cancels
that (times the model's own mscale and `rope.scaling.attn_factor`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ggserve.models.hparams import HParams


@dataclass(frozen=True)
class RopeScaling:
    freq_base: float
    freq_scale: float = 1.0
    n_ctx_orig: int = 0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @classmethod
    def from_hparams(cls, hp: HParams, freq_base_default: float = 10000.0) -> "RopeScaling":
        n_ctx_train = hp.get("context_length", 0)
        kind = hp.get("rope.scaling.type", "linear")
        factor = hp.get("rope.scaling.factor", 0.0) or hp.get("rope.scale_linear", 0.0)
        freq_scale = float(np.float32(1.0) / np.float32(factor)) if factor else 1.0
        if kind == "none":
            freq_scale = 1.0
        ext = hp.get("rope.scaling.yarn_ext_factor", -1.0)
        if ext < 0:
            ext = 1.0 if kind == "yarn" else 0.0
        # in float32 step by step, as llama.cpp computes it (the product is not exactly 1)
        f32 = np.float32
        attn = f32(1.0)
        if ext != 0:
            f = f32(1.0) / f32(freq_scale)
            log_f = f32(math.log(f))
            log_mul = f32(hp.get("rope.scaling.yarn_log_multiplier", 0.0))
            mscale = (lambda m: f32(1.0) if f <= 1.0 else f32(0.1) * m * log_f + f32(1.0))
            attn = mscale(f32(1.0)) / mscale(log_mul) if log_mul else mscale(f32(1.0))
            attn = attn * (f32(1.0) / (f32(1.0) + f32(0.1) * log_f))
        attn = float(attn * f32(hp.get("rope.scaling.attn_factor", 1.0)))
        return cls(freq_base=hp.get("rope.freq_base", freq_base_default), freq_scale=freq_scale,
                   n_ctx_orig=hp.get("rope.scaling.original_context_length", n_ctx_train) or n_ctx_train,
                   ext_factor=ext, attn_factor=attn,
                   beta_fast=hp.get("rope.scaling.yarn_beta_fast", 32.0),
                   beta_slow=hp.get("rope.scaling.yarn_beta_slow", 1.0))

    def apply(self, g, t, pos, n_rot: int, mode: int, freq_factors=None, freq_base: float | None = None,
              freq_scale: float | None = None):
        """ggml_rope_ext of t ([head_dim, n_head, n_tokens]) with these parameters."""
        return g.rope(t, pos, n_rot, mode, self.n_ctx_orig,
                      self.freq_base if freq_base is None else freq_base,
                      self.freq_scale if freq_scale is None else freq_scale,
                      self.ext_factor, self.attn_factor, self.beta_fast, self.beta_slow, freq_factors)
