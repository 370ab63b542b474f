"""Image preprocessing as llama.cpp's mtmd does it, per projector type.

ref: llama.cpp tools/mtmd/mtmd-image.cpp. llama.cpp resizes with a port of Pillow's
ImagingResample (`resize_pillow`: separable filter, 22-bit fixed point, always the
horizontal pass first); we call Pillow itself one axis at a time, which is what that
port reproduces. Decoding follows stb_image as mtmd-helper uses it (3 channels:
alpha dropped without compositing, gray replicated, 16-bit reduced to the high
byte, EXIF orientation ignored).

  gemma3    aspect-preserving bilinear resize into the square, PAD_CEIL, black pad
  mlp       the same with bicubic and pad colour (122, 116, 104)
  idefics3  Lanczos to the longest edge, Lanczos to multiples of the tile side,
            tiles row-major, then a Lanczos overview of the whole as the last tile

Tiles are float32 CHW arrays, normalised as (x / 255 - mean) / std in float32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ggserve.models.vision.mmproj import VisionConfig

BILINEAR, BICUBIC, LANCZOS = "bilinear", "bicubic", "lanczos"
_PIL_FILTER = {BILINEAR: Image.Resampling.BILINEAR, BICUBIC: Image.Resampling.BICUBIC,
               LANCZOS: Image.Resampling.LANCZOS}

LLAVA_PAD_COLOR = (122, 116, 104)       # ref: clip.cpp load_hparams, PROJECTOR_TYPE_MLP


def to_rgb(image: Image.Image) -> np.ndarray:
    """uint8 [H, W, 3] pixels of a decoded image, channels as stb_image gives them."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # stb keeps the high byte of 16-bit samples; Pillow's own conversion clips
        g = (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)
        return np.repeat(g[:, :, None], 3, axis=2)
    if image.mode != "RGB":
        # RGBA/LA -> RGB drops alpha without compositing, L -> RGB replicates, P expands the palette
        image = image.convert("RGB")
    return np.asarray(image, dtype=np.uint8)


def resize_pillow(rgb: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """Resize uint8 [H, W, 3] to [height, width, 3] with Pillow's resampling filter.

    Horizontal pass first, then vertical, each rounded and clipped to uint8, as
    llama.cpp's resize_pillow always does. Pillow's own two-axis resize may run the
    vertical pass first (Pillow 13 does for a tall image shrinking, e.g. 200x600 ->
    112x336), which changes the pixels by up to 14 levels; so each axis gets its own
    call (one-axis resizes are the same filter in both).
    """
    h, w = rgb.shape[:2]
    img = Image.fromarray(rgb, "RGB")
    if w != width:
        img = img.resize((width, h), _PIL_FILTER[algo])
    if h != height:
        img = img.resize((width, height), _PIL_FILTER[algo])
    return np.asarray(img, dtype=np.uint8) if (w, h) != (width, height) else rgb


def fit_size(width: int, height: int, target_w: int, target_h: int) -> tuple[int, int]:
    """PAD_CEIL: the aspect-preserving size inside the target, rounded up (float32 as in C++)."""
    f = np.float32
    scale = min(f(target_w) / f(width), f(target_h) / f(height))
    new_w = min(int(math.ceil(f(width) * scale)), target_w)
    new_h = min(int(math.ceil(f(height) * scale)), target_h)
    return new_w, new_h


def resize_pad(rgb: np.ndarray, side: int, algo: str, pad_color=(0, 0, 0)) -> np.ndarray:
    """Aspect-preserving resize into a side x side square, centred on pad_color."""
    h, w = rgb.shape[:2]
    if w == side and h == side:
        return rgb
    new_w, new_h = fit_size(w, h, side, side)
    resized = resize_pillow(rgb, new_w, new_h, algo)
    out = np.empty((side, side, 3), dtype=np.uint8)
    out[:] = np.asarray(pad_color, dtype=np.uint8)
    x0, y0 = (side - new_w) // 2, (side - new_h) // 2
    out[y0:y0 + new_h, x0:x0 + new_w] = resized
    return out


def resize_pad_to(rgb: np.ndarray, width: int, height: int, algo: str, pad_color=(0, 0, 0)) -> np.ndarray:
    """img_tool::resize with PAD_CEIL: aspect-preserving resize into width x height, centred on pad_color."""
    h, w = rgb.shape[:2]
    if (w, h) == (width, height):
        return rgb
    new_w, new_h = fit_size(w, h, width, height)
    resized = resize_pillow(rgb, new_w, new_h, algo)
    out = np.empty((height, width, 3), dtype=np.uint8)
    out[:] = np.asarray(pad_color, dtype=np.uint8)
    x0, y0 = (width - new_w) // 2, (height - new_h) // 2
    out[y0:y0 + new_h, x0:x0 + new_w] = resized
    return out


def size_preserved_ratio(width: int, height: int, align: int, min_pixels: int = 0, max_pixels: int = 0,
                         longest_edge: int = 0) -> tuple[int, int]:
    """mtmd-image.cpp calc_size_preserved_ratio, in float32 as the C++: sides to multiples of
    `align` (nearest), then scaled down (floor) above max_pixels or up (ceil) below min_pixels."""
    f32 = np.float32
    fa = f32(align)

    def round_by(x):
        return int(math.floor(float(f32(x) / fa) + 0.5)) * align      # std::round: half away from zero

    def ceil_by(x):
        return int(math.ceil(float(f32(x) / fa))) * align

    def floor_by(x):
        return int(math.floor(float(f32(x) / fa))) * align

    if width <= 0 or height <= 0:
        return 0, 0
    if longest_edge > 0:
        scale = min(f32(longest_edge) / f32(width), f32(longest_edge) / f32(height))
        w_bar, h_bar = ceil_by(f32(width) * scale), ceil_by(f32(height) * scale)
    else:
        w_bar, h_bar = max(align, round_by(width)), max(align, round_by(height))
    if max_pixels > 0 and h_bar * w_bar > max_pixels:
        beta = np.sqrt(f32(height) * f32(width) / f32(max_pixels), dtype=f32)
        h_bar = max(align, floor_by(f32(height) / beta))
        w_bar = max(align, floor_by(f32(width) / beta))
    elif min_pixels > 0 and h_bar * w_bar < min_pixels:
        beta = np.sqrt(f32(min_pixels) / (f32(height) * f32(width)), dtype=f32)
        h_bar = ceil_by(f32(height) * beta)
        w_bar = ceil_by(f32(width) * beta)
    return w_bar, h_bar


def normalize(rgb: np.ndarray, mean, std) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [3, H, W]: (x / 255 - mean) / std, in float32 like the C++."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


class Tiles(list):
    """The float32 CHW tiles of one image, in the order they are encoded.

    grid_x / grid_y: columns and rows of the sliced tiles (0 / 0 when the image is
    one tile); with a grid, the overview of the whole image is the last tile.
    """

    def __init__(self, tiles, grid_x: int = 0, grid_y: int = 0, n_tokens=None):
        super().__init__(tiles)
        self.grid_x = grid_x
        self.grid_y = grid_y
        self.n_tokens = list(n_tokens) if n_tokens is not None else None   # per tile (registry families)


@dataclass(frozen=True)
class Plan:
    """What preprocessing will produce for an image size, without touching pixels."""
    n_tiles: int                 # encoder runs, overview included
    grid_x: int = 0
    grid_y: int = 0
    resized: tuple[int, int] = (0, 0)     # idefics3: the size the tiles are cut from
    n_tokens: tuple = ()                  # registry families: embedding rows per tile


class FixedSize:
    """One square tile of image_size (gemma3, LLaVA-1.5)."""

    def __init__(self, cfg: VisionConfig, algo: str, pad_color):
        self.cfg, self.algo, self.pad_color = cfg, algo, pad_color

    def plan(self, width: int, height: int) -> Plan:
        _check_size(width, height)
        return Plan(1)

    def __call__(self, rgb: np.ndarray) -> Tiles:
        self.plan(rgb.shape[1], rgb.shape[0])
        sq = resize_pad(rgb, self.cfg.image_size, self.algo, self.pad_color)
        return Tiles([normalize(sq, self.cfg.image_mean, self.cfg.image_std)])


class Idefics3:
    """SmolVLM: longest edge to `longest_edge`, sides up to multiples of the tile, tiles + overview.

    ref: transformers Idefics3ImageProcessor (resize, resize_for_vision_encoder,
    split_image), which the llama.cpp preprocessor follows.
    """

    def __init__(self, cfg: VisionConfig):
        self.cfg = cfg

    def plan(self, width: int, height: int) -> Plan:
        _check_size(width, height)
        tile, edge = self.cfg.image_size, self.cfg.longest_edge
        # 1. longest edge to `edge`, the other side by the aspect ratio, made even
        w, h = _rescale_to_max_len(width, height, edge)
        # 2. both sides up to multiples of the tile side
        aspect = w / h
        if w >= h:
            w = math.ceil(w / tile) * tile
            h = math.ceil(int(w / aspect) / tile) * tile
        else:
            h = math.ceil(h / tile) * tile
            w = math.ceil(int(h * aspect) / tile) * tile
        if w <= tile and h <= tile:
            return Plan(1, 0, 0, (w, h))
        gx, gy = w // tile, h // tile
        return Plan(gx * gy + 1, gx, gy, (w, h))

    def __call__(self, rgb: np.ndarray) -> Tiles:
        h0, w0 = rgb.shape[:2]
        p = self.plan(w0, h0)
        tile, mean, std = self.cfg.image_size, self.cfg.image_mean, self.cfg.image_std
        w1, h1 = _rescale_to_max_len(w0, h0, self.cfg.longest_edge)
        big = resize_pillow(resize_pillow(rgb, w1, h1, LANCZOS), p.resized[0], p.resized[1], LANCZOS)
        if p.grid_x == 0:
            return Tiles([normalize(resize_pillow(big, tile, tile, LANCZOS), mean, std)])
        out = []
        for r in range(p.grid_y):
            for c in range(p.grid_x):
                out.append(normalize(big[r * tile:(r + 1) * tile, c * tile:(c + 1) * tile], mean, std))
        out.append(normalize(resize_pillow(big, tile, tile, LANCZOS), mean, std))
        return Tiles(out, p.grid_x, p.grid_y)


def _rescale_to_max_len(width: int, height: int, max_len: int) -> tuple[int, int]:
    """ref: transformers idefics3 _resize_output_size_rescale_to_max_len (-> width, height)."""
    aspect = width / height
    if width >= height:
        w = max_len
        h = int(w / aspect)
        h += h % 2
    else:
        h = max_len
        w = int(h * aspect)
        w += w % 2
    return max(w, 1), max(h, 1)


def _check_size(width: int, height: int) -> None:
    if width <= 0 or height <= 0:
        raise ValueError(f"image has no pixels ({width}x{height})")


def preprocessor_for(cfg: VisionConfig):
    if cfg.projector == "gemma3":
        return FixedSize(cfg, BILINEAR, (0, 0, 0))
    if cfg.projector == "mlp":
        return FixedSize(cfg, BICUBIC, LLAVA_PAD_COLOR)
    if cfg.projector == "idefics3":
        return Idefics3(cfg)
    raise ValueError(f"no preprocessor for projector {cfg.projector!r}")
