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
from ggserve.models.vision.preprocess import BICUBIC, Plan, Tiles, normalize, resize_pad_to, size_preserved_ratio
from ggserve.models.vision.registry import Family, register
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
class Gemma4V(Family):
    name = "gemma4v"

    def __init__(self, cfg, meta: dict, path: str):
        super().__init__(cfg, meta, path)
        self.merge = int(meta.get("clip.vision.projector.scale_factor", 3) or 3)
        if self.merge < 1:
            raise ModelError(f"{path}: clip.vision.projector.scale_factor must be >= 1")
        self.align = cfg.patch_size * self.merge
        self.min_pixels = MIN_TOKENS * self.align ** 2
        self.max_pixels = MAX_TOKENS * self.align ** 2

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

    def plan(self, width: int, height: int) -> Plan:
        if width <= 0 or height <= 0:
            raise ValueError(f"image has no pixels ({width}x{height})")
        w, h = size_preserved_ratio(width, height, self.align, self.min_pixels, self.max_pixels)
        gx, gy = w // self.align, h // self.align
        return Plan(1, gx, gy, (w, h), (gx * gy,))

    def preprocess(self, rgb: np.ndarray) -> Tiles:
        p = self.plan(rgb.shape[1], rgb.shape[0])
        w, h = p.resized
        img = resize_pad_to(rgb, w, h, BICUBIC, (0, 0, 0))
        return Tiles([normalize(img, self.cfg.image_mean, self.cfg.image_std)], n_tokens=p.n_tokens)

    __call__ = preprocess

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
        p, e, eps, n_head, d = cfg.patch_size, cfg.n_embd, cfg.eps, cfg.n_head, self.d_head
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
        for B in self.blocks:
            h = vit.norm(g, x, B.ln1_w, B.ln1_b, eps, "rms")
            q = g.reshape(vit.add(g, g.mul_mat(B.wq, h), B.bq), d, n_head, n)
            k = g.reshape(vit.add(g, g.mul_mat(B.wk, h), B.bk), d, n_head, n)
            v = g.reshape(vit.add(g, g.mul_mat(B.wv, h), B.bv), d, n_head, n)
            if B.q_norm is not None:
                q = vit.norm(g, q, B.q_norm, None, eps, "rms")
            if B.k_norm is not None:
                k = vit.norm(g, k, B.k_norm, None, eps, "rms")
            q, k = self._rope(g, q, pos_x, pos_y), self._rope(g, k, pos_x, pos_y)
            v = g.rms_norm(v, eps)
            a = vit.attention(g, q, k, v, B.wo, B.bo, 1.0)
            if B.attn_post_norm is not None:
                a = vit.norm(g, a, B.attn_post_norm, None, eps, "rms")
            x = g.add(a, x)
            h = vit.norm(g, x, B.ln2_w, B.ln2_b, eps, "rms")
            h = vit.ffn(g, h, B.up, B.up_b, B.gate, B.gate_b, B.down, B.down_b, cfg.ffn_op)
            if B.ffn_post_norm is not None:
                h = vit.norm(g, h, B.ffn_post_norm, None, eps, "rms")
            x = g.add(x, h)
        k = self.merge
        x = g.reshape(g.cont(g.transpose(x)), nx, ny, e, 1)                   # [nx, ny, e]
        x = g.pool_2d(x, ggml.POOL_AVG, k, k, k, k, 0, 0)
        n_out = (nx // k) * (ny // k)
        x = g.cont(g.transpose(g.reshape(x, n_out, e)))                        # [e, n_out]
        x = g.scale(x, float(np.float32(math.sqrt(e))))
        x = g.mul_mat(self.input_proj, g.rms_norm(x, eps))                     # [n_embd_out, n_out]
        return inp_raw, x, extra
