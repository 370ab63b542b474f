"""Families that encode an image as one tile of its own size (Pixtral, Qwen-VL, Gemma 4).

ref: llama.cpp tools/mtmd/mtmd-image.cpp (mtmd_image_preprocessor_dyn_size) and
clip.cpp (calc_size_preserved_ratio): both sides resized to multiples of `align`
(patch size times the merge), the token count kept between the family's limits,
bicubic, black padding.
"""
from __future__ import annotations

import numpy as np

from ggserve.models.vision.preprocess import BICUBIC, Plan, Tiles, normalize, resize_pad_to, size_preserved_ratio
from ggserve.models.vision.registry import Family


class DynamicSize(Family):
    """A one-tile family; set_limits() in __init__. tiles_grid: the tiles carry the grid."""

    tiles_grid = False

    def set_limits(self, align: int, min_tokens: int, max_tokens: int) -> None:
        self.align = align
        self.min_pixels = min_tokens * align ** 2
        self.max_pixels = max_tokens * align ** 2

    def tokens(self, width: int, height: int) -> int:
        """Embedding rows of a width x height tile."""
        return (width // self.align) * (height // self.align)

    def plan(self, width: int, height: int) -> Plan:
        if width <= 0 or height <= 0:
            raise ValueError(f"image has no pixels ({width}x{height})")
        w, h = size_preserved_ratio(width, height, self.align, self.min_pixels, self.max_pixels)
        return Plan(1, w // self.align, h // self.align, (w, h), (self.tokens(w, h),))

    def preprocess(self, rgb: np.ndarray) -> Tiles:
        p = self.plan(rgb.shape[1], rgb.shape[0])
        w, h = p.resized
        img = resize_pad_to(rgb, w, h, BICUBIC, (0, 0, 0))
        grid = (p.grid_x, p.grid_y) if self.tiles_grid else ()
        return Tiles([normalize(img, self.cfg.image_mean, self.cfg.image_std)], *grid, n_tokens=p.n_tokens)

    def __call__(self, rgb: np.ndarray) -> Tiles:
        return self.preprocess(rgb)
