"""Qwen2.5-VL (`clip.projector_type` = qwen2.5vl_merger): one dynamic-size tile per image.

ref: llama.cpp tools/mtmd/models/qwen2vl.cpp, clip.cpp (load_hparams, set_input for
qwen2.5vl), mtmd-image.cpp (mtmd_image_preprocessor_dyn_size), mtmd.cpp (vision
wrapper, M-RoPE image positions).

  preprocess  sides to multiples of patch * 2 (calc_size_preserved_ratio, 8..4096
              tokens), bicubic, PAD_CEIL, one tile
  tower       two patch convs summed, patches reordered so each 2x2 merge group is
              contiguous; RMS norms; windowed attention (layers with (il + 1) %
              n_wa_pattern != 0 attend within 112-px windows: tokens permuted by window
              before the blocks, the mask keeps each window to itself), the others full;
              M-RoPE (GGML_ROPE_TYPE_VISION: rows then columns, a quarter of a head each)
  projector   4 patches side by side -> mm.0 -> GELU -> mm.2, un-permuted by window
  prompt      <|vision_start|> gx * gy rows <|vision_end|>; in the text model the rows
              get M-RoPE positions (p0, p0 + row, p0 + col, 0) and the image advances
              the position by max(gx, gy) (arrange.mrope_positions)
"""
from __future__ import annotations

import numpy as np

from ggserve.models.registry import ModelError
from ggserve.models.vision import vit
from ggserve.models.vision.dynamic import DynamicSize
from ggserve.models.vision.registry import register
from ggserve.native import ggml

MIN_TOKENS, MAX_TOKENS = 8, 4096         # clip.cpp set_limit_image_tokens(8, 4096)
ROPE_VISION = 24                         # GGML_ROPE_TYPE_VISION
ATTN_WINDOW = 112                        # pixels; clip.cpp's default attn_window_size
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"


class QwenVLBase(DynamicSize):
    """What Qwen2.5-VL and Qwen3-VL share: dynamic-size preprocessing, the 2x2 merge
    order of patches, the tower's M-RoPE positions and the prompt layout."""

    tiles_grid = True

    def __init__(self, cfg, meta: dict, path: str):
        super().__init__(cfg, meta, path)
        self.merge = int(meta.get("clip.vision.spatial_merge_size", 2) or 2)
        if self.merge != 2:
            raise ModelError(f"{path}: Qwen-VL towers merge 2x2 patches (spatial_merge_size is {self.merge})")
        d_head = cfg.n_embd // cfg.n_head
        if d_head % 4:
            raise ModelError(f"{path}: head size {d_head} is not a multiple of 4 (M-RoPE sections)")
        self.set_limits(cfg.patch_size * self.merge, MIN_TOKENS, MAX_TOKENS)

    def check_vocab(self, tokenizer) -> None:
        for name in (VISION_START, VISION_END):
            if tokenizer.token_to_id(name) is None:
                raise ValueError(f"the text model has no {name} token, which {self.name} images need")

    def layout(self, tiles, text, image) -> None:
        text(VISION_START)
        image(0, grid=(tiles.grid_x, tiles.grid_y))
        text(VISION_END)

    def max_sizes(self):
        # the most patches: the tower's memory follows the patch count (the window mask
        # is [n, n]), not the shape
        side = int(np.sqrt(MAX_TOKENS)) * self.align
        return [(side, side)]

    # -- graph pieces ----------------------------------------------------------------

    def _patches(self, g, width: int, height: int):
        """Both patch convs summed, in 2x2 merge order -> (inp_raw, x [e, n_patches])."""
        p, e = self.cfg.patch_size, self.cfg.n_embd
        if width % self.align or height % self.align:
            raise ValueError(f"tile {width}x{height} is not a multiple of {self.align}")
        nx, ny = width // p, height // p
        inp_raw = g.input("inp_raw", ggml.F32, (width, height, 3))
        x = g.add(g.conv_2d(self.patch_embd, inp_raw, p, p), g.conv_2d(self.patch_embd_1, inp_raw, p, p))
        return inp_raw, self._merge_order(g, x, e, nx, ny)

    @staticmethod
    def _merge_order(g, x, e: int, nx: int, ny: int):
        """[nx, ny, e] (a conv's output) -> [e, nx * ny] with each 2x2 group's patches
        adjacent (row-major within the group, groups row-major)."""
        x = g.cont(g.permute(x, 1, 2, 0, 3))                              # [e, nx, ny]
        x = g.reshape(x, e * 2, nx // 2, 2, ny // 2)
        x = g.cont(g.permute(x, 0, 2, 1, 3))                              # [2e, 2, nx/2, ny/2]
        return g.reshape(x, e, nx * ny)

    @staticmethod
    def _positions(nx: int, ny: int, order=None) -> np.ndarray:
        """The tower's M-RoPE positions (row, col, row, col) of each patch in merge order,
        i32 [4 * n]; order: where each merge group sits (window permutation) or None."""
        gy, gx = np.meshgrid(np.arange(ny // 2), np.arange(nx // 2), indexing="ij")
        dy, dx = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
        rows = (2 * gy.reshape(-1, 1) + dy).ravel()
        cols = (2 * gx.reshape(-1, 1) + dx).ravel()
        n = nx * ny
        pos = np.empty((4, n), dtype=np.int32)
        dst = np.arange(n) if order is None else (np.repeat(order, 4) * 4 + np.tile(np.arange(4), len(order)))
        pos[0, dst] = rows
        pos[1, dst] = cols
        pos[2, dst] = rows
        pos[3, dst] = cols
        return pos.ravel()

    def _rope(self, g, t, positions):
        d = t.ne[0]
        return g.rope_multi(t, positions, d // 2, (d // 4,) * 4, ROPE_VISION, 32768, 10000.0, 1.0, 0.0, 1.0,
                            32.0, 1.0)


@register("qwen2.5vl_merger")
class Qwen25VL(QwenVLBase):
    name = "qwen25vl"

    def __init__(self, cfg, meta: dict, path: str):
        super().__init__(cfg, meta, path)
        wa = meta.get("clip.vision.n_wa_pattern")
        if wa is None:
            raise ModelError(f"{path}: qwen2.5vl_merger needs clip.vision.n_wa_pattern")
        self.n_wa_pattern = int(wa)
        if cfg.ffn_op not in ("silu", "gelu"):
            raise ModelError(f"{path}: qwen2.5vl blocks have a gated FFN (clip.use_silu or clip.use_gelu)")

    def load(self, w) -> None:
        cfg = self.cfg
        e, p = cfg.n_embd, cfg.patch_size
        self.patch_embd = w.get("v.patch_embd.weight", (p, p, 3, e))
        self.patch_embd_1 = w.get("v.patch_embd.weight.1", (p, p, 3, e))
        self.pre_ln = w.get("v.pre_ln.weight", (e,), required=False)
        self.post_ln = w.get("v.post_ln.weight", (e,), required=False)
        self.blocks = [vit.Block(w, i, e, cfg.n_ff) for i in range(cfg.n_layer)]
        if any(b.gate is None for b in self.blocks):
            raise ModelError(f"{self.path}: qwen2.5vl blocks need v.blk.N.ffn_gate.weight")
        self.mm0, self.mm0_b, self.mm2, self.mm2_b = vit.mlp_weights(w, "mm.0", "mm.2", 4 * e)
        self.n_embd_out = self.mm2.ne[1]

    def windows(self, gx: int, gy: int) -> tuple[np.ndarray, np.ndarray]:
        """(idx, mask): idx[src] = where merged token src goes when tokens are grouped by
        window (row-major windows of 4x4 merged tokens, row-major inside); mask f32
        [n, n] over the permuted patches: 0 within a window, lowest float elsewhere."""
        win = ATTN_WINDOW // self.align
        idx = np.empty(gx * gy, dtype=np.int32)
        n = 4 * gx * gy
        mask = np.full((n, n), np.finfo(np.float32).min, dtype=np.float32)
        dst = 0
        for y in range(0, gy, win):
            for x in range(0, gx, win):
                h, w = min(win, gy - y), min(win, gx - x)
                src = ((y + np.arange(h))[:, None] * gx + (x + np.arange(w))[None, :]).ravel()
                idx[src] = dst + np.arange(h * w)
                mask[4 * dst:4 * (dst + h * w), 4 * dst:4 * (dst + h * w)] = 0
                dst += h * w
        return idx, mask

    def build(self, g, width: int, height: int):
        cfg = self.cfg
        e, eps = cfg.n_embd, cfg.eps
        inp_raw, x = self._patches(g, width, height)                       # [e, n]
        nx, ny = width // cfg.patch_size, height // cfg.patch_size
        gx, gy = nx // 2, ny // 2
        n = nx * ny
        extra = {}
        positions = g.input("positions", ggml.I32, (4 * n,))
        if self.pre_ln is not None:
            x = vit.norm(g, x, self.pre_ln, None, eps, "rms")
        mask = idx = None
        if self.n_wa_pattern > 0:
            idx_np, mask_np = self.windows(gx, gy)
            inv_np = np.empty_like(idx_np)
            inv_np[idx_np] = np.arange(len(idx_np), dtype=np.int32)
            inv = g.input("inv_window_idx", ggml.I32, (gx * gy,))
            idx = g.input("window_idx", ggml.I32, (gx * gy,))
            mask = g.input("window_mask", ggml.F32, (n, n))             # cast to f16 by the attention
            extra.update({inv: inv_np, idx: idx_np, mask: mask_np})
            x = g.reshape(g.get_rows(g.reshape(x, 4 * e, gx * gy), inv), e, n)
            extra[positions] = self._positions(nx, ny, idx_np)
        else:
            extra[positions] = self._positions(nx, ny)
        n_wa = self.n_wa_pattern
        x = vit.vit(g, x, self.blocks, n_head=cfg.n_head, eps=eps, ffn_op=cfg.ffn_op, norm_kind="rms",
                    post_ln=(self.post_ln, None), rope=lambda g, t: self._rope(g, t, positions),
                    mask_of=lambda il: None if n_wa <= 0 or (il + 1) % n_wa == 0 else mask)
        x = g.reshape(x, 4 * e, gx * gy)
        x = vit.ffn(g, x, self.mm0, self.mm0_b, None, None, self.mm2, self.mm2_b, "gelu")
        if idx is not None:
            x = g.get_rows(x, idx)                                        # [n_embd_out, gx * gy]
        return inp_raw, x, extra
