"""LLaVA-1.6 (`mlp` projector with `clip.vision.image_grid_pinpoints`): anyres slices + overview.

ref: llama.cpp tools/mtmd/mtmd-image.cpp (mtmd_image_preprocessor_llava_uhd with
pinpoints: select_best_resolution), clip.cpp (load_hparams for PROJECTOR_TYPE_MLP),
models/llava.cpp, mtmd.cpp (ov_img_first = false, no slice tokens).

  preprocess  both sides <= image_size: the overview only (stretched to the square,
              bicubic, no pad). Otherwise the pinpoint with the most effective
              resolution (then the least waste), the image resized into it (bicubic,
              aspect kept, black pad), cut into image_size slices row-major; then the
              overview
  tower       as LLaVA-1.5 (encoder.py): CLIP ViT with the class embedding, all blocks
              but the last, patch rows -> mm.0 -> GELU -> mm.2 (576 rows per tile)
  prompt      the slices' rows then the overview's, nothing between them (llama.cpp
              ignores v.image_newline and spatial_unpad)
"""
from __future__ import annotations

import numpy as np

from ggserve.models.registry import ModelError
from ggserve.models.vision import vit
from ggserve.models.vision.encoder import LLAVA_CLS_LAST
from ggserve.models.vision.preprocess import BICUBIC, Plan, Tiles, normalize, resize_pad_to, resize_pillow
from ggserve.models.vision.registry import Family, register

PINPOINTS = "clip.vision.image_grid_pinpoints"


@register("mlp", when=lambda meta: len(meta.get(PINPOINTS, ())) > 0)
class LlavaAnyres(Family):
    name = "mlp_anyres"

    def __init__(self, cfg, meta: dict, path: str):
        super().__init__(cfg, meta, path)
        pts = [int(v) for v in meta[PINPOINTS]]
        if len(pts) % 2 or any(v <= 0 for v in pts):
            raise ModelError(f"{path}: {PINPOINTS} must hold (width, height) pairs")
        self.candidates = list(zip(pts[0::2], pts[1::2]))
        n = cfg.patches_per_side
        self.n_tokens = n * n

    def load(self, w) -> None:
        cfg = self.cfg
        e, p = cfg.n_embd, cfg.patch_size
        n_pos = cfg.patches_per_side ** 2 + 1
        self.patch_embd = w.get("v.patch_embd.weight", (p, p, 3, e))
        self.patch_bias = w.get("v.patch_embd.bias", (e,), required=False)
        self.class_embd = w.get("v.class_embd", (e,))
        self.pos_embd = w.get("v.position_embd.weight", (e, n_pos))
        self.pre_ln, self.post_ln = vit.norm_weights(w, "pre_ln", e), vit.norm_weights(w, "post_ln", e)
        # feature layer -2: the last block is never run
        self.blocks = [vit.Block(w, i, e, cfg.n_ff) for i in range(cfg.n_layer - 1)]
        self.mm0, self.mm0_b, self.mm2, self.mm2_b = vit.mlp_weights(w, "mm.0", "mm.2", e)
        self.n_embd_out = self.mm2.ne[1]

    # -- preprocessing -------------------------------------------------------------

    def best_resolution(self, width: int, height: int) -> tuple[int, int]:
        """select_best_resolution: most effective pixels, then least waste (float32 scale)."""
        f32 = np.float32
        best, best_eff, best_waste = None, 0, None
        for cw, ch in self.candidates:
            scale = min(f32(cw) / f32(width), f32(ch) / f32(height))
            tw, th = int(f32(width) * scale), int(f32(height) * scale)
            eff = min(tw * th, width * height)
            waste = cw * ch - eff
            if eff > best_eff or (eff == best_eff and waste < best_waste):
                best, best_eff, best_waste = (cw, ch), eff, waste
        return best

    def plan(self, width: int, height: int) -> Plan:
        if width <= 0 or height <= 0:
            raise ValueError(f"image has no pixels ({width}x{height})")
        side = self.cfg.image_size
        if width <= side and height <= side:
            return Plan(1, 0, 0, (0, 0), (self.n_tokens,))
        rw, rh = self.best_resolution(width, height)
        gx, gy = -(-rw // side), -(-rh // side)
        return Plan(gx * gy + 1, gx, gy, (rw, rh), (self.n_tokens,) * (gx * gy + 1))

    def preprocess(self, rgb: np.ndarray) -> Tiles:
        h, w = rgb.shape[:2]
        p = self.plan(w, h)
        side, mean, std = self.cfg.image_size, self.cfg.image_mean, self.cfg.image_std
        overview = normalize(resize_pillow(rgb, side, side, BICUBIC), mean, std)
        if not p.grid_x:
            return Tiles([overview], n_tokens=p.n_tokens)
        rw, rh = p.resized
        refined = resize_pad_to(rgb, rw, rh, BICUBIC, (0, 0, 0))
        tiles = []
        for y in range(0, rh, side):
            for x in range(0, rw, side):
                tiles.append(normalize(refined[y:y + side, x:x + side], mean, std))
        tiles.append(overview)
        return Tiles(tiles, p.grid_x, p.grid_y, n_tokens=p.n_tokens)

    __call__ = preprocess

    def layout(self, tiles, text, image) -> None:
        for i in range(len(tiles)):
            image(i)

    # -- graph -----------------------------------------------------------------------

    def build(self, g, width: int, height: int):
        cfg = self.cfg
        if width != cfg.image_size or height != cfg.image_size:
            raise ValueError(f"LLaVA tiles are {cfg.image_size}x{cfg.image_size}, got {width}x{height}")
        e = cfg.n_embd
        inp_raw, x = vit.patch_embed(g, self.patch_embd, self.patch_bias, width, height, cfg.patch_size)
        n = x.ne[1]
        # the class embedding after the patches, inputs as if it were first (encoder.py LLAVA_CLS_LAST)
        x = g.concat(x, self.class_embd, 1) if LLAVA_CLS_LAST else g.concat(self.class_embd, x, 1)
        x = vit.vit(g, g.add(x, self.pos_embd), self.blocks, n_head=cfg.n_head, eps=cfg.eps, ffn_op=cfg.ffn_op,
                    pre_ln=self.pre_ln, post_ln=self.post_ln)
        x = g.view(x, (e, n), (x.nb[1],), x.nb[1])                      # rows 1..n ("patches")
        x = g.gelu(g.add(g.mul_mat(self.mm0, x), self.mm0_b))
        x = g.add(g.mul_mat(self.mm2, x), self.mm2_b)
        return inp_raw, x, {}
