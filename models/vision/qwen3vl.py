"""Qwen3-VL (`clip.projector_type` = qwen3vl_merger): one dynamic-size tile per image.

ref: llama.cpp tools/mtmd/models/qwen3vl.cpp, clip.cpp (resize_position_embeddings,
set_input for qwen3vl), mtmd.cpp.

  preprocess  as Qwen2.5-VL (qwen25vl.py): sides to multiples of patch * 2, 8..4096 tokens
  tower       two patch convs summed, 2x2 merge order, patch bias, learned position
              embeddings resized bilinearly (align corners) to the patch grid and put
              in the same order; layer norms; fused QKV; vision M-RoPE; full attention;
              GELU FFN. After a layer with `v.deepstack.{il}.*`: its output, 4 patches
              side by side, through norm -> fc1 -> GELU -> fc2 (a deepstack feature)
  projector   post LN, 4 patches side by side -> mm.0 -> GELU -> mm.2, then the deepstack
              features appended to each row: rows of n_embd * (1 + n_deepstack), which the
              qwen3vl text model splits (models/qwen3vl.py)
  prompt      as Qwen2.5-VL: <|vision_start|> gx * gy rows <|vision_end|>, M-RoPE positions
"""
from __future__ import annotations

import numpy as np

from ggserve.models.registry import ModelError
from ggserve.models.vision import vit
from ggserve.models.vision.qwen25vl import QwenVLBase
from ggserve.models.vision.registry import register
from ggserve.native import ggml

F32 = 4


class Block:
    """A Qwen3-VL ViT block: layer norms, fused QKV, plain FFN, optional deepstack merger."""

    def __init__(self, w, i: int, e: int, f: int):
        p = f"v.blk.{i}."
        self.ln1_w, self.ln1_b = w.get(p + "ln1.weight", (e,)), w.get(p + "ln1.bias", (e,), required=False)
        self.ln2_w, self.ln2_b = w.get(p + "ln2.weight", (e,)), w.get(p + "ln2.bias", (e,), required=False)
        self.qkv = w.get(p + "attn_qkv.weight", (e, 3 * e))
        self.qkv_b = w.get(p + "attn_qkv.bias", (3 * e,))
        self.wo = w.get(p + "attn_out.weight", (e, e))
        self.bo = w.get(p + "attn_out.bias", (e,), required=False)
        self.up = w.get(p + "ffn_up.weight", (e, f))
        self.up_b = w.get(p + "ffn_up.bias", (f,), required=False)
        self.down = w.get(p + "ffn_down.weight", (f, e))
        self.down_b = w.get(p + "ffn_down.bias", (e,), required=False)
        d = f"v.deepstack.{i}."
        self.ds_norm_w = w.get(d + "norm.weight", (4 * e,), required=False)
        self.deepstack = self.ds_norm_w is not None
        if self.deepstack:
            self.ds_norm_b = w.get(d + "norm.bias", (4 * e,))
            fc1 = w.get(d + "fc1.weight")
            self.ds_fc1 = w.get(d + "fc1.weight", (4 * e, fc1.ne[1]))
            self.ds_fc1_b = w.get(d + "fc1.bias", (fc1.ne[1],))
            fc2 = w.get(d + "fc2.weight")
            self.ds_fc2 = w.get(d + "fc2.weight", (fc1.ne[1], fc2.ne[1]))
            self.ds_fc2_b = w.get(d + "fc2.bias", (fc2.ne[1],))


@register("qwen3vl_merger")
class Qwen3VL(QwenVLBase):
    name = "qwen3vl"

    def __init__(self, cfg, meta: dict, path: str):
        super().__init__(cfg, meta, path)
        if cfg.ffn_op not in ("gelu", "gelu_quick", "silu"):
            raise ModelError(f"{path}: unknown FFN activation {cfg.ffn_op!r}")

    def load(self, w) -> None:
        cfg = self.cfg
        e, p = cfg.n_embd, cfg.patch_size
        self.patch_embd = w.get("v.patch_embd.weight", (p, p, 3, e))
        self.patch_embd_1 = w.get("v.patch_embd.weight.1", (p, p, 3, e))
        self.patch_bias = w.get("v.patch_embd.bias", (e,))
        pos = w.get("v.position_embd.weight")
        self.n_per_side = int(round(np.sqrt(pos.ne[1])))
        if self.n_per_side ** 2 != pos.ne[1]:
            raise ModelError(f"{self.path}: v.position_embd.weight has {pos.ne[1]} positions, not a square grid")
        self.pos_embd = w.get("v.position_embd.weight", (e, pos.ne[1]))
        self.pre_ln, self.post_ln = vit.norm_weights(w, "pre_ln", e), vit.norm_weights(w, "post_ln", e)
        self.blocks = [Block(w, i, e, cfg.n_ff) for i in range(cfg.n_layer)]
        self.mm0, self.mm0_b, self.mm2, self.mm2_b = vit.mlp_weights(w, "mm.0", "mm.2", 4 * e)
        self.n_embd_main = self.mm2.ne[1]
        for b in self.blocks:
            if b.deepstack and b.ds_fc2.ne[1] != self.n_embd_main:
                raise ModelError(f"{self.path}: deepstack features of {b.ds_fc2.ne[1]} dims, "
                                 f"the projector's of {self.n_embd_main}")
        self.n_deepstack = sum(b.deepstack for b in self.blocks)
        self.n_embd_out = self.n_embd_main * (1 + self.n_deepstack)

    def _pos_embd(self, g, nx: int, ny: int):
        """clip.cpp resize_position_embeddings(BILINEAR | ALIGN_CORNERS) -> [e, nx * ny] row-major."""
        e, s = self.cfg.n_embd, self.n_per_side
        if nx == s and ny == s:
            return self.pos_embd
        x = g.permute(g.reshape(self.pos_embd, e, s, s), 2, 0, 1, 3)       # [s, s, e]
        x = g.interpolate(x, nx, ny, e, 1, ggml.SCALE_BILINEAR | ggml.SCALE_ALIGN_CORNERS)
        return g.reshape(g.cont(g.permute(x, 1, 2, 0, 3)), e, nx * ny)  # [e, nx * ny]

    def build(self, g, width: int, height: int):
        cfg = self.cfg
        e, eps, n_head = cfg.n_embd, cfg.eps, cfg.n_head
        d = e // n_head
        inp_raw, x = self._patches(g, width, height)                       # [e, n], merge order
        nx, ny = width // cfg.patch_size, height // cfg.patch_size
        n = nx * ny
        x = g.add(x, self.patch_bias)
        pos = g.reshape(g.cont(self._pos_embd(g, nx, ny)), e, nx, ny)
        x = g.add(x, self._merge_order(g, g.permute(pos, 2, 0, 1, 3), e, nx, ny))
        positions = g.input("positions", ggml.I32, (4 * n,))
        extra = {positions: self._positions(nx, ny)}
        if self.pre_ln[0] is not None:
            x = vit.norm(g, x, self.pre_ln[0], self.pre_ln[1], eps)
        kq_scale = 1.0 / np.sqrt(d)
        deepstack = None
        for B in self.blocks:
            h = vit.norm(g, x, B.ln1_w, B.ln1_b, eps)
            qkv = g.add(g.mul_mat(B.qkv, h), B.qkv_b)                       # [3e, n]
            q, k, v = (g.view(qkv, (d, n_head, n), (d * F32, qkv.nb[1]), j * e * F32) for j in range(3))
            q, k = self._rope(g, q, positions), self._rope(g, k, positions)
            x = g.add(vit.attention(g, q, k, v, B.wo, B.bo, kq_scale), x)
            h = vit.norm(g, x, B.ln2_w, B.ln2_b, eps)
            x = g.add(x, vit.ffn(g, h, B.up, B.up_b, None, None, B.down, B.down_b, cfg.ffn_op))
            if B.deepstack:
                f = vit.norm(g, g.reshape(x, 4 * e, n // 4), B.ds_norm_w, B.ds_norm_b, eps)
                f = vit.ffn(g, f, B.ds_fc1, B.ds_fc1_b, None, None, B.ds_fc2, B.ds_fc2_b, "gelu")
                deepstack = f if deepstack is None else g.concat(deepstack, f, 0)
        if self.post_ln[0] is not None:
            x = vit.norm(g, x, self.post_ln[0], self.post_ln[1], eps)
        x = vit.ffn(g, g.reshape(x, 4 * e, n // 4), self.mm0, self.mm0_b, None, None, self.mm2, self.mm2_b, "gelu")
        if deepstack is not None:
            x = g.concat(x, deepstack, 0)                                    # [n_embd_out, n / 4]
        return inp_raw, x, extra
