"""An mmproj's audio encoder hyperparameters (`clip.audio.*`).

ref: llama.cpp tools/mtmd/clip.cpp (clip_model_loader::load_hparams, the audio modality):
the projector type is `clip.projector_type`, or `clip.audio.projector_type` in a file
with both encoders (Gemma 4); `qwen2.5o` is Qwen2-Audio's encoder (`qwen2a`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ggserve.models.mmproj import u32
from ggserve.models.registry import ModelError


@dataclass(frozen=True)
class AudioConfig:
    projector: str
    n_mel: int
    n_embd: int
    n_head: int
    n_ff: int
    n_layer: int
    n_embd_out: int          # clip.audio.projection_dim: the text model's width
    eps: float
    stack_factor: int        # ultravox, voxtral: encoder frames stacked per token (0: none)
    sample_rate: int = 16000


def projector_type(meta: dict) -> str | None:
    proj = meta.get("clip.projector_type") or meta.get("clip.audio.projector_type")
    return "qwen2a" if proj == "qwen2.5o" else proj


def read_config(meta: dict, path: str, supported: tuple[str, ...]) -> AudioConfig:
    """The audio encoder's hyperparameters; ModelError naming the file if unsupported."""
    if not meta.get("clip.has_audio_encoder", False):
        raise ModelError(f"{path}: the mmproj has no audio encoder (clip.has_audio_encoder is not set)")
    proj = projector_type(meta)
    if proj not in supported:
        raise ModelError(f"{path}: unsupported audio projector type {proj!r} (supported: {', '.join(supported)})")
    stacked = ("ultravox", "voxtral", "glma")     # the stack factor is required (clip.cpp require_stack)
    stack = u32(meta, "clip.audio.projector.stack_factor", path, 0 if proj not in stacked else None)
    cfg = AudioConfig(
        projector=proj,
        n_mel=u32(meta, "clip.audio.num_mel_bins", path),
        n_embd=u32(meta, "clip.audio.embedding_length", path),
        n_head=u32(meta, "clip.audio.attention.head_count", path),
        n_ff=u32(meta, "clip.audio.feed_forward_length", path),
        n_layer=u32(meta, "clip.audio.block_count", path),
        n_embd_out=u32(meta, "clip.audio.projection_dim", path, 0),
        eps=float(meta.get("clip.audio.attention.layer_norm_epsilon", 1e-5)),
        stack_factor=stack,
    )
    if cfg.n_head <= 0 or cfg.n_embd % cfg.n_head:
        raise ModelError(f"{path}: audio embedding length {cfg.n_embd} is not divisible by {cfg.n_head} heads")
    if cfg.n_layer <= 0:
        raise ModelError(f"{path}: the audio encoder has no blocks")
    if proj in stacked and stack <= 0:
        raise ModelError(f"{path}: {proj} needs clip.audio.projector.stack_factor > 0")
    return cfg
