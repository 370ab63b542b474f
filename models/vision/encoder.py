"""Vision encoders and projectors of llama.cpp mmproj files, on our ggml graph API.

ref: llama.cpp tools/mtmd/clip.cpp (build_inp, build_vit, build_attn, build_ffn,
build_patch_merge_permute), models/siglip.cpp (gemma3, idefics3), models/llava.cpp (mlp).

  gemma3    SigLIP ViT -> post LN -> 4x4 average pool -> RMS norm (soft_emb_norm)
            -> input projection
  idefics3  SigLIP ViT -> post LN -> pixel shuffle (scale s) -> linear (mm.model.fc)
  mlp       CLIP ViT with a class token and pre LN, all blocks but the last (feature
            layer -2) -> patch rows -> mm.0 -> GELU -> mm.2

Attention is flash attention with K/V cast to f16 and no mask (llama.cpp's clip
default resolves to flash attention on CPU and CUDA).
"""
from __future__ import annotations

import os

import numpy as np

from ggserve.models.mmproj import MmprojEncoder
from ggserve.models.vision import vit
from ggserve.models.vision.mmproj import VisionConfig, open_mmproj
from ggserve.models.vision.preprocess import Plan, Tiles, preprocessor_for, to_rgb
from ggserve.models.vision.registry import family_class
from ggserve.models.weights import Weights
from ggserve.native import ggml

# llama.cpp's llava graph concatenates the class embedding *after* the patches while
# its inputs still assume CLS first (positions 0..n, output rows 1..n): every patch
# gets its neighbour's position embedding, patch 0 is dropped and the CLS output
# becomes the last image token. We reproduce that so embeddings match llama.cpp.
# ref: ggml-org/llama.cpp issue 25814 / PR 25844 (open when the golden data were made)
LLAVA_CLS_LAST = True


class VisionModel(MmprojEncoder):
    """An mmproj's vision encoder + projector: image -> tiles -> [n_tokens, n_embd_out] per tile.

    Weights live in backend buffers (mmap on CPU); each tile, float32 [3, H, W], is one
    graph computed with backend.compute (models/mmproj.py: encode, encode_on). Call
    close() to release the weights.
    """

    def __init__(self, cfg: VisionConfig, tensors: dict, path: str, backend, buffers: dict,
                 meta: dict | None = None):
        super().__init__(path, backend, buffers)
        self.config = cfg
        self.projector = cfg.projector
        fam = family_class(cfg.projector, meta or {})
        # a family module of models/vision/ (registry.py), or the built-in paths below
        self.family = fam(cfg, meta or {}, path) if fam is not None else None
        if self.family is not None:
            self.family.load(Weights(tensors, path))
            self.n_embd_out = self.family.n_embd_out
            self._pre = self.family
            return
        self._pre = preprocessor_for(cfg)
        e, f = cfg.n_embd, cfg.n_ff
        n_pos = cfg.patches_per_side ** 2
        w = Weights(tensors, path)
        p = cfg.patch_size
        self.patch_embd = w.get("v.patch_embd.weight", (p, p, 3, e))
        self.patch_bias = w.get("v.patch_embd.bias", (e,), required=False)
        self.class_embd = w.get("v.class_embd", (e,), required=cfg.projector == "mlp")
        if self.class_embd is not None:
            n_pos += 1
        self.pos_embd = w.get("v.position_embd.weight", (e, n_pos))
        self.pre_ln = vit.norm_weights(w, "pre_ln", e)
        self.post_ln = vit.norm_weights(w, "post_ln", e)
        self.blocks = [vit.Block(w, i, e, f) for i in range(cfg.n_layer)]

        if cfg.projector == "gemma3":
            self.soft_emb_norm = w.get("mm.soft_emb_norm.weight", (e,))
            proj = w.get("mm.input_projection.weight")
            self.input_proj = w.get("mm.input_projection.weight", (proj.ne[0], e))
            self.n_embd_out = proj.ne[0]
        elif cfg.projector == "idefics3":
            fc = w.get("mm.model.fc.weight")
            s = cfg.n_merge
            self.fc = w.get("mm.model.fc.weight", (e * s * s, fc.ne[1]))
            self.n_embd_out = fc.ne[1]
        else:  # mlp
            self.mm0, self.mm0_b, self.mm2, self.mm2_b = vit.mlp_weights(w, "mm.0", "mm.2", e)
            self.n_embd_out = self.mm2.ne[1]

    # -- loading -------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path, backend, device=None) -> "VisionModel":
        """Load an mmproj onto `device` (default: the backend's first device, a GPU if any).

        Raises ModelError naming the file for a missing, truncated or corrupt file,
        an unsupported projector type, or a missing or misshapen tensor.
        """
        path = os.fspath(path)
        gguf, cfg = open_mmproj(path)
        return cls.load(gguf, backend, device, gguf.tensors,
                        lambda tensors, buffers: cls(cfg, tensors, path, backend, buffers, gguf.metadata))

    # -- preprocessing ---------------------------------------------------------------

    def plan(self, width: int, height: int) -> Plan:
        return self._pre.plan(width, height)

    def preprocess(self, image) -> Tiles:
        """A PIL image (or uint8 [H, W, 3] array) -> its float32 CHW tiles, with grid_x / grid_y."""
        rgb = image if isinstance(image, np.ndarray) else to_rgb(image)
        return self._pre(rgb)

    @property
    def tokens_per_tile(self) -> int:
        """Rows per tile of the built-in families (a family's tiles carry their own n_tokens)."""
        return self.config.tokens_per_tile

    def tokens_per_image(self, image) -> int:
        """Embedding rows the image produces over all its tiles (wrapper text tokens excluded).

        `image` is a PIL image or a (width, height) pair; no pixels are processed.
        """
        width, height = image if isinstance(image, tuple) else image.size
        plan = self.plan(width, height)
        if self.family is not None:
            return sum(plan.n_tokens)
        return plan.n_tiles * self.tokens_per_tile

    # -- graphs ----------------------------------------------------------------------

    def build(self, g, width: int, height: int):
        """Add the encoder for one width x height tile to graph g -> (inp_raw, output).

        inp_raw: f32 ne [width, height, 3] (a CHW array); output: f32 [n_embd_out, n_tokens].
        """
        return self.build_inputs(g, width, height)[:2]

    def build_inputs(self, g, width: int, height: int):
        """build() -> (inp_raw, output, {input tensor: array}) with the other inputs the graph reads."""
        if self.family is not None:
            inp_raw, x, extra = self.family.build(g, width, height)
            x.set_name("vision_out")
            return inp_raw, g.output(x), extra
        return (*self._build(g, width, height), {})

    def _build(self, g, width: int, height: int):
        cfg = self.config
        p = cfg.patch_size
        inp_raw, x = vit.patch_embed(g, self.patch_embd, self.patch_bias, width, height, p)   # [e, n_patches]
        nx, ny = width // p, height // p
        n_patches = nx * ny
        e = cfg.n_embd

        if cfg.projector == "mlp":
            if LLAVA_CLS_LAST:
                x = g.concat(x, self.class_embd, 1)                       # [e, n_patches + 1]
            else:
                x = g.concat(self.class_embd, x, 1)
            x = self._vit(g, g.add(x, self.pos_embd), n_patches + 1, cfg.n_layer - 1)
            # patch rows 1..n (llama.cpp's "patches" input)
            x = g.view(x, (e, n_patches), (x.nb[1],), x.nb[1])
            x = g.add(g.mul_mat(self.mm0, x), self.mm0_b)
            x = g.gelu(x)
            x = g.add(g.mul_mat(self.mm2, x), self.mm2_b)                 # [n_embd_out, n_patches]
        elif cfg.projector == "gemma3":
            if nx != ny:
                raise ValueError("gemma3 tiles are square")
            x = self._vit(g, g.add(x, self.pos_embd), n_patches, cfg.n_layer)
            k = cfg.n_merge
            x = g.reshape(g.cont(g.transpose(x)), nx, ny, e, 1)           # [nx, ny, e]
            x = g.pool_2d(x, ggml.POOL_AVG, k, k, k, k, 0, 0)             # [nx/k, ny/k, e]
            n_out = (nx // k) * (ny // k)
            x = g.cont(g.transpose(g.reshape(x, n_out, e, 1)))            # [e, n_out]
            x = g.mul(g.rms_norm(x, cfg.eps), self.soft_emb_norm)
            x = g.mul_mat(g.cont(g.transpose(self.input_proj)), x)        # [n_embd_out, n_out]
        else:  # idefics3
            x = self._vit(g, g.add(x, self.pos_embd), n_patches, cfg.n_layer)
            x = self._pixel_shuffle(g, x, nx, ny, cfg.n_merge)           # [e*s*s, n_out]
            x = g.mul_mat(self.fc, x)                                     # [n_embd_out, n_out]
        x.set_name("vision_out")
        return inp_raw, g.output(x)

    def _vit(self, g, x, n_pos: int, n_blocks: int):
        """Pre LN, n_blocks pre-norm transformer blocks, post LN. x: [e, n_pos]."""
        cfg = self.config
        return vit.vit(g, x, self.blocks[:n_blocks], n_head=cfg.n_head, eps=cfg.eps, ffn_op=cfg.ffn_op,
                       pre_ln=self.pre_ln, post_ln=self.post_ln)

    @staticmethod
    def _pixel_shuffle(g, x, nx: int, ny: int, s: int):
        """[e, nx*ny] -> [e*s*s, (nx/s)*(ny/s)]: each s x s patch group's channels side by side.

        ref: clip.cpp build_patch_merge_permute (idefics3 tiles are multiples of s).
        """
        e = x.ne[0]
        x = g.reshape(x, e * s, nx // s, ny)
        x = g.permute(x, 0, 2, 1, 3)                                      # [e*s, ny, nx/s]
        x = g.reshape(g.cont(x), e * s * s, ny // s, nx // s)
        x = g.permute(x, 0, 2, 1, 3)                                      # [e*s*s, nx/s, ny/s]
        return g.reshape(g.cont(x), e * s * s, (nx // s) * (ny // s))

    def max_sizes(self) -> list[tuple[int, int]]:
        """Tile sizes (width, height) whose graphs together bound every tile's compute memory."""
        if self.family is not None:
            return list(self.family.max_sizes())
        side = self.config.image_size
        return [(side, side)]

    def max_graph(self, size=None):
        """The worst-case vision graph (the largest tile, or `size`) for backend.reserve; caller closes it."""
        g = self.backend.graph()
        self.build(g, *(size or self.max_sizes()[0]))
        return g

    def reserve(self) -> None:
        """Reserve the vision backend's compute memory for the largest tiles (max_sizes)."""
        for size in self.max_sizes():
            g = self.max_graph(size)
            try:
                self.backend.reserve(g)
            finally:
                g.close()

    # -- encoding --------------------------------------------------------------------

    def _graph(self, g, tile):
        tile = np.ascontiguousarray(tile, dtype=np.float32)
        if tile.ndim != 3 or tile.shape[0] != 3:
            raise ValueError(f"a tile is float32 [3, H, W], got shape {tile.shape}")
        inp, out, extra = self.build_inputs(g, tile.shape[2], tile.shape[1])
        return out, {inp: tile, **extra}

    def encode_image(self, image) -> list[np.ndarray]:
        """Preprocess and encode every tile of an image, in order."""
        return [self.encode(t) for t in self.preprocess(image)]
