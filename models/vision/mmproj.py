"""llama.cpp mmproj files: `clip.*` metadata and the `v.*` / `mm.*` tensor names.

ref: llama.cpp tools/mtmd/clip.cpp (clip_model_loader::load_hparams, load_tensors).
Only the vision side of the projector types below is supported; anything else is a
ModelError naming the file, raised before any weight is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggserve.models.mmproj import open_gguf, u32
from ggserve.models.registry import ModelError
from ggserve.native.gguf_file import GGUFFile

PROJECTORS = ("gemma3", "idefics3", "mlp")   # built-in paths; more families: models/vision/registry.py

# clip.cpp defaults when the key is absent
GEMMA3_N_MERGE = 4                  # avg-pool kernel; convert_hf_to_gguf only writes it when != 4


@dataclass(frozen=True)
class VisionConfig:
    projector: str
    image_size: int                 # side of one (square) encoder tile, pixels
    patch_size: int
    n_embd: int
    n_head: int
    n_ff: int
    n_layer: int
    eps: float
    ffn_op: str                     # "gelu" | "gelu_quick" | "silu"
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    n_merge: int                    # gemma3: pool kernel; idefics3: pixel-shuffle scale; mlp: 1
    longest_edge: int               # idefics3 preprocessing (clip.vision.preproc_image_size)

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_tile(self) -> int:
        n = self.patches_per_side // self.n_merge
        return n * n


def _triple(meta: dict, key: str, path: str) -> tuple[float, float, float]:
    v = meta.get(key)
    if v is None or len(v) < 3:
        raise ModelError(f"{path}: missing metadata {key!r} (3 floats)")
    a = np.asarray(v, dtype=np.float32)[:3]
    return (float(a[0]), float(a[1]), float(a[2]))


def read_config(gguf: GGUFFile) -> VisionConfig:
    """The encoder's hyperparameters from an mmproj header; ModelError if unsupported."""
    meta, path = gguf.metadata, gguf.path
    arch = meta.get("general.architecture")
    if arch != "clip":
        raise ModelError(f"{path}: not an mmproj file (general.architecture is {arch!r}, expected 'clip')")
    if not meta.get("clip.has_vision_encoder", False):
        raise ModelError(f"{path}: the mmproj has no vision encoder (clip.has_vision_encoder is not set)")
    proj = meta.get("clip.projector_type") or meta.get("clip.vision.projector_type")
    from ggserve.models.vision.registry import supported
    if proj not in supported():
        raise ModelError(f"{path}: unsupported projector type {proj!r} (supported: {', '.join(supported())})")

    if meta.get("clip.use_gelu", False) and meta.get("clip.use_silu", False):
        raise ModelError(f"{path}: both clip.use_gelu and clip.use_silu are set")
    ffn_op = "gelu" if meta.get("clip.use_gelu", False) else "silu" if meta.get("clip.use_silu", False) else "gelu_quick"

    n_merge = 1
    longest_edge = 0
    if proj == "gemma3":
        n_merge = u32(meta, "clip.vision.projector.scale_factor", path, GEMMA3_N_MERGE)
    elif proj == "idefics3":
        n_merge = u32(meta, "clip.vision.projector.scale_factor", path, 0)
        longest_edge = u32(meta, "clip.vision.preproc_image_size", path, 0)

    cfg = VisionConfig(
        projector=proj,
        image_size=u32(meta, "clip.vision.image_size", path),
        patch_size=u32(meta, "clip.vision.patch_size", path),
        n_embd=u32(meta, "clip.vision.embedding_length", path),
        n_head=u32(meta, "clip.vision.attention.head_count", path),
        n_ff=u32(meta, "clip.vision.feed_forward_length", path),
        n_layer=u32(meta, "clip.vision.block_count", path),
        eps=float(meta.get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
        ffn_op=ffn_op,
        image_mean=_triple(meta, "clip.vision.image_mean", path),
        image_std=_triple(meta, "clip.vision.image_std", path),
        n_merge=n_merge,
        longest_edge=longest_edge,
    )
    _check(cfg, path)
    return cfg


def _check(cfg: VisionConfig, path: str) -> None:
    def bad(why):
        raise ModelError(f"{path}: {why}")

    if cfg.patch_size <= 0 or cfg.image_size <= 0 or cfg.image_size % cfg.patch_size:
        bad(f"image size {cfg.image_size} is not a multiple of patch size {cfg.patch_size}")
    if cfg.n_head <= 0 or cfg.n_embd % cfg.n_head:
        bad(f"embedding length {cfg.n_embd} is not divisible by {cfg.n_head} heads")
    if cfg.n_layer <= 0:
        bad("the vision encoder has no blocks")
    if cfg.projector == "mlp" and cfg.n_layer < 2:
        bad("an mlp (LLaVA) projector needs at least 2 blocks (the last one is skipped)")
    if cfg.projector in ("gemma3", "idefics3"):
        if cfg.n_merge < 2 or cfg.patches_per_side % cfg.n_merge:
            bad(f"{cfg.patches_per_side} patches per side cannot be merged by {cfg.n_merge}")
    if cfg.projector == "idefics3" and cfg.longest_edge <= 0:
        bad("idefics3 needs clip.vision.preproc_image_size")
    if any(s == 0 for s in cfg.image_std):
        bad("clip.vision.image_std has a zero")


def open_mmproj(path) -> tuple[GGUFFile, VisionConfig]:
    """Read and validate an mmproj header. Every failure is a ModelError naming the file."""
    gguf = open_gguf(path)
    return gguf, read_config(gguf)
