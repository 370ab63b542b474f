"""MiniCPM-V 2.6 (`clip.projector_type` = resampler, clip.minicpmv_version 3): slices + resampler.

ref: llama.cpp tools/mtmd/models/minicpmv.cpp, clip.cpp (set_input for MINICPMV),
mtmd-image.cpp (mtmd_image_preprocessor_llava_uhd without pinpoints: get_best_resize,
get_best_grid, get_refine_size), mtmd.cpp (MTMD_SLICE_TMPL_MINICPMV_2_6).

  preprocess  both sides <= image_size: the image stretched to image_size square, alone.
              Otherwise an overview of about image_size^2 pixels (aspect kept, sides to
              multiples of the patch) and a grid of <= 9 slices from get_best_grid, the
              image resized (bicubic, black pad) to the refined size and cut row-major
  tower       SigLIP ViT (learned positions bucketed on a 70x70 grid, layer norms,
              post LN)
  resampler   64 learned queries attend (one head per 128 dims) to kv-projected
              patches + 2D sinusoidal positions -> ln_post -> proj: 64 rows per tile
  prompt      <image> overview </image>, then per slice <slice> s </slice>, "\\n"
              between rows of slices (not after the last)
"""
from __future__ import annotations

import math

import numpy as np

from ggserve.models.c_math import powf
from ggserve.models.registry import ModelError
from ggserve.models.vision import vit
from ggserve.models.vision.preprocess import BICUBIC, Plan, Tiles, normalize, resize_pad_to, resize_pillow
from ggserve.models.vision.registry import Family, register
from ggserve.native import ggml

MAX_SLICES = 9
POS_GRID = 70              # learned position embeddings: a 70 x 70 bucket grid
RESAMPLER_D_HEAD = 128
OMEGA_BASE = 10000.0
TOKENS = ("<image>", "</image>", "<slice>", "</slice>")


@register("resampler")
class MiniCPMV(Family):
    name = "minicpmv"

    def __init__(self, cfg, meta: dict, path: str):
        super().__init__(cfg, meta, path)
        version = int(meta.get("clip.minicpmv_version", 2) or 2)
        if version not in (3, 4, 5, 6, 100045):
            raise ModelError(f"{path}: MiniCPM-V version {version} is not supported (2.6-style slices only)")
        self.n_query = int(meta.get("clip.minicpmv_query_num", 64) or 64)

    def check_vocab(self, tokenizer) -> None:
        for name in TOKENS:
            if tokenizer.token_to_id(name) is None:
                raise ValueError(f"the text model has no {name} token, which minicpmv images need")

    def load(self, w) -> None:
        cfg = self.cfg
        e, p = cfg.n_embd, cfg.patch_size
        self.patch_embd = w.get("v.patch_embd.weight", (p, p, 3, e))
        self.patch_bias = w.get("v.patch_embd.bias", (e,), required=False)
        self.pos_embd = w.get("v.position_embd.weight", (e, POS_GRID * POS_GRID))
        self.pre_ln, self.post_ln = vit.norm_weights(w, "pre_ln", e), vit.norm_weights(w, "post_ln", e)
        self.blocks = [vit.Block(w, i, e, cfg.n_ff) for i in range(cfg.n_layer)]
        q = w.get("resampler.query")
        t = q.ne[0]
        if t % RESAMPLER_D_HEAD or t % 4:
            raise ModelError(f"{self.path}: the resampler width {t} is not a multiple of {RESAMPLER_D_HEAD}")
        self.n_embd_out = w.get("resampler.proj.weight").ne[1]
        self.query = w.get("resampler.query", (t, self.n_query))
        self.kv = w.get("resampler.kv.weight", (e, t))
        r = {}
        for n in ("ln_q", "ln_kv", "ln_post"):
            r[n] = (w.get(f"resampler.{n}.weight", (t,)), w.get(f"resampler.{n}.bias", (t,)))
        for n in ("q", "k", "v", "out"):
            r[n] = (w.get(f"resampler.attn.{n}.weight", (t, t)), w.get(f"resampler.attn.{n}.bias", (t,)))
        self.r = r
        self.proj = w.get("resampler.proj.weight", (t, self.n_embd_out))
        self.width = t

    # -- preprocessing -------------------------------------------------------------

    @staticmethod
    def _ensure_divide(length, p: int) -> int:
        return max(int(math.floor(float(np.float32(length) / np.float32(p)) + 0.5)) * p, p)

    def _best_resize(self, width: int, height: int, upscale: bool) -> tuple[int, int]:
        side, p = self.cfg.image_size, self.cfg.patch_size
        if width * height > side * side or upscale:
            r = np.float32(width) / np.float32(height)
            height = int(np.float32(side) / np.sqrt(r, dtype=np.float32))
            width = int(np.float32(height) * r)
        return self._ensure_divide(width, p), self._ensure_divide(height, p)

    @staticmethod
    def _best_grid(multiple: int, log_ratio) -> tuple[int, int]:
        cands = []
        for n in (multiple - 1, multiple, multiple + 1):
            if n == 1 or n > MAX_SLICES:
                continue
            cands += [(m, n // m) for m in range(1, n + 1) if n % m == 0]
        best, err_min = (1, 1), np.float32(np.inf)
        for gx, gy in cands:
            err = np.float32(abs(float(log_ratio) - math.log(1.0 * gx / gy)))
            if err < err_min:
                best, err_min = (gx, gy), err
        return best

    def plan(self, width: int, height: int) -> Plan:
        if width <= 0 or height <= 0:
            raise ValueError(f"image has no pixels ({width}x{height})")
        side = self.cfg.image_size
        if width <= side and height <= side:
            return Plan(1, 0, 0, (side, side), (self.n_query,))
        f32 = np.float32
        log_ratio = f32(math.log(float(f32(width) / f32(height))))
        ratio = f32(width) * f32(height) / f32(side * side)
        multiple = int(min(math.ceil(float(ratio)), MAX_SLICES))
        gx, gy = self._best_grid(multiple, log_ratio)
        # get_refine_size
        rw, rh = self._ensure_divide(width, gx), self._ensure_divide(height, gy)
        bw, bh = self._best_resize(rw // gx, rh // gy, True)
        n = gx * gy + 1
        return Plan(n, gx, gy, (bw * gx, bh * gy), (self.n_query,) * n)

    def preprocess(self, rgb: np.ndarray) -> Tiles:
        h, w = rgb.shape[:2]
        p = self.plan(w, h)
        mean, std = self.cfg.image_mean, self.cfg.image_std
        if not p.grid_x:
            side = self.cfg.image_size
            return Tiles([normalize(resize_pillow(rgb, side, side, BICUBIC), mean, std)], n_tokens=p.n_tokens)
        ow, oh = self._best_resize(w, h, False)
        tiles = [normalize(resize_pillow(rgb, ow, oh, BICUBIC), mean, std)]
        rw, rh = p.resized
        refined = resize_pad_to(rgb, rw, rh, BICUBIC, (0, 0, 0))
        sw, sh = rw // p.grid_x, rh // p.grid_y
        for r in range(p.grid_y):
            for c in range(p.grid_x):
                tiles.append(normalize(refined[r * sh:(r + 1) * sh, c * sw:(c + 1) * sw], mean, std))
        return Tiles(tiles, p.grid_x, p.grid_y, n_tokens=p.n_tokens)

    __call__ = preprocess

    def layout(self, tiles, text, image) -> None:
        text("<image>")
        image(0)
        text("</image>")
        for r in range(tiles.grid_y):
            for c in range(tiles.grid_x):
                text("<slice>")
                image(1 + r * tiles.grid_x + c)
                text("</slice>")
            if r < tiles.grid_y - 1:
                text("\n")

    def max_sizes(self):
        side, p = self.cfg.image_size, self.cfg.patch_size
        n = side // p + 1                      # sides rounded to the nearest patch: at most one more
        return [(n * p, n * p), (p, n * n * p), (n * n * p, p)]

    # -- graph -----------------------------------------------------------------------

    def build(self, g, width: int, height: int):
        cfg = self.cfg
        p = cfg.patch_size
        nx, ny = width // p, height // p
        n = nx * ny
        inp_raw, x = vit.patch_embed(g, self.patch_embd, self.patch_bias, width, height, p)
        positions = g.input("positions", ggml.I32, (n,))
        bh = np.floor(POS_GRID * np.arange(ny) / ny).astype(np.int32)
        bw = np.floor(POS_GRID * np.arange(nx) / nx).astype(np.int32)
        x = g.add(x, g.get_rows(self.pos_embd, positions))
        x = vit.vit(g, x, self.blocks, n_head=cfg.n_head, eps=cfg.eps, ffn_op=cfg.ffn_op,
                    pre_ln=self.pre_ln, post_ln=self.post_ln)
        t, eps = self.width, cfg.eps
        r = self.r
        omega = g.input("omega", ggml.F32, (t // 4,))
        pos_h = g.input("pos_h", ggml.F32, (1, n))
        pos_w = g.input("pos_w", ggml.F32, (1, n))
        idx = np.arange(n)
        k4 = t // 4
        # 1 / powf(10000, i / k4) in float32, as clip.cpp fills "omega"
        om = np.float32(1.0) / powf(OMEGA_BASE, np.arange(k4, dtype=np.float32) / np.float32(k4))
        extra = {positions: (bh[:, None] * POS_GRID + bw[None, :]).reshape(-1).astype(np.int32),
                 omega: om,
                 pos_h: (idx // nx).astype(np.float32).reshape(n, 1),
                 pos_w: (idx % nx).astype(np.float32).reshape(n, 1)}
        q = vit.norm(g, self.query, *r["ln_q"], eps)
        v = vit.norm(g, g.mul_mat(self.kv, x), *r["ln_kv"], eps)
        om_b = g.repeat_4d(omega, k4, n, 1, 1)
        tx, ty = g.mul(om_b, pos_w), g.mul(om_b, pos_h)
        pe = g.concat(g.concat(g.sin(tx), g.cos(tx), 0), g.concat(g.sin(ty), g.cos(ty), 0), 0)
        k = g.add(v, pe)
        n_head = t // RESAMPLER_D_HEAD
        Q = g.reshape(g.add(g.mul_mat(r["q"][0], q), r["q"][1]), RESAMPLER_D_HEAD, n_head, self.n_query)
        K = g.reshape(g.add(g.mul_mat(r["k"][0], k), r["k"][1]), RESAMPLER_D_HEAD, n_head, n)
        V = g.reshape(g.add(g.mul_mat(r["v"][0], v), r["v"][1]), RESAMPLER_D_HEAD, n_head, n)
        x = vit.attention(g, Q, K, V, r["out"][0], r["out"][1], 1.0 / math.sqrt(RESAMPLER_D_HEAD))
        x = vit.norm(g, x, *r["ln_post"], eps)
        x = g.mul_mat(self.proj, x)
        return inp_raw, x, extra
