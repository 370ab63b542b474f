"""Gemma 4 vision (`clip.projector_type` = gemma4v): one dynamic-size tile per image.

ref: llama.cpp tools/mtmd/models/gemma4v.cpp, clip.cpp (load_hparams, build_vit,
set_input for gemma4v), mtmd.cpp (wrapper, mtmd_decode_use_non_causal).

  preprocess  sides to multiples of patch * 3 (calc_size_preserved_ratio, 70..1120 tokens
              in clip.cpp, but llama-server and llama-mtmd-cli cap the maximum at their
              ubatch, 512: the image is decoded non-causally in one ubatch), bicubic
  tower       pixels scaled to [-1, 1], patch conv (no bias), learned x and y position
              tables, RMS-norm blocks with per-head q/k norms, V RMS-normed (no weight),
              2D NEOX RoPE (theta 100: columns on the first half of a head, rows on the
              second), kq scale 1, post-attention and post-FFN norms, gated GELU FFN
  projector   3x3 average pool, * sqrt(n_embd), RMS norm (no weight), mm.input_projection
  prompt      "<|image>" rows (attending to each other both ways) "<image|>"
"""
from __future__ import annotations

import math

import numpy as np

from ggserve.models.registry import ModelError
from ggserve.models.vision import vit
from ggserve.models.vision.dynamic import DynamicSize
from ggserve.models.vision.registry import register
from ggserve.native import ggml

ROPE_THETA = 100.0
MIN_TOKENS = 70
MAX_TOKENS = 512            # llama-server's cap: n_ubatch (clip.cpp alone allows 1120)
IMAGE_BEGIN, IMAGE_END = "<|image>", "<image|>"


class Block(vit.Block):
    def __init__(self, w, i: int, e: int, f: int, d_head: int):
        super().__init__(w, i, e, f)
        p = f"v.blk.{i}."
        self.q_norm = w.get(p + "attn_q_norm.weight", (d_head,), required=False)
        self.k_norm = w.get(p + "attn_k_norm.weight", (d_head,), required=False)
        self.attn_post_norm = w.get(p + "attn_post_norm.weight", (e,), required=False)
        self.ffn_post_norm = w.get(p + "ffn_post_norm.weight", (e,), required=False)


@register("gemma4v")
class Gemma4V(DynamicSize):
    name = "gemma4v"

    def __init__(self, cfg, meta: dict, path: str):
        super().__init__(cfg, meta, path)
        self.merge = int(meta.get("clip.vision.projector.scale_factor", 3) or 3)
        if self.merge < 1:
            raise ModelError(f"{path}: clip.vision.projector.scale_factor must be >= 1")
        self.set_limits(cfg.patch_size * self.merge, MIN_TOKENS, MAX_TOKENS)

    def check_vocab(self, tokenizer) -> None:
        for name in (IMAGE_BEGIN, IMAGE_END):
            if tokenizer.token_to_id(name) is None:
                raise ValueError(f"the text model has no {name} token, which gemma4v images need")

    def load(self, w) -> None:
        cfg = self.cfg
        e, p = cfg.n_embd, cfg.patch_size
        self.d_head = e // cfg.n_head
        self.patch_embd = w.get("v.patch_embd.weight", (p, p, 3, e))
        pos = w.get("v.position_embd.weight")
        self.pos_size = pos.ne[1]
        self.pos_embd = w.get("v.position_embd.weight", (e, self.pos_size, 2))
        self.blocks = [Block(w, i, e, cfg.n_ff, self.d_head) for i in range(cfg.n_layer)]
        proj = w.get("mm.input_projection.weight")
        self.n_embd_out = proj.ne[1]
        self.input_proj = w.get("mm.input_projection.weight", (e, self.n_embd_out))

    # -- preprocessing -------------------------------------------------------------

    def layout(self, tiles, text, image) -> None:
        text(IMAGE_BEGIN)
        image(0, bidirectional=True)
        text(IMAGE_END)

    def max_sizes(self):
        # the square and the most patches (one row or one column of tokens)
        a = self.align
        side = math.isqrt(MAX_TOKENS) * a
        return [(side, side), (MAX_TOKENS * a, a), (a, MAX_TOKENS * a)]

    # -- graph -----------------------------------------------------------------------

    def _rope(self, g, t, pos_x, pos_y):
        d = t.ne[0]
        t = g.rope(t, pos_x, d // 2, ggml.ROPE_NEOX, 0, ROPE_THETA, 1.0, 0.0, 1.0, 0.0, 0.0)
        t = g.rope(t, pos_y, d // 2, ggml.ROPE_NEOX, 0, ROPE_THETA, 1.0, 0.0, 1.0, 0.0, 0.0)
        return g.rope_set_offset(t, d // 2)

    def build(self, g, width: int, height: int):
        cfg = self.cfg
        p, e, eps, n_head = cfg.patch_size, cfg.n_embd, cfg.eps, cfg.n_head
        if width % self.align or height % self.align:
            raise ValueError(f"tile {width}x{height} is not a multiple of {self.align}")
        nx, ny = width // p, height // p
        n = nx * ny
        inp_raw = g.input("inp_raw", ggml.F32, (width, height, 3))
        x = g.conv_2d(self.patch_embd, g.scale_bias(inp_raw, 2.0, -1.0), p, p)   # [nx, ny, e]
        x = g.cont(g.transpose(g.reshape(x, n, e)))                             # [e, n]
        pos_x = g.input("pos_x", ggml.I32, (n,))
        pos_y = g.input("pos_y", ggml.I32, (n,))
        idx = np.arange(n, dtype=np.int32)
        extra = {pos_x: idx % nx, pos_y: idx // nx}
        nb1 = self.pos_embd.nb[1]
        tbl_x = g.view(self.pos_embd, (e, self.pos_size), (nb1,), 0)
        tbl_y = g.view(self.pos_embd, (e, self.pos_size), (nb1,), self.pos_size * nb1)
        x = g.add(g.add(x, g.get_rows(tbl_x, pos_x)), g.get_rows(tbl_y, pos_y))
        x = vit.vit(g, x, self.blocks, n_head=n_head, eps=eps, ffn_op=cfg.ffn_op, norm_kind="rms",
                    rope=lambda g, t: self._rope(g, t, pos_x, pos_y), kq_scale=1.0, v_norm=True)
        k = self.merge
        x = g.reshape(g.cont(g.transpose(x)), nx, ny, e, 1)                   # [nx, ny, e]
        x = g.pool_2d(x, ggml.POOL_AVG, k, k, k, k, 0, 0)
        n_out = (nx // k) * (ny // k)
        x = g.cont(g.transpose(g.reshape(x, n_out, e)))                        # [e, n_out]
        x = g.scale(x, float(np.float32(math.sqrt(e))))
        x = g.mul_mat(self.input_proj, g.rms_norm(x, eps))                     # [n_embd_out, n_out]
        return inp_raw, x, extra
