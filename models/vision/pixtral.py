"""Pixtral and Mistral 3 (`clip.projector_type` = pixtral): one dynamic-size tile per image.

ref: llama.cpp tools/mtmd/models/pixtral.cpp, clip.cpp (load_hparams, set_input for
pixtral), mtmd-image.cpp (mtmd_image_preprocessor_dyn_size), mtmd.cpp (img_end).

  preprocess  sides to multiples of patch * merge (calc_size_preserved_ratio, 8..1024
              tokens after the merge), bicubic, one tile
  tower       patch conv (no bias) -> RMS pre LN -> ViT blocks with RMS norms, 2D RoPE
              (rows on the first half of each head, columns on the second, theta 10000)
              and SiLU-gated FFNs
  mistral3    (clip.vision.spatial_merge_size, mm.patch_merger): RMS norm (mm.input_norm)
              -> 2x2 unfold -> mm.patch_merger
  projector   mm.1 -> GELU -> mm.2, then the [IMG_BREAK] vector (v.token_embd.img_break)
              after every row of tokens but the last: gx * gy + gy - 1 rows
  prompt      the rows, then the text "[IMG_END]" (no image-begin token)
"""
from __future__ import annotations

import numpy as np

from ggserve.models.registry import ModelError
from ggserve.models.vision import vit
from ggserve.models.vision.dynamic import DynamicSize
from ggserve.models.vision.registry import register
from ggserve.native import ggml

ROPE_THETA = 10000.0
MIN_TOKENS, MAX_TOKENS = 8, 1024          # after the merge (clip.cpp set_limit_image_tokens)


@register("pixtral")
class Pixtral(DynamicSize):
    name = "pixtral"

    def __init__(self, cfg, meta: dict, path: str):
        super().__init__(cfg, meta, path)
        self.merge = int(meta.get("clip.vision.spatial_merge_size", 1) or 1)
        if self.merge < 1:
            raise ModelError(f"{path}: clip.vision.spatial_merge_size must be >= 1")
        if cfg.ffn_op not in ("silu", "gelu"):
            raise ModelError(f"{path}: pixtral blocks have a gated FFN (clip.use_silu or clip.use_gelu)")
        self.set_limits(cfg.patch_size * self.merge, MIN_TOKENS, MAX_TOKENS)
        if self.merge > 1:
            self.name = "mistral3"

    def load(self, w) -> None:
        cfg = self.cfg
        e, p = cfg.n_embd, cfg.patch_size
        self.patch_embd = w.get("v.patch_embd.weight", (p, p, 3, e))
        self.patch_bias = w.get("v.patch_embd.bias", (e,), required=False)
        self.pre_ln = w.get("v.pre_ln.weight", (e,), required=False)
        self.blocks = [vit.Block(w, i, e, cfg.n_ff) for i in range(cfg.n_layer)]
        if any(b.gate is None for b in self.blocks):
            raise ModelError(f"{self.path}: pixtral blocks need v.blk.N.ffn_gate.weight")
        self.patch_merger = None
        if self.merge > 1:
            m = self.merge
            self.input_norm = w.get("mm.input_norm.weight", (e,))
            self.patch_merger = w.get("mm.patch_merger.weight", (e * m * m, e))
        self.mm1, self.mm1_b, self.mm2, self.mm2_b = vit.mlp_weights(w, "mm.1", "mm.2", e, biases=False)
        self.n_embd_out = self.mm2.ne[1]
        self.img_break = w.get("v.token_embd.img_break", (self.n_embd_out,), required=False)

    # -- preprocessing -------------------------------------------------------------

    def tokens(self, width: int, height: int) -> int:
        gx, gy = width // self.align, height // self.align
        return gx * gy + (gy - 1 if self.img_break is not None else 0)

    def layout(self, tiles, text, image) -> None:
        image(0)
        text("[IMG_END]")

    def max_sizes(self):
        # the most patches (square), and the most [IMG_BREAK] rows (one column) / widest row
        a, n = self.align, MAX_TOKENS
        side = int(np.sqrt(n)) * a
        return [(side, side), (a, n * a), (n * a, a)]

    # -- graph -----------------------------------------------------------------------

    def build(self, g, width: int, height: int):
        cfg = self.cfg
        p, e = cfg.patch_size, cfg.n_embd
        inp_raw, x = vit.patch_embed(g, self.patch_embd, self.patch_bias, width, height, p)
        nx, ny = width // p, height // p
        n = nx * ny
        pos_h = g.input("pos_h", ggml.I32, (n,))
        pos_w = g.input("pos_w", ggml.I32, (n,))
        idx = np.arange(n, dtype=np.int32)
        extra = {pos_h: idx // nx, pos_w: idx % nx}
        x = vit.vit(g, x, self.blocks, n_head=cfg.n_head, eps=cfg.eps, ffn_op=cfg.ffn_op, norm_kind="rms",
                    pre_ln=(self.pre_ln, None),
                    rope=lambda g, t: vit.rope_2d(g, t, pos_h, pos_w, ROPE_THETA))
        m = self.merge
        if self.patch_merger is not None:
            x = g.mul(g.rms_norm(x, cfg.eps), self.input_norm)
            x = g.cont(g.permute(g.reshape(x, e, nx, ny), 2, 0, 1, 3))          # [nx, ny, e]
            kernel = g.view(x, (m, m, e), (0, 0), 0)                           # its shape only
            x = g.im2col(kernel, x, m, m, 0, 0, 1, 1, True, ggml.F32)            # [m*m*e, nx/m, ny/m]
            x = g.reshape(x, x.ne[0], x.ne[1] * x.ne[2])
            x = g.mul_mat(self.patch_merger, x)                                 # [e, n / m^2]
        x = vit.ffn(g, x, self.mm1, self.mm1_b, None, None, self.mm2, self.mm2_b, "gelu")
        if self.img_break is not None:
            px, py = nx // m, ny // m
            t = x.ne[0]
            rows = g.reshape(x, t, px, py)
            # llama.cpp adds the vector to a zeroed [t, 1, py] tensor: the same rows
            tok = g.repeat_4d(g.reshape(self.img_break, t, 1, 1), t, 1, py)
            rows = g.concat(rows, tok, 1)                                      # [t, px + 1, py]
            x = g.view(rows, (t, px * py + py - 1), (rows.nb[1],), 0)
        return inp_raw, x, extra
