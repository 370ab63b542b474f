"""Llama 4 vision (`clip.projector_type` = llama4): 336-px tiles + overview, pixel shuffle.

ref: llama.cpp tools/mtmd/models/llama4.cpp, clip.cpp (load_hparams: llava-uhd
candidates up to 3x3 tiles; set_input for llama4), mtmd-image.cpp
(mtmd_image_preprocessor_llava_uhd), mtmd.cpp (wrapper, ov_img_first = false).

  preprocess  llava-uhd with the candidate grids 1x2 .. 3x3 of image_size tiles, as
              LLaVA-1.6 (llava_anyres.py): both sides <= image_size -> the overview only;
              else the best candidate, slices row-major, then the overview. (clip.cpp sets
              bilinear for llama4, but llava-uhd resizes with its own _ov/_rf algorithms,
              bicubic.)
  tower       patches unfolded (im2col) times v.patch_embd, the class embedding appended
              last, learned position embeddings, pre LN, layer-norm blocks with 2D RoPE
              (columns on the first half of a head, rows on the second; patch positions
              start at 1, the class token's is 0), post LN, class row dropped
  projector   pixel shuffle (2x2 patches side by side) -> mlp.1 -> GELU -> mlp.2 -> GELU
              -> mm.model.fc: 144 rows per tile
  prompt      "<|image_start|>" tiles' rows, overview's rows "<|image_end|>"; this llama.cpp
              build writes no tile separators
"""
from __future__ import annotations

import numpy as np

from ggserve.models.registry import ModelError
from ggserve.models.vision import vit
from ggserve.models.vision.llava_anyres import LlavaAnyres
from ggserve.models.vision.registry import Family, register
from ggserve.native import ggml

ROPE_THETA = 10000.0
MAX_TILES_PER_SIDE = 3
IMAGE_BEGIN, IMAGE_END = "<|image_start|>", "<|image_end|>"


@register("llama4")
class Llama4(LlavaAnyres):
    name = "llama4"

    def __init__(self, cfg, meta: dict, path: str):
        Family.__init__(self, cfg, meta, path)
        side = cfg.image_size
        self.candidates = [(x * side, y * side) for x in range(1, MAX_TILES_PER_SIDE + 1)
                           for y in range(1, MAX_TILES_PER_SIDE + 1) if (x, y) != (1, 1)]
        self.merge = int(meta.get("clip.vision.projector.scale_factor", 0) or 0)
        n = cfg.patches_per_side
        if self.merge < 1 or n % self.merge:
            raise ModelError(f"{path}: {n} patches per side cannot be pixel-shuffled by {self.merge}")
        self.n_tokens = (n // self.merge) ** 2

    def check_vocab(self, tokenizer) -> None:
        for name in (IMAGE_BEGIN, IMAGE_END):
            if tokenizer.token_to_id(name) is None:
                raise ValueError(f"the text model has no {name} token, which llama4 images need")

    def load(self, w) -> None:
        cfg = self.cfg
        e, p = cfg.n_embd, cfg.patch_size
        n_pos = cfg.patches_per_side ** 2 + 1
        self.patch_embd = w.get("v.patch_embd.weight", (p * p * 3, e))
        self.class_embd = w.get("v.class_embd", (e,))
        self.pos_embd = w.get("v.position_embd.weight", (e, n_pos))
        self.pre_ln, self.post_ln = vit.norm_weights(w, "pre_ln", e), vit.norm_weights(w, "post_ln", e)
        self.blocks = [vit.Block(w, i, e, cfg.n_ff) for i in range(cfg.n_layer)]
        s = self.merge
        mlp1 = w.get("mm.model.mlp.1.weight")
        self.mlp1 = w.get("mm.model.mlp.1.weight", (e * s * s, mlp1.ne[1]))
        mlp2 = w.get("mm.model.mlp.2.weight")
        self.mlp2 = w.get("mm.model.mlp.2.weight", (mlp1.ne[1], mlp2.ne[1]))
        fc = w.get("mm.model.fc.weight")
        self.n_embd_out = fc.ne[1]
        self.fc = w.get("mm.model.fc.weight", (mlp2.ne[1], self.n_embd_out))

    def layout(self, tiles, text, image) -> None:
        text(IMAGE_BEGIN)
        for i in range(len(tiles)):
            image(i)
        text(IMAGE_END)

    def build(self, g, width: int, height: int):
        cfg = self.cfg
        if width != cfg.image_size or height != cfg.image_size:
            raise ValueError(f"llama4 tiles are {cfg.image_size}x{cfg.image_size}, got {width}x{height}")
        e, p, s = cfg.n_embd, cfg.patch_size, self.merge
        nx, ny = width // p, height // p
        n = nx * ny
        inp_raw = g.input("inp_raw", ggml.F32, (width, height, 3))
        kernel = g.reshape(self.patch_embd, p, p, 3, e)                      # its shape only
        x = g.im2col(kernel, inp_raw, p, p, 0, 0, 1, 1, True, ggml.F32)      # [p*p*3, nx, ny]
        x = g.reshape(g.mul_mat(self.patch_embd, x), e, n)
        x = g.concat(x, self.class_embd, 1)                                  # [e, n + 1], class last
        pos_h = g.input("pos_h", ggml.I32, (n + 1,))
        pos_w = g.input("pos_w", ggml.I32, (n + 1,))
        idx = np.arange(n, dtype=np.int32)
        extra = {pos_h: np.append(idx // nx + 1, 0).astype(np.int32),
                 pos_w: np.append(idx % nx + 1, 0).astype(np.int32)}
        x = vit.vit(g, g.add(x, self.pos_embd), self.blocks, n_head=cfg.n_head, eps=cfg.eps, ffn_op=cfg.ffn_op,
                    pre_ln=self.pre_ln, post_ln=self.post_ln,
                    rope=lambda g, t: vit.rope_2d(g, t, pos_w, pos_h, ROPE_THETA, interleave_freq=False))
        x = g.view(x, (e, n), (x.nb[1],), 0)                                 # the patch rows
        # pixel shuffle, as clip.cpp's llama4 graph lays it out
        x = g.reshape(x, e * s, nx // s, ny, 1)
        x = g.reshape(g.cont(g.permute(x, 0, 2, 1, 3)), e * s * s, nx // s, ny // s, 1)
        x = g.reshape(x, e * s * s, n // (s * s))
        x = g.gelu(g.mul_mat(self.mlp1, x))
        x = g.gelu(g.mul_mat(self.mlp2, x))
        return inp_raw, g.mul_mat(self.fc, x), extra
